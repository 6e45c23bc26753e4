"""Sparse decode attention: per query row, the indexer picks whole key blocks, and the
paged attention kernels run exactly on them, the sink blocks and the local window.

    layer kinds (SparseConfig.layer_kinds):
        dense    the first ``dense_layers`` layers: every key
        full     own index keys (index_cache.py) and own selection
        shared   the selection of the last full layer before it (no index keys)
    one row at position p of a sparse layer (n = p + 1 keys, nb = ceil(n / bs) blocks):
        sinks    blocks 0 .. ceil(sink / bs) - 1
        window   the blocks holding positions n - window .. n - 1 (the partial one last)
        chosen   the top ceil(top_k / bs) of the blocks between (kernels/sparse_index.py)
        out      = paged_attention over the gathered table [sinks, chosen (in order), window]

Gathering whole blocks keeps the kernels' block layout (K^T per block, the SIMD paths)
and their causal count: every gathered block but the last is full, so the gathered
sequence has (len - 1) * bs + (n - (nb - 1) * bs) keys.  When the chosen blocks are all
the candidates the gathered table is the sequence's own, and sparse equals dense bit for
bit.  Rows with fewer than ``min_context`` keys run dense, in any chunk: a prompt row and
a decode row at the same position take the same path (perplexity scores the sparse path).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba
import numpy as np

from ..errors import UsageError
from ..kernels.paged_attention import paged_attention
from ..kernels.isa import current_isa
from ..kernels.paged_attention import attention_tag
from ..kernels.sparse_index import (AGG_MAX, AGG_SUM, PHI_EXP, PHI_RELU, SP_AGG, SP_FIELDS, SP_K_BLOCKS,
                                    SP_MIN_CONTEXT, SP_PHI, SP_SINK, SP_WINDOW, kept_blocks, select_blocks)
from ..kernels.tables import F16_TO_F32
from ..kv import KVPool, PagedSequence
from .index_cache import IndexCache

PHIS = {"relu": PHI_RELU, "exp": PHI_EXP}
AGGS = {"max": AGG_MAX, "sum": AGG_SUM}


@dataclass(frozen=True)
class SparseConfig:
    top_k: int = 1024  # tokens (in whole blocks) the indexer picks besides sinks and window
    sink: int = 16  # first tokens, always attended
    window: int = 256  # most recent tokens, always attended
    min_context: int = 4096  # rows with fewer keys attend densely
    dense_layers: int = 2  # the first layers stay dense
    full_every: int = 1  # every n-th sparse layer owns an indexer, the others reuse its selection
    rank: int = 16  # index key dims per KV head
    phi: str = "exp"  # relu: 5-7 % less mass at top_k 1024 (SmolLM2, d8000)
    agg: str = "sum"  # perf/sparse_bench.py quality: sum and max equal in mass, sum +3-5 % recall

    def __post_init__(self):
        if self.phi not in PHIS or self.agg not in AGGS:
            raise UsageError(f"sparse phi must be one of {sorted(PHIS)} and agg one of {sorted(AGGS)}")
        if min(self.top_k, self.sink, self.window, self.full_every, self.rank) < 1 or self.dense_layers < 0:
            raise UsageError("sparse top_k, sink, window, full_every and rank must be positive")
        if self.rank % 4:
            raise UsageError(f"sparse rank must be a multiple of 4 (got {self.rank})")

    def layer_kinds(self, n_layer: int) -> list[str]:
        return ["dense" if li < self.dense_layers else
                "full" if (li - self.dense_layers) % self.full_every == 0 else "shared" for li in range(n_layer)]


@dataclass
class SparseStats:
    rows: int = 0  # (row, sparse layer) pairs that ran sparse
    keys_attended: int = 0  # keys those rows attended (sinks, chosen, window)
    keys_total: int = 0  # keys dense attention would have read for them
    selections: int = 0  # scorer runs (full layers)
    per_layer: dict = field(default_factory=dict)


class SparseAttention:
    """The sparse path of one model on one KV pool (its index cache is attached to it).

    basis  # [L, KVH, rank, D] f32 (basis.py);  n_head: query heads."""

    def __init__(self, config: SparseConfig, basis: np.ndarray, pool: KVPool, n_head: int):
        L, KVH, r, D = basis.shape
        if (L, KVH, D) != (pool.n_layer, pool.n_kv_head, pool.head_dim) or r != config.rank:
            raise ValueError(f"basis {basis.shape} does not fit the pool ({pool.n_layer}, {pool.n_kv_head}, "
                             f"rank {config.rank}, {pool.head_dim})")
        self.config, self.basis, self.pool = config, np.ascontiguousarray(basis, np.float32), pool
        self.kinds = config.layer_kinds(L)
        self.index = IndexCache(pool, [li for li, k in enumerate(self.kinds) if k == "full"], r)
        self.G = n_head // KVH
        self.head_basis = self.basis[:, np.arange(n_head) // self.G]  # [L, H, rank, D] each head's KV basis
        self.weights = np.ones(n_head, np.float32)  # [H] head weights w_h
        self.phi, self.agg = PHIS[config.phi], AGGS[config.agg]
        self.k_blocks = -(-config.top_k // pool.block_size)
        if current_isa() == "generic":
            raise UsageError("sparse attention needs AVX2 or better (its scorer is explicit SIMD)")
        self.tag = attention_tag()
        self._scores = np.empty(pool.n_blocks, np.float32)  # [pool blocks >= candidates] scorer output
        self._table = np.empty(pool.n_blocks, np.int32)  # [pool blocks >= gathered] one row's gathered table
        self.stats = SparseStats()
        self._external: list[np.ndarray] = []  # count_into

    # ------------------------------------------------------------------ index keys
    def store_index(self, layer: int, k: np.ndarray, positions: np.ndarray, row_seq: np.ndarray,
                    tables: np.ndarray) -> None:
        """k  # [M, KVH*D] f32 rotated keys of every row of the pass."""
        if self.index.has_index(layer):
            self.index.store(layer, k, positions, row_seq, tables, self.basis[layer])

    # ------------------------------------------------------------------ selection
    def kept_blocks(self, n_keys: int) -> tuple[int, int]:
        """(sink blocks, window blocks) always attended by a row with ``n_keys`` keys."""
        return kept_blocks(n_keys, self.pool.block_size, self.config.sink, self.config.window)

    def kernel_conf(self) -> np.ndarray:
        """conf  # [SP_FIELDS] int64: the selection rule as kernels/sparse_index.row_selection reads it."""
        conf = np.zeros(SP_FIELDS, np.int64)
        conf[SP_MIN_CONTEXT], conf[SP_SINK], conf[SP_WINDOW] = self.config.min_context, self.config.sink, self.config.window
        conf[SP_K_BLOCKS], conf[SP_PHI], conf[SP_AGG] = self.k_blocks, self.phi, self.agg
        return conf

    def count_into(self, counts: np.ndarray) -> None:
        """Add ``counts``  # [workers, L, COUNT_FIELDS] int64 (the executor's sparse rows:
        rows, keys attended, keys total, selections per layer) to kv_stats from now on."""
        self._external.append(counts)

    def select(self, seq: PagedSequence, layer: int, q: np.ndarray, n_keys: int, scale: float) -> np.ndarray:
        """The gathered block table  # [n_sel] int32 (pool blocks, position order) of one
        query row  q  # [H, D] f32 with ``n_keys`` keys."""
        bs = self.pool.block_size
        nb = -(-n_keys // bs)
        n_sink, n_win = self.kept_blocks(n_keys)
        n_cand = nb - n_sink - n_win
        if n_cand <= self.k_blocks:
            return seq.table[:nb]
        n = select_blocks(q, self.head_basis[layer], scale, self.index.idx, self.index.isc,
                          int(self.index.slot_of[layer]), seq.table, n_keys, bs, self.phi, self.agg, self.weights,
                          n_sink, n_win, self.k_blocks, numba.get_num_threads(), self._scores, self._table, self.tag)
        self.stats.selections += 1
        return self._table[:n].copy()

    # ------------------------------------------------------------------ attention
    def attend(self, seq: PagedSequence, layer: int, q: np.ndarray, n_past: int, scale, out: np.ndarray,
               selected: dict) -> None:
        """out  # [M, H, D] = attention of the chunk rows  q  # [M, H, D] at positions n_past ..;
        ``selected``: this chunk's row -> gathered table of the last full layer (updated here)."""
        if seq.pool is not self.pool:
            raise ValueError(f"{seq.name} is not on the pool the sparse index cache follows")
        kind, M, bs = self.kinds[layer], q.shape[0], self.pool.block_size
        first = min(M, max(0, self.config.min_context - n_past - 1))  # rows before it have too few keys
        if kind == "dense" or first == M:
            seq.attention(layer, q, n_past, scale, out)
            return
        if first:
            seq.attention(layer, q[:first], n_past, scale, out[:first])
        p, threads = self.pool, numba.get_num_threads()
        for m in range(first, M):
            n_keys = n_past + m + 1
            if kind == "full" or m not in selected:
                selected[m] = self.select(seq, layer, q[m], n_keys, scale)
            table = selected[m]
            n_sel = (len(table) - 1) * bs + n_keys - (-(-n_keys // bs) - 1) * bs
            paged_attention(q[m:m + 1], p.data, p.data_f32, F16_TO_F32, p.kind, p.group, p.scale_offset, table, layer,
                            p.n_kv_head, bs, n_sel - 1, np.float32(scale), out[m:m + 1], threads=threads)
            self._count(layer, n_sel, n_keys)

    def _count(self, layer: int, n_sel: int, n_keys: int) -> None:
        s = self.stats
        s.rows += 1
        s.keys_attended += n_sel
        s.keys_total += n_keys
        lay = s.per_layer.setdefault(layer, [0, 0])
        lay[0] += n_sel
        lay[1] += n_keys

    def totals(self) -> SparseStats:
        """This path's counts and those of every executor counting into it."""
        s = self.stats
        t = SparseStats(s.rows, s.keys_attended, s.keys_total, s.selections,
                        {li: list(v) for li, v in s.per_layer.items()})
        for c in self._external:
            per_layer = c.sum(axis=0)  # [L, COUNT_FIELDS]
            rows, attended, total, selections = (int(v) for v in per_layer.sum(axis=0))
            t.rows, t.keys_attended, t.keys_total, t.selections = (t.rows + rows, t.keys_attended + attended,
                                                                   t.keys_total + total, t.selections + selections)
            for li in np.nonzero(per_layer[:, 0])[0]:
                lay = t.per_layer.setdefault(int(li), [0, 0])
                lay[0] += int(per_layer[li, 1])
                lay[1] += int(per_layer[li, 2])
        return t

    def kv_stats(self) -> dict:
        s = self.totals()
        d = self.index.stats()
        d.update({"sparse_min_context": self.config.min_context, "sparse_rows": s.rows, "sparse_selections": s.selections,
                  "sparse_keys_fraction": s.keys_attended / s.keys_total if s.keys_total else None})
        return d
