"""SwiGLU feed-forward activation.

    y = silu(gate) * up,   silu(g) = g / (1 + exp(-g))
"""

import numpy as np

from .jit import kernel


@kernel
def swiglu(gate, up, y):
    """gate, up, y  # [M, F] f32 (y may alias gate)"""
    M, F = gate.shape
    for m in range(M):
        for f in range(F):
            g = gate[m, f]
            y[m, f] = g / (np.float32(1.0) + np.exp(-g)) * up[m, f]
