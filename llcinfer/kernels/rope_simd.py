"""Explicit-SIMD ``rope_append`` for one decode row and one KV group (fused.rope_append is
the scalar form and the fallback): + bias, RoPE on the G query heads and the key head, q
rounded to f16 precision, k and v stored as f16 in the paged pool.

Everything is passed by address (no array arguments: each would be reference counted per
call), and the f32 <-> f16 conversions are single vcvtps2ph / vcvtph2ps instructions
instead of the scalar bit arithmetic of act_quant._half_bits.

RoPE on a vector of W lanes of a head (elements j0 .. j0+W-1), with the row's cos / sin
table cs = [c_0, s_0, c_1, s_1, ...] (rope_table; D floats per row):
    NORM (pairs 2i, 2i+1):  x' = x * C + swap(x) * S,  C = (c_i, c_i), S = (-s_i, +s_i)
        and cs[j0 : j0+W] holds exactly the pairs of these lanes (vrope_norm)
    NEOX (pairs i, i+D/2):  lo' = lo * c - hi * s,  hi' = lo * s + hi * c
        with c, s the even / odd lanes of cs[2 j0 : 2 j0 + 2W] (vcs_deinterleave)
"""

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..jit import kernel
from .paged_attention import kv_index
from .simd import Vec, addr, vlanes, vloadf, vstore, vtag
from .simd_math import fma_ir, vadd, vfma, vmul, vsub

_I16, _I32 = ir.IntType(16), ir.IntType(32)


def _half_vec(builder, v):
    return builder.fptrunc(v, ir.VectorType(ir.HalfType(), v.type.count))


@intrinsic
def vround_f16(typingctx, v):
    """Each lane rounded to the nearest f16 value, to nearest even (vcvtps2ph + vcvtph2ps)."""
    if not (isinstance(v, Vec) and v.is_float):
        return None

    def codegen(context, builder, sig, args):
        return builder.fpext(_half_vec(builder, args[0]), args[0].type)

    return v(v), codegen


@intrinsic
def vstore_f16(typingctx, a, off, v):
    """The lanes as f16 at byte ``off`` past address ``a``, contiguous (vcvtps2ph)."""
    if not (isinstance(v, Vec) and v.is_float):
        return None

    def codegen(context, builder, sig, args):
        h = _half_vec(builder, args[2])
        p = builder.inttoptr(builder.add(args[0], args[1]), h.type.as_pointer())
        builder.store(h, p, align=1)
        return context.get_dummy_value()

    return types.none(a, off, v), codegen


@intrinsic
def vstore_f16_strided(typingctx, a, off, stride, v):
    """Lane i as f16 at byte ``off + i * stride`` past address ``a`` (one conversion, W
    two-byte stores: a token's column of K^T)."""
    if not (isinstance(v, Vec) and v.is_float):
        return None

    def codegen(context, builder, sig, args):
        h = builder.bitcast(_half_vec(builder, args[3]), ir.VectorType(_I16, sig.args[3].n))
        base = builder.add(args[0], args[1])
        for i in range(sig.args[3].n):
            p = builder.inttoptr(builder.add(base, builder.mul(args[2], ir.Constant(args[2].type, i))),
                                 _I16.as_pointer())
            builder.store(builder.extract_element(h, ir.Constant(_I32, i)), p, align=1)
        return context.get_dummy_value()

    return types.none(a, off, stride, v), codegen


def _shuffle(builder, a, b, idx):
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, len(idx)), idx))


