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
    SELECT   (sparse "full" layers) tile (m, p) waits rope_done[j] for every j; part p
             of P of row m's block scores (score_part)                -> parts_ready[m]
    TOPK     tile m waits parts_ready[m] == P; row m's gathered block table and its
             keys (gather_selection)                                  -> sel_done[m]
    ATTN     tile (m, j, s) waits rope_done[j] (sel_done[m]); row m's part s over its
             own table or its gathered one (F_SEL) (row_part; S = 1:
             merged at once into attn); over its own table, the rows of a
             drafted chain in one key block go with the first one's tile
             (attention_rows), one stream of K/V for all       -> attn_done
             (S > 1: partial results)                                    -> parts_done
    MERGE    (S > 1) waits parts_done == M*KVH*S; tile (m, j)            -> attn_done
    WO       waits attn_done == M*KVH; x[:, rows] += attn Wo[rows].T     -> wo_done
    GATE_UP  waits wo_done; act[:, rows] = silu(h Wg.T) * (h Wu.T)       -> gu_done
    DOWN     waits gu_done; x[:, rows] += act Wd[rows].T                 -> down_done
and at the end LM_HEAD (waits the last down_done): logits[:, rows].

The operator table's layout and the kernels around a tile (counters, claiming, one tile's
matmul rows, the region warm-up) are in tiles.py.
"""

import numpy as np

from ..dtypes import KV_F16
from ..kernels.activation import swiglu_cols
from ..kernels.dequant import quant_get_rows
from ..jit import kernel
from ..kernels.fused import norm_quant, quant_rows, rope_append, rope_table
from ..kernels.paged_attention import merge_partials, row_part
from ..kernels.rope_simd import kv_slot_addrs, rope_append_row, rope_simd_ok
from ..kernels.sparse_index import (COUNT_ATTENDED, COUNT_REUSED, COUNT_ROWS, COUNT_SELECTIONS, COUNT_TOTAL,
                                    SP_K_BLOCKS, SP_MIN_CONTEXT, SP_REUSE, gather_selection, score_part,
                                    store_index_key)
from ..kernels.sparse_reuse import A_CHOSE, A_KEYS, gather_reused, reuses
from ..kernels.simd import addr, vlanes, vtag
from .step_args import check_signature
from .atomics import COUNTER_STRIDE, atomic_add, atomic_load, atomic_store, cpu_relax, cycle_counter
from .program import F_M0, F_M1, F_SEL, SEL_OWN, SEL_WAIT
from .tiles import (ABORT, ATTN, DOWN, F_CLAIM, F_DONE, F_KIND, F_KMASK, F_LANES, F_LAYER, F_MAT0, F_MAT1, F_MAT2,
                    F_NPART, F_NTILES, F_PBASE, F_TARGET, F_TILE, F_TTARGET, F_TWAIT, F_WAIT, FAIL, GATE_UP, LM_HEAD,
                    MERGE, QKV, ROPE, SELECT, TOPK, WO, _matmul_rows, _views, _warm_region, next_tile, signal,
                    wait_for)


@kernel
def run_worker(wid, ops, order, counters, mats, tag, x, hpriv, qpriv, dpriv, spriv, qb, kb, vb, attn, gate, up, act,
               ytmp, logits, attn_norm, ffn_norm, out_norm, eps, bq, bk, bv, has_bias, rope_cs, neox, round_q, lut,
               pos, seq, tables, split_threads, pool, pool_f32, kv_kind, kv_group, kv_scale_off, bs, scale, pmax, psum,
               pacc, sp_idx, sp_isc, sp_basis, sp_hbasis, sp_w, sp_slot, sp_conf, sel_tables, sel_n, sp_scores,
               sp_anchor, sp_chosen, sp_anchor_q, sp_counts, prof):
    """Run worker ``wid``'s operators for one step; returns 0, or the abort code.  The
    arguments, their shapes and meaning: step_args.STEP_FIELDS.

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
    rope_fast = kv_kind == KV_F16 and rope_simd_ok(D, vlanes(vt)) and rope_cs.shape[1] * 2 == D
    sp_y = np.empty(sp_basis.shape[2], np.float32)  # [r] one index key before rounding
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
        m0 = ops[o, F_M0]
        m1 = ops[o, F_M1]
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
                if sp_slot[layer] >= 0:  # index keys of the rotated K, head t (a sparse "full" layer)
                    for mm in range(M):
                        p = posu[mm]
                        store_index_key(ku[mm], t, sp_basis[layer], tables[sequ[mm], p // bs], p % bs, sp_slot[layer],
                                        sp_idx, sp_isc, sp_y)
                signal(counters, ops[o, F_DONE] + t)
            elif kind == SELECT:
                w0 = cycle_counter() if profiling else 0
                for j in range(KVH):  # the scores sum over every query head
                    if not wait_for(counters, ops[o, F_TWAIT] + j, ops[o, F_TTARGET]):
                        return atomic_load(counters, ABORT)
                if profiling:
                    tile_wait += cycle_counter() - w0
                P = ops[o, F_TILE]
                m = m0 + t // P
                sl = sp_slot[layer]
                if not reuses(qb[m].reshape((H, D)), pos[m] + 1, sp_anchor[m, sl], sp_anchor_q[m, sl], bs, sp_conf):
                    score_part(qb[m].reshape((H, D)), sp_hbasis[layer], scale, sp_idx, sp_isc, sl, tables[seq[m]],
                               pos[m] + 1, bs, sp_conf, sp_w, t % P, P, sp_scores[m], tag)
                signal(counters, ops[o, F_DONE] + t // P)
            elif kind == TOPK:
                w0 = cycle_counter() if profiling else 0
                if not wait_for(counters, ops[o, F_TWAIT] + t, ops[o, F_TTARGET]):
                    return atomic_load(counters, ABORT)
                if profiling:
                    tile_wait += cycle_counter() - w0
                m = m0 + t
                n_keys = pos[m] + 1
                sl = sp_slot[layer]
                anchor = sp_anchor[m, sl]
                if reuses(qb[m].reshape((H, D)), n_keys, anchor, sp_anchor_q[m, sl], bs, sp_conf):
                    sel_n[m] = gather_reused(tables[seq[m]], n_keys, bs, sp_conf, anchor, sp_chosen[m, sl],
                                             sel_tables[m])
                    sp_counts[wid, layer, COUNT_REUSED] += 1
                else:
                    sel_n[m] = gather_selection(tables[seq[m]], n_keys, bs, sp_conf, sp_scores[m], sel_tables[m],
                                                sp_chosen[m, sl])
                    anchor[A_KEYS] = n_keys
                    anchor[A_CHOSE] = sp_conf[SP_K_BLOCKS] if sel_n[m] < n_keys else -1
                    if sel_n[m] < n_keys:
                        sp_counts[wid, layer, COUNT_SELECTIONS] += 1
                        if sp_conf[SP_REUSE] > 0:
                            sp_anchor_q[m, sl] = qb[m].reshape((H, D))
                signal(counters, ops[o, F_DONE] + t)
            elif kind == ATTN:
                S = ops[o, F_TILE]
                m = m0 + t // (KVH * S)
                j = (t // S) % KVH
                sel = ops[o, F_SEL]
                w0 = cycle_counter() if profiling else 0
                if not wait_for(counters, ops[o, F_TWAIT] + (m - m0 if sel == SEL_WAIT else j), ops[o, F_TTARGET]):
                    return atomic_load(counters, ABORT)
                if profiling:
                    tile_wait += cycle_counter() - w0
                n_keys = pos[m] + 1
                if sel == SEL_OWN:
                    table, n_att = tables[seq[m]], n_keys
                else:  # a sparse layer: the row's gathered table
                    table, n_att = sel_tables[m], sel_n[m]
                    if j == 0 and t % S == 0 and n_keys >= sp_conf[SP_MIN_CONTEXT]:
                        sp_counts[wid, layer, COUNT_ROWS] += 1
                        sp_counts[wid, layer, COUNT_ATTENDED] += n_att
                        sp_counts[wid, layer, COUNT_TOTAL] += n_keys
                n_rows = 1 if sel != SEL_OWN else attention_rows(pos, seq, m, m0, m1, bs)
                if n_rows > 0:  # 0: an earlier row of the sequence took this one along
                    row_part(qb.reshape((qb.shape[0], H, D)), m, j, t % S, S, pool, pool_f32, lut, kv_kind, kv_group,
                             kv_scale_off, table, layer, KVH, bs, n_att, scale, split_threads, pmax, psum,
                             pacc, tag, n_rows)  # each row's own parts: the same bits whatever rows run beside it
                    if S == 1:
                        for r in range(n_rows):
                            merge_partials(pmax, psum, pacc, m + r, j, 1, KVH, attn)
                signal(counters, ops[o, F_DONE])
            elif kind == MERGE:
                S = ops[o, F_TILE]
                merge_partials(pmax, psum, pacc, m0 + t // KVH, t % KVH, S, KVH, attn)
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


check_signature(run_worker.py_func)


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


ATTENTION_ROWS = 8  # most rows of one sequence an ATTN tile takes along over one stream of K/V


@kernel
def attention_rows(pos, seq, m, m0, m1, bs):
    """Rows of [m0, m1) whose attention row m's tile computes: rows of one sequence at
    consecutive positions ending in the same key block go together, ATTENTION_ROWS at a
    time from the first of the run; 0 when row m is not the first of its group."""
    first = m  # the run's first row
    while (first > m0 and seq[first - 1] == seq[m] and pos[first - 1] == pos[first] - 1
           and pos[first - 1] // bs == pos[m] // bs):
        first -= 1
    if (m - first) % ATTENTION_ROWS != 0:
        return 0
    n = 1
    while (n < ATTENTION_ROWS and m + n < m1 and seq[m + n] == seq[m] and pos[m + n] == pos[m] + n
           and pos[m + n] // bs == pos[m] // bs):
        n += 1
    return n
