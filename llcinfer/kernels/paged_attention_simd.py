"""Explicit-SIMD decode attention over the f16 / f32 paged KV pool (paged_attention.py
holds the layout, the scalar loops and the dispatch).

One task = (query row m, kv head, split of the key blocks), as ``paged_attention._task``.
K is stored transposed within a block (``[d, token]``, see paged_attention.py), so the
scores of W keys come out of plain vector FMAs, with no horizontal sums:

    s[g, j0:j0+W] = sum_d  q[g, d] * K^T[d, j0:j0+W]      (one vcvtph2ps per d, shared by
                                                          the G heads of the group; each
                                                          broadcast q[g, d] serves the key
                                                          vectors j0 and j0 + W)

V stays row-major ([token, d]) and is accumulated as acc[g, :] += p[g, j] v[j, :], the
accumulators of a group of heads in registers.  The softmax is online per block (vector
exp on the score vectors), and the blocks ahead are prefetched.
"""

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..jit import inline_kernel, kernel
from .simd import VTag, addr, elt_kind, lane_mask_ir, load_as_f32, prefetch_ir, splat_ir, vlanes, vloadf, vsplat, vstore
from .simd_exp import vexp
from .simd_math import fma_ir, vadd, vhmax, vhsum, vmaxf, vmul, vsub

# key blocks ahead, prefetched spread over the work on a block: its K^T along the first QK
# pass (a line per step of _qk_t's loop), its V along the P V calls (a line per key).  Both
# along the first QK pass (the layout before) took 1.1-1.5x the time on this Zen 3 host, an
# eviction stream between layers (Qwen2.5-0.5B / SmolLM2 shapes, 4096 keys, 1 thread); a
# burst of the whole block at its start was slower still.  4 blocks ahead: no change.
_PREFETCH = 2
_NEG = np.float32(-1e30)  # "minus infinity" that stays finite under fastmath (ninf)


def _switch_ir(builder, value, cases, default):
    """IR: run cases[k]() when value == k, else default(); each emits code at the builder."""
    merge = builder.append_basic_block("sw.end")
    other = builder.append_basic_block("sw.default")
    sw = builder.switch(value, other)
    for k, emit in cases.items():
        bb = builder.append_basic_block(f"sw.{k}")
        sw.add_case(ir.Constant(value.type, k), bb)
        builder.position_at_end(bb)
        emit()
        builder.branch(merge)
    builder.position_at_end(other)
    default()
    builder.branch(merge)
    builder.position_at_end(merge)


def _heads_ir(builder, emit, nc, gb, args, head_steps, ncmax):
    """IR: emit(NC, GB, args) for nc == ncmax and gb in 1..4 heads (unrolled: each V vector
    widened once for the group); narrower nc (row tails): one head at a time, address
    arguments advanced by head_steps (bytes per head, IR values or None) in a loop."""

    def one_by_one(NC):
        with cgutils.for_range(builder, gb) as loop:
            emit(NC, 1, [a if s is None else builder.add(a, builder.mul(s, loop.index))
                         for a, s in zip(args, head_steps)])

    def by_heads(NC):
        _switch_ir(builder, gb, {g: (lambda g=g: emit(NC, g, args)) for g in (1, 2, 3)},
                   lambda: emit(NC, 4, args))

    # ncmax is 4 (zmm; 2-vector tails one head at a time) or 3 (ymm; 2-vector tails unrolled)
    cases = {ncmax: lambda: by_heads(ncmax), 2: (lambda: one_by_one(2)) if ncmax == 4 else (lambda: by_heads(2))}
    _switch_ir(builder, nc, cases, lambda: one_by_one(1))


def _typed(ints, vt, arr):
    """Check an intrinsic's argument types: integers, a VTag, an array whose elements
    ``load_as_f32`` reads; returns (W, element kind) or None."""
    kind = elt_kind(arr)
    if kind is None or not isinstance(vt, VTag) or not all(isinstance(a, types.Integer) for a in ints):
        return None
    return vt.n, kind


