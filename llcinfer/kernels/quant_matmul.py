"""Matrix products with GGML block-quantized weights, read straight from the memory map.

    y[m, n] = sum_k x[m, k] * W[n, k]          W stored row-major as GGML blocks

Generic path (this module): activations stay float32; each weight block is decoded in
registers and multiplied into per-lane partial sums, which LLVM vectorises.  The kernel
issue adds explicit SIMD paths behind the same signature; the NumPy oracle is
``gguf.quants.dequantize`` followed by a float matmul (see tests/test_kernels.py).

Block layouts (bytes), as in ggml-common.h:
    Q4_0  [d:f16][qs:16]            x = (nibble - 8) * d
    Q4_1  [d:f16][m:f16][qs:16]     x = nibble * d + m
    Q5_0  [d:f16][qh:u32][qs:16]    x = (nibble | bit<<4) - 16) * d
    Q8_0  [d:f16][qs:i8 x32]        x = q * d
    Q4_K  [d][dmin][scales:12][qs:128]                 256 values, 8 sub-blocks of 32
    Q6_K  [ql:128][qh:64][scales:i8 x16][d:f16]       256 values, 16 sub-blocks of 16
Nibble order: the low nibbles of qs hold the first half of the block, the high nibbles the
second half.
"""

import numpy as np
from numba import prange

from ..dtypes import Q4_0, Q4_1, Q4_K, Q5_0, Q6_K, Q8_0, QUANT_BLOCK  # noqa: F401 (QUANT_BLOCK: re-exported)
from ..jit import kernel, parallel_kernel


@kernel
def _f16(row, off, lut):
    return lut[np.int64(row[off]) | (np.int64(row[off + 1]) << 8)]


