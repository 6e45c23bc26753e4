"""The paged KV cache: a fixed-address block pool (pool.py), per-sequence block tables
(block_table.py; a draft tree's rows: tree_rows.py) and hash-chained prefix sharing with
copy-on-write (prefix.py).

    pool = KVPool(n_layer, n_kv_head, head_dim, block_size=16, n_blocks=..., kv_type="f16")
    prefix = PrefixCache(pool.block_size); pool.on_evict = prefix.forget
    seq = PagedSequence(pool, n_ctx, prefix, "sequence 0")   # what Transformer.forward takes
"""

from .block_table import PagedSequence
from .pool import INT8_GROUP, KV_TYPES, KVPool, default_budget
from .prefix import PrefixCache, PrefixStats

DEFAULT_BLOCK_SIZE = 16  # tokens per block (perf/kv_cache_report.py --block-sweep measured 16/32/64)

__all__ = ["KVPool", "PagedSequence", "PrefixCache", "PrefixStats", "KV_TYPES", "INT8_GROUP", "default_budget",
           "DEFAULT_BLOCK_SIZE", "new_pool"]


def new_pool(n_layer: int, n_kv_head: int, head_dim: int, n_ctx: int, n_seq: int = 1, kv_type: str = "f16",
             block_size: int = DEFAULT_BLOCK_SIZE, budget_bytes: int | None = None,
             prefix_sharing: bool = True) -> tuple[KVPool, PrefixCache | None]:
    """A pool reserving room for ``n_seq`` full contexts plus one more (cached prefixes,
    copy-on-write), and its prefix cache (None when sharing is off)."""
    per_seq = -(-int(n_ctx) // block_size)
    pool = KVPool(n_layer, n_kv_head, head_dim, block_size, per_seq * (max(1, n_seq) + 1), kv_type, budget_bytes)
    prefix = PrefixCache(block_size) if prefix_sharing else None
    if prefix is not None:
        pool.on_evict = prefix.forget
    return pool, prefix
