"""The decoder forward pass on the kernels (the fast path).

    x = embed(tokens)
    for each layer:
        h = rmsnorm(x);  q, k, v = h Wq (+bq), h Wk (+bk), h Wv (+bv);  rope(q, k);  K, V appended
        x += attention(q, K_cache, V_cache) Wo
        h = rmsnorm(x);  x += (silu(h Wg) * h Wu) Wd
    logits = rmsnorm(x) Wout
"""

from __future__ import annotations

import numpy as np

from .. import kernels as K
from ..model.architectures import get_architecture
from ..model.architectures.base import ModelConfig, ModelWeights
from ..model.gguf_file import GGUFFile
from ..dtypes import KV_INT8
from ..kv import DEFAULT_BLOCK_SIZE, KVPool, PagedSequence, PrefixCache, new_pool
from ..kernels.paged_attention import attention_tag
from ..weights.repack_cache import wait_loaded


def check_tree(parents: np.ndarray, n: int) -> None:
    """ValueError unless ``parents``  # [n] is -1 for row 0 and an earlier row for every other."""
    parents = np.asarray(parents, np.int64).reshape(-1)
    if parents.size != n or parents[0] != -1 or np.any(parents[1:] < 0) or np.any(parents[1:] >= np.arange(1, n)):
        raise ValueError("a draft tree's parents must be -1 for row 0 and an earlier row for every other")


