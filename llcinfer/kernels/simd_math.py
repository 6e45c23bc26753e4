"""Arithmetic on simd.py's vectors: lane-wise integer / float operations, shifts, the
int -> float conversion, FMA, the u8 x s8 dot product (vpdpbusd, or its AVX2 emulation),
max / horizontal reductions (the exponentials are in simd_exp.py).

Every operation is an ``@intrinsic`` emitting LLVM IR (see simd.py for the ``Vec`` type and
the width tags); the ``*_ir`` helpers emit the same IR inside other intrinsics.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .simd import _I8, _I16, _I32, Vec, _splat, _tag_info, _vty

# -------------------------------------------------------------------------- arithmetic
def _binop(name, int_op, float_op=None):
    def impl(typingctx, a, b):
        if not (isinstance(a, Vec) and a == b):
            return None
        op = float_op if a.is_float else int_op
        if op is None:
            return None

        def codegen(context, builder, sig, args):
            return getattr(builder, op)(args[0], args[1])

        return a(a, b), codegen

    impl.__name__ = name
    return intrinsic(impl)


vadd = _binop("vadd", "add", "fadd")
vsub = _binop("vsub", "sub", "fsub")
vmul = _binop("vmul", "mul", "fmul")  # vpmulld for ints
vdiv = _binop("vdiv", None, "fdiv")  # floats only
vand = _binop("vand", "and_")
vor = _binop("vor", "or_")


@intrinsic
def vshr(typingctx, a, k):
    """Logical shift right of every 32-bit lane by the constant ``k``."""

    def codegen(context, builder, sig, args):
        n = sig.args[0].n
        s = _splat(builder, context.cast(builder, args[1], sig.args[1], types.int32), n)
        return builder.lshr(args[0], s)

    return a(a, k), codegen


@intrinsic
def vshl(typingctx, a, k):
    """Shift left of every 32-bit lane by the constant ``k``."""

    def codegen(context, builder, sig, args):
        n = sig.args[0].n
        s = _splat(builder, context.cast(builder, args[1], sig.args[1], types.int32), n)
        return builder.shl(args[0], s)

    return a(a, k), codegen


@intrinsic
def vcvt(typingctx, a):
    """int32 lanes -> float32 lanes (vcvtdq2ps)."""
    ret = Vec(a.n, True)

    def codegen(context, builder, sig, args):
        return builder.sitofp(args[0], _vty(sig.args[0].n, True))

    return ret(a), codegen


@intrinsic
def vfma(typingctx, a, b, c):
    """a * b + c on float vectors (vfmadd)."""

    def codegen(context, builder, sig, args):
        return fma_ir(builder, *args)

    return a(a, b, c), codegen


@intrinsic
def vzero_i(typingctx, tag):
    """An int vector of zeros."""
    n, _ = _tag_info(tag)

    def codegen(context, builder, sig, args):
        return ir.Constant(_vty(n), None)

    return Vec(n, False)(tag), codegen


@intrinsic
def vzero_f(typingctx, tag):
    """A float vector of zeros."""
    n, _ = _tag_info(tag)

    def codegen(context, builder, sig, args):
        return ir.Constant(_vty(n, True), None)

    return Vec(n, True)(tag), codegen


def _vpdpbusd_ir(builder, acc, a, b, n):
    """vpdpbusd (AVX512-VNNI / AVX-VNNI): acc + per-lane sum of 4 products u8(a) x s8(b)."""
    vt = _vty(n)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt, vt]),
                                        f"llvm.x86.avx512.vpdpbusd.{32 * n}")
    return builder.call(fn, [acc, a, b])


def _maddubs_ir(builder, a, b, n):
    """vpmaddubsw: u8(a) x s8(b), adjacent pairs summed -> <2n x i16>."""
    b8 = ir.VectorType(_I8, 4 * n)
    w16 = ir.VectorType(_I16, 2 * n)
    f = cgutils.get_or_insert_function(builder.module, ir.FunctionType(w16, [b8, b8]), "llvm.x86.avx2.pmadd.ub.sw")
    return builder.call(f, [builder.bitcast(a, b8), builder.bitcast(b, b8)])


def _maddwd_ir(builder, p16, k, n):
    """vpmaddwd: i16 pairs -> k[2i] p[2i] + k[2i+1] p[2i+1] as i32 lanes; k an int (the
    constant in every half) or an <n x i32> vector read as i16 halves."""
    w16 = ir.VectorType(_I16, 2 * n)
    f = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_vty(n), [w16, w16]), "llvm.x86.avx2.pmadd.wd")
    k16 = ir.Constant(w16, [k] * (2 * n)) if isinstance(k, int) else builder.bitcast(k, w16)
    return builder.call(f, [p16, k16])


def _dot_ir(builder, acc, qs, xs, n, mode, bits):
    """acc + sum over j of the per-lane dot of 4 bytes: u8(qs[j]) x s8(xs[j]); weight bytes
    below 2**bits (bits 8: any u8).

    VNNI: two interleaved vpdpbusd chains; one chain for the 6-bit type (Q6_K dots 4
    k-groups per sub-block, and its 4-row tile has 8 chains in flight without the split:
    the joining add cost more than the latency it hid).  AVX2 has no vpdpbusd; one
    vpmaddubsw gives i16 pair sums (2 products), and vpmaddwd with ones turns i16 pairs
    into the i32 lane.  With
    weights < 2**bits and |x| <= 128 a pair sum is at most 2 (2**bits - 1) 128, so
        g = 32767 // (256 (2**bits - 1))    (8 for 4-bit, 4 for 5-bit, 2 for 6-bit weights)
    vpmaddubsw results add up in i16 (vpaddw) without overflow before one vpmaddwd: per
    32 values of a 4-bit type 8 + 1 multiplies instead of 8 + 8.  Full-range bytes (bits
    8, Q8_0 + 128) are dotted as signed bytes by _signed_dot_ir, which returns
    sum (q - 128) x without acc: the caller's acc there is VNNI's -128 sum(x) correction."""
    if mode == "vnni":
        if bits == 6:
            for q, x in zip(qs, xs):
                acc = _vpdpbusd_ir(builder, acc, q, x, n)
            return acc
        chains = [acc, ir.Constant(_vty(n), None)]
        for j, (q, x) in enumerate(zip(qs, xs)):
            chains[j % 2] = _vpdpbusd_ir(builder, chains[j % 2], q, x, n)
        return builder.add(chains[0], chains[1]) if len(qs) > 1 else chains[0]
    if bits == 8:
        return _signed_dot_ir(builder, qs, xs, n)
    g = _i16_group(bits)
    for c in range(0, len(qs), g):
        acc = builder.add(acc, _maddwd_ir(builder, _sum16(builder, qs[c:c + g], xs[c:c + g], n), 1, n))
    return acc


def _i16_group(bits):
    """How many vpmaddubsw results of weights below 2**bits add up in i16 lanes (_dot_ir)."""
    return max(1, 32767 // (256 * ((1 << bits) - 1)))


def _signed_dot_ir(builder, qs, xs, n):
    """sum over j of the per-lane dot of 4 bytes: (u8(qs[j]) - 128) x s8(xs[j]), on AVX2,
    with |x| <= 127 (Q8_0 activations: round(x / (max|x| / 127))).

    llama.cpp's sign trick: with w = q - 128 (q xor 0x80), w x = |w| (sign(w) x), so one
    vpmaddubsw of |w| (u8, at most 128) by vpsignb(x, w) (s8) gives pair sums of at most
    2 128 127 = 32512, and one vpmaddwd with ones the i32 lane: per k-group xor, abs,
    sign, 2 multiplies.  (Splitting q into nibbles instead took 2 shifts / masks, 2
    vpmaddubsw and 2 vpaddw per k-group; its i16 sums saved only the vpmaddwd.)"""
    b8 = ir.VectorType(_I8, 4 * n)
    bias = ir.Constant(b8, [-128] * (4 * n))
    fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(b8, [b8, ir.IntType(1)]),
                                          f"llvm.abs.v{4 * n}i8")
    fsign = cgutils.get_or_insert_function(builder.module, ir.FunctionType(b8, [b8, b8]), "llvm.x86.avx2.psign.b")
    sums = []
    for q, x in zip(qs, xs):
        w = builder.xor(builder.bitcast(q, b8), bias)
        p16 = _maddubs_ir(builder, builder.call(fabs, [w, ir.Constant(ir.IntType(1), 0)]),
                          builder.call(fsign, [builder.bitcast(x, b8), w]), n)
        sums.append(_maddwd_ir(builder, p16, 1, n))
    return _tree_add(builder, sums)


def _tree_add(builder, vs):
    """The sum of the vectors vs as a balanced tree of adds (not one chain)."""
    while len(vs) > 1:
        vs = [builder.add(vs[i], vs[i + 1]) if i + 1 < len(vs) else vs[i] for i in range(0, len(vs), 2)]
    return vs[0]


def _sum16(builder, qs, xs, n):
    """sum of vpmaddubsw(qs[j], xs[j]) in i16 lanes (the caller bounds it), as a tree."""
    return _tree_add(builder, [_maddubs_ir(builder, q, x, n) for q, x in zip(qs, xs)])


def _same_tuples(qs, xs) -> bool:
    """Whether the weight and activation operands are tuples of one length (a vdot's typing)."""
    return isinstance(qs, types.UniTuple) and isinstance(xs, types.UniTuple) and qs.count == xs.count


def _tuple_items(builder, sig, args):
    """The vectors of a vdot's weight and activation tuples (arguments 1 and 2)."""
    k = sig.args[1].count
    return ([builder.extract_value(args[1], j) for j in range(k)],
            [builder.extract_value(args[2], j) for j in range(k)])


def _make_vdot(bits):
    def impl(typingctx, acc, qs, xs, tag):
        n, mode = _tag_info(tag)
        if not _same_tuples(qs, xs):
            return None

        def codegen(context, builder, sig, args):
            q, x = _tuple_items(builder, sig, args)
            return _dot_ir(builder, args[0], q, x, n, mode, bits)

        return acc(acc, qs, xs, tag), codegen

    impl.__name__ = f"vdot_u{bits}"
    return intrinsic(impl)


# acc + sum_j dpbusd(qs[j], xs[j]) over tuples of k-group vectors, weights below 2**bits
vdot_u4 = _make_vdot(4)  # Q4_0, Q4_1 nibbles
vdot_u5 = _make_vdot(5)  # Q5_0
# Q8_0 stored + 128: acc + sum_j (u8(qs[j]) - 128) s8(xs[j]), acc = -128 sum(x) on VNNI
# (its unsigned dot needs the correction); the AVX2 path dots the signed bytes and drops acc
vdot_q8 = _make_vdot(8)


def _make_vdot_scaled(bits):
    def impl(typingctx, acc, qs, xs, scale, tag):
        """acc + scale * sum_j dpbusd(qs[j], xs[j]): a K-quant sub-block's integer dot times
        its scale (an i32 per lane, |scale| <= 2**15), weights below 2**bits.

        VNNI: the vpdpbusd chains from zero, one vpmulld, one add.  AVX2: the scale goes
        into the vpmaddwd that widens the i16 sums (its other operand, ones in _dot_ir):
            acc += vpmaddwd(sum of g vpmaddubsw, (scale, scale) per lane)
        which drops the vpmulld and its add; the (scale, scale) pair is built here, and
        LLVM builds it once for the rows that share a weight block."""
        n, mode = _tag_info(tag)
        if not _same_tuples(qs, xs):
            return None

        def codegen(context, builder, sig, args):
            q, x = _tuple_items(builder, sig, args)
            acc, s, lanes = args[0], args[3], _vty(n)
            if mode == "vnni":
                return builder.add(acc, builder.mul(_dot_ir(builder, ir.Constant(lanes, None), q, x, n, mode, bits), s))
            low, shift = ir.Constant(lanes, [0xFFFF] * n), ir.Constant(lanes, [16] * n)
            pair = builder.or_(builder.and_(s, low), builder.shl(s, shift))  # (scale, scale) as i16 halves
            g = _i16_group(bits)
            for c in range(0, len(q), g):
                acc = builder.add(acc, _maddwd_ir(builder, _sum16(builder, q[c:c + g], x[c:c + g], n), pair, n))
            return acc

        return acc(acc, qs, xs, scale, tag), codegen

    impl.__name__ = f"vdot_u{bits}_scaled"
    return intrinsic(impl)


vdot_u4_scaled = _make_vdot_scaled(4)  # Q4_K sub-blocks
vdot_u6_scaled = _make_vdot_scaled(6)  # Q6_K sub-blocks


@intrinsic
def vdot_i16(typingctx, acc, a, b, tag):
    """acc + per lane a.lo b.lo + a.hi b.hi, each 32-bit lane read as two signed 16-bit
    halves: vpdpwssd on VNNI, vpmaddwd + vpaddd on AVX2 (the K-quants' scale x block-sum
    terms, two sub-blocks per instruction)."""
    n, mode = _tag_info(tag)

    def codegen(context, builder, sig, args):
        vt = _vty(n)
        if mode == "vnni":
            f = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt, vt]),
                                               f"llvm.x86.avx512.vpdpwssd.{32 * n}")
            return builder.call(f, list(args[:3]))
        a16 = builder.bitcast(args[1], ir.VectorType(_I16, 2 * n))
        return builder.add(args[0], _maddwd_ir(builder, a16, args[2], n))

    return acc(acc, a, b, tag), codegen


