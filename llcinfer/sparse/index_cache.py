"""The paged index cache: one int8 index key (and its f32 scale) per token, full layer and
KV head, stored per *pool block* beside the KV pool.

It uses the pool's own block ids, so whatever a sequence's block table says holds for the
index too: a forked sequence and a sequence that adopted a shared prefix read the index
entries the first writer left in those blocks (an entry is a function of the token's key,
as the K/V are), a truncated or freed block is rewritten before any position in it is read
again, and a copy-on-write copies the block's index entries with its K/V (the pool calls
``copy_block`` of its companions).

    idx  # [full layer, pool block, kv_head, rank/4, token, 4] uint8 (q + 128; kernels/sparse_index.py)
    isc  # [full layer, pool block, kv_head, token] f32

Both are views of buffers padded by one vector (the scorer may load whole vectors at a
block's last token when the block is shorter than a vector).

Only "full" layers (those with their own indexer, policy.py) have a slot.  The arrays are
zero-filled anonymous memory: a block's pages are committed when first written.
"""

from __future__ import annotations

import numpy as np

from ..kernels.sparse_index import PAD_LANES, store_index_rows
from ..kv import KVPool


class IndexCache:
    def __init__(self, pool: KVPool, full_layers: list[int], rank: int):
        if rank % 4:
            raise ValueError(f"index rank {rank} is not a multiple of 4 (the scorer dots quads)")
        self.pool, self.rank = pool, int(rank)
        self.full_layers = list(full_layers)
        self.slot_of = np.full(pool.n_layer, -1, np.int64)  # [layer] slot in idx, -1: no index
        self.slot_of[self.full_layers] = np.arange(len(self.full_layers))
        n_full = max(1, len(self.full_layers))
        KVH, bs = pool.n_kv_head, pool.block_size
        shape = (n_full, pool.n_blocks, KVH, self.rank // 4, bs, 4)
        n_idx, n_isc = int(np.prod(shape)), n_full * pool.n_blocks * KVH * bs
        # [full layer, pool block, kv_head, rank/4, token, 4] uint8, q + 128
        self.idx = np.zeros(n_idx + 4 * PAD_LANES, np.uint8)[:n_idx].reshape(shape)
        # [full layer, pool block, kv_head, token] f32
        self.isc = np.zeros(n_isc + PAD_LANES, np.float32)[:n_isc].reshape(shape[:3] + (bs,))
        pool.companions.append(self)

    def has_index(self, layer: int) -> bool:
        return self.slot_of[layer] >= 0

    def store(self, layer: int, k: np.ndarray, positions: np.ndarray, row_seq: np.ndarray, tables: np.ndarray,
              basis: np.ndarray) -> None:
        """Index keys of the rows  k  # [M, KVH*D] f32 (rotated) of one full layer;
        basis  # [KVH, rank, D] f32 that layer's."""
        store_index_rows(k, basis, positions, row_seq, tables, self.pool.block_size, int(self.slot_of[layer]),
                         self.idx, self.isc)

    def entries(self, slot: int, blocks: np.ndarray, j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The index keys  # [n, KVH, rank] int and scales  # [n, KVH] of tokens j  # [n] of
        pool blocks ``blocks``  # [n] in full-layer ``slot``."""
        q = self.idx[slot][blocks, :, :, j, :]  # [n, KVH, rank/4, 4]
        return q.reshape(len(blocks), self.pool.n_kv_head, self.rank).astype(np.int64) - 128, self.isc[slot][blocks, :, j]

    def copy_block(self, src: int, dst: int) -> None:
        self.idx[:, dst] = self.idx[:, src]
        self.isc[:, dst] = self.isc[:, src]

    @property
    def bytes_per_token(self) -> int:
        """Index bytes of one token: full layers x KV heads x (rank int8 + one f32 scale)."""
        return len(self.full_layers) * self.pool.n_kv_head * (self.rank + 4)

    @property
    def bytes_per_token_all_layers(self) -> int:
        """What an index on every layer would take (the saving of full layers only)."""
        return self.pool.n_layer * self.pool.n_kv_head * (self.rank + 4)

    def stats(self) -> dict:
        p = self.pool
        kv_per_token = p.used_bytes_per_block // p.block_size
        return {"index_bytes_per_token": self.bytes_per_token, "index_full_layers": len(self.full_layers),
                "index_bytes_per_token_all_layers": self.bytes_per_token_all_layers,
                "kv_bytes_per_token": kv_per_token,
                "index_committed_bytes": p.n_committed * p.block_size * self.bytes_per_token}
