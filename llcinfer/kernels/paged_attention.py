"""Causal GQA attention read through a block table (the paged KV pool), and the stores
that fill it.

The pool (llcinfer.kv.pool) is one array per storage type, [block, elems], every block
holding ``bs`` tokens of every layer laid out as

    data    # [layer, 2 (K, V), kv_head, token, head_dim]    f16 bits / int8 / f32
    scales  # [layer, 2, kv_head, token, head_dim // group]  f32, int8 only, at scale_off0

Token t of a sequence lives in block ``table[t // bs]``, slot ``t % bs``.

One task = (query row m, kv head, split of the key blocks).  The G = H / KVH query heads
of a group share every K/V row read, the softmax is online per block (one rescale per
block, not per key), and long contexts are split across the thread pool
(flash-decoding) and merged at the end:

    s[g, t] = q[m, h0+g] . k[t] * scale;   out[m, h0+g] = sum_t softmax(s[g])[t] v[t]

``kind`` selects the storage type: 0 f32, 1 f16 (bit patterns), 2 int8 (x = q * scale
per ``group`` values).

Two implementations of a task, chosen by the ``tag`` argument (simd.make_tag; None is
the 'generic' ISA):

- ``_task_simd`` (a tag, f32 / f16 storage, head_dim a multiple of the tag's lanes W):
  explicit vectors.  Scores of W keys at a time come out as one vector (lane = key): per
  key the product vector q . k over the row (vcvtph2ps-widened K straight from the pool,
  vfmadd), the W product vectors summed across lanes by a shuffle tree.  The softmax runs
  on those vectors (vector exp), the values are accumulated by vector FMA with the
  accumulators of a group of heads in registers, and the blocks ahead are prefetched.
- ``_task_scalar`` (no tag, int8, other head dims): plain loops, f16 through a lookup
  table.
"""

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .isa import current_isa
from .jit import kernel, parallel_kernel
from .simd import (VTag, addr, elt_kind, fma_ir, lane_mask_ir, load_as_f32, make_tag, prefetch_l2,
                   splat_ir, vadd, vexp, vhmax, vhsum, vlanes, vloadf, vmaxf, vmul, vsplat, vstore, vsub, vtag)

_PREFETCH = 2  # key blocks ahead (measured at 4096 keys, 1 thread: 2 to 8 alike, none 1.4x slower)
_NEG = np.float32(-1e30)  # "minus infinity" that stays finite under fastmath (ninf)


