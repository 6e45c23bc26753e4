"""One sequence's view of the KV pool: its block table, tokens, prefix ids.

Token position t lives in block ``table[t // block_size]`` at slot ``t % block_size``.
The sequence is the cache object ``Transformer.forward`` takes:

    prepare(ids)                 room check, copy-on-write of a shared tail block, new blocks
    store(layer, pos0, k, v)     k, v  # [M, kv_head, head_dim] f32 -> the pool's storage type
    attention(layer, q, n_past, scale, out)   prompt rows: the blocked prefill kernel
    finish(ids)                  n_tokens += M; index blocks that became full (prefix sharing)
    truncate(n)                  rollback: drop every position >= n (whole blocks go back)
    tree_attention(...), commit_path(n_prefix, path)
                                 a draft tree after the prefix (speculative verification):
                                 its rows' attention, then the accepted path kept

``prepare`` raises OutOfMemoryError before any compute when the pool cannot commit a
block; the sequence is then exactly as it was, and other sequences are unaffected.
"""

from __future__ import annotations

import numba
import numpy as np

from ..dtypes import KV_F16, KV_F32
from ..errors import ContextLengthError, OutOfMemoryError
from ..kernels.paged_attention import attention_tag, kv_index, paged_attention, store_rows, store_rows_int8
from ..kernels.prefill_attention import prefill_attention
from ..kernels.tree_attention import move_kv_slots, tree_attention
from ..kernels.tables import F16_TO_F32
from .pool import KVPool
from .prefix import PrefixCache
from .tree_rows import TreeRows


