"""Measure decode TPOT of the executor under given domains, context depth and number of
concurrent sequences (for the planner's predicted-vs-measured table).

Each sequence's cache is grown to ``ctx`` tokens without running the prompt (the values
in the pool are zeros: attention costs the same whatever the keys), then ``n_tokens``
steps run, one token for every sequence per step; the cache is rolled back before each
repetition.  TPOT is the time of one step (every sequence gets one token per step).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from ..executor import DecodeExecutor, Domains
from ..kernels.repack_cache import wait_loaded
from ..kv import PagedSequence


def measure_tpot(model, domains: Domains, ctx: int, concurrency: int, n_tokens: int = 16, reps: int = 5,
                 executor: DecodeExecutor | None = None) -> dict:
    """{'tpot_s': median step time, 'steps_s': [per repetition], 'tokens_per_s': ...}"""
    own = executor is None
    ex = executor or DecodeExecutor(model, domains)
    n_ctx = ctx + n_tokens + 1
    pool, _ = model.new_pool(n_ctx, concurrency, prefix_sharing=False)
    seqs = [PagedSequence(pool, n_ctx, None, f"s{i}") for i in range(concurrency)]
    rng = np.random.default_rng(0)
    try:
        for s in seqs:
            s.n_tokens = ctx
        toks = rng.integers(0, model.config.vocab_size, concurrency).tolist()
        ex.step(seqs, toks)  # warm: compile, first touch of the new blocks
        wait_loaded()  # and the weights on 2 MiB pages: the steady state
        per_rep = []
        for _ in range(reps):
            for s in seqs:
                s.truncate(ctx)
            t0 = time.perf_counter()
            for _ in range(n_tokens):
                ex.step(seqs, toks)
            per_rep.append((time.perf_counter() - t0) / n_tokens)
    finally:
        for s in seqs:
            s.free()
        if own:
            ex.close()
    tpot = statistics.median(per_rep)
    return {"tpot_s": tpot, "steps_s": per_rep, "tokens_per_s": concurrency / tpot}