@kernel
def _dot_q4_0(row, x, lanes, lut):
    """lanes[j] += sum over blocks of dequant(row)[32 b + j] * x[32 b + j]   (j < 32)"""
    for b in range(x.shape[0] // 32):
        off = b * 18
        d = _f16(row, off, lut)
        for j in range(16):
            q = row[off + 2 + j]
            lanes[j] += d * np.float32(np.int32(q & 15) - 8) * x[32 * b + j]
            lanes[j + 16] += d * np.float32(np.int32(q >> 4) - 8) * x[32 * b + 16 + j]


@kernel
def _dot_q4_1(row, x, lanes, lut):
    for b in range(x.shape[0] // 32):
        off = b * 20
        d = _f16(row, off, lut)
        m = _f16(row, off + 2, lut)
        for j in range(16):
            q = row[off + 4 + j]
            lanes[j] += (d * np.float32(q & 15) + m) * x[32 * b + j]
            lanes[j + 16] += (d * np.float32(q >> 4) + m) * x[32 * b + 16 + j]


@kernel
def _dot_q5_0(row, x, lanes, lut):
    for b in range(x.shape[0] // 32):
        off = b * 22
        d = _f16(row, off, lut)
        qh = (np.uint32(row[off + 2]) | (np.uint32(row[off + 3]) << 8)
              | (np.uint32(row[off + 4]) << 16) | (np.uint32(row[off + 5]) << 24))
        for j in range(16):
            q = row[off + 6 + j]
            lo = np.int32(q & 15) | np.int32(((qh >> j) & 1) << 4)
            hi = np.int32(q >> 4) | np.int32(((qh >> (j + 16)) & 1) << 4)
            lanes[j] += d * np.float32(lo - 16) * x[32 * b + j]
            lanes[j + 16] += d * np.float32(hi - 16) * x[32 * b + 16 + j]


@kernel
def _dot_q8_0(row, x, lanes, lut):
    for b in range(x.shape[0] // 32):
        off = b * 34
        d = _f16(row, off, lut)
        for j in range(32):
            lanes[j] += d * np.float32(np.int8(row[off + 2 + j])) * x[32 * b + j]


@kernel
def _k4_scale_min(row, sc_off, j):
    """6-bit scale and min of sub-block j (0..7) of a Q4_K block (get_scale_min_k4)."""
    if j < 4:
        sc = row[sc_off + j] & 63
        mn = row[sc_off + j + 4] & 63
    else:
        sc = (row[sc_off + j + 4] & 15) | ((row[sc_off + j - 4] >> 6) << 4)
        mn = (row[sc_off + j + 4] >> 4) | ((row[sc_off + j] >> 6) << 4)
    return np.float32(sc), np.float32(mn)


@kernel
def _dot_q4_k(row, x, lanes, lut):
    for b in range(x.shape[0] // 256):
        off = b * 144
        d = _f16(row, off, lut)
        dmin = _f16(row, off + 2, lut)
        for g in range(4):  # 4 groups of 64 values: 32 low nibbles, then 32 high nibbles
            sc1, m1 = _k4_scale_min(row, off + 4, 2 * g)
            sc2, m2 = _k4_scale_min(row, off + 4, 2 * g + 1)
            d1, o1 = d * sc1, dmin * m1
            d2, o2 = d * sc2, dmin * m2
            qs = off + 16 + 32 * g
            k0 = 256 * b + 64 * g
            for l in range(32):
                q = row[qs + l]
                lanes[l] += (d1 * np.float32(q & 15) - o1) * x[k0 + l]
                lanes[l + 32] += (d2 * np.float32(q >> 4) - o2) * x[k0 + 32 + l]


@kernel
def _dot_q6_k(row, x, lanes, lut):
    for b in range(x.shape[0] // 256):
        off = b * 210
        d = _f16(row, off + 208, lut)
        for h in range(2):  # two halves of 128 values, each 4 runs of 32 (2 scales per run)
            ql = off + 64 * h
            qh = off + 128 + 32 * h
            sc = off + 192 + 8 * h
            k0 = 256 * b + 128 * h
            for s in range(2):  # 16 values share a scale
                d1 = d * np.float32(np.int8(row[sc + s]))
                d2 = d * np.float32(np.int8(row[sc + s + 2]))
                d3 = d * np.float32(np.int8(row[sc + s + 4]))
                d4 = d * np.float32(np.int8(row[sc + s + 6]))
                for i in range(16):
                    l = 16 * s + i
                    hb = row[qh + l]
                    q1 = np.int32((row[ql + l] & 15) | ((hb & 3) << 4)) - 32
                    q2 = np.int32((row[ql + l + 32] & 15) | (((hb >> 2) & 3) << 4)) - 32
                    q3 = np.int32((row[ql + l] >> 4) | (((hb >> 4) & 3) << 4)) - 32
                    q4 = np.int32((row[ql + l + 32] >> 4) | (((hb >> 6) & 3) << 4)) - 32
                    lanes[l] += d1 * np.float32(q1) * x[k0 + l]
                    lanes[l + 32] += d2 * np.float32(q2) * x[k0 + 32 + l]
                    lanes[l + 64] += d3 * np.float32(q3) * x[k0 + 64 + l]
                    lanes[l + 96] += d4 * np.float32(q4) * x[k0 + 96 + l]


@kernel
def _dot_row(qtype, row, x, lanes, lut):
    """sum_k dequant(row)[k] * x[k]: accumulate into ``lanes`` (zeroed) and reduce once."""
    lanes[:] = 0.0
    if qtype == Q4_1:
        _dot_q4_1(row, x, lanes, lut)
    elif qtype == Q8_0:
        _dot_q8_0(row, x, lanes, lut)
    elif qtype == Q4_K:
        _dot_q4_k(row, x, lanes, lut)
    elif qtype == Q6_K:
        _dot_q6_k(row, x, lanes, lut)
    elif qtype == Q5_0:
        _dot_q5_0(row, x, lanes, lut)
    else:
        _dot_q4_0(row, x, lanes, lut)
    s = np.float32(0.0)
    for j in range(lanes.shape[0]):
        s += lanes[j]
    return s


@parallel_kernel
def quant_matmul(x, w, qtype, lut, y):
    """y[m, n] = sum_k x[m, k] * dequant(w)[n, k].

    x  # [M, K] float32, contiguous
    w  # [N, row_bytes] uint8, GGML blocks
    y  # [M, N] float32 (written)

    Per-lane partial sums (``lanes``) avoid a horizontal reduction per block, so LLVM
    vectorises decode and multiply-add together; a weight row stays in L1 while it is
    dotted with every activation row.
    """
    M = x.shape[0]
    N = w.shape[0]
    n_chunks = min(N, 64)
    rows_per_chunk = (N + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        lanes = np.empty(128, np.float32)  # [128] partial sums, one per vector lane
        for n in range(c * rows_per_chunk, min(N, (c + 1) * rows_per_chunk)):
            row = w[n]
            for m in range(M):
                y[m, n] = _dot_row(qtype, row, x[m], lanes, lut)


@kernel
def _rows_into(x, w, qtype, lut, y, n, lanes):
    row = w[n]
    for m in range(x.shape[0]):
        y[m, n] = _dot_row(qtype, row, x[m], lanes, lut)


@parallel_kernel
def quant_matmul3(x0, w0, q0, y0, x1, w1, q1, y1, x2, w2, q2, y2, lut):
    """Up to three products of one layer input, in one pool launch:
    y_i = x_i @ dequant(w_i).T  (q/k/v projections; gate and up with an empty third).
    The x_i are the same activations, possibly rounded differently per weight type.

    x_i  # [M, K] f32;  w_i  # [N_i, row_bytes_i] uint8;  y_i  # [M, N_i] f32
    """
    N0, N1, N2 = w0.shape[0], w1.shape[0], w2.shape[0]
    N = N0 + N1 + N2
    n_chunks = min(N, 96)
    rows_per_chunk = (N + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        lanes = np.empty(128, np.float32)  # [128] partial sums, one per vector lane
        for r in range(c * rows_per_chunk, min(N, (c + 1) * rows_per_chunk)):
            if r < N0:
                _rows_into(x0, w0, q0, lut, y0, r, lanes)
            elif r < N0 + N1:
                _rows_into(x1, w1, q1, lut, y1, r - N0, lanes)
            else:
                _rows_into(x2, w2, q2, lut, y2, r - N0 - N1, lanes)
