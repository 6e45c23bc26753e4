"""When sparse attention pays on a plan: the context from which a decode row's sparse step
is predicted faster than its dense step, and both predictions at the workload's context.

A row with n keys attends, on every sparse layer, the blocks of its sinks, its window and
the indexer's top-k instead of all n keys; each full layer (one with its own indexer) also
scores the index keys of every candidate block first:

    dense(n)  = predict(plan, ctx = n)
    sparse(n) = predict(plan, ctx = n_eff) + L_full * rows * select(n)
      n_eff      = (L_dense * n + L_sparse * kept(n)) / L        KV read per layer, on average
      kept(n)    = min(n, (sink + top-k + window blocks) * bs)
      select(n)  = part_ns + token_ns * cand(n) / P               per full layer and row
      cand(n)    = n - (sink + window blocks) * bs                candidate keys

with P the cores of the attention (the executor scores a row's candidates in P parts; a
row that reuses an earlier row's selection, SparseConfig.reuse_steps, is counted as one
that scores, so the prediction errs on the dense side) and
part_ns / token_ns measured in this machine's decode step (engine/calibrate_sparse.py:
scoring, top-k, gathered table, the extra hand-offs and attention over scattered blocks).
``min_context`` is the least block multiple n from which sparse(n) < (1 - PAY_MARGIN)
dense(n); below it rows attend densely (SparseConfig.min_context).  The margin asks a
lossy mode for a real gain and covers the model's error near the break-even (on a Zen 3
host it predicted SmolLM2's break-even at ~2200 keys where the measured one was ~3000).  dense - sparse grows with n when the KV a
sparse layer no longer reads costs more than the index keys a full layer scores, so the
first such n is found by bisection; when sparse is slower even at ``SEARCH_MAX_CTX`` it
never pays.  top-k (for the context, SparseConfig.for_context), window and sinks stay the
configuration's: they are quality settings (perplexity), not a time budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from .calibration import Calibration
from .cost import predict
from .workload import Workload

SEARCH_MAX_CTX = 1 << 17  # longest context the break-even is searched to
PAY_MARGIN = 0.05  # sparse runs where it is predicted at least this much faster
# estimates until engine/calibrate_sparse.py measures this machine: ns per full layer and
# row, ns per candidate key and query head on one core (AVX2 Zen 3 measured 2.5-3)
SPARSE_SELECT_NS = {"part_ns": 20000.0, "token_ns_per_head": 3.0}
BLOCK_SIZE = 16  # tokens per KV block (kv.DEFAULT_BLOCK_SIZE)


def select_key(config, sparse) -> str:
    """Key of a measured selection cost: the head shape and the sparse configuration."""
    return (f"{config.n_head}/{config.n_kv_head}x{config.head_dim} r{sparse.rank} k{sparse.top_k} s{sparse.sink} "
            f"w{sparse.window} d{sparse.dense_layers} f{sparse.n_full(config.n_layer)} "
            f"L{config.n_layer}")


class Layers:
    """What a row with n keys reads under a sparse configuration on ``n_layer`` layers."""

    def __init__(self, n_layer: int, sparse):
        kinds = sparse.layer_kinds(n_layer)
        self.n_layer, self.dense, self.full = n_layer, kinds.count("dense"), sparse.n_full(n_layer)
        bs = BLOCK_SIZE
        self.fixed_blocks = -(-sparse.sink // bs) + -(-sparse.window // bs)
        self.kept_blocks = self.fixed_blocks + -(-sparse.top_k // bs)

    def selects(self, n: int) -> bool:
        """Whether a row with n keys has more candidate blocks than the top-k."""
        return -(-n // BLOCK_SIZE) > self.kept_blocks

    def n_eff(self, n: int) -> float:
        """Keys a row reads per layer, on average over the layers."""
        kept = min(n, self.kept_blocks * BLOCK_SIZE) if self.selects(n) else n
        return (self.dense * n + (self.n_layer - self.dense) * kept) / self.n_layer

    def candidates(self, n: int) -> int:
        return max(0, n - self.fixed_blocks * BLOCK_SIZE)


@dataclass(frozen=True)
class SparsePolicy:
    min_context: int | None  # keys from which rows run sparse; None: sparse never pays here
    top_k: int  # for the workload's context (SparseConfig.for_context)
    window: int
    sink: int
    dense_layers: int
    full_layers: int
    ctx: int  # the workload's context the two predictions are for
    dense_s: float  # predicted TPOT at ctx, dense attention
    sparse_s: float  # predicted TPOT at ctx were its rows sparse (= dense_s where they cannot select)
    rates: str  # 'measured' | 'estimated': where the selection costs came from

    def explain(self) -> str:
        head = (f"sparse attention (top-k {self.top_k}, window {self.window}, sinks {self.sink}; "
                f"{self.dense_layers} dense layers, {self.full_layers} with an indexer): ")
        if self.min_context is None:
            head += f"predicted never to pay on this plan (searched to {SEARCH_MAX_CTX} keys)"
        else:
            head += f"pays from {self.min_context} keys on (predicted {PAY_MARGIN:.0%} faster or more)"
        runs = self.min_context is not None and self.ctx >= self.min_context
        at = (f"\n  at ctx {self.ctx}: dense {self.dense_s * 1e3:.2f} ms, sparse {self.sparse_s * 1e3:.2f} ms per "
              f"token ({self.sparse_s / self.dense_s:.2f}x; {'sparse' if runs else 'dense'} runs there); "
              f"selection costs {self.rates}")
        return head + at


def _select_ns(cal: Calibration, config, sparse) -> tuple[dict, str]:
    got = cal.sparse_select_ns.get(select_key(config, sparse))
    if got and all(k in got for k in ("part_ns", "token_ns")):
        return got, "measured"
    est = SPARSE_SELECT_NS
    return {"part_ns": est["part_ns"], "token_ns": est["token_ns_per_head"] * config.n_head}, "estimated"


def _attention_cores(plan) -> int:
    attn = [d for d in plan.domains if d.role == "attention"]
    return len(attn[0].cores) if attn else max(len(d.cores) for d in plan.domains)


class _Model:
    """dense(n) and sparse(n) of one plan, workload and sparse configuration."""

    def __init__(self, plan, machine, w: Workload, cal: Calibration, sparse):
        self.plan, self.machine, self.w, self.cal = plan, machine, w, cal
        self.lay = Layers(w.config.n_layer, sparse)
        self.ns, self.rates = _select_ns(cal, w.config, sparse)
        self.P = _attention_cores(plan)

    def dense(self, n: int) -> float:
        return predict(self.plan, self.machine, self.w.with_(ctx=n), self.cal).tpot_s

    def sparse(self, n: int) -> float:
        lay = self.lay
        if not lay.selects(n) or lay.full == 0:
            return self.dense(n)
        select = (self.ns["part_ns"] + self.ns["token_ns"] * lay.candidates(n) / self.P) * 1e-9
        dense_eff = predict(self.plan, self.machine, self.w.with_(ctx=max(1, round(lay.n_eff(n)))), self.cal).tpot_s
        return dense_eff + lay.full * self.w.concurrency * select


def sparse_policy(plan, machine, w: Workload, sparse, cal: Calibration | None = None) -> SparsePolicy:
    """The sparse policy of ``plan`` for ``w`` and the sparse configuration ``sparse``
    (a sparse.SparseConfig for the workload's context: top_k, sink, window, dense_layers,
    full_every, rank)."""
    cal = cal or Calibration()
    m = _Model(plan, machine, w, cal, sparse)
    bs = BLOCK_SIZE

    def pays(blocks: int) -> bool:
        n = blocks * bs
        return m.lay.selects(n) and m.sparse(n) < (1 - PAY_MARGIN) * m.dense(n)

    lo, hi = m.lay.kept_blocks + 1, max(SEARCH_MAX_CTX, w.ctx) // bs
    if not pays(hi):
        first = None
    else:
        while lo < hi:  # least block count that pays
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if pays(mid) else (mid + 1, hi)
        first = lo * bs
    dense_s = m.dense(w.ctx)
    sparse_s = m.sparse(w.ctx)
    return SparsePolicy(min_context=first, top_k=sparse.top_k, window=sparse.window, sink=sparse.sink,
                        dense_layers=m.lay.dense, full_layers=m.lay.full, ctx=w.ctx, dense_s=dense_s,
                        sparse_s=sparse_s, rates=m.rates)
