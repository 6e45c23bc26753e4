"""Activation quantization as llama.cpp applies it before a quantized matmul.

llama.cpp multiplies a quantized weight row by activations quantized to its partner
("vec_dot") type: Q8_0/Q8_1 for the 32-value block types, Q8_K for the K-quants.  Doing
the same rounding here (and multiplying in float) reproduces its numerics, so greedy
output agrees with llama.cpp token for token except at genuine near-ties.

    Q8_0 / Q8_1, per block of 32:  d = max|x| / 127,  q = round(x / d),  x' = q * f16(d)
    Q8_K,        per block of 256: m = x[argmax|x|], s = -127 / m,
                                   q = min(127, round_half_even(s x)),  x' = q / s
"""

import math

import numpy as np

from ..dtypes import ACT_BF16, ACT_F16, ACT_F32, ACT_Q8_0, ACT_Q8_K
from ..jit import kernel
from .simd import addr, make_tag, vloadf, vtag
from .simd_math import vhmax, vmaxf, vminf, vsub, vzero_f

_LANES8 = make_tag("avx2")  # the 8-lane float vectors of _range, on every path (a constant to numba)


@kernel
def _half_bits(bits):
    """IEEE half bit pattern of the float32 with bit pattern ``bits``, rounded to nearest
    even (what GGML_FP32_TO_FP16 / F16C vcvtps2ph do)."""
    sign = (bits >> 16) & 0x8000
    exp = np.int32((bits >> 23) & 0xFF) - 127 + 15
    mant = bits & 0x7FFFFF
    if exp >= 31:
        return np.uint16(sign | 0x7C00)
    if exp <= 0:
        if exp < -10:
            return np.uint16(sign)
        mant = mant | 0x800000
        shift = np.uint32(14 - exp)
        half = mant >> shift
        rem = mant & ((np.uint32(1) << shift) - 1)
        halfway = np.uint32(1) << (shift - 1)
        if rem > halfway or (rem == halfway and (half & 1)):
            half += 1
        return np.uint16(sign | half)
    half = np.uint32(sign) | (np.uint32(exp) << 10) | (mant >> 13)
    rem = mant & 0x1FFF
    if rem > 0x1000 or (rem == 0x1000 and (half & 1)):
        half += 1
    return np.uint16(half)


@kernel
def _half_value(h):
    """The f32 value of the IEEE half with bit pattern ``h``, by arithmetic: in the decode
    step a 256 KiB look-up table (F16_TO_F32) is out of cache after the weight stream, and
    each look-up is a memory miss.
        h = s eeeee mmmmmmmmmm:  e = 0: (-1)^s m 2^-24;  0 < e < 31: (-1)^s (1024 + m) 2^(e - 25)"""
    e = np.int64((h >> 10) & 0x1F)
    m = np.int64(h & 0x3FF)
    if e == 31:
        v = np.float32(np.inf) if m == 0 else np.float32(np.nan)
    elif e == 0:
        v = np.float32(math.ldexp(np.float64(m), -24))
    else:
        v = np.float32(math.ldexp(np.float64(m + 1024), e - 25))
    return -v if h & 0x8000 else v


@kernel
def _range(xa, n, vt):
    """(max, min) of the n float32 at address xa (n a multiple of 16), in 8-lane vectors
    (vt: 8 lanes on every path): LLVM leaves the scalar max / min reduction unvectorised."""
    hi0 = vloadf(xa, 0, vt)
    hi1 = vloadf(xa, 32, vt)
    lo0, lo1 = hi0, hi1
    for i in range(64, 4 * n, 64):
        a = vloadf(xa, i, vt)
        b = vloadf(xa, i + 32, vt)
        hi0, lo0 = vmaxf(hi0, a), vminf(lo0, a)
        hi1, lo1 = vmaxf(hi1, b), vminf(lo1, b)
    z = vzero_f(vt)
    return vhmax(vmaxf(hi0, hi1)), -vhmax(vsub(z, vminf(lo0, lo1)))