@kernel
def _load_rows(pool, pool_f32, blk, off, n, kind, lut, scale_off, group, dst):
    """dst[:n] = f32 of pool[blk, off : off + n] (n = rows * D, rows contiguous)."""
    if kind == 1:
        for i in range(n):
            dst[i] = lut[np.int64(pool[blk, off + i])]
    elif kind == 0:
        for i in range(n):
            dst[i] = np.float32(pool[blk, off + i])
    else:
        for g in range(n // group):
            sc = pool_f32[blk, scale_off + g]
            for i in range(g * group, (g + 1) * group):
                dst[i] = np.float32(pool[blk, off + i]) * sc


@kernel
def _task_scalar(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past, scale,
                 n_splits, task, pmax, psum, pacc):
    """``_task`` in plain loops (f16 through the lookup table): every kind, every shape."""
    M, H, D = q.shape
    G = H // KVH
    s_idx = task % n_splits
    mk = task // n_splits
    m = mk // KVH
    kvh = mk % KVH
    h0 = kvh * G
    t_end = n_past + m + 1  # keys 0 .. t_end-1 are visible to row m
    nb = (t_end + bs - 1) // bs
    b0 = s_idx * nb // n_splits
    b1 = (s_idx + 1) * nb // n_splits
    kbuf = np.empty(bs * D, np.float32)  # [token, D] one block's K (then V) rows in f32
    sbuf = np.empty((G, bs), np.float32)  # [G, token] scores, then probabilities
    rmax = np.full(G, _NEG, np.float32)
    rsum = np.zeros(G, np.float32)
    acc = np.zeros((G, D), np.float32)  # [G, D] running weighted sum of values
    gs = D // group
    for b in range(b0, b1):
        blk = table[b]
        n_valid = min(bs, t_end - b * bs)
        rk = ((layer * 2 + 0) * KVH + kvh) * bs  # first K row of this (layer, head) in the block
        rv = ((layer * 2 + 1) * KVH + kvh) * bs
        _load_rows(pool, pool_f32, blk, rk * D, n_valid * D, kind, lut, scale_off0 + rk * gs, group, kbuf)
        for g in range(G):
            for j in range(n_valid):
                s = np.float32(0.0)
                for d in range(D):
                    s += q[m, h0 + g, d] * kbuf[j * D + d]
                sbuf[g, j] = s * scale
        for g in range(G):
            bm = sbuf[g, 0]
            for j in range(1, n_valid):
                bm = max(bm, sbuf[g, j])
            new = max(rmax[g], bm)
            corr = np.float32(np.exp(rmax[g] - new))
            tot = np.float32(0.0)
            for j in range(n_valid):
                p = np.float32(np.exp(sbuf[g, j] - new))
                sbuf[g, j] = p
                tot += p
            rsum[g] = rsum[g] * corr + tot
            rmax[g] = new
            for d in range(D):
                acc[g, d] *= corr
        _load_rows(pool, pool_f32, blk, rv * D, n_valid * D, kind, lut, scale_off0 + rv * gs, group, kbuf)
        for j in range(n_valid):
            for g in range(G):
                p = sbuf[g, j]
                for d in range(D):
                    acc[g, d] += p * kbuf[j * D + d]
    for g in range(G):
        pmax[task, g] = rmax[g]
        psum[task, g] = rsum[g]
        for d in range(D):
            pacc[task, g, d] = acc[g, d]


# ----------------------------------------------------------------------- SIMD (f16, f32)
def _tree_order(W):
    """Which input slot ends in each lane after ``_pair_sum``'s log2(W) levels."""
    vecs = [[[i]] for i in range(W)]  # vector -> segments -> slots
    while len(vecs) > 1:
        vecs = [[seg for pair in zip(x, y) for seg in pair] for x, y in zip(vecs[::2], vecs[1::2])]
    return [seg[0] for seg in vecs[0]]


def _pair_sum(builder, x, y, seg):
    """Two vectors of segments of ``seg`` lanes -> one of segments of seg/2 lanes (each the
    sum of a half segment), x's and y's segments interleaved: one level of the transposed
    horizontal sum of W vectors (2 shuffles and an add)."""
    W = x.type.count
    h = seg // 2
    lo, hi = [], []
    for i in range(W // seg):
        for src in (0, W):
            lo += [src + i * seg + t for t in range(h)]
            hi += [src + i * seg + h + t for t in range(h)]
    mask = ir.VectorType(ir.IntType(32), W)
    return builder.fadd(builder.shuffle_vector(x, y, ir.Constant(mask, lo)),
                        builder.shuffle_vector(x, y, ir.Constant(mask, hi)))


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


def _heads_ir(builder, emit, nc, gb, args, head_steps):
    """IR: emit(NC, GB, args) for nc == 4 and gb in 1..4 heads (unrolled: each K/V vector
    widened once for the group); nc 2 or 1 (row tails): one head at a time, address
    arguments advanced by head_steps (bytes per head, IR values or None) in a loop."""

    def one_by_one(NC):
        with cgutils.for_range(builder, gb) as loop:
            emit(NC, 1, [a if s is None else builder.add(a, builder.mul(s, loop.index))
                         for a, s in zip(args, head_steps)])

    _switch_ir(builder, nc, {4: lambda: _switch_ir(builder, gb, {g: (lambda g=g: emit(4, g, args)) for g in (1, 2, 3)},
                                                   lambda: emit(4, 4, args)),
                             2: lambda: one_by_one(2)}, lambda: one_by_one(1))


def _typed(ints, vt, arr):
    """Check an intrinsic's argument types: integers, a VTag, an array whose elements
    ``load_as_f32`` reads; returns (W, element kind) or None."""
    kind = elt_kind(arr)
    if kind is None or not isinstance(vt, VTag) or not all(isinstance(a, types.Integer) for a in ints):
        return None
    return vt.n, kind


@intrinsic
def _qk(typingctx, qa, ka, ld, nk, sa, sstride, add, nc, gb, vt, pool):
    """Scores of gb query heads against W key rows, nc vectors of each row: lane j of head
    g's result = q[g] . k[j] over those columns, stored at sa + g * sstride floats (added to
    what is there when ``add``); lanes j >= nk get _NEG.

    q rows (f32, pre-scaled) at address qa, key rows (elements as ``pool``'s) at ka, both
    ``ld`` elements apart.  Each key vector is widened once (vcvtph2ps for f16) for all
    heads of the group; a head's W per-key product vectors are summed across lanes by a
    shuffle tree, merged as soon as two of a level exist (few registers live)."""
    t = _typed((qa, ka, ld, nk, sa, sstride, add, nc, gb), vt, pool)
    if t is None:
        return None
    W, EK = t
    key_of_slot = [0] * W
    for lane, slot in enumerate(_tree_order(W)):
        key_of_slot[slot] = lane
    esize = (4, 2, 1)[EK]

    def codegen(context, builder, sig, args):
        i64, f32 = ir.IntType(64), ir.FloatType()
        vals = [context.cast(builder, a, ty, types.int64) for a, ty in zip(args[:9], sig.args[:9])]
        vty = ir.VectorType(f32, W)
        neg = ir.Constant(vty, [float(_NEG)] * W)

        def emit(NC, GB, a):
            qa_, ka_, ld_, nk_, sa_, ss_, add_ = a
            qp = builder.inttoptr(qa_, f32.as_pointer())
            qv = [[builder.load(builder.bitcast(builder.gep(qp, [builder.add(builder.mul(ld_, ir.Constant(i64, g)),
                                                                             ir.Constant(i64, ci * W))]),
                                                vty.as_pointer()), align=1)
                   for ci in range(NC)] for g in range(GB)]
            kbase = builder.inttoptr(ka_, ir.IntType(8).as_pointer())
            row_b = builder.mul(ld_, ir.Constant(i64, esize))
            last = builder.sub(nk_, ir.Constant(i64, 1))
            stacks = [[] for _ in range(GB)]  # per head: (segment size, partial vector)
            for slot in range(W):
                key = ir.Constant(i64, key_of_slot[slot])
                j = builder.select(builder.icmp_signed("<", key, nk_), key, last)  # past nk: any valid row
                row = builder.gep(kbase, [builder.mul(j, row_b)])
                kv = [load_as_f32(builder, builder.gep(row, [ir.Constant(i64, ci * W * esize)]), W, EK)
                      for ci in range(NC)]
                for g in range(GB):
                    part = builder.fmul(qv[g][0], kv[0])
                    for ci in range(1, NC):
                        part = fma_ir(builder, qv[g][ci], kv[ci], part)
                    st, seg = stacks[g], W
                    while st and st[-1][0] == seg:
                        part = _pair_sum(builder, st.pop()[1], part, seg)
                        seg //= 2
                    st.append((seg, part))
            keep = lane_mask_ir(builder, W, nk_)
            adding = builder.icmp_signed("!=", add_, ir.Constant(i64, 0))
            zero = ir.Constant(vty, None)
            sp = builder.inttoptr(sa_, f32.as_pointer())
            for g in range(GB):
                dst = builder.bitcast(builder.gep(sp, [builder.mul(ss_, ir.Constant(i64, g))]), vty.as_pointer())
                s = builder.fadd(stacks[g][0][1], builder.select(adding, builder.load(dst, align=1), zero))
                builder.store(builder.select(keep, s, neg), dst, align=1)

        ld_, ss_, nc_, gb_ = vals[2], vals[5], vals[7], vals[8]
        four = ir.Constant(i64, 4)
        _heads_ir(builder, emit, nc_, gb_, vals[:7], [builder.mul(ld_, four), None, None, None, builder.mul(ss_, four),
                                                      None, None])
        return context.get_dummy_value()

    return types.none(qa, ka, ld, nk, sa, sstride, add, nc, gb, vt, pool), codegen


@intrinsic
def _pv(typingctx, aa, pa, pstride, ca, va, ld, nk, nc, gb, vt, pool):
    """acc[g, :] = acc[g, :] * corr[g] + sum_{j < nk} p[g, j] * v[j, :] for gb heads, over
    nc vectors of columns.

    acc rows (f32) at aa and value rows (elements as ``pool``'s) at va, both ``ld``
    elements apart; p rows at pa + g * pstride floats; corr[g] at ca.  The accumulators of
    the group stay in registers over the keys; each value vector is widened once for all
    its heads."""
    t = _typed((aa, pa, pstride, ca, va, ld, nk, nc, gb), vt, pool)
    if t is None:
        return None
    W, EK = t
    esize = (4, 2, 1)[EK]

    def codegen(context, builder, sig, args):
        i64, f32 = ir.IntType(64), ir.FloatType()
        vals = [context.cast(builder, a, ty, types.int64) for a, ty in zip(args[:9], sig.args[:9])]
        vty = ir.VectorType(f32, W)

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
                                                      None, None])
        return context.get_dummy_value()

    return types.none(aa, pa, pstride, ca, va, ld, nk, nc, gb, vt, pool), codegen