# vectors of V columns per _pv pass for a group of up to 4 heads, by vector width: 4 x
# PV_COLS accumulators, the V vectors and a broadcast fit in the registers.  On AVX2, 3:
# 4 heads x 3 = 12 accumulators, 3 V vectors and a broadcast fill the 16 ymm, and 3 heads
# get 9 accumulator chains (more than the FMA latency x throughput, 8, asks; 2 per pass
# gave them 6).  4096 keys, 1 thread, 3 against 2 per pass (perf/ab_kernels.py attention):
# SmolLM2's 3 heads 0.95x the time from DRAM, 0.96x from cache; Qwen2.5-0.5B's 4 + 3
# 0.93x / 0.96x; 4 per pass for 3 heads was slower, 1.06x
PV_COLS = {16: 4, 8: 3}
# heads per _qk_t call by vector width: their accumulators (gmax x 2 key vectors, or two
# chains of gmax x 1), the key vectors and a broadcast fit in the registers (32 zmm; 16 ymm
# on AVX2)
QK_HEADS = {16: 8, 8: 4}


@intrinsic
def _qk_t(typingctx, qa, ka, kstride, nk, nd, sa, sstride, gb, nkv, pf, vt, pool):
    """Scores of gb query heads against nkv (1 or 2) vectors of W keys stored transposed:
    lane j of head g's v-th result = sum_{d < nd} q[g, d] * K^T[d, v W + j], stored at
    sa + (g * sstride + v W) floats; keys v W + j >= nk get _NEG.

    q rows (f32, pre-scaled) at address qa, nd floats apart; K^T row d (nkv W elements as
    ``pool``'s) at ka + d * kstride bytes.  Each K^T vector is widened once for all heads
    and each broadcast q[g, d] serves the nkv key vectors; with fewer than 8 accumulators
    two chains (even and odd d) hide the FMA latency.

    pf (address, 0: none): a stream prefetched along, as many bytes per step of the d loop
    as this call reads from K (2 * kstride): the K^T of a block ahead arrives spread over
    the loop instead of in one burst of misses."""
    t = _typed((qa, ka, kstride, nk, nd, sa, sstride, gb, nkv, pf), vt, pool)
    if t is None:
        return None
    W, EK = t
    gmax = QK_HEADS[W]
    esize = (4, 2, 1)[EK]

    def codegen(context, builder, sig, args):
        i64, f32 = ir.IntType(64), ir.FloatType()
        qa_, ka_, ks_, nk_, nd_, sa_, ss_, gb_, nkv_, pf_ = [
            context.cast(builder, a, ty, types.int64) for a, ty in zip(args[:10], sig.args[:10])]
        vty = ir.VectorType(f32, W)
        step = builder.shl(ks_, ir.Constant(i64, 1))  # bytes of K^T per loop step
        last = builder.sub(step, ir.Constant(i64, 1))

        def emit(GB, NKV):
            n_chains = 2 if GB * NKV < 8 else 1
            qp = builder.inttoptr(qa_, f32.as_pointer())
            kbase = builder.inttoptr(ka_, ir.IntType(8).as_pointer())
            chains = [[[cgutils.alloca_once(builder, vty) for _ in range(NKV)] for _ in range(GB)]
                      for _ in range(n_chains)]  # [chain][g][key vector]
            for slot in (x for ch in chains for row in ch for x in row):
                builder.store(ir.Constant(vty, None), slot)
            with cgutils.for_range(builder, builder.ashr(nd_, ir.Constant(i64, 1))) as loop:
                with builder.if_then(builder.icmp_signed("!=", pf_, ir.Constant(i64, 0)), likely=True):
                    off = builder.mul(loop.index, step)
                    for at in (off, builder.add(off, last)):  # first and last byte of the step's span (f32: 2 lines)
                        prefetch_ir(builder, builder.inttoptr(builder.add(pf_, at), ir.IntType(8).as_pointer()))
                for c in range(2):
                    d = builder.add(builder.shl(loop.index, ir.Constant(i64, 1)), ir.Constant(i64, c))
                    krow = builder.gep(kbase, [builder.mul(d, ks_)])
                    kv = [load_as_f32(builder, builder.gep(krow, [ir.Constant(i64, v * W * esize)]), W, EK)
                          for v in range(NKV)]
                    for g in range(GB):
                        qg = builder.load(builder.gep(qp, [builder.add(builder.mul(nd_, ir.Constant(i64, g)), d)]))
                        qb = splat_ir(builder, qg, W)
                        for v in range(NKV):
                            slot = chains[c % n_chains][g][v]
                            builder.store(fma_ir(builder, qb, kv[v], builder.load(slot)), slot)
            neg = ir.Constant(vty, [float(_NEG)] * W)
            sp = builder.inttoptr(sa_, f32.as_pointer())
            for v in range(NKV):
                keep = lane_mask_ir(builder, W, builder.sub(nk_, ir.Constant(i64, v * W)))
                for g in range(GB):
                    dst = builder.bitcast(builder.gep(sp, [builder.add(builder.mul(ss_, ir.Constant(i64, g)),
                                                                       ir.Constant(i64, v * W))]), vty.as_pointer())
                    s = builder.load(chains[0][g][v])
                    if n_chains == 2:
                        s = builder.fadd(s, builder.load(chains[1][g][v]))
                    builder.store(builder.select(keep, s, neg), dst, align=1)

        def by_heads(NKV):
            _switch_ir(builder, gb_, {g: (lambda g=g: emit(g, NKV)) for g in range(1, gmax + 1)}, lambda: None)

        _switch_ir(builder, nkv_, {2: lambda: by_heads(2)}, lambda: by_heads(1))
        return context.get_dummy_value()

    return types.none(qa, ka, kstride, nk, nd, sa, sstride, gb, nkv, pf, vt, pool), codegen


