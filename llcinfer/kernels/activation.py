"""SwiGLU feed-forward activation.

    y = silu(gate) * up,   silu(g) = g / (1 + exp(-g))

exp(-g) is clamped so a very negative gate gives 0 instead of inf/inf (fastmath assumes
no infinities, and g / (1 + inf) came out NaN).
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
            e = np.exp(min(-g, np.float32(80.0)))
            y[m, f] = g / (np.float32(1.0) + e) * up[m, f]