@kernel
def _pass_width(left):
    """Vectors per row pass: 4 while at least 4 are left, then 2, then 1."""
    return 4 if left >= 4 else (2 if left >= 2 else 1)


@kernel
def _task_simd(q, pool, table, layer, KVH, bs, n_past, scale, n_splits, task, pmax, psum, pacc, vt):
    """``_task`` on explicit vectors for f32 / f16 storage (D a multiple of W).

    Per key block: scores for chunks of W keys (lanes = keys, ``_qk``), the online softmax
    on those vectors (vector exp), then ``_pv``.  K and V are read straight from the pool
    and widened in registers; rows go in passes of 4 (2, 1) vectors, the G heads in
    groups of up to 4; the block _PREFETCH ahead is prefetched.

    The softmax exponentiates with the running max before this block's max is known and
    redoes it only when the max grows, so the block max is off the critical path."""
    M, H, D = q.shape
    G = H // KVH
    W = vlanes(vt)
    s_idx = task % n_splits
    mk = task // n_splits
    m = mk // KVH
    kvh = mk % KVH
    h0 = kvh * G
    t_end = n_past + m + 1
    nb = (t_end + bs - 1) // bs
    b0 = s_idx * nb // n_splits
    b1 = (s_idx + 1) * nb // n_splits
    nv = D // W  # vectors per row
    SW = (bs + W - 1) // W * W  # scores row length: whole vectors
    qs = np.empty((G, D), np.float32)  # [G, D] the group's query rows times scale
    for g in range(G):
        for d in range(D):
            qs[g, d] = q[m, h0 + g, d] * scale
    sbuf = np.empty((G, SW), np.float32)  # [G, key] scores, then probabilities, of one block
    acc = np.zeros((G, D), np.float32)  # [G, D]
    corr = np.empty(G, np.float32)  # [G] rescale of acc for the current block
    rmax = np.full(G, _NEG, np.float32)
    rsv = np.zeros((G, W), np.float32)  # [G, lane] running sums of probabilities
    # heads in groups of at most 4 (2 on 8 lanes: AVX2 has 16 registers), each K/V vector
    # widened once per group.  Measured (in-cache, zmm): SmolLM2's 3 heads at once 1.1x
    # faster than 2 + 1; Qwen2.5-0.5B's 4 + 3 as fast as 2 + 2 + 2 + 1, and all 7 at once
    # 0.6-0.8x (spills)
    gmax = 4 if W == 16 else 2
    n_groups = (G + gmax - 1) // gmax
    esz = pool.itemsize
    row_b = D * esz
    kv_b = bs * row_b  # bytes of one (layer, K or V, head) in a block
    kv0 = addr(pool) + ((layer * 2 + 0) * KVH + kvh) * kv_b  # this (layer, K, head) in block 0
    v_off = KVH * kv_b  # V rows follow the layer's K rows
    qa, sa, aa, ca, rsa = addr(qs), addr(sbuf), addr(acc), addr(corr), addr(rsv)
    for b in range(b0, b1):
        kb = kv0 + np.int64(table[b]) * pool.strides[0]
        n_valid = min(bs, t_end - b * bs)
        if b + _PREFETCH < b1:  # K and V of the block _PREFETCH ahead, every line, towards L2
            nxt = kv0 + np.int64(table[b + _PREFETCH]) * pool.strides[0]
            for off in range(0, kv_b, 64):
                prefetch_l2(nxt, off)
                prefetch_l2(nxt + v_off, off)
        for gi in range(n_groups):
            g0 = gi * G // n_groups
            gn = (gi + 1) * G // n_groups - g0
            for ch in range(0, n_valid, W):
                c0 = 0
                while c0 < nv:
                    nc = _pass_width(nv - c0)
                    _qk(qa + (g0 * D + c0 * W) * 4, kb + ch * row_b + c0 * W * esz, D, min(W, n_valid - ch),
                        sa + (g0 * SW + ch) * 4, SW, c0, nc, gn, vt, pool)
                    c0 += nc
        for g in range(G):
            so = sa + g * SW * 4
            ra = rsa + g * W * 4
            ref = vsplat(rmax[g], vt)
            rs = vloadf(ra, 0, vt)
            s0 = vloadf(so, 0, vt)
            mx = s0
            for ch in range(W, n_valid, W):
                mx = vmaxf(mx, vloadf(so, ch * 4, vt))
            bm = vhmax(mx)
            p = vexp(vsub(s0, ref))  # with the old reference max: not waiting for bm
            if bm > rmax[g]:  # a new reference max: rescale (rare after the first blocks)
                c = np.float32(np.exp(rmax[g] - bm))
                rmax[g] = bm
                corr[g] = c
                ref = vsplat(bm, vt)
                rs = vmul(rs, vsplat(c, vt))
                p = vexp(vsub(s0, ref))
            else:
                corr[g] = 1.0
            vstore(so, 0, p)
            rs = vadd(rs, p)
            for ch in range(W, n_valid, W):
                p = vexp(vsub(vloadf(so, ch * 4, vt), ref))  # masked keys: exp(_NEG) = 0
                vstore(so, ch * 4, p)
                rs = vadd(rs, p)
            vstore(ra, 0, rs)
        vb = kb + v_off
        for gi in range(n_groups):
            g0 = gi * G // n_groups
            gn = (gi + 1) * G // n_groups - g0
            c0 = 0
            while c0 < nv:
                nc = _pass_width(nv - c0)
                _pv(aa + (g0 * D + c0 * W) * 4, sa + g0 * SW * 4, SW, ca + g0 * 4, vb + c0 * W * esz, D, n_valid,
                    nc, gn, vt, pool)
                c0 += nc
    for g in range(G):
        pmax[task, g] = rmax[g]
        psum[task, g] = vhsum(vloadf(rsa, g * W * 4, vt))
        for d in range(D):
            pacc[task, g, d] = acc[g, d]


