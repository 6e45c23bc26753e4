"""DecodeExecutor: one decode step (one token for each of M sequences) on pinned workers
synchronised by data-dependency counters (step_kernel.py), instead of one thread-pool
launch, and its barrier, per operator.

Plan before compute: the packed matrices, biases and norms are gathered once; the
program (program.py) and the activation buffers are built once per (rows, splits) shape
and reused for every token.
"""

from __future__ import annotations

import operator
import weakref
from dataclasses import dataclass

import numpy as np

from ..dtypes import KV_INT8
from ..errors import UnsupportedModelError
from ..hw.machine import detect_topology
from ..kernels.act_quant import ACT_Q8_0, ACT_Q8_K
from ..kernels.paged_attention import split_count
from ..kernels.simd import lanes, make_tag
from ..kernels.sparse_index import COUNT_FIELDS, SP_FIELDS
from ..kernels.sparse_reuse import A_CHOSE
from ..kernels.tables import F16_TO_F32
from .atomics import COUNTER_STRIDE
from .program import Program, Shapes, Tiles, build_program
from .step_args import pack
from .step_kernel import step_prologue, step_prologue_rows
from .tiles import M_GROUPS
from .workers import ExecutorError, WorkerPool

_KIND_BIT = {ACT_Q8_0: 1, ACT_Q8_K: 2}  # activation kind -> bit of a prologue's mask
_KIND_INDEX = {ACT_Q8_0: 0, ACT_Q8_K: 1}


@dataclass(frozen=True)
class Domains:
    """Worker cores: the weight domain, and the attention domain (empty: shared)."""

    weight: tuple
    attention: tuple = ()
    micro_batches: int = 1
    tiles: Tiles = Tiles()

    @property
    def cores(self) -> list:
        return list(self.weight) + list(self.attention)


def default_domains(threads: int) -> Domains:
    """One shared domain on ``threads`` distinct physical cores (no plan: benchmarks, tests)."""
    cores = detect_topology().physical_cores()
    n = max(1, min(int(threads), len(cores)))
    return Domains(weight=tuple(cores[:n]))


def unsupported_reason(model) -> str | None:
    """Why the executor cannot run this model (None: it can)."""
    if not model.llama_rounding:
        return "exact-f32 numerics run on the batched path"
    w = model.weights
    lins = [m for lw in w.layers for m in (lw.wq, lw.wk, lw.wv, lw.wo, lw.w_gate, lw.w_up, lw.w_down)] + [w.output]
    if not all(lin.simd for lin in lins):
        return "a weight matrix has no SIMD kernel"
    if len({lin.isa for lin in lins}) != 1:
        return "weight matrices on different ISA paths"
    if model.config.head_dim % lanes(lins[0].isa):
        return "head_dim is not a multiple of the vector lanes"
    if model.inv_freq.shape[0] != model.config.head_dim // 2:
        return "rope over part of the head (rope_dim < head_dim)"
    return None