# The integer form (what the SIMD dot-product kernels consume); the float form used by the
# generic kernels and the exact-f32 comparisons is q * scale (quantize_activations).
@kernel
def quantize_q8_0_int(x, q, d, s):
    """x  # [M, K] f32 C-contiguous, K % 32 == 0  ->  q  # [M, K] int8,  d  # [M, K/32] f32
    (the f16 scale),  s  # [M, K/32] int32 (sum of the block's q)"""
    M, K = x.shape
    scratch = np.empty(1, np.float32)  # [1] to reinterpret d's bits
    scratch_bits = scratch.view(np.uint32)
    vt = vtag(_LANES8)
    xa = addr(x)
    for m in range(M):
        for b in range(K // 32):
            hi, lo = _range(xa + 4 * (m * K + 32 * b), 32, vt)
            amax = max(hi, -lo)
            dd = amax / np.float32(127.0)
            inv = np.float32(1.0) / dd if dd != 0 else np.float32(0.0)
            scratch[0] = dd
            d[m, b] = _half_value(_half_bits(scratch_bits[0]))
            tot = 0
            for j in range(32):
                v = np.int32(np.round(x[m, 32 * b + j] * inv))
                q[m, 32 * b + j] = v
                tot += v
            s[m, b] = tot


@kernel
def quantize_q8_k_int(x, q, d, s):
    """x  # [M, K] f32, K % 256 == 0  ->  q  # [M, K] int8,  d  # [M, K/256] f32,
    s  # [M, K/16] int16 (sums of 16 q, llama.cpp's bsums: at most 16 x 127; int16 so that
    two adjacent sums load as one pair for vpdpwssd)

    x C-contiguous.  Max and min in vectors (_range), whose larger magnitude gives
    the value at the first index holding max|x| as llama.cpp's strict ``>`` scan picks,
    scanning only when +max|x| and -max|x| both occur; then the rounding and the sums in
    plain loops for the vectorizer:
    each worker quantizes a whole FFN activation before its W_down tiles."""
    M, K = x.shape
    vt = vtag(_LANES8)
    xa = addr(x)
    for m in range(M):
        for b in range(K // 256):
            xb = x[m, 256 * b:256 * (b + 1)]
            hi, lo = _range(xa + 4 * (m * K + 256 * b), 256, vt)
            amax = max(hi, -lo)
            if amax == 0:
                d[m, b] = 0.0
                for j in range(256):
                    q[m, 256 * b + j] = 0
                for j in range(16):
                    s[m, 16 * b + j] = 0
                continue
            # the value at the first index holding amax: the sign of the larger of hi, -lo,
            # unless both +amax and -amax occur (then the first of them, by a scan)
            v = hi if hi > -lo else lo
            if hi == -lo:
                j = 0
                while abs(xb[j]) != amax:
                    j += 1
                v = xb[j]
            iscale = np.float32(-127.0) / v
            d[m, b] = np.float32(1.0) / iscale
            qb = q[m, 256 * b:256 * (b + 1)]
            for j in range(256):
                qb[j] = np.int8(min(np.float32(127.0), np.float32(np.rint(iscale * xb[j]))))
            for g in range(16):
                tot = 0
                for j in range(16):
                    tot += np.int32(qb[16 * g + j])
                s[m, 16 * b + g] = np.int16(tot)


def quantize_activations_int(x: np.ndarray, kind: int):
    """(q int8 [M, K], scales f32, block sums: int32 per 32 for Q8_0, int16 per 16 for
    Q8_K) of x  # [M, K] f32 for ACT_Q8_0 / ACT_Q8_K; q * scale (per block) equals
    ``quantize_activations(x, kind)``."""
    x = np.ascontiguousarray(x)  # the kernels read rows by address
    M, K = x.shape
    q = np.empty((M, K), np.int8)
    if kind == ACT_Q8_0:
        d = np.empty((M, K // 32), np.float32)
        s = np.empty((M, K // 32), np.int32)
        quantize_q8_0_int(x, q, d, s)
    elif kind == ACT_Q8_K:
        d = np.empty((M, K // 256), np.float32)
        s = np.empty((M, K // 16), np.int16)
        quantize_q8_k_int(x, q, d, s)
    else:
        raise ValueError(f"no integer form for activation kind {kind}")
    return q, d, s


def quantize_activations(x: np.ndarray, kind: int) -> np.ndarray:
    """A copy of x  # [M, K] f32 rounded the way llama.cpp feeds it to a weight of ``kind``."""
    if kind == ACT_F32:
        return x
    if kind in (ACT_Q8_0, ACT_Q8_K):
        q, d, _ = quantize_activations_int(x, kind)
        M, K = x.shape
        nb = d.shape[1]
        return (q.reshape(M, nb, K // nb).astype(np.float32) * d[:, :, None]).reshape(M, K)
    if kind == ACT_F16:
        return x.astype(np.float16).astype(np.float32)
    bits = x.view(np.uint32)  # BF16: round to nearest even on the top 16 bits
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