@kernel
def _task(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past, scale,
          n_splits, task, pmax, psum, pacc, tag=None):
    """Partial attention of one (m, kv head, split): pmax/psum [G], pacc [G, D] of this task.

    ``tag`` (simd.make_tag; last and optional): the explicit-SIMD path of that width for
    f32 / f16 storage when D is a multiple of its lanes; None (the 'generic' ISA), int8
    storage or another D: the scalar loops."""
    if tag is None:
        _task_scalar(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past, scale,
                     n_splits, task, pmax, psum, pacc)
    elif kind != 2 and q.shape[2] % vlanes(tag) == 0:
        _task_simd(q, pool, table, layer, KVH, bs, n_past, scale, n_splits, task, pmax, psum, pacc, vtag(tag))
    else:
        _task_scalar(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past, scale,
                     n_splits, task, pmax, psum, pacc)


@kernel
def _merge(pmax, psum, pacc, n_splits, KVH, out):
    """out[m, h] = the splits' partial results combined (flash-decoding reduction)."""
    M, H, D = out.shape
    G = H // KVH
    for mk in range(M * KVH):
        m = mk // KVH
        h0 = (mk % KVH) * G
        t0 = mk * n_splits
        for g in range(G):
            mx = pmax[t0, g]
            for s in range(1, n_splits):
                mx = max(mx, pmax[t0 + s, g])
            den = np.float32(0.0)
            for d in range(D):
                out[m, h0 + g, d] = 0.0
            for s in range(n_splits):
                w = np.float32(np.exp(pmax[t0 + s, g] - mx))
                den += w * psum[t0 + s, g]
                for d in range(D):
                    out[m, h0 + g, d] += w * pacc[t0 + s, g, d]
            inv = np.float32(1.0) / den
            for d in range(D):
                out[m, h0 + g, d] *= inv


