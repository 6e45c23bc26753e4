"""Fused decode-step operators used by the executor's tasks.

    norm_quant:   h = rmsnorm(x) * w, then h quantized to int8 blocks (Q8_0 and/or Q8_K)
    quant_only:   the same quantization without the norm (the input of Wo and W_down)
    rope_table:   each row's rope cos / sin, once per step
    rope_append:  for the heads of one KV group: + bias, RoPE on q and k, q rounded to f16
                  (llama.cpp's f16 Q), k and v stored in the paged pool at each row's position
                  (rope_simd.py: the same on vectors); rope_append_rows runs them for every
                  group of the batched forward pass

Each works on whole rows, single-threaded: the executor runs several of them at once on
different data.
"""

import numpy as np

from ..dtypes import KV_F16, KV_INT8
from .act_quant import _half_bits, _half_value, quantize_q8_0_int, quantize_q8_k_int
from ..jit import inline_kernel, kernel
from .norm import rms_norm
from .paged_attention import kv_index
from .rope_simd import rope_append_simd, rope_simd_ok
from .simd import lanes_of


@kernel
def quant_rows(h, kmask, q0, d0, s0, q1, d1, s1):
    """h  # [M, K] f32 -> (q0, d0, s0) Q8_0 if kmask & 1, (q1, d1, s1) Q8_K if kmask & 2."""
    if kmask & 1:
        quantize_q8_0_int(h, q0, d0, s0)
    if kmask & 2:
        quantize_q8_k_int(h, q1, d1, s1)


@kernel
def norm_quant(x, w, eps, h, kmask, q0, d0, s0, q1, d1, s1):
    """h = rmsnorm(x) * w  # [M, K], then quant_rows(h)."""
    rms_norm(x, w, eps, h)
    quant_rows(h, kmask, q0, d0, s0, q1, d1, s1)


@kernel
def rope_table(pos, inv_freq, cs):
    """cs[m, i] = (cos, sin) of pos[m] * inv_freq[i]  # [M, D/2, 2] f32: once per decode step,
    shared by every layer and head (rope_append)."""
    for m in range(pos.shape[0]):
        for i in range(inv_freq.shape[0]):
            theta = np.float64(pos[m]) * inv_freq[i]
            cs[m, i, 0] = np.float32(np.cos(theta))
            cs[m, i, 1] = np.float32(np.sin(theta))


@inline_kernel
def _rope_row(q, k, v, bq, bk, bv, has_bias, kvh, G, D, m, cs, neox, round_q, scratch):
    """Row m of KV group kvh: + bias, RoPE on its q heads and k (cos / sin cs[m]), q
    rounded to f16 (round_q)."""
    half = D // 2
    ko = kvh * D
    if has_bias:
        for d in range(D):
            k[m, ko + d] += bk[ko + d]
            v[m, ko + d] += bv[ko + d]
        for g in range(G):
            qo = (kvh * G + g) * D
            for d in range(D):
                q[m, qo + d] += bq[qo + d]
    for i in range(half):
        c = cs[m, i, 0]
        s = cs[m, i, 1]
        ia, ib = (i, i + half) if neox else (2 * i, 2 * i + 1)
        for hh in range(G + 1):
            if hh < G:
                o = (kvh * G + hh) * D
                a = q[m, o + ia]
                b = q[m, o + ib]
                q[m, o + ia] = a * c - b * s
                q[m, o + ib] = a * s + b * c
            else:
                a = k[m, ko + ia]
                b = k[m, ko + ib]
                k[m, ko + ia] = a * c - b * s
                k[m, ko + ib] = a * s + b * c
    if round_q:
        for g in range(G):
            qo = (kvh * G + g) * D
            for d in range(D):
                scratch[0] = q[m, qo + d]
                q[m, qo + d] = _half_value(_half_bits(scratch.view(np.uint32)[0]))


@kernel
def rope_rows(q, k, v, bq, bk, bv, has_bias, kvh, G, D, cs, neox, round_q):
    """``_rope_row`` for KV group kvh of every row, without the KV append (an int8 pool
    quantizes rows itself: block_table.PagedSequence.store)."""
    scratch = np.empty(1, np.float32)
    for m in range(q.shape[0]):
        _rope_row(q, k, v, bq, bk, bv, has_bias, kvh, G, D, m, cs, neox, round_q, scratch)


@kernel
def rope_append(q, k, v, bq, bk, bv, has_bias, kvh, G, D, pos, seq, cs, neox, round_q,
                pool, kind, tables, layer, KVH, bs):
    """The KV group ``kvh`` of every row m:  q heads kvh*G .. kvh*G+G-1 and k/v head kvh.

    q  # [M, H*D], k, v  # [M, KVH*D] f32 (projections, rotated here in place)
    bq # [H*D], bk, bv  # [KVH*D] biases (has_bias)
    pos, seq  # [M] position and sequence of each row;  tables  # [n_seq, blocks] int32
    cs  # [M, D/2, 2] rope cos / sin of each row (rope_table)
    pool  # [block, elems]: f16 bits (kind KV_F16) or f32 (KV_F32), layout of paged_attention.py (K^T)
    """
    scratch = np.empty(1, np.float32)  # [1] f32 <-> bits
    ko = kvh * D
    flat = pool.reshape(-1)
    for m in range(q.shape[0]):
        _rope_row(q, k, v, bq, bk, bv, has_bias, kvh, G, D, m, cs, neox, round_q, scratch)
        p = pos[m]
        blk = tables[seq[m]][p // bs]
        slot = p % bs
        for d in range(D):
            off_k = kv_index(pool, blk, layer, 0, kvh, slot, d, KVH, bs, D, kind)  # K^T: d * bs + slot
            off_v = kv_index(pool, blk, layer, 1, kvh, slot, d, KVH, bs, D, kind)
            if kind == KV_F16:
                scratch[0] = k[m, ko + d]
                flat[off_k] = _half_bits(scratch.view(np.uint32)[0])
                scratch[0] = v[m, ko + d]
                flat[off_v] = _half_bits(scratch.view(np.uint32)[0])
            else:
                flat[off_k] = k[m, ko + d]
                flat[off_v] = v[m, ko + d]


def rope_append_rows(q, k, v, bq, bk, bv, has_bias, layer, G, D, pos, seq, cs, neox, round_q, pool, kind, tables,
                     KVH, bs, tag) -> None:
    """Bias, RoPE, Q rounding and the KV append of every row and KV group (the batched
    forward pass); the executor's ROPE tiles run the same per-row kernels.  bq, bk, bv
    # [L, ...] of every layer; an int8 pool (kind KV_INT8) gets no append here."""
    simd = (tag is not None and kind == KV_F16 and rope_simd_ok(D, lanes_of(tag)) and cs.shape[1] * 2 == D)
    for kvh in range(KVH):
        if simd:
            rope_append_simd(q, k, v, bq, bk, bv, has_bias, kvh, G, D, pos, seq, cs, neox, round_q, pool, tables,
                             layer, KVH, bs, tag)
        elif kind != KV_INT8:
            rope_append(q, k, v, bq[layer], bk[layer], bv[layer], has_bias, kvh, G, D, pos, seq, cs, neox, round_q,
                        pool, kind, tables, layer, KVH, bs)
        else:
            rope_rows(q, k, v, bq[layer], bk[layer], bv[layer], has_bias, kvh, G, D, cs, neox, round_q)
