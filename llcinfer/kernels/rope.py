"""Rotary position embedding, in place.

For pair i of a head (i < D/2) at position p:  theta = p * inv_freq[i]
    [a, b] <- [a cos(theta) - b sin(theta),  a sin(theta) + b cos(theta)]
NORM (llama in GGUF): the pair is (2i, 2i+1).  NEOX (qwen2): the pair is (i, i + D/2).
"""

import numpy as np

from ..jit import kernel


@kernel
def rope_inplace(x, positions, inv_freq, neox):
    """x  # [M, H, D] f32, rotated in place;  positions  # [M] int64;  inv_freq  # [D/2] f64"""
    M, H, D = x.shape
    half = D // 2
    for m in range(M):
        p = np.float64(positions[m])
        for i in range(half):
            theta = p * inv_freq[i]
            c = np.float32(np.cos(theta))
            s = np.float32(np.sin(theta))
            for h in range(H):
                if neox:
                    ia, ib = i, i + half
                else:
                    ia, ib = 2 * i, 2 * i + 1
                a = x[m, h, ia]
                b = x[m, h, ib]
                x[m, h, ia] = a * c - b * s
                x[m, h, ib] = a * s + b * c
