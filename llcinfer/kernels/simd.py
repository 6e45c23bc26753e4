"""Explicit SIMD for numba kernels: LLVM vector types and x86 intrinsics via llvmlite.

A numba type ``Vec`` lowers to an LLVM vector (``<16 x i32>``, ``<8 x float>``, ...), so a
kernel written in Python keeps its accumulators in zmm/ymm registers.  Every operation is
an ``@intrinsic`` emitting LLVM IR with llvmlite's builder: here the types, tags, loads,
stores and prefetches; the arithmetic (FMA, dpbusd, reductions, exp) is in simd_math.py.

The vector width comes from a *tag*: an empty NumPy array whose dtype names the path
(``TAGS``).  A kernel called with another tag is another numba specialization, so one
source serves the 512-bit and 256-bit paths, and the on-disk cache keeps them apart.

    avx512vnni  W = 16 lanes of 32 bits (zmm), dpbusd = vpdpbusd zmm
    avxvnni     W = 8 (ymm),  dpbusd = vpdpbusd ymm
    avx2        W = 8 (ymm),  dpbusd = vpmaddubsw, results summed in i16 as far as the
                weights' range allows, then vpmaddwd (simd_math._dot_ir)

Integer vectors hold 32-bit lanes; a u8/s8 operand of dpbusd is the same register seen as
4 bytes per lane.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

# path name -> tag dtype;  lanes per tag dtype
TAGS = {"avx512vnni": np.dtype(np.int64), "avxvnni": np.dtype(np.int32), "avx2": np.dtype(np.int16)}
_LANES = {np.dtype(np.int64): 16, np.dtype(np.int32): 8, np.dtype(np.int16): 8}
_MODE = {np.dtype(np.int64): "vnni", np.dtype(np.int32): "vnni", np.dtype(np.int16): "emul"}


def make_tag(isa: str) -> np.ndarray:
    """The tag array for a path name of ``TAGS``."""
    return np.empty(0, TAGS[isa])


def lanes(isa: str) -> int:
    return _LANES[TAGS[isa]]


def lanes_of(tag: np.ndarray) -> int:
    """Lanes of a tag array (make_tag) from Python."""
    return _LANES[tag.dtype]


class Vec(types.Type):
    """An LLVM vector of ``n`` lanes: 32-bit ints (is_float False) or float32."""

    def __init__(self, n: int, is_float: bool):
        self.n = n
        self.is_float = is_float
        super().__init__(name=f"Vec{n}x{'f32' if is_float else 'i32'}")


@register_model(Vec)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        elt = ir.FloatType() if fe_type.is_float else ir.IntType(32)
        super().__init__(dmm, fe_type, ir.VectorType(elt, fe_type.n))


class VTag(types.Type):
    """A tag as a plain value (one byte, no reference count): what kernels pass down to
    their helpers, since every array argument costs NRT_incref/decref calls that spill the
    vector registers in a hot loop."""

    def __init__(self, n: int, mode: str):
        self.n = n
        self.mode = mode
        super().__init__(name=f"VTag{n}{mode}")


@register_model(VTag)
class _VTagModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.IntType(8))


_I8, _I16, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()


def _tag_info(tag):
    if isinstance(tag, VTag):
        return tag.n, tag.mode
    if not isinstance(tag, types.Array):
        raise TypeError("simd: the tag must be an array from make_tag() or a vtag()")
    dt = np.dtype(str(tag.dtype))
    return _LANES[dt], _MODE[dt]


@intrinsic
def vtag(typingctx, tag):
    """The tag array as a VTag value (pass this to helper functions)."""
    n, mode = _tag_info(tag)

    def codegen(context, builder, sig, args):
        return ir.Constant(ir.IntType(8), 0)

    return VTag(n, mode)(tag), codegen


def _ptr(context, builder, arr_ty, arr, off):
    """i8* to element ``off`` of a contiguous array, or to byte ``off`` past an address
    (an int from ``addr``: hot loops pass addresses, not arrays, so that numba emits no
    reference counting calls there, which would spill every vector register)."""
    if isinstance(arr_ty, types.Integer):
        base = builder.inttoptr(arr, _I8.as_pointer())
        return builder.gep(base, [off])
    data = context.make_array(arr_ty)(context, builder, arr).data
    p = builder.gep(data, [off])
    return builder.bitcast(p, _I8.as_pointer())


@intrinsic
def addr(typingctx, arr):
    """The data address of a contiguous array as an int64 (the caller keeps the array alive)."""

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        return builder.ptrtoint(data, _I64)

    return types.int64(arr), codegen


@intrinsic
def ldf(typingctx, a, i):
    """float32 element i at address a."""

    def codegen(context, builder, sig, args):
        p = builder.inttoptr(args[0], _F32.as_pointer())
        return builder.load(builder.gep(p, [args[1]]))

    return types.float32(a, i), codegen


@intrinsic
def stf(typingctx, a, i, v):
    """float32 element i at address a = v."""

    def codegen(context, builder, sig, args):
        p = builder.inttoptr(args[0], _F32.as_pointer())
        builder.store(context.cast(builder, args[2], sig.args[2], types.float32), builder.gep(p, [args[1]]))
        return context.get_dummy_value()

    return types.none(a, i, v), codegen


@intrinsic
def ldi(typingctx, a, i):
    """int32 element i at address a."""

    def codegen(context, builder, sig, args):
        p = builder.inttoptr(args[0], _I32.as_pointer())
        return builder.load(builder.gep(p, [args[1]]))

    return types.int32(a, i), codegen


def _splat(builder, val, n):
    vty = ir.VectorType(val.type, n)
    v = builder.insert_element(ir.Constant(vty, ir.Undefined), val, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(vty, ir.Undefined), ir.Constant(ir.VectorType(_I32, n), None))


def _vty(n, is_float=False):
    return ir.VectorType(_F32 if is_float else _I32, n)


# ------------------------------------------------------------------------------ loads
@intrinsic
def vlanes(typingctx, tag):
    """Number of 32-bit lanes of the tag's vectors (a compile-time constant)."""
    n, _ = _tag_info(tag)

    def codegen(context, builder, sig, args):
        return ir.Constant(_I64, n)

    return types.int64(tag), codegen


