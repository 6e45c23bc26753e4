"""The per-group inner loops of vnni_matmul.py: one group of W packed weight rows against
one row (``run*_1``) or four rows (``run*_4``) of int8 activations, returning the groups'
f32 accumulator vectors; per weight type family: the 32-value blocks (Q4_0, Q4_1, Q5_0,
Q8_0: ``dec32`` decodes a block to bytes, ``acc32`` feeds them to the rows) and the
K-quants (Q4_K, Q6_K: 256-value super-blocks).  vnni_matmul.py explains the arithmetic.
"""

import numpy as np

from ..jit import inline_kernel, kernel
from ..weights.repack import Q4_0, Q4_1, Q4_K, Q5_0, Q8_0
from .simd import ldf, ldi, prefetch_l1, prefetch_l2, vbcast4, vlanes, vload, vload_f16, vload_s8, vload_u8, vsplat
from .simd_math import vadd, vand, vcvt, vdot_u4, vdot_u5, vdot_u6, vdot_q8, vfma, vmul, vor, vshl, vshr, vzero_f, vzero_i


# Bytes ahead of the weight stream prefetched along a one-row loop (decode) of the 32-value
# types, a block's lines at its start.  On this Zen 3 host (2 vCPUs, about 15 GB/s from DRAM
# to one core) the hardware prefetchers kept too few lines in flight: weights from DRAM, 1
# thread, alternating (perf/ab_kernels.py matvec): Q8_0 0.80x the time, Q5_0 0.77x; 2 threads
# 0.88 / 0.85.  512 or 2048 bytes ahead: slower than 1024.  Measured on AVX2 (8-row groups).
W_AHEAD = 1024


# Bytes ahead of the weight stream prefetched along the one-row K-quant loops (Q4_K, Q6_K):
# spread over a super-block's 8 parts, each part's lines as its sub-block starts, instead
# of the whole super-block (1184 / 1680 bytes on AVX2) in one burst at its start.
# perf/overlap_ceiling.py --kernels (1 thread, weights from DRAM over the probe): Q4_K 0.67-
# 0.76 with no prefetch, 0.76 with the burst 1 KiB ahead, 0.92-0.98 spread 2 KiB ahead; Q6_K
# 0.73-0.82 with the burst, 0.92 spread.  Measured on AVX2 (8-row groups) only.
K_AHEAD = 2048


@inline_kernel
def _w_part(wa, at, n):
    """Prefetch towards L2 a line every 64 bytes of the n bytes at byte ``at`` of wa (n a
    compile-time constant: the loop unrolls; a span that starts mid-line has its last line
    fetched by the next part's first prefetch)."""
    for i in range(0, n, 64):
        prefetch_l2(wa, at + i)


@inline_kernel
def _w_ahead(wa, o, bs):
    """Prefetch towards L2 the bs bytes of weights W_AHEAD past offset o of the group at wa
    (a line per 64 bytes; past a group's end lie the next group's)."""
    _w_part(wa, o + W_AHEAD, bs)


@kernel
def block_bytes(qt):
    """repack.BLOCK_BYTES_PER_ROW[qt] (bytes of one block per weight row)."""
    if qt == Q4_0:
        return 18
    if qt == Q4_1:
        return 20
    if qt == Q5_0:
        return 22
    if qt == Q8_0:
        return 34
    if qt == Q4_K:
        return 148
    return 210


# ------------------------------------------------------------------- decode and dot
@kernel
def _nib8(wp, o, tag):
    """4 nib vectors at byte o -> the 8 k-groups of a 32-value chunk (values 0..15)."""
    vb = 4 * vlanes(tag)
    m = vsplat(0x0F0F0F0F, tag)
    v0 = vload(wp, o, tag)
    v1 = vload(wp, o + vb, tag)
    v2 = vload(wp, o + 2 * vb, tag)
    v3 = vload(wp, o + 3 * vb, tag)
    return (vand(v0, m), vand(v1, m), vand(v2, m), vand(v3, m),
            vand(vshr(v0, 4), m), vand(vshr(v1, 4), m), vand(vshr(v2, 4), m), vand(vshr(v3, 4), m))


