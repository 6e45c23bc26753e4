"""RMSNorm.

    y[m, k] = x[m, k] / sqrt(mean_k(x[m, :]^2) + eps) * w[k]
"""

import numpy as np

from ..jit import ordered_kernel


@ordered_kernel
def rms_norm(x, w, eps, y):
    """x  # [M, K] f32;  w  # [K] f32;  y  # [M, K] f32 (may alias x).  The sum of squares
    runs in index order wherever this is compiled (``ordered_kernel``), so the executor and
    the batched pass, fresh or cached, norm a row to the same bits."""
    M, K = x.shape
    for m in range(M):
        ss = np.float32(0.0)
        for k in range(K):
            ss += x[m, k] * x[m, k]
        inv = np.float32(1.0) / np.sqrt(ss / np.float32(K) + np.float32(eps))
        for k in range(K):
            y[m, k] = x[m, k] * inv * w[k]
