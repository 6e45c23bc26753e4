"""The KV block pool: one reserved virtual range, blocks committed as sequences grow.

At start the pool reserves ``n_blocks * block_bytes`` of address space with an anonymous
``MAP_NORESERVE`` mapping: nothing is committed, so the reservation may be as large as
all of RAM (or larger) at no cost.  A block's pages are committed by the OS on first
write, and handed back with ``madvise(MADV_DONTNEED)`` when the last sequence using it
lets go.  The mapping never moves: the base address and every block's offset are fixed
for the life of the pool, so kernels and worker threads may keep raw pointers.

A block is ``block_size`` tokens of every layer.  Layouts (``kv_index`` in
kernels/paged_attention.py is the formula):

    f16 / f32, head-major: the blocks of one (layer, kv head) are adjacent (a sequence's
    attention reads one stream per head), a block is L * KVH chunks of ``chunk_bytes``
        data    # [layer, kv_head, block, 2 (K, V), token * head_dim]  (K transposed)
    int8, block-major (page-aligned block stride):
        data    # [block, layer, 2 (K, V), kv_head, token, head_dim]
        scales  # [block, layer, 2, kv_head, token, head_dim / group] f32, after the block's data

Commitment is bounded by a byte budget (default: the available RAM less the model and a
margin): a request for a block beyond it raises ``OutOfMemoryError`` naming the sequence
and the budget, so the OS never has to kill the process.  Blocks are reference counted
(prefix sharing); full blocks that the prefix cache indexes stay committed after their
last user leaves (cached, evictable, least recently used first).
"""

from __future__ import annotations

import mmap
from collections import OrderedDict

import numpy as np

from ..dtypes import KV_INT8, KV_KINDS
from ..errors import OutOfMemoryError, UsageError
from ..weights import hugepages

KV_TYPES = ("f16", "int8", "f32")
_ITEMSIZE = {"f16": 2, "int8": 1, "f32": 4}
_DTYPE = {"f16": np.uint16, "int8": np.int8, "f32": np.float32}  # f16 kept as bit patterns
INT8_GROUP = 32  # int8 values per scale (llama.cpp's q8_0 block), head_dim if not a multiple
_HUGE = 2 << 20  # transparent huge page size (x86-64, arm64 with 4 KiB pages)

# Linux x86/arm value; Python < 3.12 does not export it (the kernel ignores unknown bits
# only on exotic architectures, where the mapping is then merely accounted, not refused).


def default_budget(model_bytes: int = 0, margin: int = 512 << 20) -> int:
    """Bytes of KV the pool may commit: available RAM - model size - margin (>= 64 MiB)."""
    try:
        import psutil

        avail = int(psutil.virtual_memory().available)
    except Exception:  # pragma: no cover - psutil missing
        avail = 4 << 30
    return max(64 << 20, avail - int(model_bytes) - margin)