@kernel
def _x8(xr, k0, tag):
    """The activation bytes of the 8 k-groups of a 32-value chunk, each broadcast."""
    return (vbcast4(xr, k0, tag), vbcast4(xr, k0 + 4, tag), vbcast4(xr, k0 + 8, tag), vbcast4(xr, k0 + 12, tag),
            vbcast4(xr, k0 + 16, tag), vbcast4(xr, k0 + 20, tag), vbcast4(xr, k0 + 24, tag),
            vbcast4(xr, k0 + 28, tag))


@kernel
def _dot4(q0, q1, q2, q3, xr, k0, init, tag):
    """init + sum over 4 k-groups (16 values: a Q6_K sub-block, weights 0..63)."""
    xs = (vbcast4(xr, k0, tag), vbcast4(xr, k0 + 4, tag), vbcast4(xr, k0 + 8, tag), vbcast4(xr, k0 + 12, tag))
    return vdot_u6(init, (q0, q1, q2, q3), xs, tag)


@kernel
def dec32(qt, wp, o, tag):
    """The 8 k-group weight vectors of the 32-value block at byte o (Q4_0/Q4_1/Q5_0/Q8_0)."""
    W = vlanes(tag)
    vb = 4 * W
    if qt == Q8_0:
        p = o + 2 * W
        return (vload(wp, p, tag), vload(wp, p + vb, tag), vload(wp, p + 2 * vb, tag), vload(wp, p + 3 * vb, tag),
                vload(wp, p + 4 * vb, tag), vload(wp, p + 5 * vb, tag), vload(wp, p + 6 * vb, tag),
                vload(wp, p + 7 * vb, tag))
    if qt == Q4_1:
        return _nib8(wp, o + 4 * W, tag)
    if qt == Q5_0:  # repack.py's P0..P4: v0..v4 in bits 0-4, v5..v7 spread over bits 5-7
        p = o + 2 * W
        p0 = vload(wp, p, tag)
        p1 = vload(wp, p + vb, tag)
        p2 = vload(wp, p + 2 * vb, tag)
        p3 = vload(wp, p + 3 * vb, tag)
        p4 = vload(wp, p + 4 * vb, tag)
        m5 = vsplat(0x1F1F1F1F, tag)
        m3 = vsplat(0x07070707, tag)
        m2 = vsplat(0x18181818, tag)
        return (vand(p0, m5), vand(p1, m5), vand(p2, m5), vand(p3, m5), vand(p4, m5),
                vor(vand(vshr(p0, 5), m3), vand(vshr(p1, 2), m2)),
                vor(vand(vshr(p2, 5), m3), vand(vshr(p3, 2), m2)),
                vor(vor(vand(vshr(p1, 7), vsplat(0x01010101, tag)), vand(vshr(p3, 6), vsplat(0x02020202, tag))),
                    vand(vshr(p4, 3), vsplat(0x1C1C1C1C, tag))))
    return _nib8(wp, o + 2 * W, tag)


@inline_kernel
def _acc32(qt, wp, o, qs, xr, dx, sx, k0, acc, tag):
    """acc + this block's contribution for one activation row (dx scale, sx block sum)."""
    W = vlanes(tag)
    xs = _x8(xr, k0, tag)
    if qt == Q8_0:
        ai = vdot_q8(vsplat(-128 * sx, tag), qs, xs, tag)
    elif qt == Q4_0:
        ai = vdot_u4(vsplat(-8 * sx, tag), qs, xs, tag)
    elif qt == Q5_0:
        ai = vdot_u5(vsplat(-16 * sx, tag), qs, xs, tag)
    else:
        ai = vdot_u4(vzero_i(tag), qs, xs, tag)
    acc = vfma(vcvt(ai), vmul(vload_f16(wp, o, tag), vsplat(dx, tag)), acc)
    if qt == Q4_1:
        acc = vfma(vload_f16(wp, o + 2 * W, tag), vsplat(dx * np.float32(sx), tag), acc)
    return acc


