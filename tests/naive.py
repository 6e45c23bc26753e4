"""Plain-NumPy oracles (float64) the kernel tests compare against, in one place.  Nothing
here shares code with llcinfer's kernels: weights come from ``gguf``'s own dequantizers,
everything else from the formulas written out.  The whole forward pass has its oracle in
llcinfer.engine.reference.ReferenceModel."""

from __future__ import annotations

import numpy as np
from gguf import quants as gguf_quants


def weight(t) -> np.ndarray:
    """float64 [rows, cols] of a tensor (a tests/tiny_models FakeTensor or a GGUF TensorInfo)."""
    rows, cols = t.shape
    name = t.qtype.name
    if name in ("F32", "F16"):
        return np.asarray(t.data).astype(np.float64).reshape(rows, cols)
    if name == "BF16":
        bits = np.ascontiguousarray(t.data).view("<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(rows, cols).astype(np.float64)
    return np.asarray(gguf_quants.dequantize(t.data, t.qtype), np.float64).reshape(rows, cols)


def assert_matmul_close(y, x, w64, rel=1e-5):
    """|y - x @ w.T| within float32 summation error: small next to the sum of |x_k w_k|
    (what rounding of the terms summed scales with)."""
    x64 = np.asarray(x, np.float64)
    ref = x64 @ w64.T
    terms = np.abs(x64) @ np.abs(w64).T  # [M, N]
    err = np.abs(y.astype(np.float64) - ref)
    assert y.shape == ref.shape and y.dtype == np.float32
    assert np.all(np.isfinite(y))
    assert np.all(err <= rel * terms + 1e-30), f"max err {err.max():.3g}, max |ref| {np.abs(ref).max():.3g}"


def rms_norm(x, w, eps):
    """x  # [M, K] / sqrt(mean(x^2) + eps) * w"""
    x64 = np.asarray(x, np.float64)
    return x64 / np.sqrt(np.mean(x64 ** 2, axis=1, keepdims=True) + eps) * w


def swiglu(gate, up):
    """silu(gate) * up"""
    g = np.asarray(gate, np.float64)
    with np.errstate(over="ignore"):
        return g / (1.0 + np.exp(-g)) * up


def rope(x, positions, inv_freq, neox, f32_angles=False):
    """x  # [M, H, D] rotated: pair (2i, 2i+1) (or (i, i + D/2) with ``neox``) of row m by
    positions[m] * inv_freq[i]; ``f32_angles``: cos and sin rounded to float32 first (the
    kernels' table)."""
    M, H, D = x.shape
    half = D // 2
    out = np.asarray(x, np.float64).copy()
    for m in range(M):
        for i in range(half):
            theta = np.float64(positions[m]) * inv_freq[i]
            c, s = np.cos(theta), np.sin(theta)
            if f32_angles:
                c, s = float(np.float32(c)), float(np.float32(s))
            a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
            xa, xb = out[m, :, a].copy(), out[m, :, b].copy()
            out[m, :, a] = xa * c - xb * s
            out[m, :, b] = xa * s + xb * c
    return out


def attention(q, k, v, n_past, scale):
    """Causal GQA softmax attention; q  # [M, H, D], k, v  # [T, KVH, D]; query row m is at
    position n_past + m and sees keys 0 .. n_past + m."""
    M, H, D = q.shape
    group = H // k.shape[1]
    out = np.empty((M, H, D))
    for m in range(M):
        T = n_past + m + 1
        for h in range(H):
            s = k[:T, h // group].astype(np.float64) @ q[m, h].astype(np.float64) * float(scale)
            p = np.exp(s - s.max())
            out[m, h] = (p / p.sum()) @ v[:T, h // group].astype(np.float64)
    return out


def q8_0_round(x):
    """Q8_0 round trip per block of 32: d = max|x| / 127, q = round(x / d), x' = q * f16(d);
    returns (x', the f16 step d per block)."""
    b = np.asarray(x, np.float64).reshape(x.shape[0], -1, 32)
    d = np.abs(b).max(-1, keepdims=True) / 127.0
    q = np.round(np.divide(b, d, out=np.zeros_like(b), where=d > 0))
    d16 = d.astype(np.float16).astype(np.float64)
    return (q * d16).reshape(x.shape), d16


def q8_k_round(x):
    """Q8_K round trip per block of 256: s = -127 / (the signed value of largest magnitude),
    q = min(127, rint(s x)), x' = q / s; returns (x', the step 1 / |s| per block)."""
    b = np.asarray(x, np.float64).reshape(x.shape[0], -1, 256)
    m = np.take_along_axis(b, np.abs(b).argmax(-1)[..., None], -1)
    s = np.divide(-127.0, m, out=np.zeros_like(m), where=m != 0)
    q = np.minimum(127.0, np.rint(s * b))
    out = np.divide(q, s, out=np.zeros_like(q), where=s != 0)
    return out.reshape(x.shape), np.divide(1.0, np.abs(s), out=np.zeros_like(s), where=s != 0)


def int8_kv_round(x, group):
    """The int8 KV cache's rule (q8_0 without the f16 step): d = max|x| / 127 per group of
    the last axis, q = round half away from zero, x' = q * d (float32)."""
    g = x.reshape(*x.shape[:-1], -1, group)
    d = (np.abs(g).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    v = g * inv
    q = np.clip(round_half_away(v), -127, 127)
    return (q * d).reshape(x.shape).astype(np.float32)


# ---------------------------------------------------------------------------- sparse indexer
def index_keys(k, basis):
    """kernels/sparse_index.store_index_rows: k  # [n, KVH, D], basis  # [KVH, r, D] ->
    (q  # [n, KVH, r] int8 values, s  # [n, KVH] f32) with y = basis @ k, s = max|y| / 127."""
    y = np.einsum("nhd,hrd->nhr", k.astype(np.float64), basis.astype(np.float64)).astype(np.float32)
    s = (np.abs(y).max(-1) / np.float32(127)).astype(np.float32)
    inv = np.where(s > 0, np.float32(1) / np.where(s > 0, s, 1), 0).astype(np.float32)
    v = y * inv[..., None]
    q = np.clip(round_half_away(v), -127, 127)
    return q.astype(np.int8), s


def round_half_away(v):
    return np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))


def block_scores(qt, q, s, G, phi, agg, w, n_sink, n_win, bs):
    """kernels/sparse_rows.select_rows's scores of one row's candidate blocks  # [n_cand]:
    qt  # [H, r] f32 the projected query heads, quantized as the kernel does,
    u[h] = round(qt[h] / c[h]), c[h] = max|qt[h]| / 127;  x[h, t] = c[h] s[t, kvh(h)]
    (u[h] . q[t, kvh(h)]);  I[t] = sum_h w[h] phi(x[h, t]);  a block's score the max (agg
    0) or sum (agg 1) of its tokens' I."""
    n = q.shape[0]
    nb = -(-n // bs)
    kvh = np.arange(qt.shape[0]) // G
    c = (np.abs(qt).max(1) / np.float32(127)).astype(np.float32)  # [H]
    inv = np.where(c > 0, np.float32(1) / np.where(c > 0, c, 1), 0).astype(np.float32)
    u = np.clip(round_half_away(qt * inv[:, None]), -127, 127).astype(np.int64)  # [H, r]
    dot = np.einsum("hr,thr->ht", u, q[:, kvh].astype(np.int64))  # [H, n] exact
    x = (dot.astype(np.float32) * s[:, kvh].T).astype(np.float64) * c[:, None]  # [H, n]
    if phi == 1:
        kept = np.zeros(n, bool)
        kept[:n_sink * bs] = True
        kept[(nb - n_win) * bs:] = True
        m = x[:, kept].max(1, keepdims=True)
        per = np.exp(np.minimum(x - m, 60.0))
    else:
        per = np.maximum(x, 0.0)
    tok = (w[:, None] * per).sum(0)  # [n]
    cand = tok[n_sink * bs:(nb - n_win) * bs].reshape(-1, bs)
    return cand.max(1) if agg == 0 else cand.sum(1)
