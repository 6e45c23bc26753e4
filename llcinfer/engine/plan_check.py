"""Timing plans on the executor: ``measure_tpot`` (a plan's decode TPOT at a context and
concurrency, on written KV) and ``check_plan``, the closed loop at start-up: the chosen
plan and the best runner-up of the other kind are timed for a few steps each and the
faster is kept (planner/closed_loop.py decides and records).
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from ..executor import DecodeExecutor, Domains
from ..kv import PagedSequence
from ..planner.calibration import Calibration, cache_key
from ..planner.closed_loop import close_loop
from ..weights.repack_cache import wait_loaded
from .placement import domains_from_plan

CHECK_KV_BYTES = 2 << 30  # the start-up check skips contexts whose KV would commit more


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def measure_tpot(model, domains: Domains, ctx: int, concurrency: int, n_tokens: int = 16, reps: int = 5) -> dict:
    """Decode TPOT of the executor under ``domains``: each of ``concurrency`` sequences holds
    ``ctx`` tokens of written K/V (ones: attention costs the same whatever the values, and
    written pages are read from memory, not from the kernel's zero page), then ``n_tokens``
    steps of one token per sequence run, the sequences rolled back before each of ``reps``
    repetitions.  {'tpot_s': median step time, 'steps_s': [per repetition], 'tokens_per_s'}"""
    ex = DecodeExecutor(model, domains)
    n_ctx = ctx + n_tokens + 1
    pool, _ = model.new_pool(n_ctx, concurrency, prefix_sharing=False)
    seqs = [PagedSequence(pool, n_ctx, None, f"s{i}") for i in range(concurrency)]
    rng = np.random.default_rng(0)
    try:
        for s in seqs:
            s.n_tokens = ctx
            pool.fill(s.table[:s.n_blocks])  # commit and write every block
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
        ex.close()
    tpot = statistics.median(per_rep)
    return {"tpot_s": tpot, "steps_s": per_rep, "tokens_per_s": concurrency / tpot}


def plan_timer(model, ctx: int, concurrency: int, n_tokens: int, reps: int):
    """timer(plan) -> seconds per step, for ``close_loop``."""
    return lambda p: measure_tpot(model, domains_from_plan(p, model.config), ctx, concurrency, n_tokens,
                                  reps)["tpot_s"]


def check_plan(model, plan, machine, cal: Calibration, workload, n_tokens: int = 4, reps: int = 3,
               log=_log):
    """The closed loop at start-up (``close_loop`` with the executor as timer, plans already
    observed on this workload not timed again); returns the plan to run.  Skipped (the plan
    returned as is) when its KV would commit more than ``CHECK_KV_BYTES``."""
    if workload.kv_bytes_per_step > CHECK_KV_BYTES:
        log(f"plan check skipped: {workload.kv_bytes_per_step / 2**30:.1f} GiB of KV at ctx {workload.ctx}")
        return plan
    t0 = time.perf_counter()
    timer = plan_timer(model, workload.ctx, workload.concurrency, n_tokens, reps)
    best, measured = close_loop(plan, workload, cal, timer, reuse=True)
    dt = time.perf_counter() - t0
    cal.note_measured("plan check", dt)
    try:
        cal.save(cache_key(machine))
    except OSError:
        pass
    if len(measured) > 1:
        log("plan check (%.1f s): " % dt + "; ".join(f"{label} {s * 1e3:.1f} ms" for label, s in measured.items())
            + f" -> {best.label}")
    return best