@inline_kernel
def run32_1(qt, wa, xa, xda, xsa, K, m, tag):
    """One activation row m over the group at address wa (32-value block types)."""
    bs = block_bytes(qt) * vlanes(tag)
    nb = K // 32
    xr = xa + m * K
    acc = vzero_f(tag)
    for b in range(nb):
        o = b * bs
        _w_ahead(wa, o, bs)
        qs = dec32(qt, wa, o, tag)
        acc = _acc32(qt, wa, o, qs, xr, ldf(xda, m * nb + b), ldi(xsa, m * nb + b), 32 * b, acc, tag)
    return acc


@inline_kernel
def run32_4(qt, wa, xa, xda, xsa, K, m, tag):
    """Activation rows m..m+3: each block decoded once, used by the 4 rows."""
    bs = block_bytes(qt) * vlanes(tag)
    nb = K // 32
    x0 = xa + m * K
    a0 = vzero_f(tag)
    a1 = vzero_f(tag)
    a2 = vzero_f(tag)
    a3 = vzero_f(tag)
    for b in range(nb):
        o = b * bs
        qs = dec32(qt, wa, o, tag)
        i = m * nb + b
        a0 = _acc32(qt, wa, o, qs, x0, ldf(xda, i), ldi(xsa, i), 32 * b, a0, tag)
        a1 = _acc32(qt, wa, o, qs, x0 + K, ldf(xda, i + nb), ldi(xsa, i + nb), 32 * b, a1, tag)
        a2 = _acc32(qt, wa, o, qs, x0 + 2 * K, ldf(xda, i + 2 * nb), ldi(xsa, i + 2 * nb), 32 * b, a2, tag)
        a3 = _acc32(qt, wa, o, qs, x0 + 3 * K, ldf(xda, i + 3 * nb), ldi(xsa, i + 3 * nb), 32 * b, a3, tag)
    return a0, a1, a2, a3


# ------------------------------------------------------------------- K-quant blocks
@kernel
def _x_ahead(xr, xsr, b):
    """Prefetch into L1 the activations of 256-value block b of one row: its 256 int8
    values (4 lines at xr) and its 16 sums (1 line at xsr).  A group of rows with
    more than 32 KiB of weights (K > about 3000 for Q4_K) streams them through L1 between
    two uses of the activations, which then come back from L2 on demand: one thread read
    Q4_K 1536x8960 at 22.5 GB/s, with this one block ahead 26.2 GB/s (probe 28.0; 2 or 4
    blocks ahead 23-24; 8960x1536, 15 KiB per group, 27 GB/s either way).  Per token,
    1 thread: 0.970x Qwen2.5-1.5B d0, 0.982x Qwen2.5-0.5B d4096.  (The 32-value types
    read 8x fewer activation bytes per weight byte: Q8_0/Q4_0 2816x4864 unchanged.)"""
    for i in range(4):
        prefetch_l1(xr, 256 * b + 64 * i)
    prefetch_l1(xsr, 64 * b)


# ---------------------------------------------------------------------------- Q4_K
@kernel
def _k4_sub(wa, o, s, qs, xr, xsr, b, isum, imin, tag):
    """Sub-block s (32 values) of the Q4_K block at byte o, one activation row
    (xr: its int8 values, xsr: its sums of 16)."""
    W = vlanes(tag)
    ai = vdot_u4(vzero_i(tag), qs, _x8(xr, 256 * b + 32 * s, tag), tag)
    isum = vadd(isum, vmul(ai, vload_u8(wa, o + 4 * W + s * W, tag)))
    bsum = ldi(xsr, 16 * b + 2 * s) + ldi(xsr, 16 * b + 2 * s + 1)
    imin = vadd(imin, vmul(vload_u8(wa, o + 12 * W + s * W, tag), vsplat(bsum, tag)))
    return isum, imin


