"""SwiGLU feed-forward activation.

    y = silu(gate) * up,   silu(g) = g / (1 + exp(-g))

exp(-g) is clamped so a very negative gate gives 0 instead of inf/inf (fastmath assumes
no infinities, and g / (1 + inf) came out NaN).  With a ``tag`` (simd.make_tag) the
exponentials are vectors (simd_exp.vexp, within 2 ulp of expf, its own clamp at +-87); the
scalar loop called libm's expf once per value, 10 % of a Qwen2.5-0.5B prefill.
"""

import numpy as np

from ..jit import inline_kernel, kernel
from .simd import addr, ldf, stf, vlanes, vloadf, vsplat, vstore, vtag
from .simd_exp import vexp
from .simd_math import vadd, vdiv, vmul, vsub, vzero_f


@inline_kernel
def _silu_mul(g, u):
    """silu(g) * u in scalars, exp(-g) clamped (see the module doc)."""
    return g / (np.float32(1.0) + np.exp(min(-g, np.float32(80.0)))) * u


@kernel
def _swiglu_scalar(gate, up, y, m):
    for f in range(gate.shape[1]):
        y[m, f] = _silu_mul(gate[m, f], up[m, f])


@kernel
def swiglu_cols(ga, ua, ya, M, F, f0, f1, vt):
    """Columns [f0, f1) of swiglu on [M, F] f32 rows by address (gate at ga, up at ua, y at
    ya; no array arguments, so nothing reference counted per call); vt a VTag."""
    W = vlanes(vt)
    one = vsplat(np.float32(1.0), vt)
    for m in range(M):
        f = f0
        while f + W <= f1:
            o = 4 * (m * F + f)
            g = vloadf(ga, o, vt)
            e = vexp(vsub(vzero_f(vt), g))
            vstore(ya, o, vmul(vdiv(g, vadd(one, e)), vloadf(ua, o, vt)))
            f += W
        while f < f1:
            stf(ya, m * F + f, _silu_mul(ldf(ga, m * F + f), ldf(ua, m * F + f)))
            f += 1


@kernel
def _swiglu_simd(gate, up, y, vt):
    for m in range(gate.shape[0]):  # rows may be strided: one call per row
        swiglu_cols(addr(gate[m]), addr(up[m]), addr(y[m]), 1, gate.shape[1], 0, gate.shape[1], vt)


@kernel
def swiglu(gate, up, y, tag=None):
    """gate, up, y  # [M, F] f32, rows contiguous (y may alias gate); tag: the SIMD path,
    None for the scalar loop."""
    if tag is None:
        for m in range(gate.shape[0]):
            _swiglu_scalar(gate, up, y, m)
    else:
        _swiglu_simd(gate, up, y, vtag(tag))