def rope_inv_freq(cfg: ModelConfig, freq_factors: np.ndarray | None) -> np.ndarray:
    """inv_freq[i] = base^(-2i/d) / factor[i]   # [rope_dim / 2] f64"""
    i = np.arange(cfg.rope_dim // 2, dtype=np.float64)
    inv = cfg.rope_base ** (-2.0 * i / cfg.rope_dim)
    if freq_factors is not None:
        inv = inv / freq_factors.astype(np.float64)
    return inv


class Transformer:
    """Weights bound to kernels plus the forward pass.  One instance serves many sequences;
    each sequence brings its own ``PagedSequence``."""

    def __init__(self, gguf: GGUFFile, llama_rounding: bool = True):
        arch_name = gguf.require("general.architecture")
        arch = get_architecture(arch_name)
        self.gguf = gguf
        self.config: ModelConfig = arch.read_config(gguf)
        self.weights: ModelWeights = arch.load_weights(gguf, self.config, K.Linear)
        self.inv_freq = rope_inv_freq(self.config, self.weights.rope_freq_factors)  # [rope_dim/2]
        self.scale = np.float32(1.0 / np.sqrt(self.config.head_dim))
        # Round matmul inputs to 8-bit blocks and K/V/Q to f16 as llama.cpp does (greedy
        # output then agrees with it except at near-ties); False keeps exact float32.
        self.llama_rounding = bool(llama_rounding)
        # vector exp in SwiGLU (as llama.cpp's own SIMD expf) with llama_rounding; libm's otherwise
        self.tag = attention_tag() if self.llama_rounding else None
        c, layers = self.config, self.weights.layers
        self.has_bias = layers[0].bq is not None
        self.bq, self.bk, self.bv = (  # [L, H*D], [L, KVH*D], [L, KVH*D] f32 (zeros without biases)
            np.stack([getattr(lw, n) for lw in layers]).astype(np.float32) if self.has_bias
            else np.zeros((c.n_layer, width), np.float32)
            for n, width in (("bq", c.n_head * c.head_dim), ("bk", c.n_kv_head * c.head_dim),
                             ("bv", c.n_kv_head * c.head_dim)))
        self._weights_settled = False  # the repacked weights are on 2 MiB pages (repack_cache)
        self.sparse = None  # sparse.SparseAttention of the engine's pool (engine/sparse_setup.py), None: dense

    def settle_weights(self) -> None:
        """Called by the engine at each decode step after the first token: lets the repacked
        weights move onto 2 MiB pages in the background (repack_cache.wait_loaded), until
        they have; raises ModelFileError if their file went bad.  Not at load (warm_up) nor
        before the first token, whose compute would share the CPUs with the copy."""
        if not self._weights_settled:
            self._weights_settled = wait_loaded(block=False)

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
            from ..kv import default_budget

            budget_bytes = default_budget(model_bytes=self.weights.nbytes)
        return new_pool(c.n_layer, c.n_kv_head, c.head_dim, n_ctx, n_seq, kv_type or self.default_kv_type,
                        block_size, budget_bytes, prefix_sharing)

    def new_cache(self, n_ctx: int, kv_type: str | None = None, block_size: int = DEFAULT_BLOCK_SIZE) -> PagedSequence:
        """A single sequence's cache on a private paged pool."""
        pool, prefix = self.new_pool(n_ctx, 1, kv_type, block_size)
        return PagedSequence(pool, n_ctx, prefix)

    def forward(self, tokens, cache: PagedSequence, all_logits: bool = False) -> np.ndarray:
        """Run ``tokens`` at positions cache.n_tokens ... of one sequence (``forward_chunks``);
        logits # [M, vocab] if all_logits else [vocab] for the last token."""
        rows = np.arange(len(tokens)) if all_logits else None
        logits = self.forward_chunks([(cache, tokens)], logit_rows=rows)
        return logits if all_logits else logits[0]

    def forward_chunks(self, chunks: list[tuple[PagedSequence, list[int]]],
                       logit_rows: np.ndarray | None = None,
                       trees: list[np.ndarray | None] | None = None) -> np.ndarray:
        """Run each chunk's tokens at positions seq.n_tokens ... of its sequence and append
        their K/V to it, all chunks in one pass: the matmuls take the rows of every chunk
        at once, rope works per row, KV append and attention per chunk.

        ``trees[i]`` (speculative verification): the parents  # [n] int of chunk i's rows
        as a draft tree (-1 for row 0, the root; parents before children).  Row r then
        sits at slot n + r, position n + depth(r), and attends to the prefix and its
        ancestors only; the sequence keeps every row until ``seq.commit_path``.

        Returns logits # [n_chunks, vocab] of each chunk's last token, or # [R, vocab] of
        the rows ``logit_rows``  # [R] (indices into the pass's rows, chunk after chunk).  A
        row's result depends on that row alone (its token, position and sequence), not on
        the other rows.
        """
        c, w = self.config, self.weights
        ids = [np.asarray(t, dtype=np.int64).reshape(-1) for _, t in chunks]
        if not chunks or any(i.size == 0 for i in ids):
            raise ValueError("forward needs at least one token per chunk")
        if len({id(seq) for seq, _ in chunks}) != len(chunks):
            raise ValueError("forward: a sequence appears in two chunks")
        for i in ids:
            if i.min() < 0 or i.max() >= c.vocab_size:
                raise ValueError(f"token id out of range [0, {c.vocab_size})")
        n_rows = sum(i.size for i in ids)
        if logit_rows is not None and len(logit_rows) and (min(logit_rows) < 0 or max(logit_rows) >= n_rows):
            raise ValueError(f"logit rows out of range [0, {n_rows})")
        pool = chunks[0][0].pool
        if any(seq.pool is not pool for seq, _ in chunks):
            raise ValueError("forward: every sequence must live in one KV pool")
        for (seq, _), i in zip(chunks, ids):
            seq.prepare(i)  # room check; blocks committed (OutOfMemoryError before any compute)
        pos0 = [seq.n_tokens for seq, _ in chunks]
        trees = trees or [None] * len(chunks)
        for t, i, p in zip(trees, ids, pos0):
            if t is not None:
                check_tree(t, i.size)
                if pool.kind == KV_INT8 or p < 1:
                    raise ValueError("a draft tree needs a committed prefix in an f16 or f32 KV pool")
                if self.sparse is not None:
                    raise ValueError("draft trees and sparse attention do not combine (the index cache stays put)")
        tree_rows = []
        try:
            for (seq, _), t in zip(chunks, trees):
                tree_rows.append(None if t is None else seq.tree_rows(t))
            return self._forward(chunks, ids, pos0, logit_rows, trees, tree_rows)
        finally:
            for r in tree_rows:
                if r is not None:
                    r.release()

    def _forward(self, chunks, ids, pos0, logit_rows, trees, tree_rows) -> np.ndarray:
        c, w = self.config, self.weights
        pool = chunks[0][0].pool
        all_ids = np.concatenate(ids)  # [M] the rows of every chunk, chunk after chunk
        M = all_ids.size
        ends = np.cumsum([i.size for i in ids])  # [n_chunks] row after each chunk's last
        starts = ends - np.array([i.size for i in ids])
        slots = np.concatenate([np.arange(p, p + i.size, dtype=np.int64) for p, i in zip(pos0, ids)])  # [M]
        positions = slots.copy()  # [M] RoPE positions: a tree row's is its depth after the prefix
        for rows, p, r0, r1 in zip(tree_rows, pos0, starts, ends):
            if rows is not None:
                positions[r0:r1] = p + rows.depth
        row_seq = np.repeat(np.arange(len(chunks), dtype=np.int64), [i.size for i in ids])  # [M] chunk of each row
        tables = np.zeros((len(chunks), max(seq.n_blocks for seq, _ in chunks)), np.int32)  # [chunk, blocks]
        for t, (seq, _) in zip(tables, chunks):
            t[:seq.n_blocks] = seq.table[:seq.n_blocks]
        cs = np.empty((M, self.inv_freq.shape[0], 2), np.float32)  # [M, D/2, 2] rope cos / sin of each row
        K.rope_table(positions, self.inv_freq, cs)
        kv = pool.kernel_args()
        x = w.token_embd.get_rows(all_ids)  # [M, d_model] residual stream
        h = np.empty_like(x)  # [M, d_model] normed input of a block
        attn = np.empty((M, c.n_head, c.head_dim), np.float32)  # [M, H, D]
        rnd = self.llama_rounding
        sp = self.sparse
        selected = [{} for _ in chunks]  # per chunk: the last full layer's tables and keys (SparseAttention.attend)
        for li, lw in enumerate(w.layers):
            K.rms_norm(x, lw.attn_norm, c.rms_eps, h)
            q, k, v = K.linear_many(h, [lw.wq, lw.wk, lw.wv], rnd)  # [M, H*D], [M, KVH*D], [M, KVH*D]
            # + bias, rope, Q rounded to f16 as llama.cpp multiplies it by its f16 K cache, K/V appended
            K.rope_append_rows(q, k, v, self.bq, self.bk, self.bv, self.has_bias, li, c.n_head // c.n_kv_head,
                               c.head_dim, slots, row_seq, cs, c.rope_neox, rnd, kv["pool"], kv["kv_kind"],
                               tables, c.n_kv_head, kv["bs"], self.tag)
            if sp is not None:  # index keys of the rotated K (full layers)
                sp.store_index(li, k, slots, row_seq, tables)
            q3 = q.reshape(M, c.n_head, c.head_dim)
            for (seq, _), r0, r1, p0, tr, sel in zip(chunks, starts, ends, pos0, tree_rows, selected):
                if kv["kv_kind"] == KV_INT8:  # rows quantized with their scales (not appended above)
                    seq.store(li, p0, k[r0:r1].reshape(-1, c.n_kv_head, c.head_dim),
                              v[r0:r1].reshape(-1, c.n_kv_head, c.head_dim))
                if tr is not None:
                    seq.tree_attention(li, q3[r0:r1], p0, tr, self.scale, attn[r0:r1])
                elif sp is None:
                    seq.attention(li, q3[r0:r1], p0, self.scale, attn[r0:r1])
                else:
                    sp.attend(seq, li, q3[r0:r1], p0, self.scale, attn[r0:r1], sel)
            x += lw.wo(attn.reshape(M, -1), llama_rounding=rnd)
            K.rms_norm(x, lw.ffn_norm, c.rms_eps, h)
            gate, up = K.linear_many(h, [lw.w_gate, lw.w_up], rnd)  # [M, d_ff] each
            K.swiglu(gate, up, gate, self.tag)
            x += lw.w_down(gate, llama_rounding=rnd)
        for (seq, _), i, t in zip(chunks, ids, trees):
            seq.finish(i, index=t is None)  # n_tokens += rows; full blocks indexed for prefix sharing
        rows = x[ends - 1] if logit_rows is None else x[np.asarray(logit_rows, np.int64)]
        K.rms_norm(rows, w.output_norm, c.rms_eps, rows)
        return w.output(np.ascontiguousarray(rows), llama_rounding=rnd)  # [n_chunks or M, vocab]