class KVPool:
    """Fixed-address paged storage for the K/V of many sequences.

    Args:
        n_layer, n_kv_head, head_dim: the model's KV geometry.
        block_size: tokens per block.
        n_blocks: blocks reserved (the virtual range; nothing is committed up front).
        kv_type: "f16" (default, llama.cpp's cache), "int8" (per-group scales) or "f32".
        budget_bytes: at most this many bytes committed at once (None: ``default_budget()``).
    """

    def __init__(self, n_layer: int, n_kv_head: int, head_dim: int, block_size: int, n_blocks: int,
                 kv_type: str = "f16", budget_bytes: int | None = None):
        if kv_type not in KV_TYPES:
            raise UsageError(f"kv_type must be one of {', '.join(KV_TYPES)} (got {kv_type!r})")
        if block_size < 1 or n_blocks < 1:
            raise UsageError(f"block_size and n_blocks must be positive (got {block_size}, {n_blocks})")
        self.n_layer, self.n_kv_head, self.head_dim = int(n_layer), int(n_kv_head), int(head_dim)
        self.block_size, self.n_blocks, self.kv_type = int(block_size), int(n_blocks), kv_type
        self.kind = KV_KINDS[kv_type]
        self.group = INT8_GROUP if head_dim % INT8_GROUP == 0 else head_dim
        rows = self.n_layer * 2 * self.n_kv_head * self.block_size  # (layer, kv, kv_head, token) rows
        data_bytes = rows * head_dim * _ITEMSIZE[kv_type]
        self.scale_offset = (data_bytes + 3) // 4  # in f32 units, from the block start
        scale_bytes = rows * (head_dim // self.group) * 4 if kv_type == "int8" else 0
        page = mmap.PAGESIZE
        self.block_bytes = -(-(self.scale_offset * 4 + scale_bytes) // page) * page  # page-aligned stride
        self.used_bytes_per_block = data_bytes + scale_bytes
        self.head_major = self.kind != KV_INT8
        self.chunk_bytes = 2 * self.block_size * head_dim * _ITEMSIZE[kv_type]  # one (layer, head) of a block
        self.reserved_bytes = self.block_bytes * self.n_blocks
        try:
            self._map = hugepages.anonymous(self.reserved_bytes, noreserve=True)  # 2 MiB pages where allowed
        except (OSError, OverflowError) as e:
            raise OutOfMemoryError(f"cannot reserve {self.reserved_bytes / 2**30:.1f} GiB of address space "
                                   f"for the KV pool: {e}") from None
        itemsize = _ITEMSIZE[kv_type]
        # the same bytes seen three ways; fixed base address for the life of the pool
        self.data = np.frombuffer(self._map, _DTYPE[kv_type]).reshape(self.n_blocks, self.block_bytes // itemsize)  # [block, elems]
        self.data_f32 = np.frombuffer(self._map, np.float32).reshape(self.n_blocks, self.block_bytes // 4)  # [block, f32 words] (int8 scales)
        self.budget_bytes = int(default_budget() if budget_bytes is None else budget_bytes)
        self.budget_blocks = max(0, self.budget_bytes // self.block_bytes)
        self.refcount = np.zeros(self.n_blocks, np.int32)  # [block] users (sequences) of each block
        self._free = list(range(self.n_blocks - 1, -1, -1))  # never-used or released blocks (stack)
        self._cached: OrderedDict[int, None] = OrderedDict()  # refcount 0 but indexed by the prefix cache (LRU order)
        self.on_evict = None  # callback(block) the prefix cache installs to forget an evicted block
        self.n_committed = 0  # blocks in use or cached (their pages may be resident)
        self.peak_committed = 0
        self.n_released = 0  # blocks handed back to the OS so far
        self.companions: list = []  # stores kept per pool block beside the KV (sparse index cache): copy_block(src, dst)

    # ------------------------------------------------------------------ addresses
    @property
    def base_address(self) -> int:
        return int(self.data.ctypes.data)

    def block_address(self, block: int) -> int:
        """Fixed address of a block's first byte (head-major: of its layer 0, head 0 chunk)."""
        return self.base_address + int(block) * (self.chunk_bytes if self.head_major else self.block_bytes)

    def _chunks(self) -> np.ndarray:
        """Head-major data seen as [layer * kv_head, block, chunk elems]."""
        n = self.n_layer * self.n_kv_head * self.n_blocks * (self.chunk_bytes // self.data.itemsize)
        return self.data.reshape(-1)[:n].reshape(self.n_layer * self.n_kv_head, self.n_blocks, -1)

    def fill(self, blocks, value: int = 1) -> None:
        """Write ``value`` into every K/V element of ``blocks`` (benchmarks: committed pages
        that are read from memory, not the kernel's shared zero page)."""
        blocks = np.asarray(blocks, np.int64)
        if self.head_major:
            self._chunks()[:, blocks, :] = value
        else:
            self.data[blocks] = value

    @property
    def committed_bytes(self) -> int:
        return self.n_committed * self.block_bytes

    @property
    def capacity_blocks(self) -> int:
        """The most blocks that may ever be committed at once (budget and reservation)."""
        return min(self.budget_blocks, self.n_blocks)

    @property
    def available_blocks(self) -> int:
        """Blocks ``allocate`` can still hand out: uncommitted ones, plus cached ones it would
        evict."""
        return max(0, self.capacity_blocks - self.n_committed) + len(self._cached)

    def kernel_args(self) -> dict:
        """What a kernel needs to read and write the pool, named as the decode step's
        arguments (executor/step_args.py): its data seen as [block, elems] and as f32 words,
        the storage kind, int8 group and scale offset, tokens per block."""
        return {"pool": self.data, "pool_f32": self.data_f32, "kv_kind": self.kind, "kv_group": self.group,
                "kv_scale_off": self.scale_offset, "bs": self.block_size}

    # ------------------------------------------------------------------ allocation
    def allocate(self, owner: str = "a sequence") -> int:
        """A fresh block (refcount 1).  Evicts the least recently used cached block when the
        budget is reached; raises OutOfMemoryError when nothing can be committed."""
        if self.n_committed >= self.budget_blocks or not self._free:
            if self._cached:
                self._evict_one()
            else:
                limit = "budget" if self._free else "reserved range"
                raise OutOfMemoryError(
                    f"KV pool exhausted: {owner} needs another block but {self.n_committed} blocks "
                    f"({self.committed_bytes / 2**20:.1f} MiB) are committed, {limit} "
                    f"{self.budget_bytes / 2**20:.1f} MiB ({min(self.budget_blocks, self.n_blocks)} blocks)")
        block = self._free.pop()
        self.refcount[block] = 1
        self.n_committed += 1
        self.peak_committed = max(self.peak_committed, self.n_committed)
        return block

    def retain(self, block: int) -> None:
        """One more user of a block (a sequence adopting a shared prefix block)."""
        if self.refcount[block] == 0:
            self._cached.pop(block)  # a cached block comes back into use
        self.refcount[block] += 1

    def release(self, block: int, keep_cached: bool = False) -> None:
        """One user fewer; at zero the block is cached (``keep_cached``) or returned to the OS."""
        self.refcount[block] -= 1
        if self.refcount[block] > 0:
            return
        if keep_cached:
            self._cached[block] = None
        else:
            self._give_back(block)

    def touch_cached(self, block: int) -> None:
        if block in self._cached:
            self._cached.move_to_end(block)

    def _evict_one(self) -> None:
        block, _ = self._cached.popitem(last=False)
        if self.on_evict is not None:
            self.on_evict(block)
        self._give_back(block)

    def drop_cached(self) -> int:
        """Return every cached (unused) block to the OS; returns how many."""
        n = len(self._cached)
        while self._cached:
            self._evict_one()
        return n

    def _give_back(self, block: int) -> None:
        if not self.head_major:
            self._map.madvise(mmap.MADV_DONTNEED, block * self.block_bytes, self.block_bytes)
        elif self.chunk_bytes % mmap.PAGESIZE == 0:  # its L * KVH chunks (smaller ones stay committed)
            self._give_back_chunks(block)
        self._free.append(block)
        self.n_committed -= 1
        self.n_released += 1

    def _give_back_chunks(self, block: int) -> None:
        """DONTNEED the block's chunk in every (layer, head) region; where the 2 MiB page
        around the chunk holds only free blocks, the whole page (a partly unmapped huge
        page would stay resident until the kernel splits it under memory pressure)."""
        region, cb = self.n_blocks * self.chunk_bytes, self.chunk_bytes
        busy = self.refcount > 0  # [block] in use, or cached for the prefix index
        busy[list(self._cached)] = True
        for r in range(self.n_layer * self.n_kv_head):
            start, stop = r * region + block * cb, r * region + (block + 1) * cb
            lo = max(r * region, start // _HUGE * _HUGE)
            hi = min((r + 1) * region, lo + _HUGE)
            b_lo, b_hi = (lo - r * region) // cb, -(-(hi - r * region) // cb)
            if not busy[b_lo:b_hi].any():
                start, stop = b_lo * cb + r * region, min(b_hi * cb + r * region, (r + 1) * region)
            self._map.madvise(mmap.MADV_DONTNEED, start, stop - start)

    # ------------------------------------------------------------------ copy-on-write
    def copy_block(self, src: int, dst: int) -> None:
        if self.head_major:
            c = self._chunks()
            c[:, dst] = c[:, src]
        else:
            self.data[dst] = self.data[src]
        for c in self.companions:  # their per-block data follows the copy (copy-on-write)
            c.copy_block(src, dst)

    def stats(self) -> dict:
        return {"kv_type": self.kv_type, "block_size": self.block_size, "block_bytes": self.block_bytes,
                "reserved_bytes": self.reserved_bytes, "budget_bytes": self.budget_bytes,
                "committed_blocks": self.n_committed, "cached_blocks": len(self._cached),
                "peak_committed_blocks": self.peak_committed, "released_blocks": self.n_released}

    def close(self) -> None:
        """Unmap (only when no array view is alive; otherwise the OS frees it at exit)."""
        try:
            del self.data, self.data_f32
            self._map.close()
        except (BufferError, AttributeError):
            pass
