"""Timing plans on the executor: ``measure_tpot`` (a plan's decode TPOT at a context and
concurrency, on written KV), ``measure_alternating`` (several set-ups timed in turn, A B
A B, so a noisy host's slow moments fall on all of them) and ``check_plan``, the closed
loop at start-up: the chosen plan and the best runner-up of the other kind are timed in
turn for a few steps each and the faster is kept (planner/closed_loop.py decides and
records).
"""

from __future__ import annotations

import statistics
import sys
import time
from contextlib import contextmanager

import numpy as np

from ..executor import DecodeExecutor, Domains
from ..kv import PagedSequence
from ..planner.calibration import Calibration, cache_key
from ..planner.closed_loop import close_loop, other_kind
from ..sparse import SparseAttention
from ..weights.repack_cache import wait_loaded
from .placement import domains_from_plan

CHECK_KV_BYTES = 2 << 30  # the start-up check skips contexts whose KV would commit more
SWITCH_PAUSE_S = 0.01  # longer than a serving worker waits for the next step (workers.IDLE_CYCLES)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class _StepBench:
    """An executor under ``domains`` with ``concurrency`` sequences holding ``ctx`` tokens of
    written K/V (ones: attention costs the same whatever the values, and written pages are
    read from memory, not from the kernel's zero page), warmed by one step.  With
    ``sparse`` (a SparseConfig) its rows run sparse attention over random index keys and a
    random basis (the selection costs what it costs on real keys: distinct scores)."""

    def __init__(self, model, domains: Domains, ctx: int, concurrency: int, n_tokens: int, sparse=None):
        self.ctx = ctx
        n_ctx = ctx + n_tokens + 1
        pool, _ = model.new_pool(n_ctx, concurrency, prefix_sharing=False)
        self.seqs = [PagedSequence(pool, n_ctx, None, f"s{i}") for i in range(concurrency)]
        for s in self.seqs:
            s.n_tokens = ctx
            pool.fill(s.table[:s.n_blocks])  # commit and write every block
        self.model, self.sparse = model, None if sparse is None else _written_sparse(model, pool, sparse, self.seqs)
        self.toks = np.random.default_rng(0).integers(0, model.config.vocab_size, concurrency).tolist()
        with self._sparse_on():
            self.ex = DecodeExecutor(model, domains)
            self.ex.step(self.seqs, self.toks)  # warm: compile, first touch of the new blocks

    @contextmanager
    def _sparse_on(self):
        """The model's sparse attention is this bench's while its executor is built and steps."""
        saved, self.model.sparse = self.model.sparse, self.sparse
        try:
            yield
        finally:
            self.model.sparse = saved

    def seconds_per_step(self, n_tokens: int) -> float:
        """``n_tokens`` steps of one token per sequence from ``ctx``: mean seconds per step."""
        for s in self.seqs:
            s.truncate(self.ctx)
        with self._sparse_on():
            t0 = time.perf_counter()
            for _ in range(n_tokens):
                self.ex.step(self.seqs, self.toks)
            return (time.perf_counter() - t0) / n_tokens

    def close(self) -> None:
        for s in self.seqs:
            s.free()
        self.ex.close()


def _written_sparse(model, pool, config, seqs) -> SparseAttention:
    c = model.config
    basis = np.random.default_rng(0).standard_normal((c.n_layer, c.n_kv_head, config.rank, c.head_dim))
    sp = SparseAttention(config, basis.astype(np.float32), pool, c.n_head)
    rng = np.random.default_rng(1)
    for s in seqs:  # random keys: distinct scores, as real text gives the top-k
        blocks = s.table[:s.n_blocks]
        sp.index.idx[:, blocks] = rng.integers(0, 256, sp.index.idx[:, blocks].shape, dtype=np.uint8)
        sp.index.isc[:, blocks] = 0.01
    return sp


def measure_alternating(model, layouts: list, n_tokens: int = 16, reps: int = 5) -> list[dict]:
    """Decode TPOT of several executor set-ups, each (domains, ctx, concurrency[, sparse]), timed in
    turn (A B A B ...) so that all see the same moments of a noisy host: per set-up,
    {'tpot_s': median over ``reps`` repetitions of ``n_tokens`` steps, 'steps_s': [per
    repetition], 'tokens_per_s'}.  Between set-ups the idle one's workers are given time to
    stop waiting for a step (they would take its cores)."""
    benches = []
    try:
        for layout in layouts:
            benches.append(_StepBench(model, *layout[:3], n_tokens, *layout[3:]))
        wait_loaded()  # the weights on 2 MiB pages: the steady state
        per_rep = [[] for _ in benches]
        for _ in range(reps):
            for i, bench in enumerate(benches):
                if len(benches) > 1:
                    time.sleep(SWITCH_PAUSE_S)
                per_rep[i].append(bench.seconds_per_step(n_tokens))
    finally:
        for bench in benches:
            bench.close()
    out = []
    for (_, _, concurrency, *_), steps in zip(layouts, per_rep):
        tpot = statistics.median(steps)
        out.append({"tpot_s": tpot, "steps_s": steps, "tokens_per_s": concurrency / tpot})
    return out


def measure_tpot(model, domains: Domains, ctx: int, concurrency: int, n_tokens: int = 16, reps: int = 5) -> dict:
    """Decode TPOT of the executor under ``domains`` at ``ctx`` tokens of written K/V per
    sequence (``measure_alternating`` of one set-up)."""
    return measure_alternating(model, [(domains, ctx, concurrency)], n_tokens, reps)[0]


def plan_timer(model, plans: list, ctx: int, concurrency: int, n_tokens: int, reps: int):
    """timer(plan) -> seconds per step, for ``close_loop``: the first call times all of
    ``plans`` in turn (``measure_alternating``), later calls look their result up; a plan
    not among them is timed alone."""
    measured = {}

    def timer(p) -> float:
        if not measured and plans:
            got = measure_alternating(model, [(domains_from_plan(q, model.config), ctx, concurrency) for q in plans],
                                      n_tokens, reps)
            measured.update({q.label: g["tpot_s"] for q, g in zip(plans, got)})
        if p.label not in measured:
            measured[p.label] = measure_tpot(model, domains_from_plan(p, model.config), ctx, concurrency, n_tokens,
                                             reps)["tpot_s"]
        return measured[p.label]

    return timer


def check_plan(model, plan, machine, cal: Calibration, workload, n_tokens: int = 4, reps: int = 3,
               log=_log):
    """The closed loop at start-up (``close_loop`` with the executor as timer, plans already
    observed on this workload not timed again); returns the plan to run.  Skipped (the plan
    returned as is) when its KV would commit more than ``CHECK_KV_BYTES``."""
    if workload.kv_bytes_per_step > CHECK_KV_BYTES:
        log(f"plan check skipped: {workload.kv_bytes_per_step / 2**30:.1f} GiB of KV at ctx {workload.ctx}")
        return plan
    t0 = time.perf_counter()
    todo = [p for p in (plan, other_kind(plan)) if p is not None and p.observed is None]
    timer = plan_timer(model, todo, workload.ctx, workload.concurrency, n_tokens, reps)
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
