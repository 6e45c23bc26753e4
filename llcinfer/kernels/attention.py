"""Causal multi-head attention over a KV cache (grouped-query: H query heads share
H / KVH key-value heads).

    s[t]   = q . k[t] * scale                 for t <= n_past + m
    out    = sum_t softmax(s)[t] * v[t]

Decode and prefill share the kernel: query row m sits at position n_past + m.  The
softmax is computed online (running max and sum), one pass over the keys.
"""

import numpy as np
from numba import prange

from .jit import kernel, parallel_kernel


@kernel
def _attend(q, k_cache, v_cache, n_past, scale, out, task):
    """One (query row m, head h) pair: task = m * H + h."""
    M, H, D = q.shape
    KVH = k_cache.shape[1]
    m = task // H
    h = task % H
    kvh = h // (H // KVH)
    acc = np.zeros(D, np.float32)  # [D] running weighted sum of values
    running_max = -np.inf
    running_sum = np.float32(0.0)
    for t in range(n_past + m + 1):
        s = np.float32(0.0)
        for d in range(D):
            s += q[m, h, d] * k_cache[t, kvh, d]
        s *= scale
        if s > running_max:
            corr = np.float32(np.exp(running_max - s))
            running_sum *= corr
            for d in range(D):
                acc[d] *= corr
            running_max = s
        p = np.float32(np.exp(s - running_max))
        running_sum += p
        for d in range(D):
            acc[d] += p * v_cache[t, kvh, d]
    inv = np.float32(1.0) / running_sum
    for d in range(D):
        out[m, h, d] = acc[d] * inv


@parallel_kernel
def attention_parallel(q, k_cache, v_cache, n_past, scale, out):
    """q        # [M, H, D] f32 (already rotated)
    k_cache  # [T, KVH, D] f32, positions 0 .. n_past + M - 1 filled
    v_cache  # [T, KVH, D] f32
    out      # [M, H, D] f32
    """
    M, H, D = q.shape
    for task in prange(M * H):
        _attend(q, k_cache, v_cache, n_past, scale, out, task)


@kernel
def attention_serial(q, k_cache, v_cache, n_past, scale, out):
    """Same as attention_parallel on the calling thread (small work: no pool launch)."""
    M, H, D = q.shape
    for task in range(M * H):
        _attend(q, k_cache, v_cache, n_past, scale, out, task)


# Below this many multiply-adds a pool launch (~10 us) costs more than it saves.
_SERIAL_WORK = 1 << 17


def attention(q, k_cache, v_cache, n_past, scale, out):
    """Causal GQA attention of q's rows at positions n_past.. over the cache (see module doc)."""
    M, H, D = q.shape
    work = M * H * D * (n_past + M) * 2
    if work < _SERIAL_WORK:
        attention_serial(q, k_cache, v_cache, n_past, scale, out)
    else:
        attention_parallel(q, k_cache, v_cache, n_past, scale, out)
