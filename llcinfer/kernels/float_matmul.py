"""Matrix products with float weights: F32, and F16 / BF16 read through lookup tables.

    y[m, n] = sum_k x[m, k] * W[n, k]
"""

import numpy as np
from numba import prange

from ..jit import parallel_kernel


@parallel_kernel
def f32_matmul(x, w, y):
    """x  # [M, K] f32;  w  # [N, K] f32;  y  # [M, N] f32"""
    M, K = x.shape
    N = w.shape[0]
    for n in prange(N):
        for m in range(M):
            s = np.float32(0.0)
            for k in range(K):
                s += x[m, k] * w[n, k]
            y[m, n] = s


@parallel_kernel
def half_matmul(x, w_bits, lut, y):
    """F16 or BF16 weights given as raw 16-bit patterns and the matching table.

    x       # [M, K] f32
    w_bits  # [N, K] uint16
    lut     # [65536] f32 (F16_TO_F32 or BF16_TO_F32)
    y       # [M, N] f32
    """
    M, K = x.shape
    N = w_bits.shape[0]
    for n in prange(N):
        wrow = np.empty(K, np.float32)
        for k in range(K):
            wrow[k] = lut[w_bits[n, k]]
        for m in range(M):
            s = np.float32(0.0)
            for k in range(K):
                s += x[m, k] * wrow[k]
            y[m, n] = s


@parallel_kernel
def half_get_rows(w_bits, ids, lut, out):
    """out[i] = W[ids[i]] for F16/BF16 weights.  w_bits # [N, K] uint16; out # [T, K] f32"""
    T, K = out.shape
    for i in prange(T):
        for k in range(K):
            out[i, k] = lut[w_bits[ids[i], k]]