@intrinsic
def _pv(typingctx, aa, pa, pstride, ca, va, ld, nk, nc, gb, pf, vt, pool):
    """acc[g, :] = acc[g, :] * corr[g] + sum_{j < nk} p[g, j] * v[j, :] for gb heads, over
    nc vectors of columns.

    acc rows (f32) at aa and value rows (elements as ``pool``'s) at va, both ``ld``
    elements apart; p rows at pa + g * pstride floats; corr[g] at ca.  The accumulators of
    the group stay in registers over the keys; each value vector is widened once for all
    its heads.

    pf (address, 0: none): the line at pf + j * (ld elements) is prefetched at key j (one
    line of each V row of a block ahead, spread over the keys)."""
    t = _typed((aa, pa, pstride, ca, va, ld, nk, nc, gb, pf), vt, pool)
    if t is None:
        return None
    W, EK = t
    esize = (4, 2, 1)[EK]

    def codegen(context, builder, sig, args):
        i64, f32 = ir.IntType(64), ir.FloatType()
        vals = [context.cast(builder, a, ty, types.int64) for a, ty in zip(args[:10], sig.args[:10])]
        vty = ir.VectorType(f32, W)
        pf_ = vals[9]

        def emit(NC, GB, a):
            aa_, pa_, ps_, ca_, va_, ld_, nk_ = a
            ap = builder.inttoptr(aa_, f32.as_pointer())
            pp = builder.inttoptr(pa_, f32.as_pointer())
            cp = builder.inttoptr(ca_, f32.as_pointer())
            vbase = builder.inttoptr(va_, ir.IntType(8).as_pointer())
            row_b = builder.mul(ld_, ir.Constant(i64, esize))
            aptr = [[builder.bitcast(builder.gep(ap, [builder.add(builder.mul(ld_, ir.Constant(i64, g)),
                                                                  ir.Constant(i64, ci * W))]), vty.as_pointer())
                     for ci in range(NC)] for g in range(GB)]
            slots = []
            for g in range(GB):
                corr = splat_ir(builder, builder.load(builder.gep(cp, [ir.Constant(i64, g)])), W)
                for ci in range(NC):
                    slot = cgutils.alloca_once(builder, vty)
                    builder.store(builder.fmul(builder.load(aptr[g][ci], align=1), corr), slot)
                    slots.append(slot)
            with cgutils.for_range(builder, nk_) as loop:
                j = loop.index
                with builder.if_then(builder.icmp_signed("!=", pf_, ir.Constant(i64, 0)), likely=True):
                    prefetch_ir(builder, builder.inttoptr(builder.add(pf_, builder.mul(j, row_b)),
                                                          ir.IntType(8).as_pointer()))
                row = builder.gep(vbase, [builder.mul(j, row_b)])
                vv = [load_as_f32(builder, builder.gep(row, [ir.Constant(i64, ci * W * esize)]), W, EK)
                      for ci in range(NC)]
                for g in range(GB):
                    pg = builder.load(builder.gep(pp, [builder.add(builder.mul(ps_, ir.Constant(i64, g)), j)]))
                    pb = splat_ir(builder, pg, W)
                    for ci in range(NC):
                        s = slots[g * NC + ci]
                        builder.store(fma_ir(builder, pb, vv[ci], builder.load(s)), s)
            for g in range(GB):
                for ci in range(NC):
                    builder.store(builder.load(slots[g * NC + ci]), aptr[g][ci], align=1)

        ps_, ld_, nc_, gb_ = vals[2], vals[5], vals[7], vals[8]
        four = ir.Constant(i64, 4)
        _heads_ir(builder, emit, nc_, gb_, vals[:7], [builder.mul(ld_, four), builder.mul(ps_, four), None, four, None,
                                                      None, None], PV_COLS[W])
        return context.get_dummy_value()

    return types.none(aa, pa, pstride, ca, va, ld, nk, nc, gb, pf, vt, pool), codegen