@intrinsic
def vrope_norm(typingctx, x, cs):
    """NORM rotation of the lanes of x (pairs of adjacent lanes) by the interleaved cos /
    sin pairs in cs: lane 2i = x_2i c - x_2i+1 s, lane 2i+1 = x_2i+1 c + x_2i s."""
    if not (isinstance(x, Vec) and x.is_float and x == cs):
        return None

    def codegen(context, builder, sig, args):
        xv, csv = args
        n = sig.args[0].n
        c = _shuffle(builder, csv, csv, [2 * (j // 2) for j in range(n)])
        s = _shuffle(builder, csv, csv, [2 * (j // 2) + 1 for j in range(n)])
        sign = ir.Constant(csv.type, [(-1.0 if j % 2 == 0 else 1.0) for j in range(n)])
        swapped = _shuffle(builder, xv, xv, [j ^ 1 for j in range(n)])
        return fma_ir(builder, builder.fmul(swapped, sign), s, builder.fmul(xv, c))

    return x(x, cs), codegen


@intrinsic
def vcs_deinterleave(typingctx, a, b, odd):
    """The even (odd = 0: cos) or odd (odd = 1: sin) lanes of the 2W floats a ++ b."""
    if not (isinstance(a, Vec) and a.is_float and a == b and isinstance(odd, types.IntegerLiteral)):
        return None
    k = odd.literal_value

    def codegen(context, builder, sig, args):
        n = sig.args[0].n
        return _shuffle(builder, args[0], args[1], [2 * j + k for j in range(n)])

    return a(a, b, odd), codegen


@kernel
def rope_append_row(qa, ka, va, bqa, bka, bva, has_bias, csa, G, D, neox, round_q, kdst, kstride, vdst, vt):
    """One row of one KV group: q  # [G, D] f32 at qa, k, v  # [D] f32 at ka, va (rotated
    in place), biases (has_bias) at bqa, bka, bva; cs  # [D/2, 2] the row's cos / sin at csa;
    k stored as f16 at kdst + d * kstride bytes (K^T), v as f16 contiguous at vdst.
    Needs D a multiple of 2W (rope_simd_ok)."""
    W = vlanes(vt)
    half = D // 2
    if has_bias:
        for g in range(G):
            for j in range(0, D, W):
                o = 4 * (g * D + j)
                vstore(qa, o, vadd(vloadf(qa, o, vt), vloadf(bqa, o, vt)))
        for j in range(0, D, W):
            vstore(ka, 4 * j, vadd(vloadf(ka, 4 * j, vt), vloadf(bka, 4 * j, vt)))
            vstore(va, 4 * j, vadd(vloadf(va, 4 * j, vt), vloadf(bva, 4 * j, vt)))
    for h in range(G + 1):
        xa = qa + 4 * h * D if h < G else ka
        if neox:
            for j in range(0, half, W):
                c = vcs_deinterleave(vloadf(csa, 8 * j, vt), vloadf(csa, 8 * j + 4 * W, vt), 0)
                s = vcs_deinterleave(vloadf(csa, 8 * j, vt), vloadf(csa, 8 * j + 4 * W, vt), 1)
                lo = vloadf(xa, 4 * j, vt)
                hi = vloadf(xa, 4 * (j + half), vt)
                vstore(xa, 4 * j, vsub(vmul(lo, c), vmul(hi, s)))
                vstore(xa, 4 * (j + half), vfma(lo, s, vmul(hi, c)))
        else:
            for j in range(0, D, W):
                vstore(xa, 4 * j, vrope_norm(vloadf(xa, 4 * j, vt), vloadf(csa, 4 * j, vt)))
    if round_q:
        for j in range(0, G * D, W):
            vstore(qa, 4 * j, vround_f16(vloadf(qa, 4 * j, vt)))
    for j in range(0, D, W):
        vstore_f16_strided(kdst, j * kstride, kstride, vloadf(ka, 4 * j, vt))
        vstore_f16(vdst, 2 * j, vloadf(va, 4 * j, vt))


@kernel
def rope_simd_ok(D, W):
    """Whether rope_append_row handles heads of D elements on W lanes."""
    return D % (2 * W) == 0


@kernel
def kv_slot_addrs(pool, blk, layer, kvh, slot, KVH, bs, D):
    """(K^T, V) byte addresses of token ``slot`` of pool block ``blk`` for (layer, kv head
    kvh) in the head-major f16 pool (paged_attention.kv_index): K^T column d is at
    k + d * 2 * bs, V row element d at v + 2 * d."""
    base = addr(pool)
    k = base + 2 * kv_index(pool, blk, layer, 0, kvh, slot, 0, KVH, bs, D, 1)
    v = base + 2 * kv_index(pool, blk, layer, 1, kvh, slot, 0, KVH, bs, D, 1)
    return k, v


@kernel
def rope_append_simd(q, k, v, bq, bk, bv, has_bias, kvh, G, D, pos, seq, cs, neox, round_q, pool, tables, layer,
                     KVH, bs, tag):
    """fused.rope_append (f16 pool) for KV group kvh of every row, through rope_append_row.

    q  # [M, H*D], k, v  # [M, KVH*D] f32, rows contiguous;  bq  # [L, H*D], bk, bv
    # [L, KVH*D] biases of every layer;  cs  # [M, D/2, 2];  tag: a simd tag or a VTag.
    Needs rope_simd_ok(D, W) and an f16 head-major pool (the caller checks).
    The executor's run_worker makes the same rope_append_row calls with addresses it
    computes itself: calling this form with its 11 array arguments (each reference
    counted) measured 1.5 % slower per token (SmolLM2, d0, 2 threads)."""
    vt = vtag(tag)
    for m in range(q.shape[0]):
        p = pos[m]
        kd, vd = kv_slot_addrs(pool, tables[seq[m], p // bs], layer, kvh, p % bs, KVH, bs, D)
        rope_append_row(addr(q) + 4 * (m * q.shape[1] + kvh * G * D), addr(k) + 4 * (m * k.shape[1] + kvh * D),
                        addr(v) + 4 * (m * v.shape[1] + kvh * D), addr(bq) + 4 * (layer * bq.shape[1] + kvh * G * D),
                        addr(bk) + 4 * (layer * bk.shape[1] + kvh * D), addr(bv) + 4 * (layer * bv.shape[1] + kvh * D),
                        has_bias, addr(cs) + 4 * m * D, G, D, neox, round_q, kd, 2 * bs, vd, vt)
