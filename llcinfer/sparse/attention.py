"""Sparse decode attention: per query row, the indexer picks whole key blocks, and the
paged attention kernels run exactly on them, the sink blocks and the local window.

    layer kinds (SparseConfig.layer_kinds):
        dense    the first ``dense_layers`` layers: every key
        full     own index keys (index_cache.py) and own selection
        shared   the selection of the last full layer before it (no index keys)
    across rows (reuse_steps): a full layer's row whose query stays close to that
        of the row that last scored, a few rows back, takes its blocks (kernels/sparse_reuse.py)
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
a decode row at the same position take the same path (perplexity scores the sparse path);
with reuse, a prompt row reuses from the rows before it in its chunk, a decode row on the
executor from the steps before it, and a decode row on the batched path scores alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numba
import numpy as np

from ..errors import UsageError
from ..kernels.isa import current_isa
from ..kernels.paged_attention import attention_tag
from ..kernels.sparse_index import (AGG_MAX, AGG_SUM, PHI_EXP, PHI_RELU, SP_AGG, SP_FIELDS, SP_K_BLOCKS,
                                    SP_MIN_CONTEXT, SP_PHI, SP_REUSE, SP_REUSE_COS, SP_SINK,
                                    SP_WINDOW, kept_blocks)
from ..kernels.sparse_rows import attend_rows, select_rows
from ..kernels.tables import F16_TO_F32
from ..kv import KVPool, PagedSequence
from .index_cache import IndexCache

PHIS = {"relu": PHI_RELU, "exp": PHI_EXP}
AGGS = {"max": AGG_MAX, "sum": AGG_SUM}


@dataclass(frozen=True)
class SparseConfig:
    top_k: int = 1024  # tokens (in whole blocks) the indexer picks besides sinks and window
    # for_context(n_ctx) raises top_k to n_ctx / top_k_per (0: top_k fixed): at -c 32768
    # Qwen-0.5B's perplexity was 1.044x dense with 1024, 1.018x with 2048
    top_k_per: int = 16
    sink: int = 16  # first tokens, always attended
    window: int = 256  # most recent tokens, always attended
    min_context: int = 4096  # rows with fewer keys attend densely
    # the first layers stay dense: one, not two (SmolLM2 -c 8192 PPL 5.3506 against 5.3508,
    # perf/README), saving a whole-context attention layer per step
    dense_layers: int = 1
    full_every: int = 1  # every n-th sparse layer owns an indexer, the others reuse its selection
    indexers: int | None = None  # or only this many, chosen on calibration loss (layer_choice.py)
    full_layers: tuple = ()  # or these layers own one (the first sparse layer among them)
    # a full layer takes the blocks of the row that last ran its scorer, at most reuse_steps
    # rows back, while the query's mean cosine over heads to that row's stays >= reuse_cos
    # (kernels/sparse_reuse.py; 0: every row scores).  SmolLM2, -c 8192: 0.9 reused 13 % of
    # the prompt rows' selections at no measurable perplexity, 0.8 46 % for +1 %
    reuse_steps: int = 4
    reuse_cos: float = 0.9
    rank: int = 16  # index key dims per KV head
    phi: str = "exp"  # relu: 5-7 % less mass at top_k 1024 (SmolLM2, d8000)
    agg: str = "sum"  # perf/sparse_bench.py quality: sum and max equal in mass, sum +3-5 % recall

    def __post_init__(self):
        if self.phi not in PHIS or self.agg not in AGGS:
            raise UsageError(f"sparse phi must be one of {sorted(PHIS)} and agg one of {sorted(AGGS)}")
        if min(self.top_k, self.sink, self.window, self.full_every, self.rank) < 1 or self.dense_layers < 0:
            raise UsageError("sparse top_k, sink, window, full_every and rank must be positive")
        if self.reuse_steps < 0 or not -1.0 <= self.reuse_cos <= 1.0:
            raise UsageError(f"sparse reuse_steps must be >= 0 and reuse_cos in [-1, 1] (got {self.reuse_steps}, "
                             f"{self.reuse_cos})")
        if self.top_k_per < 0:
            raise UsageError(f"sparse top_k_per must be 0 (top_k fixed) or positive (got {self.top_k_per})")
        if self.rank % 4:
            raise UsageError(f"sparse rank must be a multiple of 4 (got {self.rank})")
        if self.indexers is not None and self.indexers < 1:
            raise UsageError(f"sparse indexers must be positive (got {self.indexers})")
        if self.full_layers and (self.dense_layers not in self.full_layers or min(self.full_layers) < self.dense_layers
                                 or len(set(self.full_layers)) != len(self.full_layers)):
            raise UsageError(f"sparse full_layers {self.full_layers} must be distinct sparse layers, the first "
                             f"sparse layer ({self.dense_layers}) among them")

    @classmethod
    def from_options(cls, top_k: int | None = None, indexers: int | None = None) -> "SparseConfig":
        """The configuration of LLM's and the CLI's options: a top_k given stays as given."""
        given = {k: v for k, v in (("top_k", top_k), ("indexers", indexers)) if v is not None}
        return cls(**given, **({"top_k_per": 0} if top_k is not None else {}))

    def for_context(self, n_ctx: int) -> "SparseConfig":
        """This configuration for a context of ``n_ctx`` tokens: top_k raised to n_ctx /
        top_k_per (a multiple of 16) where that is more."""
        if not self.top_k_per:
            return self
        return replace(self, top_k=max(self.top_k, -(-n_ctx // self.top_k_per // 16) * 16))

    def kernel_conf(self, block_size: int) -> np.ndarray:
        """conf  # [SP_FIELDS] int64: the selection rule as kernels/sparse_index.py reads it."""
        conf = np.zeros(SP_FIELDS, np.int64)
        conf[SP_MIN_CONTEXT], conf[SP_SINK], conf[SP_WINDOW] = self.min_context, self.sink, self.window
        conf[SP_K_BLOCKS] = -(-self.top_k // block_size)
        conf[SP_PHI], conf[SP_AGG] = PHIS[self.phi], AGGS[self.agg]
        conf[SP_REUSE], conf[SP_REUSE_COS] = self.reuse_steps, round(self.reuse_cos * 1e6)
        return conf

    def n_full(self, n_layer: int) -> int:
        """Layers that own an indexer (``indexers`` of them once chosen or not)."""
        if self.indexers is not None and not self.full_layers and self.indexers < n_layer - self.dense_layers:
            return self.indexers  # before with_chosen_layers names them
        return self.layer_kinds(n_layer).count("full")

    def layer_kinds(self, n_layer: int) -> list[str]:
        def full(li):
            return li in self.full_layers if self.full_layers else (li - self.dense_layers) % self.full_every == 0
        return ["dense" if li < self.dense_layers else "full" if full(li) else "shared" for li in range(n_layer)]


@dataclass
class SparseStats:
    rows: int = 0  # (row, sparse layer) pairs that ran sparse
    keys_attended: int = 0  # keys those rows attended (sinks, chosen, window)
    keys_total: int = 0  # keys dense attention would have read for them
    selections: int = 0  # scorer runs (full layers)
    reused: int = 0  # full-layer selections taken from an earlier row instead (reuse_steps)
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
        if current_isa() == "generic":
            raise UsageError("sparse attention needs AVX2 or better (its scorer is explicit SIMD)")
        self.tag = attention_tag()
        self.conf = config.kernel_conf(pool.block_size)  # [SP_FIELDS] int64 the selection rule
        self._row_scores = np.empty(0, np.float32)  # [rows * blocks] select_rows' scores, grown on demand
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

    def count_into(self, counts: np.ndarray) -> None:
        """Add ``counts``  # [workers, L, COUNT_FIELDS] int64 (the executor's sparse rows:
        rows, keys attended, keys total, selections per layer) to kv_stats from now on."""
        self._external.append(counts)

    def select(self, seq: PagedSequence, layer: int, q: np.ndarray, n_keys: int, scale: float) -> np.ndarray:
        """The gathered block table  # [n_sel] int32 (pool blocks, position order) of one
        query row  q  # [H, D] f32 with ``n_keys`` keys."""
        tables, keys = self.select_rows(seq, layer, q[None], n_keys - 1, scale)
        bs = self.pool.block_size
        last = n_keys - (-(-n_keys // bs) - 1) * bs  # keys in the last block, gathered last
        return tables[0, :(int(keys[0]) - last) // bs + 1].copy()

    def select_rows(self, seq: PagedSequence, layer: int, q: np.ndarray, n_past: int,
                    scale: float) -> tuple[np.ndarray, np.ndarray]:
        """(tables  # [M, nb] int32, keys  # [M] int64): each row's gathered pool blocks (the
        first of them in use) and the keys they hold, for the query rows  q  # [M, H, D] f32
        at positions n_past ..  (a row that does not select gets its own table)."""
        M, bs = q.shape[0], self.pool.block_size
        nb = -(-(n_past + M) // bs)  # the last row's blocks
        if self._row_scores.size < M * nb:
            self._row_scores = np.empty(M * nb, np.float32)
        scores = self._row_scores[:M * nb].reshape(M, nb)  # [M, >= candidates] block scores
        tables = np.empty((M, nb), np.int32)  # [M, nb] gathered pool blocks of each row
        keys = np.empty(M, np.int64)  # [M] keys each gathered table holds
        reused = select_rows(q, self.head_basis[layer], scale, self.index.idx, self.index.isc,
                             int(self.index.slot_of[layer]), seq.table, n_past, bs, self.conf, self.weights,
                             numba.get_num_threads(), scores, tables, keys, self.tag)
        self.stats.selections += int(np.count_nonzero(keys < n_past + 1 + np.arange(M))) - reused
        self.stats.reused += reused
        return tables, keys

    # ------------------------------------------------------------------ attention
    def attend(self, seq: PagedSequence, layer: int, q: np.ndarray, n_past: int, scale, out: np.ndarray,
               selected: dict) -> None:
        """out  # [M, H, D] = attention of the chunk rows  q  # [M, H, D] at positions n_past ..;
        ``selected``: this chunk's selection by the last full layer (filled here: "tables",
        "keys" of select_rows for the rows from the first sparse one)."""
        if seq.pool is not self.pool:
            raise ValueError(f"{seq.name} is not on the pool the sparse index cache follows")
        kind, M = self.kinds[layer], q.shape[0]
        first = min(M, max(0, self.config.min_context - n_past - 1))  # rows before it have too few keys
        if kind == "dense" or first == M:
            seq.attention(layer, q, n_past, scale, out)
            return
        if first:
            seq.attention(layer, q[:first], n_past, scale, out[:first])
        rows = q[first:]  # [M - first, H, D]
        if kind == "full" or not selected:
            selected["tables"], selected["keys"] = self.select_rows(seq, layer, rows, n_past + first, scale)
        tables, keys = selected["tables"], selected["keys"]
        p = self.pool
        attend_rows(rows, p.data, p.data_f32, F16_TO_F32, p.kind, p.group, p.scale_offset, tables, keys, layer,
                    p.n_kv_head, p.block_size, scale, numba.get_num_threads(), out[first:], self.tag)
        self._count(layer, keys, n_past + first)

    def _count(self, layer: int, keys: np.ndarray, n_past: int) -> None:
        """Count the rows at n_past .. that attended keys  # [rows] int64 keys each."""
        s, n = self.stats, keys.size
        attended, total = int(keys.sum()), n * (n_past + 1) + n * (n - 1) // 2
        s.rows += n
        s.keys_attended += attended
        s.keys_total += total
        lay = s.per_layer.setdefault(layer, [0, 0])
        lay[0] += attended
        lay[1] += total

    def totals(self) -> SparseStats:
        """This path's counts and those of every executor counting into it."""
        s = self.stats
        t = SparseStats(s.rows, s.keys_attended, s.keys_total, s.selections, s.reused,
                        {li: list(v) for li, v in s.per_layer.items()})
        for c in self._external:
            per_layer = c.sum(axis=0)  # [L, COUNT_FIELDS]
            rows, attended, total, selections, reused = (int(v) for v in per_layer.sum(axis=0))
            t.rows, t.keys_attended, t.keys_total = t.rows + rows, t.keys_attended + attended, t.keys_total + total
            t.selections, t.reused = t.selections + selections, t.reused + reused
            for li in np.nonzero(per_layer[:, 0])[0]:
                lay = t.per_layer.setdefault(int(li), [0, 0])
                lay[0] += int(per_layer[li, 1])
                lay[1] += int(per_layer[li, 2])
        return t

    def kv_stats(self) -> dict:
        s = self.totals()
        d = self.index.stats()
        d.update({"sparse_min_context": self.config.min_context, "sparse_rows": s.rows,
                  "sparse_selections": s.selections, "sparse_reused": s.reused,
                  "sparse_keys_fraction": s.keys_attended / s.keys_total if s.keys_total else None})
        return d