@kernel
def _pass_width(left, most):
    """Vectors per row pass: ``most`` (4 or 3) while that many are left, then 2, then 1."""
    return most if left >= most else (2 if left >= 2 else 1)


@inline_kernel
def online_softmax_block(so, ra, m_old, n_valid, vt):
    """One key block of the online softmax of one query row: the scores at ``so`` (f32,
    whole vectors; masked keys at _NEG) become exp(s - m) in place and are added to the
    running sums at ``ra`` (one vector, lane-wise), m the running max, raised to the
    block's max where that is larger (the running sums then rescaled by exp(m_old - m)).
    Returns (m, the rescale factor for the row's accumulators: 1 or exp(m_old - m)).

    It exponentiates with the old max before the block's max is known and redoes it only
    when the max grows (rare after the first blocks), so the block max is off the
    critical path."""
    W = vlanes(vt)
    ref = vsplat(m_old, vt)
    rs = vloadf(ra, 0, vt)
    s0 = vloadf(so, 0, vt)
    mx = s0
    for ch in range(W, n_valid, W):
        mx = vmaxf(mx, vloadf(so, ch * 4, vt))
    bm = vhmax(mx)
    p = vexp(vsub(s0, ref))
    m, c = m_old, np.float32(1.0)
    if bm > m_old:
        c = np.float32(np.exp(m_old - bm))
        m = bm
        ref = vsplat(bm, vt)
        rs = vmul(rs, vsplat(c, vt))
        p = vexp(vsub(s0, ref))
    vstore(so, 0, p)
    rs = vadd(rs, p)
    for ch in range(W, n_valid, W):
        p = vexp(vsub(vloadf(so, ch * 4, vt), ref))  # masked keys: exp(_NEG - m) = 0
        vstore(so, ch * 4, p)
        rs = vadd(rs, p)
    vstore(ra, 0, rs)
    return m, c


