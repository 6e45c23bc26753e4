"""The per-group inner loops of vnni_matmul.py for Q4_K (256-value super-blocks; Q6_K's
are in vnni_q6k.py, with the prefetch distance and activation prefetch of this module):
one group of W packed weight rows against one row (``runk4_1``), two (``runk4_2``), or
three or four rows (``runk4_4``) of int8 activations, returning the group's f32
accumulator vectors.  vnni_matmul.py explains the arithmetic, repack.py the layout.

Every row's accumulator sees the same operations in the same order in every tile (per
super-block: the integer sums of its sub-blocks, then one fused multiply-add per float
term), so an output does not depend on the tile its row falls in.
"""

from ..jit import kernel
from .simd import ldf, prefetch_l1, vbcast4, vlanes, vload_f16, vload_u8, vsplat
from .simd_math import vcvt, vdot_i16, vdot_u4_scaled, vfma, vmul, vor, vshl, vzero_f, vzero_i
from .vnni_blocks import _nib8, _w_part, _x8


# Bytes ahead of the weight stream prefetched along the one-row K-quant loops (the 2- to
# 4-row loops prefetch the next group in their first pass, vnni_matmul.py):
# spread over a super-block's 8 parts, each part's lines as its sub-block starts, instead
# of the whole super-block (1184 / 1680 bytes on AVX2) in one burst at its start.
# perf/overlap_ceiling.py --kernels (1 thread, weights from DRAM over the probe): Q4_K 0.67-
# 0.76 with no prefetch, 0.76 with the burst 1 KiB ahead, 0.92-0.98 spread 2 KiB ahead; Q6_K
# 0.73-0.82 with the burst, 0.92 spread.  Measured on AVX2 (8-row groups) only.
K_AHEAD = 2048


@kernel
def _x_ahead(xr, xsr, b):
    """Prefetch into L1 the activations of 256-value block b of one row: its 256 int8
    values (4 lines at xr) and its 16 int16 sums (half a line at xsr).  A group of rows with
    more than 32 KiB of weights (K > about 3000 for Q4_K) streams them through L1 between
    two uses of the activations, which then come back from L2 on demand: one thread read
    Q4_K 1536x8960 at 22.5 GB/s, with this one block ahead 26.2 GB/s (probe 28.0; 2 or 4
    blocks ahead 23-24; 8960x1536, 15 KiB per group, 27 GB/s either way).  Per token,
    1 thread: 0.970x Qwen2.5-1.5B d0, 0.982x Qwen2.5-0.5B d4096.  (The 32-value types
    read 8x fewer activation bytes per weight byte: Q8_0/Q4_0 2816x4864 unchanged.)"""
    for i in range(4):
        prefetch_l1(xr, 256 * b + 64 * i)
    prefetch_l1(xsr, 32 * b)


# ---------------------------------------------------------------------------- Q4_K
@kernel
def _pair_u8(wa, at, tag):
    """W bytes at byte ``at`` (one per lane), each repeated in both 16-bit halves of its
    lane: the operand that multiplies a pair of int16 sums in vdot_i16."""
    v = vload_u8(wa, at, tag)
    return vor(v, vshl(v, 16))


