"""The per-group inner loops of vnni_matmul.py for the 32-value block types (Q4_0, Q4_1,
Q5_0, Q8_0; the K-quants are in vnni_kquant.py): one group of W packed weight rows against
one row (``run32_1``), two (``run32_2``), or three or four rows (``run32_4``) of int8
activations, returning the group's f32 accumulator vectors.  ``dec32`` decodes a block to
bytes, ``_acc32`` feeds them to one row.  vnni_matmul.py explains the arithmetic.

Every row's accumulator sees the same operations in the same order in every tile, so an
output does not depend on the tile its row falls in (tests/test_kernels_simd.py checks it
bit for bit).
"""

import numpy as np

from ..jit import inline_kernel, kernel
from ..weights.repack import Q4_0, Q4_1, Q4_K, Q5_0, Q8_0
from .simd import ldf, ldi, prefetch_l2, vbcast4, vlanes, vload, vload_f16, vsplat
from .simd_math import vand, vcvt, vdot_u4, vdot_u5, vdot_q8, vfma, vmul, vor, vshr, vzero_f, vzero_i


# Bytes ahead of the weight stream prefetched along a one-row loop (decode) of the 32-value
# types, a block's lines at its start.  On this Zen 3 host (2 vCPUs, about 15 GB/s from DRAM
# to one core) the hardware prefetchers kept too few lines in flight: weights from DRAM, 1
# thread, alternating (perf/ab_kernels.py matvec): Q8_0 0.80x the time, Q5_0 0.77x; 2 threads
# 0.88 / 0.85.  512 or 2048 bytes ahead: slower than 1024.  Measured on AVX2 (8-row groups).
W_AHEAD = 1024


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
def run32_2(qt, wa, xa, xda, xsa, K, m, tag):
    """Activation rows m, m+1: each block decoded once, used by the 2 rows; the weight
    stream prefetched a little ahead as run32_1 (for a lone pass over short rows, M = 2,
    the next group instead was slower)."""
    bs = block_bytes(qt) * vlanes(tag)
    nb = K // 32
    x0 = xa + m * K
    a0 = vzero_f(tag)
    a1 = vzero_f(tag)
    for b in range(nb):
        o = b * bs
        _w_ahead(wa, o, bs)
        qs = dec32(qt, wa, o, tag)
        i = m * nb + b
        a0 = _acc32(qt, wa, o, qs, x0, ldf(xda, i), ldi(xsa, i), 32 * b, a0, tag)
        a1 = _acc32(qt, wa, o, qs, x0 + K, ldf(xda, i + nb), ldi(xsa, i + nb), 32 * b, a1, tag)
    return a0, a1


@inline_kernel
def run32_4(qt, wa, xa, xda, xsa, K, m, R, tag):
    """Activation rows m..m+R-1, R = 4, or 3 (the remainder of M = 3, 7, ...; the fourth
    accumulator stays zero): each block decoded once, used by the R rows; the first pass
    (m = 0) prefetches the next group's blocks along (vnni_matmul.py)."""
    bs = block_bytes(qt) * vlanes(tag)
    nb = K // 32
    x0 = xa + m * K
    a0 = vzero_f(tag)
    a1 = vzero_f(tag)
    a2 = vzero_f(tag)
    a3 = vzero_f(tag)
    ahead = nb * bs  # the next group's block b lies one group further
    for b in range(nb):
        o = b * bs
        if m == 0:
            _w_part(wa, o + ahead, bs)
        qs = dec32(qt, wa, o, tag)
        i = m * nb + b
        a0 = _acc32(qt, wa, o, qs, x0, ldf(xda, i), ldi(xsa, i), 32 * b, a0, tag)
        a1 = _acc32(qt, wa, o, qs, x0 + K, ldf(xda, i + nb), ldi(xsa, i + nb), 32 * b, a1, tag)
        a2 = _acc32(qt, wa, o, qs, x0 + 2 * K, ldf(xda, i + 2 * nb), ldi(xsa, i + 2 * nb), 32 * b, a2, tag)
        if R == 4:
            a3 = _acc32(qt, wa, o, qs, x0 + 3 * K, ldf(xda, i + 3 * nb), ldi(xsa, i + 3 * nb), 32 * b, a3, tag)
    return a0, a1, a2, a3