# ------------------------------------------------- float helpers (softmax, attention)
def _fintrinsic(builder, name, vals):
    t = vals[0].type
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(t, [v.type for v in vals]),
                                        f"llvm.{name}.v{t.count}f32")
    return builder.call(fn, list(vals))


def fma_ir(builder, a, b, c):
    """IR: a * b + c on float vectors of equal width (llvm.fma: vfmadd)."""
    return _fintrinsic(builder, "fma", [a, b, c])


def _max_ir(builder, a, b):
    """a > b ? a : b lane-wise (vmaxps; no NaN ordering, unlike llvm.maxnum)."""
    return builder.select(builder.fcmp_ordered(">", a, b), a, b)


def _min_ir(builder, a, b):
    return builder.select(builder.fcmp_ordered("<", a, b), a, b)


def _float_vec(a):
    return isinstance(a, Vec) and a.is_float


@intrinsic
def vmaxf(typingctx, a, b):
    """Lane-wise max of two float vectors (vmaxps)."""
    if not (_float_vec(a) and a == b):
        return None

    def codegen(context, builder, sig, args):
        return _max_ir(builder, *args)

    return a(a, b), codegen


@intrinsic
def vminf(typingctx, a, b):
    """Lane-wise min of two float vectors (vminps)."""
    if not (_float_vec(a) and a == b):
        return None

    def codegen(context, builder, sig, args):
        return _min_ir(builder, *args)

    return a(a, b), codegen


def _hreduce(builder, v, op):
    n = v.type.count
    while n > 1:
        h = n // 2
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, h), list(range(h))))
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, h), list(range(h, n))))
        v = op(lo, hi)
        n = h
    return builder.extract_element(v, ir.Constant(_I32, 0))


@intrinsic
def vhmax(typingctx, a):
    """The largest lane of a float vector, as a float32 scalar."""
    if not _float_vec(a):
        return None

    def codegen(context, builder, sig, args):
        return _hreduce(builder, args[0], lambda x, y: _max_ir(builder, x, y))

    return types.float32(a), codegen


@intrinsic
def vhsum(typingctx, a):
    """The sum of the lanes of a float vector (pairwise), as a float32 scalar."""
    if not _float_vec(a):
        return None

    def codegen(context, builder, sig, args):
        return _hreduce(builder, args[0], builder.fadd)

    return types.float32(a), codegen
