"""Weights repacked at load for the dot-product kernels (vnni_matmul.py); NumPy only.

Rows are taken in groups of W (16 for 512-bit vectors, 8 for 256-bit; the last group is
padded with zero rows).  A group is one contiguous byte row: its blocks one after the other,
each block holding the group's W rows interleaved so that one vector load of 4*W bytes
gives every row (one per 32-bit lane) 4 consecutive values ("k-group") of the block:

    nib vector (4W bytes) of a 32-value chunk, j = 0..3:  lane r, byte i:
        low nibble  = value[r, 4j + i]        (k-group j)
        high nibble = value[r, 16 + 4j + i]   (k-group j + 4)
    Q5_0 vectors P0..P4 of the 5-bit values v_j[r, i] = value[r, 4j + i] (k-group j):
        bits 0-4 of P_j = v_j (j = 0..4); bits 5-7 carry v5, v6, v7:
        P0: v5 bits 0-2,  P1: v5 bits 3-4 + v7 bit 0,  P2: v6 bits 0-2,
        P3: v6 bits 3-4 + v7 bit 1,  P4: v7 bits 2-4
    Q6_K high-2-bit vectors a = 0, 1:  lane r, byte i, bits 2t..2t+1 = bits 4-5 of
        value[r, 4 (4a + t) + i]
    Q8_0 vectors j = 0..7: lane r, byte i = value[r, 4j + i] + 128 (as u8)
    f16 scale vectors: W halves, one per row;  u8/s8 sub-block scale vectors: W bytes

Block layouts (bytes, W rows), same size as GGML's except Q4_K (+4 bytes per row-block,
its 6-bit scales and mins unpacked to bytes):
    Q4_0  [d 2W][nib 4 x 4W]                      value = nibble - 8          (x d)
    Q4_1  [d 2W][m 2W][nib 4 x 4W]                value = nibble * d + m
    Q5_0  [d 2W][P 5 x 4W]                        value = v - 16
    Q8_0  [d 2W][q 8 x 4W]                        value = q - 128
    Q4_K  [d 2W][dmin 2W][sc 8 x W][m 8 x W][nib 8 chunks x 4 x 4W]
                                                  value = d sc_s nibble - dmin m_s
    Q6_K  [d 2W][sc 16 x W (s8)][8 chunks of (nib 4 x 4W, hbits 2 x 4W)]
                                                  value = d sc_s ((nibble | h2 << 4) - 32)
"""

from __future__ import annotations

import numpy as np

from ..dtypes import Q4_0, Q4_1, Q4_K, Q5_0, Q6_K, Q8_0, QUANT_BLOCK

# Version of the packed layout above.  Bump it whenever repack() produces different bytes
# for the same input (a layout change, a new field): repacked weights cached on disk
# (repack_cache.py) with another version are rebuilt instead of being read.
FORMAT_VERSION = 2  # 2: Q5_0 as 5 vectors of 5-bit values (was nibbles + a high-bit vector)

_RAW = QUANT_BLOCK  # GGML block: (values, bytes)
BLOCK_BYTES_PER_ROW = {Q4_0: 18, Q4_1: 20, Q5_0: 22, Q8_0: 34, Q4_K: 148, Q6_K: 210}
SUPPORTED = tuple(_RAW)


def block_size(qtype: int) -> int:
    return _RAW[qtype][0]


# ------------------------------------------------------------------ raw GGML -> fields
def _f16(raw, a):
    return np.ascontiguousarray(raw[..., a:a + 2]).view(np.float16)[..., 0]