class PagedSequence:
    def __init__(self, pool: KVPool, n_ctx: int, prefix: PrefixCache | None = None, name: str = "sequence 0"):
        self.pool, self.prefix, self.name = pool, prefix, name
        self.n_ctx = int(n_ctx)
        self.block_size = bs = pool.block_size
        self.table = np.zeros(max(1, -(-self.n_ctx // bs)), np.int32)  # [block slot] pool block ids
        self.n_blocks = 0  # table[:n_blocks] are held (refcount taken)
        self.ids: list[int | None] = []  # [block slot] prefix id of the (full) block, None if not indexed
        self.tokens: list[int] = []  # token id at each position (-1: written without a token id)
        self._n = 0
        self._indexed = 0  # ids[:_indexed] are all set
        self._spare: int | None = None  # a block held past the table for the next growth (commit_path)
        # positions below this attend on the blocked prefill kernel, the rest on the decode
        # kernels; None: the rows of a call with M > 1 rows (see ``attention``)
        self.prefill_until: int | None = None

    # ------------------------------------------------------------------ size
    @property
    def n_tokens(self) -> int:
        return self._n

    @n_tokens.setter
    def n_tokens(self, n: int) -> None:
        """Set the length directly (benchmarks that fill K/V with ``store``): grows with
        unknown tokens, which are never indexed for sharing, or truncates."""
        n = int(n)
        if n <= self._n:
            self.truncate(n)
            return
        self.check_room(n - self._n)
        self._grow(n)
        self.tokens.extend([-1] * (n - self._n))
        self._n = n

    @property
    def itemsize(self) -> int:
        return self.pool.data.itemsize

    def block_addresses(self) -> list[int]:
        return [self.pool.block_address(b) for b in self.table[:self.n_blocks]]

    def check_room(self, n_new: int) -> None:
        if self._n + n_new > self.n_ctx:
            raise ContextLengthError(
                f"context full: {self._n} + {n_new} tokens exceed the context length {self.n_ctx}")

    # ------------------------------------------------------------------ blocks
    def _grow(self, n_tokens: int) -> None:
        """Hold enough blocks for ``n_tokens``; all or nothing."""
        need = -(-n_tokens // self.block_size)
        got = []
        try:
            while self.n_blocks + len(got) < need:
                if self._spare is not None:
                    got.append(self._spare)
                    self._spare = None
                else:
                    got.append(self.pool.allocate(self.name))
        except OutOfMemoryError:
            for b in reversed(got):
                self.pool.release(b)
            raise
        for b in got:
            self.table[self.n_blocks] = b
            self.ids.append(None)
            self.n_blocks += 1

    def _shared(self, block: int) -> bool:
        return self.pool.refcount[block] > 1 or (self.prefix is not None and self.prefix.is_registered(block))

    def _release(self, block: int) -> None:
        self.pool.release(block, keep_cached=self.prefix is not None and self.prefix.is_registered(block))

    def _make_writable(self, pos: int) -> None:
        """Copy-on-write: the block holding ``pos`` becomes this sequence's own."""
        i = pos // self.block_size
        if i >= self.n_blocks:
            return
        old = int(self.table[i])
        if not self._shared(old):
            return
        new = self.pool.allocate(self.name)
        self.pool.copy_block(old, new)
        self._release(old)
        self.table[i] = new
        self.ids[i] = None
        self._indexed = min(self._indexed, i)
        if self.prefix is not None:
            self.prefix.stats.cow_copies += 1

    # ------------------------------------------------------------------ forward protocol
    def prepare(self, ids) -> None:
        m = len(ids)
        self.check_room(m)
        self._make_writable(self._n)
        self._grow(self._n + m)

    def store(self, layer: int, pos0: int, k: np.ndarray, v: np.ndarray) -> None:
        """k, v  # [M, n_kv_head, head_dim] f32 for positions pos0 .. pos0+M-1"""
        end = pos0 + k.shape[0]
        if end > self.n_blocks * self.block_size:
            self._grow(end)
        p, table = self.pool, self.table[:self.n_blocks]
        for kv, src in ((0, k), (1, v)):
            if p.kind == KV_F16:
                store_rows(p.data, table, layer, kv, self.block_size, pos0, src.astype(np.float16).view(np.uint16))
            elif p.kind == KV_F32:
                store_rows(p.data, table, layer, kv, self.block_size, pos0, np.ascontiguousarray(src, np.float32))
            else:
                store_rows_int8(p.data, p.data_f32, p.scale_offset, p.group, table, layer, kv, self.block_size,
                                pos0, np.ascontiguousarray(src, np.float32))

    def read(self, layer: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(k, v)  # [stop - start, n_kv_head, head_dim] f32 copies of positions start..stop-1
        (tests and benchmarks; not a fast path)."""
        p, bs = self.pool, self.block_size
        KVH, D = p.n_kv_head, p.head_dim
        out = np.empty((2, max(0, stop - start), KVH, D), np.float32)  # [kv, token, kv_head, D]
        for t in range(start, stop):
            blk, j = int(self.table[t // bs]), t % bs
            for kv in (0, 1):
                rows = ((layer * 2 + kv) * KVH + np.arange(KVH)) * bs + j  # [KVH] row ids (int8 scales)
                idx = kv_index.py_func(p.data, blk, layer, kv, np.arange(KVH)[:, None], j, np.arange(D)[None, :], KVH,
                                       bs, D, p.kind)  # [KVH, D] flat element ids
                raw = p.data.reshape(-1)[idx.ravel()].reshape(KVH, D)
                if p.kind == KV_F16:
                    out[kv, t - start] = raw.view(np.float16)
                elif p.kind == KV_F32:
                    out[kv, t - start] = raw
                else:
                    gs = D // p.group
                    sc = p.data_f32[blk, p.scale_offset + (rows[:, None] * gs + np.arange(gs)).ravel()]
                    out[kv, t - start] = raw * np.repeat(sc.reshape(KVH, gs), p.group, axis=1)
        return out[0], out[1]

    def keys(self, layer: int) -> np.ndarray:
        """k  # [n_tokens, n_kv_head, head_dim] f32 of one layer, read in bulk (calibration);
        an int8 pool goes through ``read``."""
        p, bs, n = self.pool, self.block_size, self._n
        if not p.head_major:
            return self.read(layer, 0, n)[0]
        KVH, D, nb = p.n_kv_head, p.head_dim, self.n_blocks
        chunks = p._chunks()[layer * KVH:(layer + 1) * KVH][:, self.table[:nb], :bs * D]  # [KVH, block, K^T elems]
        kt = chunks.reshape(KVH, nb, D, bs)  # [KVH, block, D, token]
        kt = kt.view(np.float16) if p.kind == KV_F16 else kt
        return np.ascontiguousarray(kt.transpose(1, 3, 0, 2).reshape(nb * bs, KVH, D)[:n], dtype=np.float32)

    def attention(self, layer: int, q: np.ndarray, n_past: int, scale, out: np.ndarray) -> None:
        """out  # [M, H, D] = causal attention of q  # [M, H, D] over positions 0 .. n_past+M-1.

        Rows at positions below ``prefill_until`` run on the blocked prefill kernel, the
        others on the decode kernels (the two round differently).  The engine sets it to
        the prompt length, so that a prompt row rounds the same whatever chunk it is in
        (a 1-token chunk included) and a generated row recomputed after preemption as in
        its decode step; None (other callers): the blocked kernel for calls of M > 1 rows."""
        p, M = self.pool, q.shape[0]
        if self.prefill_until is None:
            n_pre = M if M > 1 else 0
        else:
            n_pre = min(M, max(0, self.prefill_until - n_past))
        args = (p.data, p.data_f32, F16_TO_F32, p.kind, p.group, p.scale_offset, self.table[:self.n_blocks], layer,
                p.n_kv_head, self.block_size)
        threads = numba.get_num_threads()
        if n_pre:
            prefill_attention(q[:n_pre], *args, n_past, np.float32(scale), out[:n_pre], threads=threads)
        if n_pre < M:
            paged_attention(q[n_pre:], *args, n_past + n_pre, np.float32(scale), out[n_pre:], threads=threads)

    def tree_rows(self, parents: np.ndarray) -> TreeRows:
        """Before a draft tree's forward (rows at slots n_tokens ...): each row's path and
        scratch blocks for ``tree_attention``; give them back with ``TreeRows.release``.
        Raises OutOfMemoryError (nothing held) when the pool has no room for them."""
        return TreeRows(self, parents)

    def tree_attention(self, layer: int, q: np.ndarray, n_prefix: int, rows: TreeRows, scale,
                       out: np.ndarray) -> None:
        """out  # [M, H, D] = attention of tree rows q  # [M, H, D] (row i at slot n_prefix + i)
        over the prefix and their ancestors (kernels/tree_attention.py)"""
        p = self.pool
        tree_attention(q, p.data, p.data_f32, F16_TO_F32, p.kind, self.table[:self.n_blocks], layer, p.n_kv_head,
                       self.block_size, n_prefix, rows.paths, rows.depth, rows.tables, np.float32(scale),
                       numba.get_num_threads(), out, attention_tag())

    def finish(self, ids, index: bool = True) -> None:
        """n_tokens += len(ids); ``index`` False for a draft tree, whose rows are not a
        sequence of tokens until ``commit_path``."""
        self.tokens.extend(int(t) for t in ids)
        self._n += len(ids)
        if index:
            self._index_full_blocks()

    def commit_path(self, n_prefix: int, path: list[int]) -> None:
        """Keep, of the draft tree written after ``n_prefix`` tokens, its root (slot
        n_prefix) and the accepted nodes ``path`` (tree rows, root's child first): node
        path[d-1] moves from slot n_prefix + path[d-1] to n_prefix + d, the rest is dropped.
        The positions already carry their final RoPE (a node's position is its depth)."""
        if self.pool.kind not in (KV_F16, KV_F32):
            raise ValueError("draft trees need an f16 or f32 KV pool")
        tree_tokens = self.tokens[n_prefix:]
        src = np.array([n_prefix + i for i in path], np.int64)  # [depth] slots of the accepted nodes
        dst = np.arange(n_prefix + 1, n_prefix + 1 + len(path), dtype=np.int64)  # [depth] their final slots
        if src.size and np.any(src != dst):
            p = self.pool
            move_kv_slots(p.data, self.table[:self.n_blocks], p.n_layer, p.n_kv_head, self.block_size, p.head_dim,
                          p.kind, src, dst)
        for d, i in enumerate(path):
            self.tokens[n_prefix + 1 + d] = tree_tokens[i]
        self.truncate(n_prefix + 1 + len(path), keep_spare=True)
        self._index_full_blocks()

    def _index_full_blocks(self) -> None:
        if self.prefix is None:
            return
        bs = self.block_size
        for i in range(self._indexed, self._n // bs):
            if self.ids[i] is not None:
                self._indexed = i + 1
                continue
            chunk = tuple(self.tokens[i * bs:(i + 1) * bs])
            parent = self.ids[i - 1] if i else 0
            if parent is None or min(chunk) < 0:
                return
            self.ids[i] = self.prefix.register(parent, chunk, int(self.table[i]))
            self._indexed = i + 1

    # ------------------------------------------------------------------ rollback, sharing
    def truncate(self, n_tokens: int, keep_spare: bool = False) -> None:
        """Forget every position >= n_tokens (rollback); whole blocks past it go back, but
        with ``keep_spare`` the first of them (this sequence's own) is held for the next
        growth: a verification whose rows cross into a new block every few steps would
        otherwise hand its pages to the OS and fault them in again each time."""
        n = max(0, min(int(n_tokens), self._n))
        keep = -(-n // self.block_size)
        for i in range(self.n_blocks - 1, keep - 1, -1):  # tail first: the LRU keeps heads longest
            b = int(self.table[i])
            if keep_spare and i == keep and self._spare is None and not self._shared(b):
                self._spare = b
            else:
                self._release(b)
        self.n_blocks = keep
        del self.ids[keep:]
        if n % self.block_size:
            self.ids[n // self.block_size] = None  # a partial block is not a full prefix any more
        del self.tokens[n:]
        self._n = n
        self._indexed = min(self._indexed, n // self.block_size)

    def clear(self) -> None:
        self.truncate(0)
        if self._spare is not None:
            self._release(self._spare)
            self._spare = None

    free = clear

    def adopt_prefix(self, tokens: list[int], max_tokens: int | None = None) -> int:
        """Start this (empty) sequence with the longest indexed prefix of ``tokens`` (at most
        ``max_tokens``); returns the number of tokens whose K/V are now shared."""
        if self.prefix is None:
            return 0
        if self._n:
            raise ValueError("adopt_prefix needs an empty sequence")
        limit = len(tokens) if max_tokens is None else min(len(tokens), max_tokens)
        blocks, bids = self.prefix.match(tokens, limit)
        self.prefix.stats.lookups += 1
        for i, (b, bid) in enumerate(zip(blocks, bids)):
            self.pool.retain(b)
            self.table[i] = b
            self.ids.append(bid)
        self.n_blocks = len(blocks)
        n = min(len(blocks) * self.block_size, limit)
        self.tokens = [int(t) for t in tokens[:n]]
        self._n = n
        if n % self.block_size:
            self.ids[-1] = None
        self._indexed = n // self.block_size
        self.prefix.stats.hit_blocks += len(blocks)
        self.prefix.stats.hit_tokens += n
        return n

    def fork(self, name: str) -> "PagedSequence":
        """A new sequence sharing every block of this one (copy-on-write on divergence)."""
        other = PagedSequence(self.pool, self.n_ctx, self.prefix, name)
        for b in self.table[:self.n_blocks]:
            self.pool.retain(int(b))
        other.table[:self.n_blocks] = self.table[:self.n_blocks]
        other.n_blocks, other.ids, other.tokens, other._n = self.n_blocks, list(self.ids), list(self.tokens), self._n
        other._indexed, other.prefill_until = self._indexed, self.prefill_until
        return other

    def __del__(self):
        try:
            self.clear()
        except Exception:
            pass

