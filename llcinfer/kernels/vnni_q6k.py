"""The per-group inner loops of vnni_matmul.py for Q6_K (256-value super-blocks of 6-bit
weights, 16 scales of 16 values): one group of W packed weight rows against one row
(``runk6_1``), two (``runk6_2``), or three or four rows (``runk6_4``) of int8
activations.  The prefetching and the tile rules are vnni_kquant.py's (Q4_K);
vnni_matmul.py explains the arithmetic, repack.py the layout.
"""

from ..jit import kernel
from .simd import ldf, vbcast4, vlanes, vload, vload_f16, vload_s8, vsplat
from .simd_math import vand, vcvt, vdot_i16, vdot_u6_scaled, vfma, vmul, vor, vshl, vshr, vzero_f, vzero_i
from .vnni_blocks import _nib8, _w_part
from .vnni_kquant import K_AHEAD, _x_ahead


@kernel
def _x4(xr, k0, tag):
    """The activation bytes of the 4 k-groups of a 16-value sub-block, each broadcast."""
    return vbcast4(xr, k0, tag), vbcast4(xr, k0 + 4, tag), vbcast4(xr, k0 + 8, tag), vbcast4(xr, k0 + 12, tag)


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
def _bias_pair(wa, at, tag):
    """-32 times the scales of sub-blocks 2c, 2c+1 (W signed bytes each, from byte ``at``)
    as one i16 pair per lane, for vdot_i16."""
    W = vlanes(tag)
    lo = vmul(vload_s8(wa, at, tag), vsplat(-32, tag))
    hi = vmul(vload_s8(wa, at + W, tag), vsplat(-32, tag))
    return vor(vand(lo, vsplat(0xFFFF, tag)), vshl(hi, 16))


@kernel
def _k6_chunk(wa, o, c, qs, bp, xr, xsr, b, isum, tag):
    """Sub-blocks 2c, 2c+1 (16 values each) of the Q6_K block at byte o, one activation row;
    bp their -32 scale pair (_bias_pair).  The weights are stored + 32:
        isum += scale_j * sum (q + 32) x  -  32 scale_j bsum_j     over j = 2c, 2c+1
    (the scales in vdot_u6_scaled, both bias terms in one vpdpwssd)."""
    W = vlanes(tag)
    k0 = 256 * b + 32 * c
    at = o + 2 * W + 2 * c * W  # the scales of sub-block 2c, then 2c+1: W signed bytes each
    isum = vdot_u6_scaled(isum, (qs[0], qs[1], qs[2], qs[3]), _x4(xr, k0, tag), vload_s8(wa, at, tag), tag)
    isum = vdot_u6_scaled(isum, (qs[4], qs[5], qs[6], qs[7]), _x4(xr, k0 + 16, tag), vload_s8(wa, at + W, tag), tag)
    return vdot_i16(isum, bp, vbcast4(xsr, 2 * (16 * b + 2 * c), tag), tag)


@kernel
def _k6_end(wa, o, dx, isum, acc, tag):
    return vfma(vcvt(isum), vmul(vload_f16(wa, o, tag), vsplat(dx, tag)), acc)


@kernel
def runk6_1(wa, xa, xda, xsa, K, m, tag):
    W = vlanes(tag)
    bs = 210 * W
    nb = K // 256
    xr = xa + m * K
    xsr = xsa + 2 * m * (K // 16)
    acc = vzero_f(tag)
    for b in range(nb):
        o = b * bs
        _x_ahead(xr, xsr, b + 1)
        isum = vzero_i(tag)
        for c in range(8):
            _w_part(wa, o + K_AHEAD + c * (bs // 8), bs // 8)
            qs = _dec6(wa, o + 18 * W + 24 * W * c, tag)
            bp = _bias_pair(wa, o + 2 * W + 2 * c * W, tag)
            isum = _k6_chunk(wa, o, c, qs, bp, xr, xsr, b, isum, tag)
        acc = _k6_end(wa, o, ldf(xda, m * nb + b), isum, acc, tag)
    return acc


@kernel
def runk6_2(wa, xa, xda, xsa, K, m, tag):
    """Rows m, m+1, as runk4_2."""
    W = vlanes(tag)
    bs = 210 * W
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
        for c in range(8):
            if m == 0:  # the first pass over the group: the next one's weights
                _w_part(wa, o + ahead + c * (bs // 8), bs // 8)
            qs = _dec6(wa, o + 18 * W + 24 * W * c, tag)
            bp = _bias_pair(wa, o + 2 * W + 2 * c * W, tag)
            s0 = _k6_chunk(wa, o, c, qs, bp, x0, xs0, b, s0, tag)
            s1 = _k6_chunk(wa, o, c, qs, bp, x0 + K, xs0 + xss, b, s1, tag)
        i = m * nb + b
        a0 = _k6_end(wa, o, ldf(xda, i), s0, a0, tag)
        a1 = _k6_end(wa, o, ldf(xda, i + nb), s1, a1, tag)
    return a0, a1


@kernel
def runk6_4(wa, xa, xda, xsa, K, m, R, tag):
    """Rows m..m+R-1, R = 4 or 3, as runk4_4."""
    W = vlanes(tag)
    bs = 210 * W
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
        for c in range(8):
            if m == 0:  # the first pass over the group: the next one's weights
                _w_part(wa, o + ahead + c * (bs // 8), bs // 8)
            qs = _dec6(wa, o + 18 * W + 24 * W * c, tag)
            bp = _bias_pair(wa, o + 2 * W + 2 * c * W, tag)
            s0 = _k6_chunk(wa, o, c, qs, bp, x0, xs0, b, s0, tag)
            s1 = _k6_chunk(wa, o, c, qs, bp, x0 + K, xs0 + xss, b, s1, tag)
            s2 = _k6_chunk(wa, o, c, qs, bp, x0 + 2 * K, xs0 + 2 * xss, b, s2, tag)
            if R == 4:
                s3 = _k6_chunk(wa, o, c, qs, bp, x0 + 3 * K, xs0 + 3 * xss, b, s3, tag)
        i = m * nb + b
        a0 = _k6_end(wa, o, ldf(xda, i), s0, a0, tag)
        a1 = _k6_end(wa, o, ldf(xda, i + nb), s1, a1, tag)
        a2 = _k6_end(wa, o, ldf(xda, i + 2 * nb), s2, a2, tag)
        if R == 4:
            a3 = _k6_end(wa, o, ldf(xda, i + 3 * nb), s3, a3, tag)
    return a0, a1, a2, a3