@intrinsic
def vload(typingctx, arr, off, tag):
    """4*W bytes of a contiguous array from element ``off`` as an int vector (unaligned)."""
    n, _ = _tag_info(tag)
    ret = Vec(n, False)

    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1])
        return builder.load(builder.bitcast(p, _vty(n).as_pointer()), align=1)

    return ret(arr, off, tag), codegen


@intrinsic
def vloadf(typingctx, arr, off, tag):
    """W float32 of a contiguous float32 array from element ``off``."""
    n, _ = _tag_info(tag)
    ret = Vec(n, True)

    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1])
        return builder.load(builder.bitcast(p, _vty(n, True).as_pointer()), align=1)

    return ret(arr, off, tag), codegen


@intrinsic
def vload_f16(typingctx, arr, off, tag):
    """W IEEE halves at element ``off`` of a byte array, widened to float32 (vcvtph2ps)."""
    n, _ = _tag_info(tag)
    ret = Vec(n, True)

    def codegen(context, builder, sig, args):
        return load_as_f32(builder, _ptr(context, builder, sig.args[0], args[0], args[1]), n, 1)

    return ret(arr, off, tag), codegen


def _bytes_to_lanes(signed: bool):
    """An intrinsic loading W bytes at element ``off`` of a byte array, extended to 32-bit
    lanes (sign-extended if ``signed``, else zero-extended)."""

    def load(typingctx, arr, off, tag):
        n, _ = _tag_info(tag)

        def codegen(context, builder, sig, args):
            p = _ptr(context, builder, sig.args[0], args[0], args[1])
            b = builder.load(builder.bitcast(p, ir.VectorType(_I8, n).as_pointer()), align=1)
            return (builder.sext if signed else builder.zext)(b, _vty(n))

        return Vec(n, False)(arr, off, tag), codegen

    return intrinsic(load)


vload_u8 = _bytes_to_lanes(signed=False)  # W bytes, zero-extended to 32-bit lanes
vload_s8 = _bytes_to_lanes(signed=True)  # W bytes, sign-extended to 32-bit lanes


@intrinsic
def vbcast4(typingctx, arr, off, tag):
    """The 4 bytes at element ``off`` of a byte array, as one i32 broadcast to every lane
    (folds into vpdpbusd's {1toN} memory operand)."""
    n, _ = _tag_info(tag)
    ret = Vec(n, False)

    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1])
        v = builder.load(builder.bitcast(p, _I32.as_pointer()), align=1)
        return _splat(builder, v, n)

    return ret(arr, off, tag), codegen


