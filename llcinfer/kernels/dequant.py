"""Rows of a GGML block-quantized matrix as float32: the token-embedding lookup of every
decode step.  gguf.quants.dequantize (the oracle, tests/test_kernels.py) costs about
0.2 ms of Python per call for one row, 5 % of a SmolLM2 decode step; this is one numba
call.  Block layouts and value formulas: quant_matmul.py's module docstring.
"""

import numpy as np

from ..jit import kernel
from .quant_matmul import Q4_1, Q4_K, Q5_0, Q6_K, Q8_0, _f16, _k4_scale_min


@kernel
def _row_32(qtype, row, out, lut):
    """Q4_0 / Q4_1 / Q5_0 / Q8_0: out[32 b + j] for every block b."""
    for b in range(out.shape[0] // 32):
        k0 = 32 * b
        if qtype == Q8_0:
            off = b * 34
            d = _f16(row, off, lut)
            for j in range(32):
                out[k0 + j] = d * np.float32(np.int8(row[off + 2 + j]))
            continue
        if qtype == Q4_1:
            off = b * 20
            d, m, qs, hbits = _f16(row, off, lut), _f16(row, off + 2, lut), off + 4, np.uint32(0)
        elif qtype == Q5_0:
            off = b * 22
            d, m, qs = _f16(row, off, lut), np.float32(0.0), off + 6
            hbits = (np.uint32(row[off + 2]) | (np.uint32(row[off + 3]) << 8)
                     | (np.uint32(row[off + 4]) << 16) | (np.uint32(row[off + 5]) << 24))
        else:  # Q4_0
            off = b * 18
            d, m, qs, hbits = _f16(row, off, lut), np.float32(0.0), off + 2, np.uint32(0)
        bias = 16 if qtype == Q5_0 else (0 if qtype == Q4_1 else 8)
        for j in range(16):
            q = row[qs + j]
            lo = np.int32(q & 15) | np.int32(((hbits >> j) & 1) << 4)
            hi = np.int32(q >> 4) | np.int32(((hbits >> (j + 16)) & 1) << 4)
            out[k0 + j] = d * np.float32(lo - bias) + m
            out[k0 + 16 + j] = d * np.float32(hi - bias) + m


@kernel
def _row_q4_k(row, out, lut):
    for b in range(out.shape[0] // 256):
        off = b * 144
        d, dmin = _f16(row, off, lut), _f16(row, off + 2, lut)
        for g in range(4):  # 64 values: 32 low nibbles (sub-block 2g), 32 high (2g + 1)
            sc1, m1 = _k4_scale_min(row, off + 4, 2 * g)
            sc2, m2 = _k4_scale_min(row, off + 4, 2 * g + 1)
            k0 = 256 * b + 64 * g
            for l in range(32):
                q = row[off + 16 + 32 * g + l]
                out[k0 + l] = d * sc1 * np.float32(q & 15) - dmin * m1
                out[k0 + 32 + l] = d * sc2 * np.float32(q >> 4) - dmin * m2


@kernel
def _row_q6_k(row, out, lut):
    for b in range(out.shape[0] // 256):
        off = b * 210
        d = _f16(row, off + 208, lut)
        for h in range(2):  # two halves of 128 values: 4 runs of 32, a scale per 16
            ql, qh, sc, k0 = off + 64 * h, off + 128 + 32 * h, off + 192 + 8 * h, 256 * b + 128 * h
            for l in range(32):
                hb = row[qh + l]
                s = l // 16
                q = ((row[ql + l] & 15) | ((hb & 3) << 4), (row[ql + l + 32] & 15) | (((hb >> 2) & 3) << 4),
                     (row[ql + l] >> 4) | (((hb >> 4) & 3) << 4), (row[ql + l + 32] >> 4) | (((hb >> 6) & 3) << 4))
                for r in range(4):
                    out[k0 + 32 * r + l] = d * np.float32(np.int8(row[sc + s + 2 * r])) * np.float32(np.int32(q[r]) - 32)


@kernel
def quant_get_rows(w, ids, qtype, lut, out):
    """out[i] = dequant(w[ids[i]])   w  # [N, row bytes] uint8; ids checked by the caller;
    out  # [len(ids), K] float32."""
    for i in range(ids.shape[0]):
        row = w[ids[i]]
        if qtype == Q4_K:
            _row_q4_k(row, out[i], lut)
        elif qtype == Q6_K:
            _row_q6_k(row, out[i], lut)
        else:
            _row_32(qtype, row, out[i], lut)
