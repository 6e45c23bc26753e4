"""A simple contiguous per-sequence KV cache (float32): the reference layout.

The default cache is the paged pool (llcinfer.kv); this one stays for comparisons
(``Transformer.new_cache(n_ctx, layout="contiguous")``, perf/kv_cache_report.py) and
implements the same forward protocol (prepare / store / attention / finish / truncate).
NumPy's zeroed allocation is lazily committed by the OS.
"""

from __future__ import annotations

import numpy as np

from .errors import ContextLengthError, OutOfMemoryError
from .kernels import attention


class KVCache:
    def __init__(self, n_layer: int, n_ctx: int, n_kv_head: int, head_dim: int, f16_values: bool = True):
        self.n_ctx = int(n_ctx)
        self.f16_values = f16_values  # store values rounded to f16, as llama.cpp's f16 cache holds them
        try:
            self.k = np.zeros((n_layer, n_ctx, n_kv_head, head_dim), np.float32)  # [layer, token, kv_head, head_dim]
            self.v = np.zeros((n_layer, n_ctx, n_kv_head, head_dim), np.float32)  # [layer, token, kv_head, head_dim]
        except MemoryError:
            gib = 2 * n_layer * n_ctx * n_kv_head * head_dim * 4 / 2**30
            raise OutOfMemoryError(f"cannot allocate a KV cache of {gib:.1f} GiB for {n_ctx} tokens") from None
        self.n_tokens = 0  # positions 0 .. n_tokens-1 hold valid K/V

    def check_room(self, n_new: int) -> None:
        if self.n_tokens + n_new > self.n_ctx:
            raise ContextLengthError(
                f"context full: {self.n_tokens} + {n_new} tokens exceed the context length {self.n_ctx}"
            )

    def prepare(self, ids) -> None:
        self.check_room(len(ids))

    def finish(self, ids) -> None:
        self.n_tokens += len(ids)

    @property
    def itemsize(self) -> int:
        return self.k.itemsize

    def read(self, layer: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(k, v)  # [stop - start, n_kv_head, head_dim] f32 copies"""
        return self.k[layer, start:stop].copy(), self.v[layer, start:stop].copy()

    def attention(self, layer: int, q: np.ndarray, n_past: int, scale, out: np.ndarray) -> None:
        """out  # [M, H, D] = causal attention of q  # [M, H, D] over positions 0 .. n_past+M-1"""
        attention(q, self.k[layer], self.v[layer], n_past, scale, out)

    def store(self, layer: int, pos0: int, k: np.ndarray, v: np.ndarray) -> None:
        """k, v  # [M, n_kv_head, head_dim] for positions pos0 .. pos0+M-1"""
        if self.f16_values:
            k, v = k.astype(np.float16), v.astype(np.float16)
        self.k[layer, pos0:pos0 + k.shape[0]] = k
        self.v[layer, pos0:pos0 + v.shape[0]] = v

    def truncate(self, n_tokens: int) -> None:
        """Forget every position >= n_tokens (rollback, or reuse of a shared prefix)."""
        self.n_tokens = max(0, min(int(n_tokens), self.n_tokens))

    def clear(self) -> None:
        self.n_tokens = 0