@intrinsic
def vsplat(typingctx, val, tag):
    """Scalar broadcast: an int gives an int vector, a float a float vector."""
    n, _ = _tag_info(tag)
    is_float = isinstance(val, types.Float)
    ret = Vec(n, is_float)

    def codegen(context, builder, sig, args):
        v = args[0]
        if is_float:
            v = context.cast(builder, v, sig.args[0], types.float32)
        else:
            v = context.cast(builder, v, sig.args[0], types.int32)
        return _splat(builder, v, n)

    return ret(val, tag), codegen


@intrinsic
def vstoref(typingctx, arr, off, vec):
    """Store a float vector at element ``off`` of a contiguous float32 array (unaligned)."""

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        p = builder.gep(data, [args[1]])
        builder.store(args[2], builder.bitcast(p, args[2].type.as_pointer()), align=1)
        return context.get_dummy_value()

    return types.none(arr, off, vec), codegen


@intrinsic
def vlane(typingctx, vec, i):
    """Lane ``i`` of a vector as a scalar (float32 or int32)."""
    ret = types.float32 if vec.is_float else types.int32

    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], context.cast(builder, args[1], sig.args[1], types.int32))

    return ret(vec, i), codegen


_ELT_KINDS = {np.dtype(np.float32): 0, np.dtype(np.uint16): 1, np.dtype(np.int8): 2}


def elt_kind(arr) -> int | None:
    """What the elements of an array type hold, for ``load_as_f32`` (typing time): 0
    float32, 1 IEEE half bit patterns (uint16), 2 int8; None for anything else."""
    if not isinstance(arr, types.Array):
        return None
    return _ELT_KINDS.get(np.dtype(str(arr.dtype)))


def load_as_f32(builder, p, n, kind):
    """IR: ``n`` elements at i8* ``p`` (unaligned) widened to <n x float>; kind as
    ``elt_kind`` (a half vector becomes one vcvtph2ps)."""
    if kind == 0:
        return builder.load(builder.bitcast(p, _vty(n, True).as_pointer()), align=1)
    if kind == 1:
        h = builder.load(builder.bitcast(p, ir.VectorType(ir.HalfType(), n).as_pointer()), align=1)
        return builder.fpext(h, _vty(n, True))
    b = builder.load(builder.bitcast(p, ir.VectorType(_I8, n).as_pointer()), align=1)
    return builder.sitofp(b, _vty(n, True))


def splat_ir(builder, val, n):
    """IR: a scalar broadcast to ``n`` lanes."""
    return _splat(builder, val, n)


def lane_mask_ir(builder, n, count):
    """IR: <n x i1>, lane i true iff i < count (an i64 value)."""
    iota = ir.Constant(ir.VectorType(_I64, n), list(range(n)))
    return builder.icmp_signed("<", iota, _splat(builder, count, n))


@intrinsic
def vstore(typingctx, arr, off, vec):
    """Store a vector at element ``off`` of a contiguous array, or at byte ``off`` past an
    int address (``addr``), unaligned."""

    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1])
        builder.store(args[2], builder.bitcast(p, args[2].type.as_pointer()), align=1)
        return context.get_dummy_value()

    return types.none(arr, off, vec), codegen


def prefetch_ir(builder, p, locality=2):
    """IR: prefetch the cache line at i8* ``p``, towards L2 (locality 2: prefetcht1) or L1
    (3: prefetcht0); never faults."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [p.type, _I32, _I32, _I32]),
                                        "llvm.prefetch.p0")
    builder.call(fn, [p, ir.Constant(_I32, 0), ir.Constant(_I32, locality), ir.Constant(_I32, 1)])


@intrinsic
def prefetch_l2(typingctx, a, off):
    """Prefetch the cache line at byte ``off`` past int address ``a`` (or element ``off``
    of an array) towards L2 (prefetcht1); never faults."""

    def codegen(context, builder, sig, args):
        prefetch_ir(builder, _ptr(context, builder, sig.args[0], args[0], args[1]))
        return context.get_dummy_value()

    return types.none(a, off), codegen


@intrinsic
def prefetch_l1(typingctx, a, off):
    """As ``prefetch_l2``, towards L1 (prefetcht0)."""

    def codegen(context, builder, sig, args):
        prefetch_ir(builder, _ptr(context, builder, sig.args[0], args[0], args[1]), 3)
        return context.get_dummy_value()

    return types.none(a, off), codegen
