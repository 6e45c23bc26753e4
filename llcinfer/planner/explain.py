"""``Plan.explain()``: the machine, the chosen plan (cores, resident tensors and bytes per
domain, tiles, KV location), the predicted TPOT and its terms, the TPOT observed for it
where it was measured, and the runner-ups with the terms they lose on."""

from __future__ import annotations

import re
from collections import defaultdict

from ..hw.sysfs import format_cpulist

MIB = 1 << 20


def _mib(n: float) -> str:
    return f"{n / MIB:.1f} MiB"


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if abs(s) < 0.01 else f"{s * 1e3:.1f} ms"


def describe_groups(names: list[str]) -> str:
    """['blk.0.attn', 'blk.0.ffn', 'blk.1.attn', 'output'] -> 'blk.0 (attn+ffn), blk.1 (attn), output'
    with layer ranges merged: 'blk.0-29, output'."""
    halves: dict[int, set[str]] = defaultdict(set)
    rest = []
    for n in names:
        m = re.fullmatch(r"blk\.(\d+)\.(attn|ffn)", n)
        if m:
            halves[int(m.group(1))].add(m.group(2))
        else:
            rest.append(n)
    parts = []
    full = [i for i, h in halves.items() if h == {"attn", "ffn"}]
    if full:
        parts.append(f"blk.{format_cpulist(full)}")
    for half in ("attn", "ffn"):
        only = [i for i, h in halves.items() if h == {half}]
        if only:
            parts.append(f"blk.{format_cpulist(only)}.{half}")
    return ", ".join(parts + rest)


def describe_ops(ops: list[str]) -> str:
    """Operator names grouped: 'embed, attn_norm qkv wo ... x 30 layers, lm_head'."""
    per_layer: dict[str, set[int]] = defaultdict(set)
    order, glob = [], []
    for op in ops:
        m = re.fullmatch(r"blk\.(\d+)\.(\w+)", op)
        if m:
            if m.group(2) not in per_layer:
                order.append(m.group(2))
            per_layer[m.group(2)].add(int(m.group(1)))
        else:
            glob.append(op)
    layers = sorted(set().union(*per_layer.values())) if per_layer else []
    mid = f"{' '.join(order)} x layers {format_cpulist(layers)}" if order else ""
    head = [g for g in glob if g == "embed"]
    tail = [g for g in glob if g != "embed"]
    return ", ".join(head + ([mid] if mid else []) + tail)


def _domain_lines(d) -> list[str]:
    out = [f"  {d.name}: cores {format_cpulist(d.cores)} ({len(d.cores)}), cache share {_mib(d.cache_share_bytes)}, "
           f"resident {_mib(d.resident_bytes)}"]
    for lvl in ("L2", "LLC"):
        names = [n for n, _ in d.resident if d.resident_level.get(n) == lvl]
        if names:
            nb = sum(b for n, b in d.resident if d.resident_level.get(n) == lvl)
            out.append(f"    resident in {lvl}: {describe_groups(names)} ({_mib(nb)})")
    if d.streamed:
        out.append(f"    streamed from DRAM: {describe_groups([n for n, _ in d.streamed])} "
                   f"({_mib(sum(b for _, b in d.streamed))})")
    out.append(f"    ops: {describe_ops(d.ops)}")
    if d.tiles:
        out.append("    rows per task: " + ", ".join(f"{k} {v}" for k, v in d.tiles.items()))
    return out


def _terms(p) -> str:
    return ", ".join(f"{k} {_ms(v)}" for k, v in p.terms.items() if abs(v) >= 5e-7)


def _why(best, other) -> str:
    """The work terms that grow most from the chosen plan to ``other`` (and its bound)."""
    bp, op = best.prediction, other.prediction
    diffs = {k: op.terms.get(k, 0.0) - bp.terms.get(k, 0.0) for k in set(op.terms) | set(bp.terms)
             if k != "overlap"}
    worst = [(k, v) for k, v in sorted(diffs.items(), key=lambda kv: -kv[1]) if v > 1e-7][:2]
    bound = f"bound by {op.bound}"
    if op.tpot_s <= bp.tpot_s * 1.005:
        return f"ties ({bound}); the simpler plan is kept"
    if not worst:
        return f"{bound}, with less overlap between its domains"
    return f"{bound}; more " + ", ".join(f"{k} (+{_ms(v)})" for k, v in worst)


def _observed(plan) -> str:
    o = plan.observed
    return (f"observed TPOT {_ms(o['measured_s'])} ({o['when']}; the model alone predicted "
            f"{_ms(o['predicted_s'])} then)")


def _calibrated(p) -> str:
    """What measurement on this machine changed in the prediction, beyond its rates."""
    said = [f"{name}'s weight-side work x{f:.2f} (this model's decode step measured here)"
            for name, f in p.work_scale.items()]
    if p.feedback != (1.0, 1.0):
        said.append(f"fed back from observed TPOTs: weight side x{p.feedback[0]:.2f}, attention "
                    f"x{p.feedback[1]:.2f}")
    return "calibrated: " + "; ".join(said)


def explain(plan) -> str:
    p = plan.prediction
    lines = [f"machine: {plan.machine}",
             f"  read bandwidth with the plan's {plan.threads} cores: "
             + ", ".join(f"{k} {v:.0f} GB/s" for k, v in plan.rates.items())
             + f"; effective LLC {_mib(plan.effective_llc_bytes)} per instance",
             f"workload: {plan.workload}",
             f"plan: {plan.label}"]
    if p is not None:
        c = plan.concurrency
        lines.append(f"  predicted TPOT {_ms(p.tpot_s)} ({1 / p.tpot_s:.0f} tok/s per sequence, "
                     f"{c / p.tpot_s:.0f} tok/s in all); {p.micro_batches} micro-batch"
                     f"{'es' if p.micro_batches > 1 else ''}, bound by {p.bound}, sync by {p.sync}")
        if plan.observed:
            lines.append(f"  {_observed(plan)}")
        lines.append(f"  terms: {_terms(p)}")
        if p.work_scale or p.feedback != (1.0, 1.0):
            lines.append(f"  {_calibrated(p)}")
        lines.append("  busy per step: " + ", ".join(f"{k} {_ms(v)}" for k, v in p.busy.items()))
    for d in plan.domains:
        lines += _domain_lines(d)
    kv = plan.kv
    lines.append(f"  KV: {_mib(kv['bytes_per_step'])} read per step, on NUMA node "
                 f"{','.join(map(str, kv['numa_nodes']))} in {', '.join(kv['domains'])}; "
                 f"{_mib(kv['resident_bytes'])} of it resident in cache")
    per_level = defaultdict(list)
    for pl in plan.placement:
        per_level[(pl.domain, pl.level)].append(pl)
    for (dom, lvl), pls in per_level.items():
        sizes = sorted({_mib(x.bytes) for x in pls})
        lines.append(f"  placement {dom}/{lvl}: {len(pls)} pool{'s' if len(pls) > 1 else ''} of "
                     f"{' / '.join(sizes)} ({pls[0].groups}{', row slices' if pls[0].groups != 'kv' else ''})")
    if plan.runners_up:
        lines.append("runners-up:")
        for r in plan.runners_up:
            rp = r.prediction
            pct = 100 * (rp.tpot_s / p.tpot_s - 1) if p else 0.0
            tag = " [what-if: the executor does not run layer groups]" if r.what_if else ""
            seen = f"; {_observed(r)}" if r.observed else ""
            lines.append(f"  {_ms(rp.tpot_s):>10} (+{pct:.0f}%)  {r.label}{tag}: {_why(plan, r)}{seen}")
    return "\n".join(lines)
