"""The decode step as one numba call per worker: a static list of operators per worker,
tiles claimed dynamically, synchronised on data-dependency counters (no barriers).

An operator (a row of ``ops``) waits once for its input (``F_WAIT`` >= ``F_TARGET``),
then each of its ``F_NPART`` workers claims tiles with atomic increments (``next_tile``:
its own contiguous region first, counter ``F_CLAIM`` + region) until none are left; every
finished tile adds 1 to its ``F_DONE`` counter (or, for the q/k/v projections, to the
counter of the KV head it belongs to), which is what consumers wait on.  A worker that
claims a tile of a matmul first prepares its private copy of the input (RMSNorm + int8
quantization, or quantization only), so no hand-off is needed for it.

Per layer, with G = H / KVH query heads per KV head:
    QKV      tiles: per KV group j, [k_j, v_j, q_{jG} .. q_{jG+G-1}]   -> head_ready[j]
    ROPE     tile j waits head_ready[j] == G + 2; bias, rope, KV append  -> rope_done[j]
    ATTN     tile (m, j, s) waits rope_done[j]; S = 1: writes attn      -> attn_done
             (S > 1: partial results)                                    -> parts_done
    MERGE    (S > 1) waits parts_done == M*KVH*S; tile (m, j)            -> attn_done
    WO       waits attn_done == M*KVH; x[:, rows] += attn Wo[rows].T     -> wo_done
    GATE_UP  waits wo_done; act[:, rows] = silu(h Wg.T) * (h Wu.T)       -> gu_done
    DOWN     waits gu_done; x[:, rows] += act Wd[rows].T                 -> down_done
and at the end LM_HEAD (waits the last down_done): logits[:, rows].
"""

import numpy as np

from ..kernels.activation import swiglu_cols
from ..kernels.dequant import quant_get_rows
from ..kernels.jit import kernel
from ..kernels.fused import norm_quant, quant_rows, rope_append, rope_table
from ..kernels.paged_attention import _task as attention_task
from ..kernels.rope_simd import kv_slot_addrs, rope_append_row, rope_simd_ok
from ..kernels.simd import addr, prefetch_l2, vlanes, vtag
from ..kernels.vnni_matmul import group_rows
from .atomics import COUNTER_STRIDE, atomic_add, atomic_load, atomic_store, cpu_relax, cycle_counter, sched_yield

