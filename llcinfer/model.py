"""The decoder forward pass on the kernels (the fast path).

    x = embed(tokens)
    for each layer:
        h = rmsnorm(x);  q, k, v = h Wq (+bq), h Wk (+bk), h Wv (+bv);  rope(q, k)
        x += attention(q, K_cache, V_cache) Wo
        h = rmsnorm(x);  x += (silu(h Wg) * h Wu) Wd
    logits = rmsnorm(x) Wout
"""

from __future__ import annotations

import numpy as np

from . import kernels as K
from .architectures import get_architecture
from .architectures.base import ModelConfig, ModelWeights
from .gguf_file import GGUFFile
from .kv import DEFAULT_BLOCK_SIZE, KVPool, PagedSequence, PrefixCache, new_pool
from .kernels.paged_attention import attention_tag
from .kernels.repack_cache import wait_loaded
from .kv_cache import KVCache


def rope_inv_freq(cfg: ModelConfig, freq_factors: np.ndarray | None) -> np.ndarray:
    """inv_freq[i] = base^(-2i/d) / factor[i]   # [rope_dim / 2] f64"""
    i = np.arange(cfg.rope_dim // 2, dtype=np.float64)
    inv = cfg.rope_base ** (-2.0 * i / cfg.rope_dim)
    if freq_factors is not None:
        inv = inv / freq_factors.astype(np.float64)
    return inv


class Transformer:
    """Weights bound to kernels plus the forward pass.  One instance serves many sequences;
    each sequence brings its own ``KVCache``."""

    def __init__(self, gguf: GGUFFile, llama_rounding: bool = True):
        arch_name = gguf.require("general.architecture")
        arch = get_architecture(arch_name)
        self.gguf = gguf
        self.config: ModelConfig = arch.read_config(gguf)
        self.weights: ModelWeights = arch.load_weights(gguf, self.config)
        self.inv_freq = rope_inv_freq(self.config, self.weights.rope_freq_factors)  # [rope_dim/2]
        self.scale = np.float32(1.0 / np.sqrt(self.config.head_dim))
        # Round matmul inputs to 8-bit blocks and K/V/Q to f16 as llama.cpp does (greedy
        # output then agrees with it except at near-ties); False keeps exact float32.
        self.llama_rounding = bool(llama_rounding)
        # vector exp in SwiGLU (as llama.cpp's own SIMD expf) with llama_rounding; libm's otherwise
        self.tag = attention_tag() if self.llama_rounding else None
        self.executor = None  # DecodeExecutor for one-token steps (use_executor), else the simple path
        self._weights_settled = False  # the repacked weights are on 2 MiB pages (repack_cache)

    def settle_weights(self) -> None:
        """Called by the engine at each decode step after the first token: lets the repacked
        weights move onto 2 MiB pages in the background (repack_cache.wait_loaded), until
        they have; raises ModelFileError if their file went bad.  Not at load (warm_up) nor
        before the first token, whose compute would share the CPUs with the copy."""
        if not self._weights_settled:
            self._weights_settled = wait_loaded(block=False)

    def use_executor(self, domains=None) -> str | None:
        """Run decode steps on the dependency-driven executor with ``domains`` (None: stop
        using it).  Returns why it cannot be used (None when it is).  LLCINFER_EXECUTOR=0
        keeps the simple path."""
        import os

        from .executor import DecodeExecutor, unsupported_reason

        if self.executor is not None:
            self.executor.close()
            self.executor = None
        if domains is None:
            return None
        if os.environ.get("LLCINFER_EXECUTOR", "1") == "0":
            return "disabled by LLCINFER_EXECUTOR=0"
        why = unsupported_reason(self)
        if why is None:
            self.executor = DecodeExecutor(self, domains)
        return why

    def _executor_for(self, caches) -> bool:
        ex = self.executor
        return (ex is not None and all(isinstance(c, PagedSequence) and c.pool.kind in (0, 1) for c in caches)
                and len({id(c.pool) for c in caches}) == 1)

    def decode_batch(self, tokens, caches: list) -> np.ndarray:
        """One token for each sequence (tokens[i] continues caches[i]); logits # [M, vocab].
        One executor step for all of them when possible, else one forward each."""
        if len(tokens) != len(caches):
            raise ValueError(f"decode_batch: {len(tokens)} tokens for {len(caches)} sequences")
        if self._executor_for(caches):
            return self.executor.step(caches, tokens)
        return np.stack([self.forward([t], c) for t, c in zip(tokens, caches)])

    @property
    def default_kv_type(self) -> str:
        """f16 as llama.cpp (the default numerics); f32 in exact mode."""
        return "f16" if self.llama_rounding else "f32"

    def new_pool(self, n_ctx: int, n_seq: int = 1, kv_type: str | None = None,
                 block_size: int = DEFAULT_BLOCK_SIZE, budget_bytes: int | None = None,
                 prefix_sharing: bool = True) -> tuple[KVPool, PrefixCache | None]:
        """A paged KV pool for ``n_seq`` sequences of up to ``n_ctx`` tokens (and its prefix cache)."""
        c = self.config
        if budget_bytes is None:
            from .kv import default_budget

            budget_bytes = default_budget(model_bytes=self.weights.nbytes)
        return new_pool(c.n_layer, c.n_kv_head, c.head_dim, n_ctx, n_seq, kv_type or self.default_kv_type,
                        block_size, budget_bytes, prefix_sharing)

    def new_cache(self, n_ctx: int, kv_type: str | None = None, layout: str = "paged",
                  block_size: int = DEFAULT_BLOCK_SIZE) -> PagedSequence | KVCache:
        """A single sequence's cache: on a private paged pool (default), or the simple
        contiguous f32 array (``layout="contiguous"``, for comparisons)."""
        c = self.config
        if layout == "contiguous":
            return KVCache(c.n_layer, n_ctx, c.n_kv_head, c.head_dim, f16_values=self.llama_rounding)
        pool, prefix = self.new_pool(n_ctx, 1, kv_type, block_size)
        return PagedSequence(pool, n_ctx, prefix)

    def forward(self, tokens, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        """Run ``tokens`` at positions cache.n_tokens ...; append their K/V to the cache.

        Returns logits # [M, vocab] if all_logits else [vocab] for the last token.
        """
        c, w = self.config, self.weights
        if type(tokens) in (list, tuple) and len(tokens) == 1 and self._executor_for([cache]):
            logits = self.executor.step([cache], tokens)  # decode: one token, checked there
            return logits if all_logits else logits[0]
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        M = ids.size
        if M == 0:
            raise ValueError("forward() needs at least one token")
        if ids.min() < 0 or ids.max() >= c.vocab_size:
            raise ValueError(f"token id out of range [0, {c.vocab_size})")
        if M == 1 and self._executor_for([cache]):
            logits = self.executor.step([cache], ids)
            return logits if all_logits else logits[0]
        cache.prepare(ids)  # room check; blocks committed (OutOfMemoryError before any compute)
        pos0 = cache.n_tokens
        positions = np.arange(pos0, pos0 + M, dtype=np.int64)  # [M]
        x = w.token_embd.get_rows(ids)  # [M, d_model] residual stream
        h = np.empty_like(x)  # [M, d_model] normed input of a block
        attn = np.empty((M, c.n_head, c.head_dim), np.float32)  # [M, H, D]
        rnd = self.llama_rounding
        for li, lw in enumerate(w.layers):
            K.rms_norm(x, lw.attn_norm, c.rms_eps, h)
            q, k, v = K.linear_many(h, [lw.wq, lw.wk, lw.wv], rnd)  # [M, H*D], [M, KVH*D], [M, KVH*D]
            if lw.bq is not None:
                q += lw.bq
                k += lw.bk
                v += lw.bv
            q3 = q.reshape(M, c.n_head, c.head_dim)
            k3 = k.reshape(M, c.n_kv_head, c.head_dim)
            K.rope_inplace(q3, positions, self.inv_freq, c.rope_neox)
            K.rope_inplace(k3, positions, self.inv_freq, c.rope_neox)
            cache.store(li, pos0, k3, v.reshape(M, c.n_kv_head, c.head_dim))
            if rnd:  # llama.cpp multiplies Q by its f16 K cache in f16
                q3[...] = q3.astype(np.float16)
            cache.attention(li, q3, pos0, self.scale, attn)
            x += lw.wo(attn.reshape(M, -1), llama_rounding=rnd)
            K.rms_norm(x, lw.ffn_norm, c.rms_eps, h)
            gate, up = K.linear_many(h, [lw.w_gate, lw.w_up], rnd)  # [M, d_ff] each
            K.swiglu(gate, up, gate, self.tag)
            x += lw.w_down(gate, llama_rounding=rnd)
        cache.finish(ids)  # n_tokens += M; full blocks indexed for prefix sharing
        rows = x if all_logits else x[-1:]
        K.rms_norm(rows, w.output_norm, c.rms_eps, rows)
        logits = w.output(np.ascontiguousarray(rows), llama_rounding=rnd)  # [M or 1, vocab]
        return logits if all_logits else logits[0]

    def warm_up(self) -> None:
        """Compile (or load from numba's disk cache) every kernel the forward pass uses, so
        the first prompt's timing measures the model, not the JIT."""
        cache = self.new_cache(4)
        self.forward([0, 0], cache)  # batched path
        self.forward([0], cache)  # decode path