@kernel
def _k4_end(wa, o, dx, isum, imin, acc, tag):
    W = vlanes(tag)
    acc = vfma(vcvt(isum), vmul(vload_f16(wa, o, tag), vsplat(dx, tag)), acc)
    return vfma(vcvt(imin), vmul(vload_f16(wa, o + 2 * W, tag), vsplat(-dx, tag)), acc)


@kernel
def runk4_1(wa, xa, xda, xsa, K, m, tag):
    W = vlanes(tag)
    bs = 148 * W
    nb = K // 256
    xr = xa + m * K
    xsr = xsa + 4 * m * (K // 16)
    acc = vzero_f(tag)
    for b in range(nb):
        o = b * bs
        _x_ahead(xr, xsr, b + 1)
        isum = vzero_i(tag)
        imin = vzero_i(tag)
        for s in range(8):
            _w_part(wa, o + K_AHEAD + s * (bs // 8), bs // 8)
            qs = _nib8(wa, o + 20 * W + 16 * W * s, tag)
            isum, imin = _k4_sub(wa, o, s, qs, xr, xsr, b, isum, imin, tag)
        acc = _k4_end(wa, o, ldf(xda, m * nb + b), isum, imin, acc, tag)
    return acc


@kernel
def runk4_4(wa, xa, xda, xsa, K, m, tag):
    W = vlanes(tag)
    bs = 148 * W
    nb = K // 256
    x0 = xa + m * K
    xs0 = xsa + 4 * m * (K // 16)
    xss = 4 * (K // 16)
    a0 = vzero_f(tag)
    a1 = vzero_f(tag)
    a2 = vzero_f(tag)
    a3 = vzero_f(tag)
    for b in range(nb):
        o = b * bs
        s0 = vzero_i(tag)
        s1 = vzero_i(tag)
        s2 = vzero_i(tag)
        s3 = vzero_i(tag)
        n0 = vzero_i(tag)
        n1 = vzero_i(tag)
        n2 = vzero_i(tag)
        n3 = vzero_i(tag)
        for s in range(8):
            qs = _nib8(wa, o + 20 * W + 16 * W * s, tag)
            s0, n0 = _k4_sub(wa, o, s, qs, x0, xs0, b, s0, n0, tag)
            s1, n1 = _k4_sub(wa, o, s, qs, x0 + K, xs0 + xss, b, s1, n1, tag)
            s2, n2 = _k4_sub(wa, o, s, qs, x0 + 2 * K, xs0 + 2 * xss, b, s2, n2, tag)
            s3, n3 = _k4_sub(wa, o, s, qs, x0 + 3 * K, xs0 + 3 * xss, b, s3, n3, tag)
        i = m * nb + b
        a0 = _k4_end(wa, o, ldf(xda, i), s0, n0, a0, tag)
        a1 = _k4_end(wa, o, ldf(xda, i + nb), s1, n1, a1, tag)
        a2 = _k4_end(wa, o, ldf(xda, i + 2 * nb), s2, n2, a2, tag)
        a3 = _k4_end(wa, o, ldf(xda, i + 3 * nb), s3, n3, a3, tag)
    return a0, a1, a2, a3


# ---------------------------------------------------------------------------- Q6_K
@kernel
def _dec6(wp, p, tag):
    """Chunk of 32 values at byte p (nib 16W, then 2 high-2-bit vectors): 8 k-groups 0..63."""
    vb = 4 * vlanes(tag)
    q = _nib8(wp, p, tag)
    h0 = vload(wp, p + 4 * vb, tag)
    h1 = vload(wp, p + 5 * vb, tag)
    m = vsplat(0x30303030, tag)
    return (vor(q[0], vand(vshl(h0, 4), m)), vor(q[1], vand(vshl(h0, 2), m)),
            vor(q[2], vand(h0, m)), vor(q[3], vand(vshr(h0, 2), m)),
            vor(q[4], vand(vshl(h1, 4), m)), vor(q[5], vand(vshl(h1, 2), m)),
            vor(q[6], vand(h1, m)), vor(q[7], vand(vshr(h1, 2), m)))


@kernel
def _k6_chunk(wa, o, c, qs, xr, xsr, b, isum, tag):
    """Sub-blocks 2c, 2c+1 (16 values each) of the Q6_K block at byte o, one activation row."""
    W = vlanes(tag)
    k0 = 256 * b + 32 * c
    sb = 16 * b + 2 * c
    a = _dot4(qs[0], qs[1], qs[2], qs[3], xr, k0, vsplat(-32 * ldi(xsr, sb), tag), tag)
    isum = vadd(isum, vmul(a, vload_s8(wa, o + 2 * W + (2 * c) * W, tag)))
    a = _dot4(qs[4], qs[5], qs[6], qs[7], xr, k0 + 16, vsplat(-32 * ldi(xsr, sb + 1), tag), tag)
    return vadd(isum, vmul(a, vload_s8(wa, o + 2 * W + (2 * c + 1) * W, tag)))


@kernel
def runk6_1(wa, xa, xda, xsa, K, m, tag):
    W = vlanes(tag)
    bs = 210 * W
    nb = K // 256
    xr = xa + m * K
    xsr = xsa + 4 * m * (K // 16)
    acc = vzero_f(tag)
    for b in range(nb):
        o = b * bs
        _x_ahead(xr, xsr, b + 1)
        isum = vzero_i(tag)
        for c in range(8):
            _w_part(wa, o + K_AHEAD + c * (bs // 8), bs // 8)
            qs = _dec6(wa, o + 18 * W + 24 * W * c, tag)
            isum = _k6_chunk(wa, o, c, qs, xr, xsr, b, isum, tag)
        acc = vfma(vcvt(isum), vmul(vload_f16(wa, o, tag), vsplat(ldf(xda, m * nb + b), tag)), acc)
    return acc


@kernel
def runk6_4(wa, xa, xda, xsa, K, m, tag):
    W = vlanes(tag)
    bs = 210 * W
    nb = K // 256
    x0 = xa + m * K
    xs0 = xsa + 4 * m * (K // 16)
    xss = 4 * (K // 16)
    a0 = vzero_f(tag)
    a1 = vzero_f(tag)
    a2 = vzero_f(tag)
    a3 = vzero_f(tag)
    for b in range(nb):
        o = b * bs
        s0 = vzero_i(tag)
        s1 = vzero_i(tag)
        s2 = vzero_i(tag)
        s3 = vzero_i(tag)
        for c in range(8):
            qs = _dec6(wa, o + 18 * W + 24 * W * c, tag)
            s0 = _k6_chunk(wa, o, c, qs, x0, xs0, b, s0, tag)
            s1 = _k6_chunk(wa, o, c, qs, x0 + K, xs0 + xss, b, s1, tag)
            s2 = _k6_chunk(wa, o, c, qs, x0 + 2 * K, xs0 + 2 * xss, b, s2, tag)
            s3 = _k6_chunk(wa, o, c, qs, x0 + 3 * K, xs0 + 3 * xss, b, s3, tag)
        d = vload_f16(wa, o, tag)
        i = m * nb + b
        a0 = vfma(vcvt(s0), vmul(d, vsplat(ldf(xda, i), tag)), a0)
        a1 = vfma(vcvt(s1), vmul(d, vsplat(ldf(xda, i + nb), tag)), a1)
        a2 = vfma(vcvt(s2), vmul(d, vsplat(ldf(xda, i + 2 * nb), tag)), a2)
        a3 = vfma(vcvt(s3), vmul(d, vsplat(ldf(xda, i + 3 * nb), tag)), a3)
    return a0, a1, a2, a3
