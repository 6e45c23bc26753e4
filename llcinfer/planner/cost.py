"""The analytical TPOT model: a plan's time per decode step from bytes over bandwidth per
level, compute rates and synchronisation costs.

Per micro-batch of b sequences, every domain's busy time is a sum over its operators:

    matmul   max(read, compute) + tasks * task_ns + the tail of the last tile,
             read = weight bytes / (bw(level, cores the tiles keep busy) * matmul_read_efficiency),
             compute = weights * (b // 4 + b % 4) / unpack rate + b * weights / int8 MAC rate
    attention max(KV bytes / bw(level of the KV), flops / attention rate) + one small op (rope, append)
    norms    small_op_ns each

Weights are read at the level where their group lives (``Domain.resident_level``: L2, LLC,
else DRAM).  Hand-offs (or barriers, for the operator-synchronised batched forward pass) are counted
per layer: norm->qkv, qkv->attention, attention->wo, wo->gate_up, gate_up->down, plus
embed, the stage boundaries and the LM head; each costs by the cores it spans (one LLC,
several LLCs, several sockets) and the number of producers that signal it.

The step of ``concurrency`` sequences runs as m micro-batches (m = 1 .. number of busy
resources); TPOT(m) = max(latency of one micro-batch through all layers, m * the busiest
resource's time per micro-batch).  With one sequence a split plan serialises (the sum,
less the attention of heads whose q/k/v tiles finish before the QKV tail); with two or
more the weight and attention domains work on different micro-batches at once.  Finally
TPOT >= all DRAM bytes of the step / the machine's DRAM rate, and the host's own cost per
step (step_overhead_ns + sequences * step_overhead_seq_ns) is added.

Every constant is a field of ``Calibration`` (defaults are estimates; measured values are
saved per machine and replace them).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields

from .. import paths
from .bandwidth import Rates
from ..hw.machine import Machine
from .workload import Workload


@dataclass
class Calibration:
    """Rates and costs of the TPOT model.  Defaults are estimates for a current x86 core;
    ``Calibration.save(key)`` stores fitted values for one machine."""

    unpack_weights_per_core: float = 90e9
    """weights per second one core unpacks to int8 lanes in the repacked matmul, once per
    weight per micro-batch (fitted with ``matmul_macs_per_core`` to Q5_0/Q6_K 4864x896 and
    896x4864 matrices on one core of the development machine: 60 GMAC/s at 1 row, 110-120 at
    4 rows, 2026-11-30)."""
    matmul_macs_per_core: float = 180e9
    """int8 multiply-accumulates per second one core adds per sequence of the micro-batch."""
    attention_flops_per_core: float = 10e9
    """flops per second per core for decode attention over f16 K/V (q.k, softmax, p.v;
    the paged kernel measured 9.3e9 on one core, ctx 8192, 12/2 heads x 128, 2026-11-30)."""
    small_op_ns: float = 300.0
    """one small operator (rms norm, rope + KV append, embedding row, swiglu tail) per
    micro-batch, in ns."""
    task_ns: float = 100.0
    """claiming and finishing one matmul task (tile), in ns per task."""
    handoff_ns: float = 200.0
    """one data-dependency hand-off whose producers and consumers share one LLC, in ns."""
    handoff_cross_llc_ns: float = 600.0
    """one hand-off spanning several LLC instances (CCDs, dies) of one socket, in ns."""
    handoff_cross_socket_ns: float = 1500.0
    """one hand-off spanning sockets, in ns."""
    handoff_producer_ns: float = 15.0
    """added per producer core of the largest LLC group plus per LLC group (hierarchical
    counters: the increments to one cache line serialise), in ns."""
    barrier_ns: float = 9000.0
    """one barrier (a numba/OpenMP parallel region) within one LLC, in ns (measured 8.8 us
    median on the 2-core development machine, kernels/jit.py)."""
    barrier_cross_llc_ns: float = 12000.0
    """one barrier spanning several LLC instances, in ns."""
    barrier_cross_socket_ns: float = 20000.0
    """one barrier spanning sockets, in ns."""
    l2_usable_fraction: float = 0.5
    """share of each core's L2 that can hold resident weight tiles (the rest: activations,
    KV tiles, code)."""
    llc_usable_fraction: float = 0.9
    """share of the effective LLC that can hold resident tensors."""
    kv_pollution: float = 0.5
    """fraction of the KV bytes streamed through an LLC per step that displaces resident
    weights in it (0: non-temporal KV reads; 1: plain LRU)."""
    head_overlap: float = 0.8
    """with one sequence, the fraction of the attention of all KV heads but the last that
    overlaps the QKV projection of later heads (split plans)."""
    matmul_read_efficiency: float = 1.0
    """fraction of the machine's read bandwidth (its curve) a matmul reaches when it streams
    weights: perf/calibrate.py measures it by streaming every layer's ffn_gate of
    Qwen2.5-0.5B through the kernel (decode, one row) on all threads."""
    step_overhead_ns: float = 0.0
    """fixed host-side cost of one decode step outside the workers (embedding row, block
    tables, job hand-out, logits copy), in ns."""
    step_overhead_seq_ns: float = 0.0
    """host-side cost per sequence of a step (KV block bookkeeping), in ns."""
    attn_stream_reserve_bytes: int = 4 << 20
    """LLC bytes an attention domain keeps for streaming KV tiles in an LLC instance it
    shares with a weight domain, when its KV does not fit (the rest goes to weights)."""

    def handoff_s(self, m: Machine, producers, consumers, mode: str = "handoff") -> float:
        """Seconds for one hand-off (or barrier) from ``producers`` to ``consumers``."""
        key = (id(m), tuple(producers), tuple(consumers), mode)
        memo = self.__dict__.setdefault("_memo", {})
        if key not in memo:
            memo[key] = self._handoff_s(m, producers, consumers, mode)
        return memo[key]

    def _handoff_s(self, m: Machine, producers, consumers, mode: str) -> float:
        span = set(producers) | set(consumers)
        n_llc = len(m.llc_groups(span))
        n_sock = len({m.package_of.get(c, 0) for c in span})
        if mode == "barrier":
            ns = (self.barrier_cross_socket_ns if n_sock > 1 else
                  self.barrier_cross_llc_ns if n_llc > 1 else self.barrier_ns)
        else:
            groups = m.llc_groups(producers)
            base = (self.handoff_cross_socket_ns if n_sock > 1 else
                    self.handoff_cross_llc_ns if n_llc > 1 else self.handoff_ns)
            ns = base + self.handoff_producer_ns * (max(len(g) for g in groups) + len(groups))
        return ns * 1e-9

    # -- persistence ---------------------------------------------------------------------

    @staticmethod
    def path(key: str) -> str:
        return os.fspath(paths.machine_dir() / f"calibration-{key}.json")

    @classmethod
    def load(cls, key: str | None) -> "Calibration":
        """The calibration saved for machine ``key``; defaults for missing fields or file."""
        if not key:
            return cls()
        try:
            with open(cls.path(key)) as fh:
                d = json.load(fh)
        except (OSError, ValueError):
            return cls()
        names = {f.name: f.type for f in fields(cls)}
        kw = {k: (int(v) if names[k] == "int" else float(v)) for k, v in d.items()
              if k in names and isinstance(v, (int, float))}
        return cls(**kw)

    def save(self, key: str) -> str:
        path = self.path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            json.dump(asdict(self), fh, indent=1)
        return path


@dataclass
class Prediction:
    """Predicted time per output token (one decode step) and what it is made of.

    ``terms`` are seconds per step along what bounds it (one micro-batch's path through all
    domains when ``bound`` is 'latency', else the busiest domain's work); they add up to
    ``tpot_s``: 'overlap' <= 0 is what the roofline max (reads vs compute) and overlapping
    heads hide, 'dram_contention' >= 0 what a saturated DRAM adds.  ``busy`` is every
    domain's work per step.
    """

    tpot_s: float
    terms: dict[str, float] = field(default_factory=dict)
    micro_batches: int = 1
    bound: str = ""  # 'latency' | 'busy:<domain>' | 'dram'
    sync: str = "handoff"  # 'handoff' | 'barrier'
    busy: dict[str, float] = field(default_factory=dict)  # domain -> seconds of work per step


TERM_ORDER = ("weights_L2", "weights_LLC", "weights_DRAM", "matmul_compute", "tasks", "kv_LLC", "kv_DRAM",
              "attention_compute", "small_ops", "handoffs", "barriers", "step_overhead", "overlap", "dram_contention")


class _Acc:
    """Busy seconds and term seconds of one resource for one micro-batch."""

    def __init__(self):
        self.busy = 0.0
        self.terms: dict[str, float] = {}

    def add(self, term: str, s: float) -> None:
        self.terms[term] = self.terms.get(term, 0.0) + s


def _matmul(acc: _Acc, w: Workload, cal: Calibration, rates: Rates, cores, layer, op, level, tile, b) -> float:
    nbytes = w.op_weight_bytes(layer, op)
    rows = w.op_rows(op)
    tasks = math.ceil(rows / tile)
    t = len(cores)
    t_eff = min(t, tasks)
    read = nbytes / (rates.read_gbs(level, cores) * 1e9 * cal.matmul_read_efficiency * t_eff / t)
    n_weights = w.op_macs(op) // w.concurrency
    # the kernel decodes each weight block once per 4 activation rows, then once per
    # remaining row (vnni_matmul: 4-row and 1-row paths)
    unpacks = b // 4 + b % 4
    compute = (n_weights * unpacks / (t_eff * cal.unpack_weights_per_core)
               + n_weights * b / (t_eff * cal.matmul_macs_per_core))
    over = tasks * cal.task_ns * 1e-9 / t_eff
    body = max(read, compute)
    # tiles are claimed dynamically: while the last tile runs, the other workers of the
    # domain wait on average half a tile (nothing when every worker gets one tile)
    tail = 0.0 if tasks <= t_eff else 0.5 * (t_eff - 1) / t_eff * body * t_eff / tasks
    acc.add(f"weights_{level}", read)
    acc.add("matmul_compute", compute)
    acc.add("tasks", over + tail)
    dt = body + over + tail
    acc.busy += dt
    return dt


def _small(acc: _Acc, cal: Calibration, n: int = 1) -> None:
    acc.add("small_ops", n * cal.small_op_ns * 1e-9)
    acc.busy += n * cal.small_op_ns * 1e-9


def _attention(acc: _Acc, w: Workload, cal: Calibration, rates: Rates, dom, b) -> float:
    kv = w.kv_bytes_per_step_layer * b / w.concurrency
    f_res = dom.kv_resident_fraction
    read_llc = kv * f_res / (rates.read_gbs("LLC", dom.cores) * 1e9)
    read_dram = kv * (1 - f_res) / (rates.read_gbs("DRAM", dom.cores) * 1e9)
    compute = w.attention_flops_layer * b / w.concurrency / (len(dom.cores) * cal.attention_flops_per_core)
    acc.add("kv_LLC", read_llc)
    acc.add("kv_DRAM", read_dram)
    acc.add("attention_compute", compute)
    dt = max(read_llc + read_dram, compute)
    acc.busy += dt
    _small(acc, cal)  # rope + KV append
    return dt


def _pass(plan, m: Machine, w: Workload, cal: Calibration, rates: Rates, b: int, sync: str):
    """One micro-batch of b sequences through every layer: (latency, {domain: _Acc}, seconds of
    hand-offs between domains and stages).

    Per stage: the weight domain's operators, the attention of its layers (on the attention
    domain, or on the same cores in a shared stage), 3 hand-offs inside the weight domain
    and 2 to the attention domain and back per layer, one at the stage boundary."""
    accs = {d.name: _Acc() for d in plan.domains}
    weights = sorted((d for d in plan.domains if d.role in ("weights", "shared")), key=lambda d: d.stage)
    attn_dom = next((d for d in plan.domains if d.role == "attention"), None)
    latency = cross = 0.0
    sync_term = "barriers" if sync == "barrier" else "handoffs"
    prev = None
    for wd in weights:
        ad = attn_dom or wd
        acc, aacc = accs[wd.name], accs[ad.name]
        w0, a0 = acc.busy, aacc.busy
        inner_one = cal.handoff_s(m, wd.cores, wd.cores, sync)
        cross_one = cal.handoff_s(m, wd.cores, ad.cores, sync)
        n_inner, hand, overlap = 0, 0.0, 0.0
        if prev is not None:  # stage boundary: the residual moves to the next layer group
            hand += cal.handoff_s(m, prev.cores, wd.cores, sync)
        if wd.stage == 0:
            _small(acc, cal)  # embed
        lvl = wd.resident_level
        for layer in wd.layers:
            _small(acc, cal)  # attn_norm
            qkv = _matmul(acc, w, cal, rates, wd.cores, layer, "qkv", lvl.get(f"blk.{layer}.attn", "DRAM"),
                          wd.tiles["qkv"], b)
            a = _attention(aacc, w, cal, rates, ad, b)
            if ad is not wd and b == 1:  # heads whose q/k/v are ready start before the QKV tail
                overlap += min(a, qkv) * cal.head_overlap * (w.config.n_kv_head - 1) / w.config.n_kv_head
            _matmul(acc, w, cal, rates, wd.cores, layer, "wo", lvl.get(f"blk.{layer}.attn", "DRAM"),
                    wd.tiles["wo"], b)
            _small(acc, cal)  # ffn_norm
            for op in ("gate_up_swiglu", "down"):
                _matmul(acc, w, cal, rates, wd.cores, layer, op, lvl.get(f"blk.{layer}.ffn", "DRAM"),
                        wd.tiles[op], b)
            n_inner += 3  # norm->qkv, wo->gate_up, gate_up->down
            hand += 2 * cross_one  # qkv->attention, attention->wo
        if wd.stage == weights[-1].stage:
            _small(acc, cal)  # output norm
            _matmul(acc, w, cal, rates, wd.cores, 0, "lm_head", lvl.get("output", "DRAM"), wd.tiles["lm_head"], b)
            n_inner += 1
        inner = n_inner * inner_one
        acc.add(sync_term, inner)
        acc.busy += inner  # waiting on its own dependencies keeps the domain busy
        work = (acc.busy - w0) + (aacc.busy - a0 if ad is not wd else 0.0)
        latency += work - overlap + hand
        cross += hand
        prev = wd
    return latency, accs, cross


def predict(plan, m: Machine, w: Workload, cal: Calibration | None = None, rates: Rates | None = None,
            sync: str = "handoff") -> Prediction:
    """TPOT of ``plan`` (domains with roles, cores, layers, resident levels, tiles)."""
    cal = cal or Calibration()
    rates = rates or Rates(m)
    c = w.concurrency
    n_res = len(plan.domains)
    best = None
    for mb in range(1, min(c, n_res) + 1):
        b = math.ceil(c / mb)
        latency, accs, cross = _pass(plan, m, w, cal, rates, b, sync)
        busiest = max(accs, key=lambda k: accs[k].busy)
        busy = mb * accs[busiest].busy
        tpot = max(latency, busy)
        if best is None or tpot < best[0] - 1e-12:
            best = (tpot, mb, accs, cross, "latency" if latency >= busy else f"busy:{busiest}")
    tpot, mb, accs, cross, bound = best
    sync_term = "barriers" if sync == "barrier" else "handoffs"
    if bound == "latency":  # one micro-batch's path through every domain
        terms = _sum_terms(a.terms for a in accs.values())
        terms[sync_term] = terms.get(sync_term, 0.0) + cross
    else:  # the busiest domain, once per micro-batch
        terms = {k: mb * v for k, v in accs[bound.split(":", 1)[1]].terms.items()}
    floor = _dram_bytes(plan, mb) / (rates.dram_total * 1e9)
    if floor > tpot:
        terms["dram_contention"] = floor - tpot
        tpot, bound = floor, "dram"
    host = (cal.step_overhead_ns + c * cal.step_overhead_seq_ns) * 1e-9  # outside the workers
    terms["step_overhead"] = host
    tpot += host
    work = sum(v for k, v in terms.items() if k != "dram_contention")
    terms["overlap"] = min(0.0, tpot - terms.get("dram_contention", 0.0) - work)
    terms = {k: terms[k] for k in TERM_ORDER if k in terms}
    busy = {name: mb * a.busy for name, a in accs.items()}
    return Prediction(tpot_s=tpot, terms=terms, micro_batches=mb, bound=bound, sync=sync, busy=busy)


def _sum_terms(dicts) -> dict[str, float]:
    out: dict[str, float] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _dram_bytes(plan, mb: int) -> float:
    """Bytes one step reads from DRAM: streamed weights once per micro-batch, streamed KV once."""
    total = 0.0
    for d in plan.domains:
        for group, nbytes in d.streamed:
            total += nbytes if group == "kv" else mb * nbytes
    return total