# operator kinds
QKV, ROPE, ATTN, MERGE, WO, GATE_UP, DOWN, LM_HEAD, FAIL = 0, 1, 2, 3, 4, 5, 6, 7, 99
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
    s1 = spriv[wid, 1, :M * (K // 16)].reshape((M, K // 16))
    xin[0, 0], xin[0, 1], xin[0, 2] = addr(q0), addr(d0), addr(s0)
    xin[1, 0], xin[1, 1], xin[1, 2] = addr(q1), addr(d1), addr(s1)
    return (q0, q1), (d0, d1), (s0, s1)


@kernel
def run_worker(wid, ops, order, counters,  # program: ops [n_ops, N_FIELDS], order [workers, max_ops]
               mats, tag,  # packed weights [n_mats, 5]: M_ADDR, M_GROUPS, M_STRIDE, M_QT, M_KIND
               x, hpriv, qpriv, dpriv, spriv,  # x [M, d] residual; private [workers, ...] inputs
               qb, kb, vb, attn, gate, up, act, ytmp, logits,  # activations (see model.forward)
               attn_norm, ffn_norm, out_norm, eps, bq, bk, bv, has_bias,  # norms [L, d], biases [L, ...]
               rope_cs, neox, round_q, lut, pos, seq, tables,  # rope [M, D/2, 2] cos/sin; rows' positions / sequences
               pool, pool_f32, kv_kind, kv_group, kv_scale_off, bs, scale,  # paged KV pool
               pmax, psum, pacc,  # attention partials [M*KVH*S, G(, D)]
               prof):  # [workers, n_ops + 1, 2] cycles waiting / working per operator, accumulated (shape[0] 0: off)
    """Run worker ``wid``'s operators for one step; returns 0, or the abort code.

    Each operator works on its micro-batch's rows [m0, m1) (fields F_M0, F_M1 after the
    N_FIELDS of the table), so the activation arrays are sliced per operator.  With
    ``prof`` non-empty, the cycles spent waiting for an operator's input and working on
    its tiles (tile waits included) are added to prof[wid, op].
    """
    profiling = prof.shape[0] > 0
    if profiling:  # row n_ops: this step's entry and exit stamps
        prof[wid, ops.shape[0], 0] = cycle_counter()
    d_model = x.shape[1]
    H, D = attn.shape[1], attn.shape[2]
    KVH = kb.shape[1] // D
    G = H // KVH
    vt = vtag(tag)
    # rope + KV append on vectors (f16 pool, D a multiple of 2W); else the scalar loops
    rope_fast = kv_kind == 1 and rope_simd_ok(D, vlanes(vt)) and rope_cs.shape[1] * 2 == D
    xin = np.zeros((2, 3), np.int64)  # [activation kind, 3] addresses of this worker's int8 input (_views)
    cur0, cur1 = 0, x.shape[0]  # rows of the current views (all rows: one micro-batch)
    xu, qu, ku, vu, au = x, qb, kb, vb, attn
    gu, uu, actu, yu, lu = gate, up, act, ytmp, logits
    posu, sequ = pos, seq
    for i in range(order.shape[1]):
        o = order[wid, i]
        if o < 0:
            break
        kind = ops[o, F_KIND]
        layer = ops[o, F_LAYER]
        n_tiles = ops[o, F_NTILES]
        if kind == FAIL:
            raise RuntimeError("injected task failure")
        c0 = cycle_counter() if profiling else 0
        if kind != ROPE and kind != ATTN and kind != MERGE:
            _warm_region(ops, o, mats, wid, G, D)
        if not wait_for(counters, ops[o, F_WAIT], ops[o, F_TARGET]):
            return atomic_load(counters, ABORT)
        c1 = cycle_counter() if profiling else 0
        m0 = ops[o, N_FIELDS]
        m1 = ops[o, N_FIELDS + 1]
        M = m1 - m0
        if m0 != cur0 or m1 != cur1:  # another micro-batch: views of its rows (each view is reference counted)
            xu, qu, ku, vu, au = x[m0:m1], qb[m0:m1], kb[m0:m1], vb[m0:m1], attn[m0:m1]
            gu, uu, actu, yu, lu = gate[m0:m1], up[m0:m1], act[m0:m1], ytmp[m0:m1], logits[m0:m1]
            posu, sequ = pos[m0:m1], seq[m0:m1]
            cur0, cur1 = m0, m1
        prepared = False
        tile_wait = 0  # cycles spent waiting for a ROPE / ATTN tile's input (profiling)
        n_part = ops[o, F_NPART]
        me = (wid - ops[o, F_PBASE]) % n_part
        k = 0  # regions this worker has exhausted (next_tile)
        while True:
            t, k = next_tile(counters, ops[o, F_CLAIM], n_tiles, n_part, me, k)
            if t < 0:
                break
            if kind == QKV:
                if not prepared:
                    xq, xd, xs = _views(qpriv, dpriv, spriv, wid, M, d_model, xin)
                    norm_quant(xu, attn_norm[layer], eps, hpriv[wid, :M * d_model].reshape((M, d_model)),
                               ops[o, F_KMASK], xq[0], xd[0], xs[0], xq[1], xd[1], xs[1])
                    prepared = True
                j = t // (G + 2)
                r = t % (G + 2)
                gph = D // ops[o, F_LANES]  # vector groups per head
                if r == 0:
                    _matmul_rows(mats, ops[o, F_MAT1], j * gph, (j + 1) * gph, xin, M, d_model, addr(ku),
                                 ku.shape[1], vt)
                elif r == 1:
                    _matmul_rows(mats, ops[o, F_MAT2], j * gph, (j + 1) * gph, xin, M, d_model, addr(vu),
                                 vu.shape[1], vt)
                else:
                    h = j * G + r - 2
                    _matmul_rows(mats, ops[o, F_MAT0], h * gph, (h + 1) * gph, xin, M, d_model, addr(qu),
                                 qu.shape[1], vt)
                signal(counters, ops[o, F_DONE] + j)
            elif kind == ROPE:
                w0 = cycle_counter() if profiling else 0
                if not wait_for(counters, ops[o, F_TWAIT] + t, ops[o, F_TTARGET]):
                    return atomic_load(counters, ABORT)
                if profiling:
                    tile_wait += cycle_counter() - w0
                if rope_fast:
                    for mm in range(M):
                        p = posu[mm]
                        kd, vd = kv_slot_addrs(pool, tables[sequ[mm], p // bs], layer, t, p % bs, KVH, bs, D)
                        rope_append_row(addr(qu) + 4 * (mm * qu.shape[1] + t * G * D),
                                        addr(ku) + 4 * (mm * ku.shape[1] + t * D), addr(vu) + 4 * (mm * vu.shape[1] + t * D),
                                        addr(bq) + 4 * (layer * bq.shape[1] + t * G * D),
                                        addr(bk) + 4 * (layer * bk.shape[1] + t * D),
                                        addr(bv) + 4 * (layer * bv.shape[1] + t * D), has_bias,
                                        addr(rope_cs) + 4 * (m0 + mm) * D, G, D, neox, round_q, kd, 2 * bs, vd, vt)
                else:
                    rope_append(qu, ku, vu, bq[layer], bk[layer], bv[layer], has_bias, t, G, D, posu, sequ,
                                rope_cs[m0:m1], neox, round_q, pool, kv_kind, tables, layer, KVH, bs)
                signal(counters, ops[o, F_DONE] + t)
            elif kind == ATTN:
                S = ops[o, F_TILE]
                m = m0 + t // (KVH * S)
                j = (t // S) % KVH
                w0 = cycle_counter() if profiling else 0
                if not wait_for(counters, ops[o, F_TWAIT] + j, ops[o, F_TTARGET]):
                    return atomic_load(counters, ABORT)
                if profiling:
                    tile_wait += cycle_counter() - w0
                base = m * KVH * S
                tl = t % (KVH * S)
                q3 = qb[m:m + 1].reshape((1, H, D))
                attention_task(q3, pool, pool_f32, lut, kv_kind, kv_group, kv_scale_off, tables[seq[m]], layer, KVH,
                               bs, pos[m], scale, S, tl, pmax[base:], psum[base:], pacc[base:], tag)
                if S == 1:  # normalise here (what the merge does for one split)
                    for g in range(G):
                        inv = np.float32(1.0) / psum[base + tl, g]
                        for dd in range(D):
                            attn[m, j * G + g, dd] = pacc[base + tl, g, dd] * inv
                signal(counters, ops[o, F_DONE])
            elif kind == MERGE:
                S = ops[o, F_TILE]
                _merge_one(pmax, psum, pacc, m0 + t // KVH, t % KVH, S, KVH, attn)
                signal(counters, ops[o, F_DONE])
            else:
                if not prepared:
                    if kind == WO:
                        K = H * D
                        xq, xd, xs = _views(qpriv, dpriv, spriv, wid, M, K, xin)
                        quant_rows(au.reshape((M, H * D)), ops[o, F_KMASK], xq[0], xd[0], xs[0], xq[1], xd[1], xs[1])
                    elif kind == GATE_UP:
                        K = d_model
                        xq, xd, xs = _views(qpriv, dpriv, spriv, wid, M, K, xin)
                        norm_quant(xu, ffn_norm[layer], eps, hpriv[wid, :M * K].reshape((M, K)),
                                   ops[o, F_KMASK], xq[0], xd[0], xs[0], xq[1], xd[1], xs[1])
                    elif kind == DOWN:
                        K = actu.shape[1]
                        xq, xd, xs = _views(qpriv, dpriv, spriv, wid, M, K, xin)
                        quant_rows(actu, ops[o, F_KMASK], xq[0], xd[0], xs[0], xq[1], xd[1], xs[1])
                    else:  # LM_HEAD
                        K = d_model
                        xq, xd, xs = _views(qpriv, dpriv, spriv, wid, M, K, xin)
                        norm_quant(xu, out_norm, eps, hpriv[wid, :M * K].reshape((M, K)),
                                   ops[o, F_KMASK], xq[0], xd[0], xs[0], xq[1], xd[1], xs[1])
                    prepared = True
                W = ops[o, F_TILE]  # rows per tile, a multiple of the lanes
                lanes = ops[o, F_LANES]
                g0 = t * (W // lanes)
                g1 = g0 + W // lanes
                r0 = t * W
                if kind == WO or kind == DOWN:
                    _matmul_rows(mats, ops[o, F_MAT0], g0, g1, xin, M, K, addr(yu), yu.shape[1], vt)
                    r1 = min(r0 + W, d_model)
                    for m in range(M):
                        for r in range(r0, r1):
                            xu[m, r] += yu[m, r]
                elif kind == GATE_UP:
                    F = gu.shape[1]
                    _matmul_rows(mats, ops[o, F_MAT0], g0, g1, xin, M, K, addr(gu), F, vt)
                    _matmul_rows(mats, ops[o, F_MAT1], g0, g1, xin, M, K, addr(uu), F, vt)
                    swiglu_cols(addr(gu), addr(uu), addr(actu), M, F, r0, min(r0 + W, F), vt)
                elif kind == LM_HEAD:
                    _matmul_rows(mats, ops[o, F_MAT0], g0, g1, xin, M, K, addr(lu), lu.shape[1], vt)
                else:
                    raise RuntimeError("unknown operator kind")
                signal(counters, ops[o, F_DONE])
        if profiling:
            prof[wid, o, 0] += c1 - c0 + tile_wait
            prof[wid, o, 1] += cycle_counter() - c1 - tile_wait
    if profiling:
        prof[wid, ops.shape[0], 1] = cycle_counter()
    return 0


@kernel
def _merge_one(pmax, psum, pacc, m, j, S, KVH, out):
    """out[m, heads of group j] = the S partial results combined (flash-decoding merge)."""
    G = pmax.shape[1]
    D = out.shape[2]
    t0 = (m * KVH + j) * S
    for g in range(G):
        mx = pmax[t0, g]
        for s in range(1, S):
            mx = max(mx, pmax[t0 + s, g])
        den = np.float32(0.0)
        h = j * G + g
        for dd in range(D):
            out[m, h, dd] = 0.0
        for s in range(S):
            w = np.float32(np.exp(pmax[t0 + s, g] - mx))
            den += w * psum[t0 + s, g]
            for dd in range(D):
                out[m, h, dd] += w * pacc[t0 + s, g, dd]
        inv = np.float32(1.0) / den
        for dd in range(D):
            out[m, h, dd] *= inv


@kernel
def wait_job(counters, slot, target, spins):
    """Spin up to ``spins`` times for counter ``slot`` to reach target (a new step); the
    caller blocks on an Event when this returns False."""
    for _ in range(spins):
        if atomic_load(counters, slot * COUNTER_STRIDE) >= target:
            return True
        cpu_relax()
    return False


# slots of a WorkerPool's control array (one cache line each, COUNTER_STRIDE apart)
C_GEN, C_FIN, C_VERSION = 0, 1, 2  # job generation; jobs finished by workers 1..; args version of serve
C_CURRENT, C_RESULT = 3, 4  # C_CURRENT + 2 w: generation worker w is running; C_RESULT + 2 w: its code


@kernel
def serve(wid, control, version, seen, idle_cycles, *args):
    """A worker thread's step loop without Python: wait for the next generation, run
    ``run_worker(wid, *args)``, store its code, count it finished, repeat.  Returns the
    last generation run (0 jobs run: ``seen``) when a job of another args version is posted
    (new arrays, a Python job, shutdown), or after ``idle_cycles`` without a job, so that
    the thread can pick up new arguments or block.  The caller never waits for this
    thread's Python code (nor its GIL) between steps."""
    S = COUNTER_STRIDE
    while True:
        t0 = cycle_counter()
        while atomic_load(control, C_GEN * S) <= seen:
            if cycle_counter() - t0 > idle_cycles:
                return seen
            cpu_relax()
        if atomic_load(control, C_VERSION * S) != version:
            return seen
        seen += 1
        atomic_store(control, (C_CURRENT + 2 * wid) * S, seen)
        code = run_worker(wid, *args)
        atomic_store(control, (C_RESULT + 2 * wid) * S, code)
        atomic_add(control, C_FIN * S, 1)


@kernel
def step_prologue(pos, inv_freq, rope_cs, counters):
    """Before a step: each row's rope cos / sin (rope_table), the counters zeroed."""
    rope_table(pos, inv_freq, rope_cs)
    counters[:] = 0


@kernel
def step_prologue_rows(w, ids, qtype, lut, x, pos, inv_freq, rope_cs, counters):
    """step_prologue, and x = the quantized embedding rows ids of w  # [N, row bytes]
    (ids checked by the caller)."""
    quant_get_rows(w, ids, qtype, lut, x)
    step_prologue(pos, inv_freq, rope_cs, counters)