@parallel_kernel
def paged_attention_parallel(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past,
                             scale, n_splits, out, tag=None):
    """q [M, H, D] f32 rotated; table [blocks] int32; out [M, H, D] f32 (see module doc);
    tag: the SIMD path (``_task``), None for the scalar loops."""
    M, H, D = q.shape
    n_tasks = M * KVH * n_splits
    pmax = np.empty((n_tasks, H // KVH), np.float32)  # [task, G]
    psum = np.empty((n_tasks, H // KVH), np.float32)  # [task, G]
    pacc = np.empty((n_tasks, H // KVH, D), np.float32)  # [task, G, D]
    for task in prange(n_tasks):
        _task(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past, scale,
              n_splits, task, pmax, psum, pacc, tag)
    _merge(pmax, psum, pacc, n_splits, KVH, out)


@kernel
def paged_attention_serial(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past,
                           scale, n_splits, out, tag=None):
    """Same as paged_attention_parallel on the calling thread."""
    M, H, D = q.shape
    n_tasks = M * KVH * n_splits
    pmax = np.empty((n_tasks, H // KVH), np.float32)
    psum = np.empty((n_tasks, H // KVH), np.float32)
    pacc = np.empty((n_tasks, H // KVH, D), np.float32)
    for task in range(n_tasks):
        _task(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past, scale,
              n_splits, task, pmax, psum, pacc, tag)
    _merge(pmax, psum, pacc, n_splits, KVH, out)


_SERIAL_WORK = 1 << 17  # multiply-adds below which a pool launch costs more than it saves
_BLOCKS_PER_SPLIT = 4  # at least this many key blocks per split


def n_splits_for(M: int, KVH: int, n_blocks: int, threads: int) -> int:
    """Key-block splits per (row, kv head) so that the tasks fill ``threads`` evenly."""
    if threads <= 1 or M * KVH >= 2 * threads:
        return 1
    want = -(-4 * threads // (M * KVH))
    step = threads // np.gcd(M * KVH, threads)
    want = -(-want // step) * step
    return max(1, min(want, n_blocks // _BLOCKS_PER_SPLIT))


_TAGS: dict[str, np.ndarray | None] = {}


def attention_tag(isa: str | None = None) -> np.ndarray | None:
    """The ``tag`` argument of the kernels for an ISA path (None: ``isa.current_isa()``);
    None for 'generic' (the scalar loops)."""
    name = current_isa() if isa is None else isa
    if name not in _TAGS:
        _TAGS[name] = None if name == "generic" else make_tag(name)
    return _TAGS[name]


def paged_attention(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past, scale, out,
                    threads: int = 1, isa: str | None = None):
    """Dispatch: serial for small work, else split over the thread pool; ``isa`` picks the
    path (None: the process's, ``isa.current_isa()``)."""
    M, H, D = q.shape
    tag = attention_tag(isa) if kind != 2 else None  # int8: the scalar loops either way
    n_keys = n_past + M
    work = M * H * D * n_keys * 2
    n_blocks = (n_keys + bs - 1) // bs
    if work < _SERIAL_WORK or threads <= 1:
        paged_attention_serial(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past,
                               scale, 1, out, tag)
    else:
        n_splits = n_splits_for(M, KVH, n_blocks, threads)
        paged_attention_parallel(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past,
                                 scale, n_splits, out, tag)


@kernel
def store_rows(pool, table, layer, kv, bs, pos0, src):
    """pool[...] <- src  # [M, KVH, D] (uint16 f16 bits or f32, the pool's dtype), positions pos0.."""
    M, KVH, D = src.shape
    for m in range(M):
        p = pos0 + m
        blk = table[p // bs]
        j = p % bs
        for h in range(KVH):
            off = (((layer * 2 + kv) * KVH + h) * bs + j) * D
            for d in range(D):
                pool[blk, off + d] = src[m, h, d]


@kernel
def store_rows_int8(pool, pool_f32, scale_off0, group, table, layer, kv, bs, pos0, src):
    """Quantize src  # [M, KVH, D] f32 to int8 with one f32 scale per ``group`` values
    (llama.cpp's q8_0 rule: d = max|x| / 127, q = round(x / d))."""
    M, KVH, D = src.shape
    gs = D // group
    for m in range(M):
        p = pos0 + m
        blk = table[p // bs]
        j = p % bs
        for h in range(KVH):
            r = ((layer * 2 + kv) * KVH + h) * bs + j
            for g in range(gs):
                amax = np.float32(0.0)
                for d in range(g * group, (g + 1) * group):
                    amax = max(amax, abs(src[m, h, d]))
                dsc = amax / np.float32(127.0)
                inv = np.float32(1.0) / dsc if dsc > 0 else np.float32(0.0)
                pool_f32[blk, scale_off0 + r * gs + g] = dsc
                for d in range(g * group, (g + 1) * group):
                    v = src[m, h, d] * inv
                    iv = np.int64(v + np.float32(0.5)) if v >= 0 else -np.int64(np.float32(0.5) - v)
                    pool[blk, r * D + d] = min(127, max(-127, iv))
