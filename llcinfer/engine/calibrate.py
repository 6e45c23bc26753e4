"""First-use calibration: the rates of this machine's kernels, measured once per machine and
kernel version and cached (planner/calibration.py), so the planner never plans from
another host's numbers.

``ensure_calibration(model, machine, threads)`` measures what the cached calibration lacks
for this model, printing one progress line per item, and saves it unless other processes
took more than OTHER_LOAD_MAX of the machine's CPU time meanwhile (hw/cpu_load.py: a
calibration measured beside another job would mislead every later start):

  bandwidth    the read-bandwidth curve with every core count a domain can get (hw/probe.py)
  attention    decode attention over an f16 paged KV of this model's head shape: flops per
               core with the KV in cache (the kernel alone, one core)
  matmul <q>   for each weight type of this model: unpack / MAC rates per core (a slice in L2,
               1 and 4 activation rows) and GB/s streaming every matrix of that type from DRAM
               with one and with four activation rows, per core count
  step         the executor's host-side cost per step outside its workers (1 and 4 sequences)
  decode step  the executor's own decode step of this model on a shared domain of one core
               and of all, with 1 and 4 sequences: at 16 tokens of context (the model's
               prediction of it over the measured time is the work factor of its weight side)
               and at a context whose KV is several times the LLC and half the weights (the
               difference is the streamed attention rate, with whatever it costs the rest
               of the step)
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from ..executor import DecodeExecutor, Domains
from ..hw.bandwidth import probe_curve, save_curve
from ..hw.cpu_load import OtherLoad
from ..hw.machine import Machine
from ..kernels import set_threads
from ..kernels.act_quant import quantize_activations_int
from ..kernels.paged_attention import paged_attention
from ..kernels.simd import make_tag
from ..kernels.tables import F16_TO_F32
from ..kernels.vnni_matmul import vnni_matmul_table
from ..kv import PagedSequence, new_pool
from ..planner.bandwidth import Rates, effective_llc_bytes
from ..planner.calibration import Calibration, cache_key
from ..planner.candidates import budget_cores, sensible_k
from ..planner.cost import predict
from ..planner.plan import Domain, build
from ..planner.workload import workload_from_model
from .placement import domains_from_plan
from .plan_check import measure_alternating

STREAM_MIN_BYTES = 3  # a streamed working set is at least this many times the LLC
STEP_TOKENS, STEP_REPS = 8, 5  # decode steps timed per repetition, repetitions (median)
STREAM_MIN_CTX = 4096  # shorter rows read their KV less efficiently (more, smaller splits)
OTHER_LOAD_MAX = 0.2  # a calibration during which other processes took more of the CPU time is not cached


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def core_counts(m: Machine, threads: int) -> list[int]:
    """Core counts a plan on ``threads`` cores can give a domain (weights or attention):
    1, the attention counts ``sensible_k`` tries, what they leave, and all."""
    ks = sensible_k(threads)
    return sorted({1, threads} | set(ks) | {threads - k for k in ks})


def attention_shape(config) -> str:
    """Key of the attention rates: query heads / KV heads x head dim."""
    return f"{config.n_head}/{config.n_kv_head}x{config.head_dim}"


def stream_llc_bytes(m: Machine) -> int:
    """The LLC bytes a streamed working set must exceed: the effective LLC of ``m``'s
    bandwidth curve (where its reads fall to near DRAM level), bounded by the reported
    size.  A guest can be told of far more LLC than it gets (480 MiB reported, about 100
    MiB behaving as cache), and sets sized from the report (1.4 GB there) only make the
    calibration slower."""
    reported = m.llc_total_bytes()
    return effective_llc_bytes(m.bandwidth, cap_bytes=reported) if m.bandwidth else reported


def ensure_calibration(model, m: Machine, threads: int, log=_log) -> Calibration:
    """The cached calibration for ``m``, with whatever ``model`` needs that it lacks measured
    now (a few seconds, once) and saved (``save_if_quiet``)."""
    key = cache_key(m)
    cal = Calibration.load(key)
    counts = core_counts(m, threads)
    cores = budget_cores(m, threads)
    todo = []
    if m.bandwidth_source == "estimated" or not {int(t) for _, t, _ in m.bandwidth} >= set(counts):
        todo.append(("bandwidth", lambda: _bandwidth(m, counts)))
    shape = attention_shape(model.config)
    if shape not in cal.attention_flops:
        todo.append((f"attention {shape}", lambda: _attention(cal, model.config)))
    lins = _matrices(model)
    for qt in sorted(q for q in {lin.qtype.name for lin in lins} if f"{q}@4" not in cal.matmul_stream_gbs):
        todo.append((f"matmul {qt}", lambda qt=qt: _matmul(cal, [x for x in lins if x.qtype.name == qt], counts,
                                                           stream_llc_bytes(m))))
    if "step" not in cal.measured:
        todo.append(("step", lambda: _step_overhead(cal, model, cores)))
    name = workload_from_model(model, ctx=16).name
    if name not in cal.work_factor or f"{shape}@4" not in cal.attention_stream_gbs:
        todo.append((f"decode step {name}", lambda: _decode_step(cal, model, m, cores, stream_llc_bytes(m))))
    if not todo:
        return cal
    log(f"calibrating this machine's kernels (once per machine and kernel version; "
        f"{Calibration.path(key)})")
    total = time.perf_counter()
    with OtherLoad() as load:
        for name, fn in todo:
            t0 = time.perf_counter()
            note = fn()
            dt = time.perf_counter() - t0
            cal.note_measured(name, dt)
            log(f"  {name}: {note} ({dt:.1f} s)")
    set_threads(threads)
    cal.note_measured("first-use total", time.perf_counter() - total)
    if save_if_quiet(cal, key, load, log) and any(name == "bandwidth" for name, _ in todo):
        save_curve(m, m.bandwidth)
    return cal


def save_if_quiet(cal: Calibration, key: str, load: OtherLoad, log) -> bool:
    """Cache ``cal`` unless other processes took more than OTHER_LOAD_MAX of the CPU time
    while it was measured (then this process plans from it, and the next start measures
    again); whether the machine was quiet."""
    if load.share is not None and load.share > OTHER_LOAD_MAX:
        log(f"  not saved: other processes took {100 * load.share:.0f} % of the CPU time while it measured; "
            "the next start measures again")
        return False
    try:
        cal.save(key)
    except OSError as exc:
        log(f"  not saved: {exc}")
    return True


def _bandwidth(m: Machine, counts: list[int]) -> str:
    threads = sorted(set(counts) | {int(t) for _, t, _ in m.bandwidth if m.bandwidth_source != "estimated"})
    m.bandwidth, m.bandwidth_source = probe_curve(m, threads=threads), "measured"  # saved with the rest
    dram = {t: g for w, t, g in m.bandwidth if w == max(p[0] for p in m.bandwidth)}
    return "DRAM " + ", ".join(f"{t} core{'s' if t > 1 else ''} {g:.0f} GB/s" for t, g in sorted(dram.items()))


def _best_time(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def _attention(cal: Calibration, config) -> str:
    """Flops/s per core of the attention kernel alone over one layer's KV at ctx 2048 (in
    cache), on one core."""
    H, KVH, D = config.n_head, config.n_kv_head, config.head_dim
    ctx = 2048
    pool, _ = new_pool(1, KVH, D, ctx + 1, 1, "f16", 16, 1 << 40, False)
    seq = PagedSequence(pool, ctx + 1)
    rng = np.random.default_rng(0)
    kv = rng.standard_normal((ctx, KVH, D)).astype(np.float32)  # [token, kv_head, D]
    seq.store(0, 0, kv, kv)
    seq.n_tokens = ctx
    q = rng.standard_normal((1, H, D)).astype(np.float32)  # [1, H, D]
    out = np.empty_like(q)  # [1, H, D]
    table = seq.table[:seq.n_blocks]
    scale = np.float32(D ** -0.5)

    def run():
        for _ in range(8):
            paged_attention(q, pool.data, pool.data_f32, F16_TO_F32, pool.kind, pool.group, pool.scale_offset,
                            table, 0, KVH, 16, ctx - 1, scale, out, threads=1)

    try:
        set_threads(1)
        flops = 4.0 * H * D * ctx / (_best_time(run, 5) / 8)
        cal.attention_flops[attention_shape(config)] = flops
    finally:
        seq.free()
    return f"{flops / 1e9:.1f} GFLOP/s per core in cache"


def _matrices(model) -> list:
    w = model.weights
    lins = [x for lw in w.layers for x in (lw.wq, lw.wk, lw.wv, lw.wo, lw.w_gate, lw.w_up, lw.w_down)] + [w.output]
    return [x for x in lins if x.simd]


def _tables(lins, M: int, rng, packs=None):
    """(mats [n, 5], acts [a, 4], the arrays they point into, y) for vnni_matmul_table over
    the packed weights of ``lins`` (or ``packs``, one array per lin)."""
    keep, acts, act_index = [], [], {}
    rows = []
    for i, lin in enumerate(lins):
        k = (lin.cols, lin.act_kind)
        if k not in act_index:
            q, d, s = quantize_activations_int(rng.standard_normal((M, lin.cols)).astype(np.float32), lin.act_kind)
            keep += [q, d, s]
            act_index[k] = len(acts)
            acts.append([q.ctypes.data, d.ctypes.data, s.ctypes.data, lin.cols])
        p = lin.prepare() if packs is None else packs[i]
        rows.append([p.ctypes.data, p.shape[0], p.strides[0], int(lin.qtype), act_index[k]])
        keep.append(p)
    ny = max(r[1] for r in rows) * 16  # at most 16 lanes per group
    y = np.empty((M, ny), np.float32)  # [M, lanes * groups] scratch
    return np.array(rows, np.int64), np.array(acts, np.int64), keep, y


def _matmul(cal: Calibration, lins, counts: list[int], llc: int) -> str:
    """Unpack / MAC rates per core from an L2-sized slice at 1 and 4 rows; streamed GB/s per
    core count over all matrices of the type (when they are fewer bytes than several times
    the LLC, over that many bytes of copies of them: a set that fits would be read from it)."""
    qt = lins[0].qtype.name
    tag = make_tag(lins[0].isa)
    rng = np.random.default_rng(0)
    nbytes = sum(x.prepare().nbytes for x in lins)
    reps = -(-STREAM_MIN_BYTES * llc // nbytes)
    packs = None if reps <= 1 else [np.array(x.prepare()) for _ in range(reps) for x in lins]  # distinct memory
    reps = max(1, reps)
    set_threads(1)
    # one matrix's first groups, about 512 KiB: stays in L2
    first = _tables(lins[:1], 1, rng)[0]
    first[0, 1] = max(1, min(int(first[0, 1]), (512 << 10) // int(first[0, 2])))
    w_small = int(first[0, 1]) * 16 * lins[0].cols
    t = {}
    for M in (1, 4):
        _, a_m, keep_m, y_m = _tables(lins[:1], M, rng)
        t[M] = _best_time(lambda: [vnni_matmul_table(first, a_m, M, y_m, tag, 1) for _ in range(50)], 5) / 50
    per_row = max(1e-12, (t[4] - t[1]) / 3)
    cal.matmul_compute[qt] = [w_small / max(1e-12, t[1] - per_row), w_small / per_row]
    for rows, key in ((1, qt), (4, f"{qt}@4")):  # the 4-row loops do not prefetch: their own rate
        mats, acts, keep, y = _tables(lins * reps, rows, rng, packs)
        gbs = {}
        for n in counts:
            set_threads(n)
            dt = _best_time(lambda n=n: vnni_matmul_table(mats, acts, rows, y, tag, 4 * n), 3)
            gbs[str(n)] = round(nbytes * reps / dt / 1e9, 2)
        cal.matmul_stream_gbs[key] = gbs
    gbs = cal.matmul_stream_gbs[qt]
    del keep
    return (f"{cal.matmul_compute[qt][1] / 1e9:.0f} GMAC/s per core per row; streamed "
            + ", ".join(f"{n} core{'s' if int(n) > 1 else ''} {g:.1f} GB/s" for n, g in gbs.items()))


def _step_overhead(cal: Calibration, model, cores: list[int]) -> str:
    """(fixed, per sequence) ns of an executor step outside its workers, at ctx 16."""
    ex = DecodeExecutor(model, Domains(weight=tuple(cores)))
    run = ex.workers.run_step
    inside = []

    def timed(args, counters):
        t0 = time.perf_counter()
        r = run(args, counters)
        inside.append(time.perf_counter() - t0)
        return r

    ex.workers.run_step = timed
    out = {}
    try:
        for n in (1, 4):
            pool, _ = model.new_pool(64, n, prefix_sharing=False)
            seqs = [PagedSequence(pool, 64, None, f"s{i}") for i in range(n)]
            for s in seqs:
                s.n_tokens = 16
            total = []
            inside.clear()
            for _ in range(12):
                t0 = time.perf_counter()
                ex.step(seqs, [5] * n)
                total.append(time.perf_counter() - t0)
                for s in seqs:
                    s.truncate(16)
            out[n] = statistics.median(np.array(total[2:]) - np.array(inside[2:])) * 1e9
            for s in seqs:
                s.free()
    finally:
        ex.close()
    cal.step_overhead_seq_ns = max(0.0, (out[4] - out[1]) / 3)
    cal.step_overhead_ns = max(0.0, out[1] - cal.step_overhead_seq_ns)
    return f"{cal.step_overhead_ns / 1e3:.0f} us + {cal.step_overhead_seq_ns / 1e3:.0f} us per sequence"


def _decode_step(cal: Calibration, model, m: Machine, cores: list[int], llc: int) -> str:
    """The executor's decode step on a shared domain of 1 and of all ``cores``, with 1 and 4
    sequences, at 16 tokens of context and at a long one: the work factors of this model
    (measured / predicted at 16 tokens) and the streamed attention rates of its head shape
    (KV bytes of the difference / the median over repetitions of the long step less the
    short one), all set-ups timed in one alternation."""
    config = model.config
    w16 = workload_from_model(model, ctx=16)
    everything = list(range(config.n_layer))
    tok_bytes = w16.kv_bytes_per_token_layer * config.n_layer  # K and V of one token, all layers
    stream_bytes = max(STREAM_MIN_BYTES * llc, w16.layer_weight_bytes // 2)
    rates = Rates(m)
    shape = attention_shape(config)
    cal.work_factor.pop(w16.name, None)
    factors, gbs = {}, {1: {}, 4: {}}
    setups = []  # (cores, rows, plan, workload, long ctx): every one timed in one alternation
    for n in sorted({1, len(cores)}):
        for rows in (1, 4):
            w = w16.with_(concurrency=rows)
            plan = build(m, w, [Domain("shared", "shared", cores[:n], layers=everything)], "shared",
                         f"shared: {n} cores", rates, cal)
            ctx = max(STREAM_MIN_CTX, -(-stream_bytes // (tok_bytes * rows * 16)) * 16)
            setups.append((n, rows, plan, w, ctx))
    # the short and long steps of all set-ups in turn, so that a noisy host's slow seconds
    # fall on all of them alike, and each long step less the short one of its repetition
    timed = measure_alternating(model, [(domains_from_plan(plan, config), c, rows) for _, rows, plan, _, ctx in setups
                                        for c in (16, ctx)], n_tokens=STEP_TOKENS, reps=STEP_REPS)
    for i, (n, rows, plan, w, ctx) in enumerate(setups):
        short_reps, long_reps = timed[2 * i]["steps_s"], timed[2 * i + 1]["steps_s"]
        short = timed[2 * i]["tpot_s"]
        extra = statistics.median(b - a for a, b in zip(short_reps, long_reps))  # paired: same moments
        gbs[rows][str(n)] = round(rows * (ctx - 16) * tok_bytes / max(extra, 1e-6) / 1e9, 2)
        key = f"{n}x{rows}"
        base = predict(plan, m, w, cal, rates).model_s
        cal.work_factor[w16.name] = {key: 2.0}  # the prediction is linear in the factor
        rest = predict(plan, m, w, cal, rates).model_s - base
        cal.work_factor.pop(w16.name)
        factors[key] = round(min(4.0, max(0.25, (short - base + rest) / rest)), 3) if rest > 0 else 1.0
    cal.work_factor[w16.name] = factors
    cal.attention_stream_gbs[shape] = gbs[1]
    cal.attention_stream_gbs[f"{shape}@4"] = gbs[4]
    return ("work factor " + ", ".join(f"{k} {v:.2f}" for k, v in factors.items()) + "; streamed attention "
            + ", ".join(f"{n} core{'s' if int(n) > 1 else ''} {g:.1f}/{gbs[4][n]:.1f} GB/s (1/4 rows)"
                        for n, g in gbs[1].items()))
