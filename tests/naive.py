"""Plain-NumPy oracles (float64) that the kernel tests compare against.  Nothing here
shares code with llcinfer's kernels."""

from __future__ import annotations

import numpy as np


def attention_oracle(q, k, v, n_past, scale):
    """Causal GQA softmax attention; q  # [M, H, D], k, v  # [T, KVH, D]; query row m is at
    position n_past + m and sees keys 0 .. n_past + m."""
    M, H, D = q.shape
    KVH = k.shape[1]
    group = H // KVH
    out = np.empty((M, H, D))
    for m in range(M):
        T = n_past + m + 1
        for h in range(H):
            kv = h // group
            s = k[:T, kv].astype(np.float64) @ q[m, h].astype(np.float64) * float(scale)
            p = np.exp(s - s.max())
            p /= p.sum()
            out[m, h] = p @ v[:T, kv].astype(np.float64)
    return out
