"""Candidate layouts for ``make_plan``: which cores form which domain, and which layers each
weight domain (pipeline stage) runs.

Families (a plan's runner-ups are the best of each other family):

- ``shared``: one domain on all cores (weights and attention take turns on every core);
- ``shared-stages``: layer groups, each on its own LLC instances or socket, each stage
  running weights and attention of its layers;
- ``split``: k attention cores (machines with one LLC: k from 1 up to three quarters);
- ``split-llc``: whole LLC instances (CCDs, dies) for attention, the rest for weights,
  optionally with the weights in layer groups (``split-llc-stages``);
- ``split-colocated``: 1 or 2 attention cores in every LLC instance.
"""

from __future__ import annotations

from ..errors import UsageError
from ..hw.machine import Machine
from .plan import Domain
from .workload import Workload


def budget_cores(m: Machine, threads: int | None) -> list[int]:
    """The CPUs a plan for ``threads`` threads uses: all physical cores by default; fewer are
    spread round-robin over LLC instances (more cache and bandwidth per thread); more take
    SMT siblings."""
    phys = m.physical_cores()
    if threads is None:
        return phys
    if threads < 1:
        raise UsageError(f"--threads must be at least 1, got {threads}")
    if threads > len(m.cpus):
        raise UsageError(f"--threads {threads}: the machine has {len(m.cpus)} logical CPUs available")
    if threads > len(phys):
        extra = [c for c in m.cpus if c not in phys]
        return sorted(phys + extra[: threads - len(phys)])
    groups = m.llc_groups(phys)
    order = [g[r] for r in range(max(len(g) for g in groups)) for g in groups if r < len(g)]
    return sorted(order[:threads])


def sensible_k(n: int) -> list[int]:
    """Attention core counts to try on n cores sharing one LLC: 1, 2, 3, 4, 6, 8, 12, ... up
    to 3n/4 (always 1 when n >= 2)."""
    ks, k = [], 1
    while k <= max(1, 3 * n // 4) and k < n:
        ks.append(k)
        k = k + 1 if k < 4 else int(k * 1.5)
    return ks


def split_layers(w: Workload, core_counts: list[int]) -> list[list[int]]:
    """Contiguous layer groups, one per stage, with weight bytes in proportion to the stage's
    cores (the LM head counts for the last stage); every stage gets at least one layer."""
    g_n = len(core_counts)
    total = w.layer_weight_bytes + w.lm_head_bytes
    bounds, acc, stage = [[] for _ in range(g_n)], 0.0, 0
    target = [total * sum(core_counts[: i + 1]) / sum(core_counts) for i in range(g_n)]
    for i in range(w.config.n_layer):
        left_layers, left_stages = w.config.n_layer - i, g_n - stage
        if stage < g_n - 1 and bounds[stage] and (acc + w.layers[i].total / 2 > target[stage]
                                                  or left_layers <= left_stages - 1):
            stage += 1
        bounds[stage].append(i)
        acc += w.layers[i].total
    return bounds


def _chunks(groups: list[list[int]], n: int) -> list[list[int]]:
    """Split LLC groups (in order) into n contiguous chunks of groups -> cores per chunk."""
    out, k = [], len(groups)
    for i in range(n):
        part = groups[i * k // n:(i + 1) * k // n]
        out.append(sorted(c for g in part for c in g))
    return out


def _stage_counts(m: Machine, groups: list[list[int]], n_layer: int) -> list[int]:
    """Layer-group counts worth trying over these LLC groups: 2, one per socket, one per LLC."""
    k = len(groups)
    sockets = len({m.package_of.get(g[0], 0) for g in groups})
    return sorted({g for g in (2, sockets, k) if 2 <= g <= min(k, n_layer)})


def _weights(m, w, groups, n_stages, role, prefix) -> list[Domain]:
    chunks = _chunks(groups, n_stages)
    layers = split_layers(w, [len(c) for c in chunks])
    if n_stages == 1:
        return [Domain(prefix, role, chunks[0], layers=layers[0])]
    return [Domain(f"stage{i}.{prefix}", role, c, stage=i, layers=ls)
            for i, (c, ls) in enumerate(zip(chunks, layers))]


def layouts(m: Machine, w: Workload, cores: list[int]) -> list[tuple[str, str, str, list[Domain]]]:
    """[(family, kind, label, domains)] for every candidate on ``cores``."""
    groups = m.llc_groups(cores)
    k = len(groups)
    n = len(cores)
    everything = list(range(w.config.n_layer))
    out = [("shared", "shared", f"shared: all {n} cores on {_llcs(k)}",
            [Domain("shared", "shared", list(cores), layers=everything)])]
    for g in _stage_counts(m, groups, w.config.n_layer):
        out.append(("shared-stages", "shared", f"shared, {g} layer groups on {_llcs(k)} ({n} cores)",
                    _weights(m, w, groups, g, "shared", "shared")))
    if n < 2:
        return out
    if k == 1:
        for a in sensible_k(n):
            out.append(("split", "split", f"split: weights {_cores(n - a)} + attention {_cores(a)}",
                        [Domain("weights", "weights", cores[: n - a], layers=everything),
                         Domain("attention", "attention", cores[n - a:], layers=everything)]))
        return out
    for j in range(1, k):
        wg, ag = groups[: k - j], groups[k - j:]
        a_cores = sorted(c for g in ag for c in g)
        w_n = n - len(a_cores)
        for g in [1] + _stage_counts(m, wg, w.config.n_layer):
            fam = "split-llc" if g == 1 else "split-llc-stages"
            stages = "" if g == 1 else f" in {g} layer groups"
            out.append((fam, "split", f"split: weights {w_n} cores on {_llcs(k - j)}{stages} + attention "
                        f"{len(a_cores)} cores on {_llcs(j)}",
                        _weights(m, w, wg, g, "weights", "weights")
                        + [Domain("attention", "attention", a_cores, layers=everything)]))
    for p in (1, 2):
        if all(len(g) > p for g in groups):
            a_cores = sorted(c for g in groups for c in g[-p:])
            w_cores = sorted(c for c in cores if c not in a_cores)
            out.append(("split-colocated", "split",
                        f"split: {p} attention core{'s' if p > 1 else ''} in each of {_llcs(k)}, "
                        f"weights on the other {len(w_cores)}",
                        [Domain("weights", "weights", w_cores, layers=everything),
                         Domain("attention", "attention", a_cores, layers=everything)]))
    return out


def _cores(k: int) -> str:
    return f"{k} core{'s' if k > 1 else ''}"


def _llcs(k: int) -> str:
    return f"{k} LLC{'s' if k > 1 else ''}"
