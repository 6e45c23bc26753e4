"""The executor's operator table (kinds, fields, matrix-table columns) and the small
kernels a worker runs around its tiles: waiting on and signalling dependency counters,
claiming tiles (``next_tile``), one tile's matmul rows by address, the warm-up of a
region's first weights, and the views of a worker's private int8 input
(step_kernel.run_worker is the loop that uses them).
"""

import numpy as np

from ..jit import kernel
from ..kernels.simd import addr, prefetch_l2
from ..kernels.vnni_matmul import group_rows
from .atomics import COUNTER_STRIDE, atomic_add, atomic_load, atomic_store, cpu_relax, sched_yield

# operator kinds
QKV, ROPE, ATTN, MERGE, WO, GATE_UP, DOWN, LM_HEAD, SELECT, TOPK, FAIL = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 99
# fields of an operator row
(F_KIND, F_LAYER, F_NTILES, F_TILE, F_WAIT, F_TARGET, F_CLAIM, F_DONE, F_TWAIT, F_TTARGET,
 F_MAT0, F_MAT1, F_MAT2, F_KMASK, F_LANES, F_PBASE, F_NPART) = range(17)
N_FIELDS = 17
# columns of the packed-matrix table: address, groups of lanes rows, bytes per group, GGML
# type, activation kind (0 Q8_0, 1 Q8_K)
M_ADDR, M_GROUPS, M_STRIDE, M_QT, M_KIND = range(5)
# counter 0: abort flag (0 running, 1 a worker failed, 2 a wait timed out)
ABORT = 0
SPINS_BEFORE_YIELD = 2000
WARM_BYTES = 4096  # _warm_region
YIELDS_BEFORE_TIMEOUT = 20_000_000  # several seconds: only a bug gets there


@kernel
def wait_for(counters, c, target):
    """Spin (then yield) until counter c >= target; False if the step was aborted."""
    if c < 0:
        return True
    n = 0
    while atomic_load(counters, c * COUNTER_STRIDE) < target:
        if atomic_load(counters, ABORT) != 0:
            return False
        n += 1
        if n < SPINS_BEFORE_YIELD:
            cpu_relax()
        else:
            sched_yield()
            if n > YIELDS_BEFORE_TIMEOUT:
                atomic_store(counters, ABORT, 2)
                return False
    return True


@kernel
def signal(counters, c):
    atomic_add(counters, c * COUNTER_STRIDE, 1)


@kernel
def next_tile(counters, c0, n_tiles, P, me, k):
    """The next tile for participant ``me`` of P, and the regions it has left behind.

    The tiles are cut into P contiguous regions, region r claimed through counter c0 + r.
    A participant takes its own region's tiles in order, then helps the next regions
    (me + 1, me + 2 ... mod P).  So each worker mostly streams one contiguous stretch of
    weights and claims on a counter no other core touches until it runs out of work.
    (One shared counter, every worker's tiles interleaved with the other's, measured 4 %
    slower per token: SmolLM2, 2 threads, d0, 64-row tiles.)
    Returns (tile, k); tile -1 when every region is exhausted."""
    while k < P:
        r = me + k
        if r >= P:
            r -= P
        t = r * n_tiles // P + atomic_add(counters, (c0 + r) * COUNTER_STRIDE, 1)
        if t < (r + 1) * n_tiles // P:
            return t, k
        k += 1
    return -1, k


@kernel
def _matmul_rows(mats, mat, g0, g1, xin, M, K, ya, ny, vt):
    """y[:, g0 W : g1 W] = x @ W[rows].T for matrix ``mat`` of mats  # [n_mats, 5] (M_ADDR
    ...); xin  # [2 kinds, 3] addresses of the worker's int8 input, block scales and sums
    per activation kind; y  # [M, ny] f32 at address ya; vt a VTag.  Two arrays per call:
    each array argument costs an atomic add on its reference count at entry and exit."""
    kd = mats[mat, M_KIND]
    qt, wa, stride = mats[mat, M_QT], mats[mat, M_ADDR], mats[mat, M_STRIDE]
    for g in range(g0, min(g1, mats[mat, M_GROUPS])):
        group_rows(qt, wa + g * stride, g, xin[kd, 0], xin[kd, 1], xin[kd, 2], M, K, ya, ny, vt)


@kernel
def _warm_region(ops, o, mats, wid, G, D):
    """Prefetch (towards L2) the first WARM_BYTES of the weights this worker's region of
    matmul operator ``o`` starts with, before it waits for the operator's input: the new
    stream's first misses overlap the wait and the input's quantization instead of
    stalling its first tile (the hardware prefetcher needs a few lines to train)."""
    n_part = ops[o, F_NPART]
    me = (wid - ops[o, F_PBASE]) % n_part
    t = me * ops[o, F_NTILES] // n_part  # first tile of this worker's region (next_tile)
    lanes = ops[o, F_LANES]
    if ops[o, F_KIND] == QKV:  # tiles per KV group j: [k_j, v_j, q_jG .. q_jG+G-1], one head each
        j, r = t // (G + 2), t % (G + 2)
        mat = ops[o, F_MAT1] if r == 0 else (ops[o, F_MAT2] if r == 1 else ops[o, F_MAT0])
        g = (j if r < 2 else j * G + r - 2) * (D // lanes)
    else:
        mat = ops[o, F_MAT0]
        g = t * (ops[o, F_TILE] // lanes)
    if g >= mats[mat, M_GROUPS]:
        return
    a = mats[mat, M_ADDR] + g * mats[mat, M_STRIDE]
    for off in range(0, WARM_BYTES, 64):
        prefetch_l2(a, off)


@kernel
def _views(qpriv, dpriv, spriv, wid, M, K, xin):
    """This worker's int8 input buffers seen as [M, K] (kind 0 Q8_0, kind 1 Q8_K); their
    addresses go to xin  # [2 kinds, 3] (int8 values, block scales, block sums)."""
    q0 = qpriv[wid, 0, :M * K].reshape((M, K))
    q1 = qpriv[wid, 1, :M * K].reshape((M, K))
    d0 = dpriv[wid, 0, :M * (K // 32)].reshape((M, K // 32))
    d1 = dpriv[wid, 1, :M * (K // 256)].reshape((M, K // 256))
    s0 = spriv[wid, 0, :M * (K // 32)].reshape((M, K // 32))
    s1 = spriv[wid, 1].view(np.int16)[:M * (K // 16)].reshape((M, K // 16))  # Q8_K sums are int16
    xin[0, 0], xin[0, 1], xin[0, 2] = addr(q0), addr(d0), addr(s0)
    xin[1, 0], xin[1, 1], xin[1, 2] = addr(q1), addr(d1), addr(s1)
    return (q0, q1), (d0, d1), (s0, s1)