class DecodeExecutor:
    """Decode steps of ``model`` on ``domains``' workers.  ``workers``: run on another
    executor's pool (a draft model's steps on the target's threads, one after the other;
    same cores), which the owner closes.  ``head_rows``: the LM head computes the logits of
    the first ``head_rows`` token ids only (a drafter's shortened head; a multiple of the
    vector lanes), all of them by default."""

    def __init__(self, model, domains: Domains, workers: WorkerPool | None = None, head_rows: int | None = None):
        why = unsupported_reason(model)
        if why:
            raise UnsupportedModelError(f"executor: {why}")
        c, w = model.config, model.weights
        self.head_rows = c.vocab_size if head_rows is None else int(head_rows)
        whole = self.head_rows == c.vocab_size or self.head_rows % lanes(w.output.isa) == 0
        if not (0 < self.head_rows <= c.vocab_size and whole):
            raise ValueError(f"executor: head_rows {head_rows} is not a multiple of the lanes up to {c.vocab_size}")
        self.model, self.domains = model, domains
        self.config = c
        lins = [[lw.wq, lw.wk, lw.wv, lw.wo, lw.w_gate, lw.w_up, lw.w_down] for lw in w.layers] + [[w.output]]
        self.isa = lins[0][0].isa
        self.tag = make_tag(self.isa)
        flat = [lin for group in lins for lin in group]
        self.mats = [lin.prepare() for lin in flat]  # [n_mats] packed [groups, bytes]; kept alive here
        if not all(p.flags.c_contiguous for p in self.mats):
            raise UnsupportedModelError("executor: packed weights are not contiguous")
        # [n_mats, 5] columns M_ADDR, M_GROUPS (of lanes rows), M_STRIDE (bytes per group), M_QT, M_KIND
        self.mat_table = np.array([[p.ctypes.data, p.shape[0], p.shape[1], int(lin.qtype), _KIND_INDEX[lin.act_kind]]
                                   for p, lin in zip(self.mats, flat)], np.int64).reshape(-1, 5)
        self.mat_table[-1, M_GROUPS] = -(-self.head_rows // lanes(self.isa))  # the LM head's first head_rows rows
        ids, k = [], 0
        for group in lins:
            ids.append(tuple(range(k, k + len(group))))
            k += len(group)

        def mask(*ls) -> int:  # the activation kinds a prologue must produce
            return sum({_KIND_BIT[x.act_kind] for x in ls})

        masks = [(mask(lw.wq, lw.wk, lw.wv), mask(lw.wo), mask(lw.w_gate, lw.w_up), mask(lw.w_down)) for lw in w.layers]
        masks.append(mask(w.output))
        # sparse attention (sparse/attention.py) on the pool it was enabled for, or None
        self.sparse = getattr(model, "sparse", None)
        self.shapes = Shapes(c, lanes(self.isa), tuple(ids), tuple(masks), self.head_rows,
                             tuple(self.sparse.kinds) if self.sparse is not None else ())
        self.attn_norm = np.stack([lw.attn_norm for lw in w.layers]).astype(np.float32)  # [L, d]
        self.ffn_norm = np.stack([lw.ffn_norm for lw in w.layers]).astype(np.float32)  # [L, d]
        if workers is not None and workers.n != len(domains.cores):
            raise ValueError(f"executor: a shared pool of {workers.n} workers for {len(domains.cores)} cores")
        self._owns_workers = workers is None
        self.workers = workers or WorkerPool(domains.cores, [0] * len(domains.weight) + [1] * len(domains.attention))
        n_w = len(domains.weight)
        self._weight_ids = list(range(n_w))
        self._attn_ids = list(range(n_w, n_w + len(domains.attention)))
        self.split_threads = len(self._attn_ids) or self.workers.n  # a row's attention is split for these (split_count)
        self._programs: dict[tuple, Program] = {}
        self._buffers: dict[tuple, dict] = {}
        self._jobs: dict[tuple, dict] = {}  # (M, splits) -> the step's arguments (_job)
        self.tables_capacity = 64  # blocks per sequence of a new job's tables (doubled as needed)
        self.last_program: Program | None = None
        self.model_block_size = 16
        self.profile = None  # {program key: (program, [workers, n_ops + 1, 2] cycles)} while profiling (start_profile)
        self._embed = self._make_embed()
        self._no_profile = np.zeros((0, 0, 2), np.int64)
        self.sparse_counts = np.zeros((self.workers.n, c.n_layer, COUNT_FIELDS), np.int64)  # [worker, L, COUNT_*]
        if self.sparse is not None:
            self.sparse.count_into(self.sparse_counts)

    def _make_embed(self):
        """embed(ids, x, pos, rope_cs, counters): x = the embedding rows of ids, and the
        step's prologue (rope table, counters zeroed); one kernel call for a quantized
        embedding matrix."""
        emb, inv_freq = self.model.weights.token_embd, self.model.inv_freq
        src = emb.quant_rows_source()
        if src is not None:
            w, qt = src
            return lambda ids, x, pos, cs, ctr: step_prologue_rows(w, ids, qt, F16_TO_F32, x, pos, inv_freq, cs, ctr)

        def embed(ids, x, pos, cs, ctr):
            emb.get_rows(ids, out=x)
            step_prologue(pos, inv_freq, cs, ctr)
        return embed

    def start_profile(self) -> None:
        """Accumulate, per worker and operator, the cycles spent waiting for the operator's
        input and working on its tiles, over the following steps (perf/step_profile.py)."""
        self.profile = {}

    def _profile(self, prog: Program) -> np.ndarray:
        if self.profile is None:
            return self._no_profile
        key = (prog.order.shape[0], prog.ops.shape[0], id(prog))
        if key not in self.profile:
            self.profile[key] = (prog, np.zeros((prog.order.shape[0], prog.ops.shape[0] + 1, 2), np.int64))
        return self.profile[key][1]

    # ------------------------------------------------------------------ planning
    def program(self, M: int, n_splits: int, micro_batches: int | None = None) -> Program:
        """The operator table for M rows and ``n_splits`` attention parts per row, in the
        domains' micro-batches (``micro_batches`` overrides: 1 when a sequence has several
        rows, whose later rows attend to the earlier ones' K/V)."""
        U = self.domains.micro_batches if micro_batches is None else micro_batches
        key = (M, n_splits, U)
        if key not in self._programs:
            self._programs[key] = build_program(self.shapes, M, self._weight_ids, self._attn_ids, n_splits, U,
                                                self.domains.tiles)
        return self._programs[key]

    def buffers(self, M: int, n_splits: int, micro_batches: int | None = None) -> dict:
        U = self.domains.micro_batches if micro_batches is None else micro_batches
        key = (M, n_splits, U)
        if key not in self._buffers:
            c = self.config
            NW, H, KVH, D = self.workers.n, c.n_head, c.n_kv_head, c.head_dim
            G, kmax = H // KVH, max(c.d_model, H * D, c.d_ff)
            f32 = np.float32
            self._buffers[key] = dict(
                x=np.zeros((M, c.d_model), f32),  # [M, d] residual stream
                hpriv=np.zeros((NW, M * kmax), f32),  # [worker, M*K] normed input, private
                qpriv=np.zeros((NW, 2, M * kmax), np.int8),  # [worker, kind, M*K] int8 input
                dpriv=np.zeros((NW, 2, M * kmax // 32 + 1), f32),  # [worker, kind, M*K/32] block scales
                spriv=np.zeros((NW, 2, M * kmax // 16 + 1), np.int32),  # [worker, kind, M*K/16] block sums
                qb=np.zeros((M, H * D), f32), kb=np.zeros((M, KVH * D), f32), vb=np.zeros((M, KVH * D), f32),
                attn=np.zeros((M, H, D), f32),  # [M, H, D] attention output
                gate=np.zeros((M, c.d_ff), f32), up=np.zeros((M, c.d_ff), f32), act=np.zeros((M, c.d_ff), f32),
                ytmp=np.zeros((M, c.d_model), f32),  # [M, d] Wo / W_down tile outputs before the residual add
                logits=np.zeros((M, self.head_rows), f32),  # [M, head_rows]
                rope_cs=np.zeros((M, self.model.inv_freq.shape[0], 2), f32),  # [M, D/2, 2] rope cos / sin per row
                pmax=np.zeros((M * KVH * n_splits, G), f32),  # [M*KVH*S, G] partial softmax max
                psum=np.zeros((M * KVH * n_splits, G), f32),  # [M*KVH*S, G] partial softmax sum
                pacc=np.zeros((M * KVH * n_splits, G, D), f32),  # [M*KVH*S, G, D] partial outputs
                counters=np.zeros(self.program(M, n_splits, U).n_counters * COUNTER_STRIDE, np.int64),
            )
        return self._buffers[key]

    def n_splits(self, n_keys: int) -> int:
        """Attention parts per row of a step whose longest row has ``n_keys`` keys."""
        return split_count(n_keys, self.model_block_size, self.config.n_kv_head, self.split_threads)

    # ------------------------------------------------------------------ the step
    def _job(self, M: int, S: int, U: int, pool, nb: int) -> dict:
        """The step's argument tuple for (M rows, S splits, U micro-batches, pool), built once
        and reused while the block tables fit: the serving workers keep running on the same
        tuple.  Per step only the contents of ``pos``, ``seq`` and ``tables`` change."""
        key = (M, S, U)  # one pool per key is kept alive: the latest one
        job = self._jobs.get(key)
        prof = self._no_profile if self.profile is None else self._profile(self.program(M, S, U))
        if job is None or job["tables"].shape[1] < nb or job["pool"] is not pool or job["prof"] is not prof:
            cap = self.tables_capacity if job is None else job["tables"].shape[1]
            while cap < nb:  # room for the blocks, doubled as sequences grow
                cap *= 2
            prog, b, c, m = self.program(M, S, U), self.buffers(M, S, U), self.config, self.model
            pos = np.zeros(M, np.int64)  # [M] rows' positions
            tables = np.zeros((M, cap), np.int32)  # [sequence, blocks] pool block ids of each sequence
            seq_idx = np.arange(M, dtype=np.int64)  # [M] row m -> its sequence's row of tables
            sp_args = self._sparse_args(M, cap, pool)
            args = pack(dict(
                ops=prog.ops, order=prog.order, counters=b["counters"], mats=self.mat_table, tag=self.tag,
                **{k: b[k] for k in ("x", "hpriv", "qpriv", "dpriv", "spriv", "qb", "kb", "vb", "attn", "gate", "up",
                                     "act", "ytmp", "logits", "rope_cs", "pmax", "psum", "pacc")},
                attn_norm=self.attn_norm, ffn_norm=self.ffn_norm, out_norm=m.weights.output_norm,
                eps=np.float32(c.rms_eps), bq=m.bq, bk=m.bk, bv=m.bv, has_bias=m.has_bias,
                neox=c.rope_neox, round_q=True, lut=F16_TO_F32, pos=pos, seq=seq_idx, tables=tables,
                split_threads=self.split_threads, **pool.kernel_args(), scale=m.scale, prof=prof, **sp_args))
            job = dict(args=args, prog=prog, buffers=b, pos=pos, seq=seq_idx, tables=tables, pool=pool, prof=prof,
                       ids=np.zeros(M, np.int64),  # ids: [M] this step's tokens
                       anchor=sp_args["sp_anchor"], owners=[None] * M)  # owners: (sequence, position) of each row
            self._jobs[key] = job
        return job

    def _sparse_args(self, M: int, cap: int, pool) -> dict:
        """The step's sparse-attention arguments (step_args.py), placeholders without it."""
        c, sp, f32 = self.config, self.sparse, np.float32
        if sp is None:
            return dict(sp_idx=np.zeros((1, 1, 1, 1, 1, 4), np.uint8), sp_isc=np.zeros((1, 1, 1, 1), f32),
                        sp_basis=np.zeros((1, 1, 4, 1), f32), sp_hbasis=np.zeros((1, 1, 4, 1), f32),
                        sp_w=np.zeros(1, f32), sp_slot=np.full(c.n_layer, -1, np.int64),
                        sp_conf=sp_conf_placeholder(), sel_tables=np.zeros((1, 1), np.int32),
                        sel_n=np.zeros(1, np.int64), sp_scores=np.zeros((1, 1), f32),
                        sp_anchor=np.full((1, 1, 2), -1, np.int64), sp_chosen=np.zeros((1, 1, 1), np.int32),
                        sp_anchor_q=np.zeros((1, 1, 1, 1), f32), sp_counts=self.sparse_counts)
        if pool is not sp.pool:
            raise ValueError("executor step: sparse attention follows another KV pool than this step's")
        n_full = max(1, int(sp.index.slot_of.max()) + 1)
        return dict(sp_idx=sp.index.idx, sp_isc=sp.index.isc, sp_basis=sp.basis, sp_hbasis=sp.head_basis,
                    sp_w=sp.weights, sp_slot=sp.index.slot_of, sp_conf=sp.conf,
                    sel_tables=np.zeros((M, cap), np.int32),  # [M, blocks] each row's gathered table
                    sel_n=np.zeros(M, np.int64),  # [M] keys it holds
                    sp_scores=np.zeros((M, pool.n_blocks), f32),  # [M, blocks] candidate block scores
                    sp_anchor=np.full((M, n_full, 2), -1, np.int64),  # [M, full layer, A_*] no anchor yet
                    sp_chosen=np.zeros((M, n_full, cap), np.int32),  # [M, full layer, blocks]
                    sp_anchor_q=np.zeros((M, n_full, c.n_head, c.head_dim), f32),  # [M, full layer, H, D]
                    sp_counts=self.sparse_counts)

    def step(self, seqs: list, tokens, copy: bool = True) -> np.ndarray:
        """One token for each sequence; returns logits  # [M, head_rows]: a copy, or with
        ``copy`` False the step's own buffer, valid until the next step of as many rows
        (the step loop, which reads them before it steps again).

        Per token this is Python run right after the weights streamed through the caches,
        so every call and array operation is a string of cache misses (measured 230-280 us
        a token on SmolLM2, 40 us warm): the ids are checked as Python ints, the embedding
        rows, rope table and counter reset are one kernel (step_prologue)."""
        ids = _token_ids(tokens, self.config.vocab_size)
        if len(ids) != len(seqs) or not seqs:
            raise ValueError(f"executor step: {len(ids)} tokens for {len(seqs)} sequences")
        return self._run(seqs, [(t,) for t in ids], len(ids), None, copy)

    def step_rows(self, seqs: list, token_lists: list, index: list | None = None, copy: bool = True) -> np.ndarray:
        """Consecutive tokens for each sequence in one step: sequence i's tokens take rows
        at positions n_tokens, n_tokens + 1, ..., each attending to the sequence's prefix
        and its own earlier rows (causal), so a drafted chain is verified in one step as
        plain decoding would compute it token by token.  ``index[i]`` False: sequence i's
        rows are a draft, not indexed for prefix sharing (PagedSequence.finish).  Returns
        logits  # [rows, head_rows], the sequences' rows in order (``copy`` as for ``step``)."""
        lists = [_token_ids(t, self.config.vocab_size) for t in token_lists]
        if len(lists) != len(seqs) or not seqs or not all(lists):
            raise ValueError(f"executor step: {len(lists)} token lists for {len(seqs)} sequences (none empty)")
        if len(set(map(id, seqs))) != len(seqs):
            raise ValueError("executor step: a sequence appears twice")
        return self._run(seqs, lists, sum(map(len, lists)), index, copy)

    def _run(self, seqs: list, lists: list, M: int, index: list | None, copy: bool) -> np.ndarray:
        pool = seqs[0].pool
        if any(s.pool is not pool for s in seqs):
            raise ValueError("executor step: every sequence must live in one KV pool")
        if pool.kind == KV_INT8:
            raise UnsupportedModelError("executor: int8 KV cache runs on the batched path")
        if getattr(self.model, "sparse", None) is not self.sparse:
            raise ValueError("executor step: the model's sparse attention changed after this executor was built")
        for s, t in zip(seqs, lists):
            s.prepare(t)
        nb = max(s.n_blocks for s in seqs)
        self.model_block_size = pool.block_size
        S = self.n_splits(max(s.n_tokens + len(t) for s, t in zip(seqs, lists)))
        U = self.domains.micro_batches if M == len(seqs) else 1  # a sequence's rows in one micro-batch
        job = self._job(M, S, U, pool, nb)
        pos, seq_idx, tables, id_buf = job["pos"], job["seq"], job["tables"], job["ids"]
        r = 0
        for i, (s, t) in enumerate(zip(seqs, lists)):
            tables[i, :s.n_blocks] = s.table[:s.n_blocks]
            n = s.n_tokens
            for tok in t:
                pos[r] = n
                id_buf[r] = tok
                seq_idx[r] = i
                n += 1
                r += 1
        if self.sparse is not None and self.sparse.config.reuse_steps:
            _forget_moved_anchors(job, seqs, lists)
        self.last_program = job["prog"]
        b = job["buffers"]
        self._embed(id_buf, b["x"], pos, b["rope_cs"], b["counters"])
        codes = self.workers.run_step(job["args"], b["counters"])
        if any(codes):
            raise ExecutorError("executor step aborted: a dependency wait timed out" if 2 in codes
                                else "executor step aborted")
        for i, (s, t) in enumerate(zip(seqs, lists)):
            s.finish(t, index=True if index is None else bool(index[i]))
        return b["logits"].copy() if copy else b["logits"]

    def close(self) -> None:
        if self._owns_workers:
            self.workers.close()

    def __del__(self):  # the pool's threads keep it alive, not this object
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


def _forget_moved_anchors(job: dict, seqs: list, lists: list) -> None:
    """A row keeps its sparse reuse anchors (kernels/sparse_reuse.py) only while it holds
    the same sequence at the next position, step after step."""
    owners, anchor, r = job["owners"], job["anchor"], 0
    for s, t in zip(seqs, lists):
        for i in range(len(t)):
            prev, now = owners[r], s.n_tokens + i
            if prev is None or prev[0]() is not s or prev[1] != now - 1:
                anchor[r, :, A_CHOSE] = -1  # no anchor
            owners[r] = (weakref.ref(s), now)
            r += 1


def sp_conf_placeholder() -> np.ndarray:
    """A selection rule no row meets (without sparse attention no layer reads it)."""
    conf = np.zeros(SP_FIELDS, np.int64)  # [SP_FIELDS]
    conf[:] = 1 << 62
    return conf


def _token_ids(tokens, vocab_size: int) -> list[int]:
    """``tokens`` as Python ints in [0, vocab_size); ints and numpy ints, not 3.7, "3" or None."""
    try:
        ids = [operator.index(t) for t in tokens]
    except TypeError:
        raise ValueError(f"token ids must be integers, got {list(tokens)!r}"[:200]) from None
    for t in ids:
        if t < 0 or t >= vocab_size:
            raise ValueError(f"token id out of range [0, {vocab_size})")
    return ids
