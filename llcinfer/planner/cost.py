"""The analytical TPOT model: a plan's time per decode step from bytes over bandwidth per
level, compute rates and synchronisation costs.

Per micro-batch of b sequences, every domain's busy time is a sum over its operators:

    matmul   max(read, compute) + tasks * task_ns + the tail of the last tile,
             read = weight bytes / (bw(level, cores the tiles keep busy) * matmul_read_efficiency),
             compute = weights * ceil(b / 4) / unpack rate + b * weights / int8 MAC rate
    attention max(KV bytes / bw(level of the KV), flops / attention rate) + one small op (rope, append)
    norms    small_op_ns each

The weight-side work of a domain (the matmuls' weight reads, norms, its inner hand-offs) is
scaled by the factor measured for this model's decode step on that many cores and rows
(``Calibration.work_scale``), the matmuls' compute term not: the factor is measured at 1
and 4 rows, where the reads bound the matmuls, and a verification step of more rows is
bound by the compute it never saw; streamed KV goes at the rate measured in the step
(``Calibration.attention_gbs``), which bounds the attention's compute term too.

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
step (step_overhead_ns + sequences * step_overhead_seq_ns) is added.  Weights and KV read
from DRAM go at the kernels' own measured streaming rates per core count where the
calibration has them.  Last, the observed TPOTs feed back (``Calibration.feedback``): the
prediction splits into its attention part (what the step costs beyond the same step at one
token of context) and the rest, each scaled by its fed-back factor ('feedback' term).

Every constant is a field of ``Calibration`` (calibration.py: defaults are estimates;
values measured on this machine with this kernel version replace them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .bandwidth import Rates
from .calibration import Calibration
from ..hw.machine import Machine
from .workload import MATMUL_TENSORS, Workload, workload_key


@dataclass
class Prediction:
    """Predicted time per output token (one decode step) and what it is made of.

    ``terms`` are seconds per step along what bounds it (one micro-batch's path through all
    domains when ``bound`` is 'latency', else the busiest domain's work); they add up to
    ``tpot_s``: 'overlap' <= 0 is what the roofline max (reads vs compute) and overlapping
    heads hide, 'dram_contention' >= 0 what a saturated DRAM adds, 'feedback' what the
    observed TPOTs correct.  ``busy`` is every
    domain's work per step.
    """

    tpot_s: float
    terms: dict[str, float] = field(default_factory=dict)
    micro_batches: int = 1
    bound: str = ""  # 'latency' | 'busy:<domain>' | 'dram'
    sync: str = "handoff"  # 'handoff' | 'barrier'
    busy: dict[str, float] = field(default_factory=dict)  # domain -> seconds of work per step
    model_s: float = 0.0  # the model's TPOT before what observations feed back ('feedback' term)
    attention_s: float = 0.0  # the part of model_s the context adds (attention and what it displaces)
    work_scale: dict[str, float] = field(default_factory=dict)  # domain -> measured weight-side factor
    feedback: tuple[float, float] = (1.0, 1.0)  # fed-back factors: weight side, attention


TERM_ORDER = ("weights_L2", "weights_LLC", "weights_DRAM", "matmul_compute", "tasks", "kv_LLC", "kv_DRAM",
              "attention_compute", "small_ops", "handoffs", "barriers", "step_overhead", "overlap", "dram_contention", "feedback")


class _Acc:
    """Busy seconds and term seconds of one resource for one micro-batch; ``scale`` is the
    measured factor on its weight-side work (``Calibration.work_scale``)."""

    def __init__(self, scale: float = 1.0):
        self.busy = 0.0
        self.terms: dict[str, float] = {}
        self.scale = scale

    def add(self, term: str, s: float) -> None:
        self.terms[term] = self.terms.get(term, 0.0) + s


def _tensor_weights(w: Workload, t: str) -> int:
    """Weights (rows x cols) of one layer tensor or the LM head."""
    c = w.config
    q, kv = c.n_head * c.head_dim, c.n_kv_head * c.head_dim
    return {"wq": q * c.d_model, "wk": kv * c.d_model, "wv": kv * c.d_model, "wo": c.d_model * q,
            "w_gate": c.d_ff * c.d_model, "w_up": c.d_ff * c.d_model, "w_down": c.d_model * c.d_ff,
            "lm_head": c.vocab_size * c.d_model}[t]


def _op_tensors(w: Workload, layer: int, op: str) -> list[tuple[str, int, int]]:
    """[(weight type, bytes, weights)] of the tensors a matmul operator reads."""
    names = ("lm_head",) if op == "lm_head" else MATMUL_TENSORS[op]
    out = []
    for t in names:
        nbytes = w.lm_head_bytes if t == "lm_head" else getattr(w.layers[layer], t)
        out.append((w.qtypes.get(t, ""), nbytes, _tensor_weights(w, t)))
    return out


def _matmul(acc: _Acc, w: Workload, cal: Calibration, rates: Rates, cores, layer, op, level, tile, b) -> float:
    rows = w.op_rows(op)
    tasks = math.ceil(rows / tile)
    t = len(cores)
    t_eff = min(t, tasks)
    # the kernel decodes each weight block once per 4 activation rows and once for the
    # remaining 1 to 3 (vnni_matmul: 4-, 3-, 2- and 1-row tiles)
    unpacks = -(-b // 4)
    read = compute = 0.0
    for qtype, nbytes, n_weights in _op_tensors(w, layer, op):
        # from DRAM: the kernel's measured streaming rate, with the 4-row tile's when b >= 3
        # (the 3-row tile prefetches as the 4-row one does)
        gbs = cal.matmul_gbs(qtype if b < 3 else f"{qtype}@4", t_eff) if level == "DRAM" else None
        if gbs is None:  # not measured: the machine's curve at this level
            gbs = rates.read_gbs(level, cores) * cal.matmul_read_efficiency * t_eff / t
        read += nbytes / (gbs * 1e9)
        unpack, macs = cal.unpack_macs(qtype)
        compute += n_weights * unpacks / (t_eff * unpack) + n_weights * b / (t_eff * macs)
    f = acc.scale
    read = f * read
    over = f * tasks * cal.task_ns * 1e-9 / t_eff
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
    dt = acc.scale * n * cal.small_op_ns * 1e-9
    acc.add("small_ops", dt)
    acc.busy += dt


def _attention(acc: _Acc, w: Workload, cal: Calibration, rates: Rates, dom, b) -> float:
    kv = w.kv_bytes_per_step_layer * b / w.concurrency
    f_res = dom.kv_resident_fraction
    read_llc = kv * f_res / (rates.read_gbs("LLC", dom.cores) * 1e9)
    c = w.config
    shape = f"{c.n_head}/{c.n_kv_head}x{c.head_dim}"
    stream_gbs = cal.attention_gbs(shape, len(dom.cores), b)  # measured in the step: compute included
    read_dram = kv * (1 - f_res) / ((stream_gbs or rates.read_gbs("DRAM", dom.cores)) * 1e9)
    compute = w.attention_flops_layer * b / w.concurrency / (len(dom.cores) * cal.attention_flops_rate(shape))
    if stream_gbs:  # no slower than the measured stream rate, whose own compute it includes
        compute = min(compute, kv / (stream_gbs * 1e9))
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
    accs = {d.name: _Acc(1.0 if d.role == "attention" else cal.work_scale(w.name, len(d.cores), b))
            for d in plan.domains}
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
        inner = acc.scale * n_inner * inner_one
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
    pred = _model(plan, m, w, cal, rates, sync)
    # the attention part: what the step costs beyond the same step at one token of context
    weight_s = _model(plan, m, w.with_(ctx=1), cal, rates, sync).tpot_s if w.ctx > 1 else pred.tpot_s
    pred.attention_s = max(0.0, pred.tpot_s - weight_s)
    a, b = cal.feedback(workload_key(w, plan.threads), plan.shape)
    fed = a * (pred.tpot_s - pred.attention_s) + b * pred.attention_s
    if (a, b) != (1.0, 1.0):  # what the TPOTs observed feed back
        pred.terms["feedback"] = fed - pred.tpot_s
        pred.tpot_s = fed
        pred.feedback = (a, b)
    return pred


def _model(plan, m: Machine, w: Workload, cal: Calibration, rates: Rates, sync: str) -> Prediction:
    """The model's TPOT of ``plan`` before feedback (``model_s`` = ``tpot_s``)."""
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
    floor = _dram_bytes(plan, mb, w) / (rates.dram_total * 1e9)
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
    return Prediction(tpot_s=tpot, terms=terms, micro_batches=mb, bound=bound, sync=sync, busy=busy,
                      model_s=tpot, work_scale={name: a.scale for name, a in accs.items() if a.scale != 1.0})


def forward_seconds(plan, m: Machine, w: Workload, rows: int, cal: Calibration | None = None,
                    rates: Rates | None = None, sync: str = "barrier") -> float:
    """Seconds of one forward of ``rows`` rows spread over the workload's sequences (each
    row reading its sequence's KV) in one pass through ``plan``'s domains, host overhead
    included: the shape of a speculative verification or a short prefill chunk."""
    cal = cal or Calibration()
    latency, _, _ = _pass(plan, m, w, cal, rates or Rates(m), rows, sync)
    return latency + (cal.step_overhead_ns + w.concurrency * cal.step_overhead_seq_ns) * 1e-9


def _sum_terms(dicts) -> dict[str, float]:
    out: dict[str, float] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _dram_bytes(plan, mb: int, w: Workload | None = None) -> float:
    """Bytes one step reads from DRAM: streamed weights once per micro-batch, streamed KV
    once (with ``w``: the streamed share of ``w``'s KV, not of the planned workload's)."""
    kv_planned = plan.kv.get("bytes_per_step", 0)
    kv_scale = w.kv_bytes_per_step / kv_planned if w is not None and kv_planned else 1.0
    total = 0.0
    for d in plan.domains:
        for group, nbytes in d.streamed:
            total += nbytes * kv_scale if group == "kv" else mb * nbytes
    return total