def _nibs(qs):
    """[..., 16 or 32k] bytes -> values: low nibbles first half, high nibbles second."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _k4_scales(s):
    """[..., 12] Q4_K scale bytes -> (sc [..., 8], m [..., 8]) u8 (get_scale_min_k4)."""
    sc = np.empty(s.shape[:-1] + (8,), np.uint8)
    mn = np.empty_like(sc)
    sc[..., :4] = s[..., 0:4] & 63
    mn[..., :4] = s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc, mn


def _q6_values(raw):
    """[..., 210] -> [..., 256] u8 values 0..63 (value index k uses scale k // 16)."""
    ql, qh = raw[..., 0:128], raw[..., 128:192]
    v = np.empty(raw.shape[:-1] + (256,), np.uint8)
    for h in range(2):
        l0, l1, hb = ql[..., 64 * h:64 * h + 32], ql[..., 64 * h + 32:64 * h + 64], qh[..., 32 * h:32 * h + 32]
        o = 128 * h
        v[..., o:o + 32] = (l0 & 15) | ((hb & 3) << 4)
        v[..., o + 32:o + 64] = (l1 & 15) | (((hb >> 2) & 3) << 4)
        v[..., o + 64:o + 96] = (l0 >> 4) | (((hb >> 4) & 3) << 4)
        v[..., o + 96:o + 128] = (l1 >> 4) | (((hb >> 6) & 3) << 4)
    return v


# ----------------------------------------------------------- fields -> interleaved vectors
def _rowvec(a, W):
    """[R, nb, ...] per-row fields -> [G, nb, ..., W] (rows innermost), as bytes [G, nb, -1]."""
    R, nb = a.shape[:2]
    G = R // W
    a = a.reshape((G, W, nb) + a.shape[2:])
    a = np.moveaxis(a, 1, -1)
    return np.ascontiguousarray(a).view(np.uint8).reshape(G, nb, -1)


def _nibvec(v, W):
    """values [R, nc, 32] (0..15) -> [G, nc, 16W] bytes: 4 nib vectors per 32-chunk."""
    R, nc, _ = v.shape
    G = R // W
    lo = v[..., :16].reshape(G, W, nc, 4, 4)
    hi = v[..., 16:].reshape(G, W, nc, 4, 4)
    p = (lo | (hi << 4)).transpose(0, 2, 3, 1, 4)  # (g, c, j, r, i)
    return np.ascontiguousarray(p).reshape(G, nc, 16 * W)


def _q5vec(v, W):
    """5-bit values [R, nb, 32] -> [G, nb, 20W] bytes: the vectors P0..P4 of the module doc.
    Decoding (vnni_blocks.dec32) takes 23 vector operations per block, against 35 for
    nibbles plus a high-bit plane (each k-group: shift, mask and OR of its high bit)."""
    R, nb, _ = v.shape
    G = R // W
    k = v.reshape(G, W, nb, 8, 4).transpose(0, 2, 3, 1, 4)  # (g, b, k-group j, r, i)
    p = k[:, :, :5].astype(np.uint8)  # P0..P4, bits 0-4
    v5, v6, v7 = k[:, :, 5], k[:, :, 6], k[:, :, 7]
    p[:, :, 0] |= (v5 & 7) << 5
    p[:, :, 1] |= ((v5 >> 3) & 3) << 5 | (v7 & 1) << 7
    p[:, :, 2] |= (v6 & 7) << 5
    p[:, :, 3] |= ((v6 >> 3) & 3) << 5 | ((v7 >> 1) & 1) << 7
    p[:, :, 4] |= (v7 >> 2) << 5
    return np.ascontiguousarray(p).reshape(G, nb, 20 * W)


def _h2vec(h2, W):
    """2-bit values [R, nc, 32] -> [G, nc, 8W]: vector a, lane r, byte i, bits 2t = h2[r, 4(4a+t)+i]."""
    R, nc, _ = h2.shape
    G = R // W
    h2 = h2.reshape(G, W, nc, 2, 4, 4).astype(np.uint8)  # (g, r, c, a, t, i)
    acc = np.zeros((G, W, nc, 2, 4), np.uint8)
    for t in range(4):
        acc |= h2[:, :, :, :, t, :] << (2 * t)
    return np.ascontiguousarray(acc.transpose(0, 2, 3, 1, 4)).reshape(G, nc, 8 * W)


def _q8vec(q, W):
    """int8 [R, nb, 32] -> [G, nb, 32W] u8 (q + 128): 8 vectors, lane r byte i = q[r, 4j + i]."""
    R, nb, _ = q.shape
    G = R // W
    u = (q.view(np.uint8) ^ 0x80).reshape(G, W, nb, 8, 4)
    return np.ascontiguousarray(u.transpose(0, 2, 3, 1, 4)).reshape(G, nb, 32 * W)


def _pack_rows(raw, qtype, W):
    """raw [R, nb, type_size] (R % W == 0) -> [G, nb * block_bytes] packed."""
    R, nb, _ = raw.shape
    G = R // W
    if qtype in (Q4_0, Q4_1):
        parts = [_rowvec(_f16(raw, 0), W)]
        if qtype == Q4_1:
            parts.append(_rowvec(_f16(raw, 2), W))
        qs = raw[..., 4:20] if qtype == Q4_1 else raw[..., 2:18]
        parts.append(_nibvec(_nibs(qs), W))
    elif qtype == Q5_0:
        qh = np.ascontiguousarray(raw[..., 2:6]).view("<u4")[..., 0]
        hbit = ((qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
        parts = [_rowvec(_f16(raw, 0), W), _q5vec(_nibs(raw[..., 6:22]) | (hbit << 4), W)]
    elif qtype == Q8_0:
        parts = [_rowvec(_f16(raw, 0), W), _q8vec(raw[..., 2:34].view(np.int8), W)]
    elif qtype == Q4_K:
        sc, mn = _k4_scales(raw[..., 4:16])
        v = np.empty((R, nb, 256), np.uint8)
        for g in range(4):
            qs = raw[..., 16 + 32 * g:48 + 32 * g]
            v[..., 64 * g:64 * g + 32] = qs & 15
            v[..., 64 * g + 32:64 * g + 64] = qs >> 4
        nib = _nibvec(v.reshape(R, nb * 8, 32), W).reshape(G, nb, -1)
        parts = [_rowvec(_f16(raw, 0), W), _rowvec(_f16(raw, 2), W), _rowvec(sc, W), _rowvec(mn, W), nib]
    elif qtype == Q6_K:
        v = _q6_values(raw).reshape(R, nb * 8, 32)
        nib = _nibvec(v & 15, W).reshape(G, nb, 8, 16 * W)
        h2 = _h2vec(v >> 4, W).reshape(G, nb, 8, 8 * W)
        chunks = np.concatenate([nib, h2], axis=-1).reshape(G, nb, -1)
        parts = [_rowvec(_f16(raw, 208), W), _rowvec(np.ascontiguousarray(raw[..., 192:208]), W), chunks]
    else:
        raise ValueError(f"repack: unsupported type {qtype}")
    out = np.concatenate(parts, axis=-1)
    assert out.shape[-1] == BLOCK_BYTES_PER_ROW[qtype] * W
    return out.reshape(G, -1)


def packed_shape(qtype: int, N: int, K: int, W: int) -> tuple[int, int]:
    """Shape of repack()'s result for an [N, K] matrix: (ceil(N / W), (K / block) * block_bytes * W)."""
    return -(-N // W), K // block_size(qtype) * BLOCK_BYTES_PER_ROW[qtype] * W


def repack(w: np.ndarray, qtype: int, K: int, W: int, chunk_rows: int = 4096) -> np.ndarray:
    """w  # [N, row_bytes] uint8 GGML rows  ->  [ceil(N / W), (K / block) * block_bytes * W] uint8."""
    N = w.shape[0]
    block, tsize = _RAW[qtype]
    nb = K // block
    out = np.empty(packed_shape(qtype, N, K, W), np.uint8)
    step = max(W, chunk_rows // W * W)
    for r0 in range(0, N, step):
        r1 = min(N, r0 + step)
        raw = np.asarray(w[r0:r1]).reshape(r1 - r0, nb, tsize)
        if (r1 - r0) % W:
            pad = np.zeros((W - (r1 - r0) % W, nb, tsize), np.uint8)  # zero rows: d = 0
            raw = np.concatenate([raw, pad])
        out[r0 // W:r0 // W + raw.shape[0] // W] = _pack_rows(raw, qtype, W)
    return out


# ---------------------------------------------------------------- inverse (for the tests)
def _unrow(b, W, dtype, per):
    """[G, nb, per*W*itemsize] bytes -> [G*W, nb, per] of dtype."""
    G, nb, _ = b.shape
    a = np.ascontiguousarray(b).view(dtype).reshape(G, nb, per, W)
    return np.moveaxis(a, -1, 1).reshape(G * W, nb, per)


def _unnib(b, W):
    G, nc, _ = b.shape
    p = b.reshape(G, nc, 4, W, 4).transpose(0, 3, 1, 2, 4)  # (g, r, c, j, i)
    lo, hi = p & 15, p >> 4
    return np.concatenate([lo.reshape(G * W, nc, 16), hi.reshape(G * W, nc, 16)], axis=-1)


def unpack(p: np.ndarray, qtype: int, N: int, K: int, W: int) -> np.ndarray:
    """Dequantized float32 [N, K] from a repacked matrix (checks the layout round trip)."""
    G = p.shape[0]
    nb = K // block_size(qtype)
    bb = BLOCK_BYTES_PER_ROW[qtype] * W
    b = p.reshape(G, nb, bb)
    f32 = np.float32
    if qtype in (Q4_0, Q4_1, Q5_0, Q8_0):
        d = _unrow(b[..., :2 * W], W, np.float16, 1)[..., 0].astype(f32)  # [R, nb]
        o = 2 * W
        if qtype == Q8_0:
            u = b[..., o:o + 32 * W].reshape(G, nb, 8, W, 4).transpose(0, 3, 1, 2, 4).reshape(G * W, nb, 32)
            vals = (u ^ 0x80).view(np.int8).astype(f32)
            x = vals * d[..., None]
        elif qtype == Q5_0:
            P = b[..., o:o + 20 * W].reshape(G, nb, 5, W, 4).transpose(0, 3, 1, 2, 4).astype(np.int32)  # (g, r, b, k, i)
            v = np.concatenate([P & 31,
                                ((P[:, :, :, 0:1] >> 5) | ((P[:, :, :, 1:2] >> 5 & 3) << 3)),
                                ((P[:, :, :, 2:3] >> 5) | ((P[:, :, :, 3:4] >> 5 & 3) << 3)),
                                ((P[:, :, :, 1:2] >> 7) | ((P[:, :, :, 3:4] >> 7) << 1) | ((P[:, :, :, 4:5] >> 5) << 2))],
                               axis=3)  # (g, r, b, k-group 0..7, i)
            x = (v.reshape(G * W, nb, 32) - 16).astype(f32) * d[..., None]
        else:
            if qtype == Q4_1:
                m = _unrow(b[..., o:o + 2 * W], W, np.float16, 1)[..., 0].astype(f32)
                o += 2 * W
            v = _unnib(b[..., o:o + 16 * W], W).astype(np.int32)
            if qtype == Q4_0:
                x = (v - 8).astype(f32) * d[..., None]
            else:
                x = v.astype(f32) * d[..., None] + m[..., None]
    elif qtype == Q4_K:
        d = _unrow(b[..., :2 * W], W, np.float16, 1)[..., 0].astype(f32)
        dmin = _unrow(b[..., 2 * W:4 * W], W, np.float16, 1)[..., 0].astype(f32)
        sc = _unrow(b[..., 4 * W:12 * W], W, np.uint8, 8).astype(f32)
        mn = _unrow(b[..., 12 * W:20 * W], W, np.uint8, 8).astype(f32)
        v = _unnib(np.ascontiguousarray(b[..., 20 * W:]).reshape(G, nb * 8, 16 * W), W).reshape(G * W, nb, 8, 32)
        x = (d[..., None] * sc)[..., None] * v.astype(f32) - (dmin[..., None] * mn)[..., None]
    elif qtype == Q6_K:
        d = _unrow(b[..., :2 * W], W, np.float16, 1)[..., 0].astype(f32)
        sc = _unrow(b[..., 2 * W:18 * W], W, np.int8, 16).astype(f32)
        ch = np.ascontiguousarray(b[..., 18 * W:]).reshape(G, nb, 8, 24 * W)
        nib = _unnib(np.ascontiguousarray(ch[..., :16 * W]).reshape(G, nb * 8, 16 * W), W)  # [R, nb*8, 32]
        h = ch[..., 16 * W:].reshape(G, nb, 8, 2, W, 4).transpose(0, 4, 1, 2, 3, 5)  # (g, r, b, c, a, i)
        t = (h[..., None, :] >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3  # (g, r, b, c, a, t, i)
        v = nib.reshape(G * W, nb, 8, 32).astype(np.int32) | (t.reshape(G * W, nb, 8, 32).astype(np.int32) << 4)
        x = (d[..., None] * sc).reshape(G * W, nb, 16, 1) * (v - 32).astype(f32).reshape(G * W, nb, 16, 16)
    else:
        raise ValueError(f"unpack: unsupported type {qtype}")
    return np.ascontiguousarray(x.reshape(G * W, K)[:N], dtype=f32)