@kernel
def _task_simd(q, pool, table, layer, KVH, bs, n_past, scale, n_splits, task, pmax, psum, pacc, vt, n_rows=1,
               row_step=0):
    """``_task`` on explicit vectors for f32 / f16 storage (D a multiple of W), for query
    rows m .. m + n_rows - 1 (row m + r at position n_past + m + r, its results in slot
    task + r row_step; every row with the same key-block count, so the same split).

    Per key block, for each row in turn: scores for chunks of 2 W keys (lanes = keys,
    ``_qk_t`` on the transposed K, each broadcast query value serving two key vectors),
    the online softmax on those vectors (vector exp), then ``_pv``.  The rows after the
    first read the block from L1: one stream of K/V for all of them, and each row's
    arithmetic is what it is alone (the same bits for any n_rows).  K and V are read
    straight from the pool and widened in registers; V rows go in passes of PV_COLS (4
    or 3, then 2, 1) vectors, the G heads in groups of up to 4; the block _PREFETCH ahead
    is prefetched along (K^T in the first QK pass, V in the P V calls).
    Needs bs a multiple of W and D a multiple of W (``_task`` checks).

    The softmax is online per block (``online_softmax_block``)."""
    M, H, D = q.shape
    G = H // KVH
    W = vlanes(vt)
    R = n_rows
    s_idx = task % n_splits
    mk = task // n_splits
    m = mk // KVH
    kvh = mk % KVH
    h0 = kvh * G
    t_end = n_past + m + 1  # the first row's keys; row r sees t_end + r
    nb = (t_end + bs - 1) // bs
    b0 = s_idx * nb // n_splits
    b1 = (s_idx + 1) * nb // n_splits
    nv = D // W  # vectors per row
    SW = (bs + W - 1) // W * W  # scores row length: whole vectors
    qs = np.empty((R, G, D), np.float32)  # [row, G, D] the group's query rows times scale
    for r in range(R):
        for g in range(G):
            for d in range(D):
                qs[r, g, d] = q[m + r, h0 + g, d] * scale
    sbuf = np.empty((R, G, SW), np.float32)  # [row, G, key] scores, then probabilities, of one block
    acc = np.zeros((R, G, D), np.float32)  # [row, G, D]
    corr = np.empty((R, G), np.float32)  # [row, G] rescale of acc for the current block
    rmax = np.full((R, G), _NEG, np.float32)  # [row, G]
    rsv = np.zeros((R, G, W), np.float32)  # [row, G, lane] running sums of probabilities
    # P V: heads in groups of at most 4, each V vector widened once per group.  Measured
    # (in-cache, zmm): SmolLM2's 3 heads at once 1.1x faster than 2 + 1; Qwen2.5-0.5B's
    # 4 + 3 as fast as 2 + 2 + 2 + 1, and all 7 at once 0.6-0.8x (spills).  On AVX2 (16
    # ymm) a group takes 3 V vectors per pass (PV_COLS)
    gmax = 4
    pv_cols = 4 if W == 16 else 3  # PV_COLS[W]
    n_groups = (G + gmax - 1) // gmax
    qk_max = 8 if W == 16 else 4  # QK_HEADS[W]: the scores of up to 8 heads per pass over K
    n_qk = (G + qk_max - 1) // qk_max
    esz = pool.itemsize
    row_b = D * esz
    kv_b = bs * row_b  # bytes of one (layer, K or V, head) in a block: K^T [D, bs], V [bs, D]
    blk_b = 2 * kv_b  # head-major pool (kv_index): block b of (layer, head) is blk_b bytes after b - 1
    kv0 = addr(pool) + (layer * KVH + kvh) * pool.shape[0] * blk_b  # this (layer, head)'s K in block 0
    v_off = kv_b  # V rows follow the block's K^T
    q0, s0a, a0, c0a, rs0 = addr(qs), addr(sbuf), addr(acc), addr(corr), addr(rsv)
    n_pv = 0  # P V calls per block
    c0 = 0
    while c0 < nv:
        c0 += _pass_width(nv - c0, pv_cols)
        n_pv += 1
    n_pv *= n_groups
    v_lines = (row_b + 63) // 64  # cache lines per V row
    pf_every = max(1, n_pv // v_lines)  # V of the block ahead: spread over the P V calls
    for b in range(b0, b1):
        kb = kv0 + np.int64(table[b]) * blk_b
        # K and V of the block _PREFETCH ahead, towards L2: K^T along the first QK pass, V along P V
        nxt = kv0 + np.int64(table[b + _PREFETCH]) * blk_b if b + _PREFETCH < b1 else 0
        for r in range(R):
            n_valid = min(bs, t_end + r - b * bs)
            qa, sa, aa = q0 + r * G * D * 4, s0a + r * G * SW * 4, a0 + r * G * D * 4
            ca, rsa = c0a + r * G * 4, rs0 + r * G * W * 4
            for gi in range(n_qk):
                g0 = gi * G // n_qk
                gn = (gi + 1) * G // n_qk - g0
                pf_k = nxt if gi == 0 and r == 0 else 0  # the K^T of the block ahead along the first pass
                for ch in range(0, n_valid, 2 * W):  # two key vectors per pass over K^T
                    _qk_t(qa + g0 * D * 4, kb + ch * esz, bs * esz, n_valid - ch, D, sa + (g0 * SW + ch) * 4, SW,
                          gn, 2 if n_valid - ch > W else 1, pf_k if ch == 0 else 0, vt, pool)
            for g in range(G):
                rmax[r, g], corr[r, g] = online_softmax_block(sa + g * SW * 4, rsa + g * W * 4, rmax[r, g], n_valid, vt)
            vb = kb + v_off
            k = 0  # P V call of this block
            for gi in range(n_groups):
                g0 = gi * G // n_groups
                gn = (gi + 1) * G // n_groups - g0
                c0 = 0
                while c0 < nv:
                    nc = _pass_width(nv - c0, pv_cols)
                    pf = 0  # every pf_every-th call: one line of each V row of the block ahead
                    if r == 0 and nxt != 0 and k % pf_every == 0 and k // pf_every < v_lines:
                        pf = nxt + v_off + (k // pf_every) * 64
                    _pv(aa + (g0 * D + c0 * W) * 4, sa + g0 * SW * 4, SW, ca + g0 * 4, vb + c0 * W * esz, D,
                        n_valid, nc, gn, pf, vt, pool)
                    c0 += nc
                    k += 1
    for r in range(R):
        slot = task + r * row_step
        for g in range(G):
            pmax[slot, g] = rmax[r, g]
            psum[slot, g] = vhsum(vloadf(rs0, (r * G + g) * W * 4, vt))
            for d in range(D):
                pacc[slot, g, d] = acc[r, g, d]
