"""First-use calibration of what sparse attention adds to this machine's decode step (the
planner's sparse policy reads it: planner/sparse_policy.py).

Measured in the executor's own step, as the dense rates are (engine/calibrate.py): one
sequence on a shared domain of all cores, sparse rows at three contexts n and dense rows
at n_eff(n), the keys a row reads per layer on average (sparse layers read only their
kept blocks), all timed in turn (A B A B).  The sparse step is the dense step at n_eff
plus, per full layer, the selection: scoring the candidates' index keys in parts on the
P cores, the top-k, the gathered table, the extra hand-offs and whatever attending
scattered blocks costs more.  Per full layer and row:

    select(n) = part_ns + token_ns * cand(n) / P        (cand: candidate keys of a row with n keys)

a least-squares line through the three contexts gives the two constants.  The step
differences are small beside the step at the shorter contexts, so the line's slope can
come out at or below zero on a busy host; it is held at least at what the fused scorer
and top-k alone cost per candidate key (``scorer_seconds``, timed at the longest
context), which the step cannot undercut.  Once per
machine, kernel version, model shape and sparse configuration (rank, top-k, sinks,
window, layer policy), cached with the rest of the calibration.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from ..executor import Domains
from ..hw.cpu_load import OtherLoad
from ..hw.machine import Machine
from ..kernels.paged_attention import attention_tag
from ..kernels.sparse_rows import select_rows
from ..planner.calibration import Calibration, cache_key
from ..planner.candidates import budget_cores
from ..planner.sparse_policy import BLOCK_SIZE, Layers, select_key
from .calibrate import save_if_quiet
from .plan_check import measure_alternating

CONTEXTS = (4096, 8192, 16384)  # keys of the timed sparse rows
STEP_TOKENS, STEP_REPS = 8, 5  # decode steps timed per repetition, repetitions (median)


def ensure_sparse_calibration(model, sparse, m: Machine, threads: int, log) -> Calibration:
    """The cached calibration with the selection cost of ``model`` under ``sparse`` (a
    SparseConfig) measured now if it lacks it (seconds, once), saved unless the machine was
    busy meanwhile (calibrate.save_if_quiet)."""
    key = cache_key(m)
    cal = Calibration.load(key)
    name = select_key(model.config, sparse)
    if name in cal.sparse_select_ns:
        return cal
    t0 = time.perf_counter()
    with OtherLoad() as load:
        got = measure_select(model, sparse, budget_cores(m, threads))
    dt = time.perf_counter() - t0
    cal.sparse_select_ns[name] = got
    cal.note_measured(f"sparse select {name}", dt)
    log(f"  sparse select {name}: {got['token_ns']:.1f} ns per candidate key and core, "
        f"{got['part_ns'] / 1e3:.1f} us per full layer ({dt:.1f} s)")
    save_if_quiet(cal, key, load, log)
    return cal


def measure_select(model, sparse, cores: list[int]) -> dict:
    """{'part_ns', 'token_ns'} of one row's selection per full layer (token_ns: per
    candidate key on one core) in the decode step on a shared domain of ``cores``."""
    lay = Layers(model.config.n_layer, sparse)
    if lay.full == 0:  # every layer dense: nothing selects
        return {"part_ns": 0.0, "token_ns": 0.0}
    dom = Domains(weight=tuple(cores))
    every = replace(sparse, min_context=0, reuse_steps=0)  # every row scores
    layouts = []
    for n in CONTEXTS:
        layouts += [(dom, n, 1, every), (dom, max(16, round(lay.n_eff(n))), 1)]
    t = [r["tpot_s"] for r in measure_alternating(model, layouts, n_tokens=STEP_TOKENS, reps=STEP_REPS)]
    over = np.array([(t[2 * i] - t[2 * i + 1]) / lay.full for i in range(len(CONTEXTS))])  # [contexts] s per full layer
    cand = np.array([lay.candidates(n) for n in CONTEXTS], float)  # [contexts] candidate keys
    per_key, part = np.polyfit(cand, over, 1)  # seconds per candidate key on P cores, per full layer
    c = model.config
    alone = scorer_seconds(c.n_kv_head, c.n_head // c.n_kv_head, c.head_dim, sparse.rank, CONTEXTS[-1],
                           every.kernel_conf(BLOCK_SIZE), len(cores), bs=BLOCK_SIZE)
    per_key = max(per_key, alone / cand[-1])
    part = max(0.0, float(np.mean(over - per_key * cand)))
    return {"part_ns": part * 1e9, "token_ns": per_key * len(cores) * 1e9}


def scorer_seconds(kv_heads: int, group: int, head_dim: int, rank: int, n_keys: int, kernel_conf: np.ndarray,
                   threads: int, reps: int = 20, bs: int = 16) -> float:
    """Median seconds of one decode row's selection on one layer alone (the fused scorer and
    top-k, kernels/sparse_rows.select_rows) at a head shape, on random index entries in
    blocks scattered over a pool, under the selection rule ``kernel_conf``  # [SP_FIELDS]."""
    rng = np.random.default_rng(0)
    nb = -(-n_keys // bs)
    pool_blocks = nb + 100
    table = rng.permutation(pool_blocks)[:nb].astype(np.int32)  # [nb] scattered pool blocks
    idx = rng.integers(0, 256, (1, pool_blocks, kv_heads, rank // 4, bs, 4)).astype(np.uint8)
    # idx  # [slot, block, kv_head, rank / 4, token, 4]
    isc = rng.uniform(0.001, 0.02, (1, pool_blocks, kv_heads, bs)).astype(np.float32)  # [slot, block, kvh, token]
    n_head = kv_heads * group
    q = rng.standard_normal((1, n_head, head_dim)).astype(np.float32)  # [row, H, D]
    basis = (rng.standard_normal((n_head, rank, head_dim)) / 8).astype(np.float32)  # [H, r, D]
    w = np.ones(n_head, np.float32)  # [H]
    scores = np.empty((1, pool_blocks), np.float32)  # [1, >= candidates]
    sel = np.empty((1, pool_blocks), np.int32)  # [1, >= gathered blocks]
    keys = np.empty(1, np.int64)  # [1] keys of the gathered table
    args = (q, basis, head_dim ** -0.5, idx, isc, 0, table, n_keys - 1, bs, kernel_conf, w, threads, scores, sel, keys,
            attention_tag())
    select_rows(*args)  # compiled and warm
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        select_rows(*args)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))
