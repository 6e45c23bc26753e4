"""Vector exponentials on simd.py's float vectors: e**x (softmax, SiLU; Cephes expf) and
a cheaper 2**y for the sparse indexer's scores, which rank blocks and need no last ulp.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba.extending import intrinsic

from .simd import _vty
from .simd_math import _fintrinsic, _float_vec, _max_ir, _min_ir, fma_ir

_EXP_LO, _EXP_HI = -87.33654, 88.0  # below: 0 (f32 underflow); above: clamped
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
             5.0000001201e-1)  # Cephes expf, on [-ln2/2, ln2/2]


def exp_ir(builder, x):
    """IR: lane-wise e**x of a float vector: Cephes expf (range reduction by ln2 in two
    parts, degree-6 polynomial, 2**n through the exponent bits); within 2 ulp, 0 below
    -87.3 (exp(_NEG) is exactly 0)."""
    n = x.type.count
    vt = _vty(n, True)

    def c(v):
        return ir.Constant(vt, [float(np.float32(v))] * n)

    xc = _min_ir(builder, _max_ir(builder, x, c(_EXP_LO)), c(_EXP_HI))
    fx = _fintrinsic(builder, "floor", [fma_ir(builder, xc, c(1.44269504088896341), c(0.5))])
    r = fma_ir(builder, fx, c(-0.693359375), xc)
    r = fma_ir(builder, fx, c(2.12194440e-4), r)
    y = c(_EXP_POLY[0])
    for k in _EXP_POLY[1:]:
        y = fma_ir(builder, y, r, c(k))
    y = fma_ir(builder, y, builder.fmul(r, r), builder.fadd(r, c(1.0)))
    e = builder.shl(builder.add(builder.fptosi(fx, _vty(n)), ir.Constant(_vty(n), [127] * n)),
                    ir.Constant(_vty(n), [23] * n))
    y = builder.fmul(y, builder.bitcast(e, vt))
    return builder.select(builder.fcmp_ordered("<", x, c(_EXP_LO)), ir.Constant(vt, None), y)


@intrinsic
def vexp(typingctx, a):
    """Lane-wise e**a of a float vector (``exp_ir``)."""
    if not _float_vec(a):
        return None

    def codegen(context, builder, sig, args):
        return exp_ir(builder, args[0])

    return a(a), codegen


_EXP2_LO, _EXP2_HI = -125.0, 127.0  # 2**n stays a normal float's exponent
# 2**f on [-1/2, 1/2], degree 4, fitted for relative error (within 2.8e-6), c0 first
_EXP2_POLY = (0.99999916553, 0.69312196970, 0.24024981260, 0.05591703951, 0.00956051797)


def exp2_ir(builder, y):
    """IR: lane-wise 2**y of a float vector, y clamped to [-125, 127]: n = round(y),
    f = y - n in [-1/2, 1/2], 2**y = p(f) 2**n with n added into p's exponent bits."""
    n = y.type.count
    vt, it = _vty(n, True), _vty(n)

    def c(v):
        return ir.Constant(vt, [float(np.float32(v))] * n)

    yc = _min_ir(builder, _max_ir(builder, y, c(_EXP2_LO)), c(_EXP2_HI))
    rn = _fintrinsic(builder, "rint", [yc])
    f = builder.fsub(yc, rn)
    p = c(_EXP2_POLY[-1])
    for k in reversed(_EXP2_POLY[:-1]):  # Horner: ((c4 f + c3) f + c2) f ...
        p = fma_ir(builder, p, f, c(k))
    e = builder.shl(builder.fptosi(rn, it), ir.Constant(it, [23] * n))
    return builder.bitcast(builder.add(builder.bitcast(p, it), e), vt)


@intrinsic
def vexp2(typingctx, a):
    """Lane-wise 2**a of a float vector (``exp2_ir``: within 2.8e-6 relative)."""
    if not _float_vec(a):
        return None

    def codegen(context, builder, sig, args):
        return exp2_ir(builder, args[0])

    return a(a), codegen