@kernel
def _k4_sub(wa, o, s, qs, mp, xr, xsr, b, isum, imin, tag):
    """Sub-block s (32 values) of the Q4_K block at byte o, one activation row
    (xr: its int8 values, xsr: its int16 sums of 16); mp the sub-block's mins as i16 pairs.
        isum += scale_s * dot_s      imin += min_s * (bsum_2s + bsum_2s+1)   (one vpdpwssd)"""
    W = vlanes(tag)
    isum = vdot_u4_scaled(isum, qs, _x8(xr, 256 * b + 32 * s, tag), vload_u8(wa, o + 4 * W + s * W, tag), tag)
    return isum, vdot_i16(imin, mp, vbcast4(xsr, 2 * (16 * b + 2 * s), tag), tag)


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
    xsr = xsa + 2 * m * (K // 16)
    acc = vzero_f(tag)
    for b in range(nb):
        o = b * bs
        _x_ahead(xr, xsr, b + 1)
        isum = vzero_i(tag)
        imin = vzero_i(tag)
        for s in range(8):
            _w_part(wa, o + K_AHEAD + s * (bs // 8), bs // 8)
            qs = _nib8(wa, o + 20 * W + 16 * W * s, tag)
            mp = _pair_u8(wa, o + 12 * W + s * W, tag)
            isum, imin = _k4_sub(wa, o, s, qs, mp, xr, xsr, b, isum, imin, tag)
        acc = _k4_end(wa, o, ldf(xda, m * nb + b), isum, imin, acc, tag)
    return acc


@kernel
def runk4_2(wa, xa, xda, xsa, K, m, tag):
    """Rows m, m+1: each sub-block decoded once for both; activations prefetched as in
    runk4_1, the next group's weights in the first pass over this one (m = 0: M = 2)."""
    W = vlanes(tag)
    bs = 148 * W
    nb = K // 256
    x0 = xa + m * K
    xs0 = xsa + 2 * m * (K // 16)
    xss = 2 * (K // 16)
    a0 = vzero_f(tag)
    a1 = vzero_f(tag)
    ahead = nb * bs  # the next group's super-block b lies one group further
    for b in range(nb):
        o = b * bs
        _x_ahead(x0, xs0, b + 1)
        _x_ahead(x0 + K, xs0 + xss, b + 1)
        s0 = vzero_i(tag)
        s1 = vzero_i(tag)
        n0 = vzero_i(tag)
        n1 = vzero_i(tag)
        for s in range(8):
            if m == 0:  # the first pass over the group: the next one's weights
                _w_part(wa, o + ahead + s * (bs // 8), bs // 8)
            qs = _nib8(wa, o + 20 * W + 16 * W * s, tag)
            mp = _pair_u8(wa, o + 12 * W + s * W, tag)
            s0, n0 = _k4_sub(wa, o, s, qs, mp, x0, xs0, b, s0, n0, tag)
            s1, n1 = _k4_sub(wa, o, s, qs, mp, x0 + K, xs0 + xss, b, s1, n1, tag)
        i = m * nb + b
        a0 = _k4_end(wa, o, ldf(xda, i), s0, n0, a0, tag)
        a1 = _k4_end(wa, o, ldf(xda, i + nb), s1, n1, a1, tag)
    return a0, a1


@kernel
def runk4_4(wa, xa, xda, xsa, K, m, R, tag):
    """Rows m..m+R-1, R = 4, or 3 (the remainder of M = 3, 7, ...; the fourth accumulator
    stays zero): each sub-block decoded once for the R rows; the next group's weights
    prefetched in the first pass (m = 0)."""
    W = vlanes(tag)
    bs = 148 * W
    nb = K // 256
    x0 = xa + m * K
    xs0 = xsa + 2 * m * (K // 16)
    xss = 2 * (K // 16)
    a0 = vzero_f(tag)
    a1 = vzero_f(tag)
    a2 = vzero_f(tag)
    a3 = vzero_f(tag)
    ahead = nb * bs  # the next group's super-block b lies one group further
    for b in range(nb):
        o = b * bs
        for r in range(R):
            _x_ahead(x0 + r * K, xs0 + r * xss, b + 1)
        s0 = vzero_i(tag)
        s1 = vzero_i(tag)
        s2 = vzero_i(tag)
        s3 = vzero_i(tag)
        n0 = vzero_i(tag)
        n1 = vzero_i(tag)
        n2 = vzero_i(tag)
        n3 = vzero_i(tag)
        for s in range(8):
            if m == 0:  # the first pass over the group: the next one's weights
                _w_part(wa, o + ahead + s * (bs // 8), bs // 8)
            qs = _nib8(wa, o + 20 * W + 16 * W * s, tag)
            mp = _pair_u8(wa, o + 12 * W + s * W, tag)
            s0, n0 = _k4_sub(wa, o, s, qs, mp, x0, xs0, b, s0, n0, tag)
            s1, n1 = _k4_sub(wa, o, s, qs, mp, x0 + K, xs0 + xss, b, s1, n1, tag)
            s2, n2 = _k4_sub(wa, o, s, qs, mp, x0 + 2 * K, xs0 + 2 * xss, b, s2, n2, tag)
            if R == 4:
                s3, n3 = _k4_sub(wa, o, s, qs, mp, x0 + 3 * K, xs0 + 3 * xss, b, s3, n3, tag)
        i = m * nb + b
        a0 = _k4_end(wa, o, ldf(xda, i), s0, n0, a0, tag)
        a1 = _k4_end(wa, o, ldf(xda, i + nb), s1, n1, a1, tag)
        a2 = _k4_end(wa, o, ldf(xda, i + 2 * nb), s2, n2, a2, tag)
        if R == 4:
            a3 = _k4_end(wa, o, ldf(xda, i + 3 * nb), s3, n3, a3, tag)
    return a0, a1, a2, a3
