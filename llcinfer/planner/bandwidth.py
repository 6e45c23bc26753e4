"""Read bandwidth by working-set size: the probe, its per-machine cache, and the per-level
rates the cost model reads from it.

A curve is a list of ``(working_set_bytes, threads, read_GBps)`` points.  The probe
(``probe_curve``) reads log-spaced working sets from 256 KiB to several times the LLC with
1 thread, the cores of one LLC instance, and all cores; it takes a few seconds and is
cached as JSON in ``$LLCINFER_HOME/machine/bandwidth-<machine key>.json``.

The reported LLC size is not the effective one (MACHINE.md: 480 MiB reported, about
100 MiB behaves as cache, the rest is taken by other tenants), so ``effective_llc_bytes``
finds where the curve falls to DRAM level, and ``Rates`` classifies the points of each
thread count into L2 / LLC / DRAM to get per-level bandwidth for any set of cores.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from .machine import Machine

Curve = list[tuple[int, int, float]]  # (working_set_bytes, threads, GB/s)

# Per-level figures for curves estimated without a probe (a generic current x86 server
# core; topology files give their own in "bandwidth_model").
DEFAULT_MODEL = {
    "l2_gbs_per_core": 80.0, "llc_gbs_per_core": 30.0, "llc_gbs_per_instance": 200.0,
    "dram_gbs_per_core": 12.0, "dram_gbs_per_instance": 60.0, "dram_gbs": 60.0,
    "llc_effective_fraction": 0.8,
}


def machine_dir() -> Path:
    """``$LLCINFER_HOME/machine`` (default ``~/.cache/llcinfer/machine``)."""
    from ..catalog import llcinfer_home

    return llcinfer_home() / "machine"


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------------------
# Probe and cache


def probe_sizes(m: Machine, n_points: int = 8) -> list[int]:
    """Log-spaced working sets from 256 KiB to 4x the LLC (256 MiB .. 1 GiB)."""
    llc = m.llc
    total = llc.size_bytes * len(llc.instances) if llc else 32 << 20
    top = min(1 << 30, max(256 << 20, 4 * total))
    lo = 256 << 10
    return [int(lo * (top / lo) ** (i / (n_points - 1))) for i in range(n_points)]


def probe_threads(m: Machine) -> list[int]:
    """1 thread, the cores of one LLC instance, and all cores (deduplicated)."""
    n = len(m.physical_cores())
    return sorted({1, min(n, m.cores_per_llc()), n})


def probe_curve(m: Machine, sizes=None, threads=None) -> Curve:
    """Measure the curve (a few seconds).  GB/s are rounded to 0.1."""
    from ..bench.probe import read_bandwidth_curve

    pts = read_bandwidth_curve(sizes or probe_sizes(m), threads or probe_threads(m))
    return [(w, t, round(b / 1e9, 1)) for w, t, b in pts]


def curve_path(m: Machine) -> Path:
    return machine_dir() / f"bandwidth-{m.key()}.json"


def load_cached_curve(m: Machine) -> Curve | None:
    try:
        d = json.loads(curve_path(m).read_text())
        return [(int(w), int(t), float(g)) for w, t, g in d["points"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_curve(m: Machine, curve: Curve) -> Path:
    path = curve_path(m)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"key": m.key(), "cpu_model": m.cpu_model, "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "points": [list(p) for p in curve]}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)
    return path


def machine_curve(m: Machine, given=None, probe: bool = False) -> tuple[Curve, str]:
    """(curve, source) for ``detect_machine``: given > cached > probed > estimated."""
    if given is not None:
        return [(int(w), int(t), float(g)) for w, t, g in given], "given"
    cached = load_cached_curve(m)
    if cached:
        return cached, "cached"
    if probe:
        curve = probe_curve(m)
        try:
            save_curve(m, curve)
        except OSError:
            pass
        return curve, "measured"
    return synthetic_curve(m), "estimated"


# ---------------------------------------------------------------------------------------
# Synthetic curves (estimates for topology files and unprobed machines)


def synthetic_curve(m: Machine, model: dict | None = None, threads=None, sizes=None) -> Curve:
    """A curve from per-level figures (``DEFAULT_MODEL`` keys).  Threads are packed onto
    LLC instances; a working set is served from L2, then the effective LLC, then DRAM
    (``_blend``)."""
    p = dict(DEFAULT_MODEL, **(model or {}))
    cores = len(m.physical_cores())
    cpi = m.cores_per_llc()
    n_inst_all = len(m.llc_groups(m.physical_cores()))
    llc = m.llc
    l2 = m.private_level
    l2_core = (l2.size_bytes / max(1, len(l2.instances[0]))) if l2 else 0
    llc_inst = (llc.size_bytes if llc else 32 << 20) * p["llc_effective_fraction"]
    threads = threads or sorted({1, min(cpi, cores), cores})
    top = max(2 << 30, 16 * n_inst_all * llc_inst)
    sizes = sizes or [int((256 << 10) * 2 ** (i / 2)) for i in range(int(2 * math.log2(top / (256 << 10))) + 1)]
    out = []
    for t in threads:
        n = min(n_inst_all, _ceil_div(t, cpi))
        per = t / n
        bw2 = t * p["l2_gbs_per_core"]
        bw3 = n * min(per * p["llc_gbs_per_core"], p["llc_gbs_per_instance"])
        bwd = min(n * min(per * p["dram_gbs_per_core"], p["dram_gbs_per_instance"]), p["dram_gbs"])
        cap2, cap3 = 0.8 * t * l2_core, n * llc_inst
        out += [(int(ws), int(t), round(_blend(ws, [(cap2, bw2), (cap3 + cap2, bw3)], bwd), 1)) for ws in sizes]
    return out


def _blend(ws: float, levels: list[tuple[float, float]], floor_gbs: float) -> float:
    """GB/s reading a cyclic working set ``ws`` through caches [(capacity, GB/s)] in order:
    below a capacity every access hits; above it the hit share falls as (capacity / ws)^2
    (replacement keeps little of a set larger than the cache); the rest goes to DRAM."""
    sec, left = 0.0, 1.0  # seconds per byte, share of accesses not yet served
    for cap, gbs in levels:
        hit = left if ws <= cap else left * (cap / ws) ** 2
        sec += hit / gbs
        left -= hit
    return 1.0 / (sec + left / floor_gbs)


# ---------------------------------------------------------------------------------------
# Reading the curve


def _by_threads(curve: Curve) -> dict[int, list[tuple[int, float]]]:
    out: dict[int, list[tuple[int, float]]] = {}
    for w, t, g in curve:
        out.setdefault(int(t), []).append((int(w), float(g)))
    return {t: sorted(v) for t, v in out.items()}


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    k = len(xs)
    return xs[k // 2] if k % 2 else 0.5 * (xs[k // 2 - 1] + xs[k // 2])


def effective_llc_bytes(curve: Curve, threads: int | None = None, cap_bytes: int | None = None) -> int:
    """The working set at which read bandwidth falls to near DRAM level (1.5x the bandwidth
    of the two largest sets), log-interpolated between points; for ``threads`` (default:
    the largest thread count in the curve).  ``cap_bytes`` (the reported LLC) bounds it."""
    by_t = _by_threads(curve)
    if not by_t:
        return int(cap_bytes or 0)
    pts = by_t[threads if threads in by_t else max(by_t)]
    dram = _median([g for _, g in pts[-2:]])
    thr = 1.5 * dram
    eff = pts[-1][0]
    for i, (w, g) in enumerate(pts):
        if g < thr:
            if i == 0:
                eff = w
            else:
                (w0, g0) = pts[i - 1]
                frac = (g0 - thr) / (g0 - g) if g0 != g else 0.0
                eff = int(w0 * (w / w0) ** frac)
            break
    return int(min(eff, cap_bytes) if cap_bytes else eff)


class Rates:
    """Per-level read bandwidth of any set of cores, from a machine's curve.

    For each measured thread count T (threads packed onto LLC instances: n(T) instances,
    T/n(T) threads each) the points are classified: private cache (working set within half
    of T cores' L2), LLC (between 1.5x that and 0.6x the effective LLC of n(T) instances),
    DRAM (beyond 4x that).  The median of each class, divided by n(T), is one point of a
    per-instance rate function of threads-per-instance; a set of cores reads at the sum of
    its instances' rates (DRAM capped by the machine's DRAM rate for the NUMA nodes used).
    """

    LEVELS = ("L2", "LLC", "DRAM")

    def __init__(self, m: Machine):
        self.m = m
        self._memo: dict[tuple, float] = {}
        self.curve = list(m.bandwidth) or synthetic_curve(m)
        self.cpi = m.cores_per_llc()
        self.n_inst = len(m.llc_groups(m.physical_cores()))
        llc, l2 = m.llc, m.private_level
        by_t = _by_threads(self.curve)
        t_max = max(by_t)
        n_max = self._n(t_max)
        reported = (llc.size_bytes if llc else 32 << 20) * n_max
        #: effective bytes of one LLC instance
        self.llc_eff_instance = effective_llc_bytes(self.curve, t_max, reported) // n_max
        #: private (L2) bytes per core
        self.l2_core = int(l2.size_bytes / max(1, len(l2.instances[0]))) if l2 else 0
        pts: dict[str, dict[float, list[float]]] = {k: {} for k in self.LEVELS}
        #: (level, threads) -> GB/s of the whole thread set, as measured
        self.measured: dict[tuple[str, int], float] = {}
        for t, row in by_t.items():
            n = self._n(t)
            cap2, cap3 = t * self.l2_core, n * self.llc_eff_instance
            ranges = {"L2": (0, 0.5 * cap2), "LLC": (1.5 * cap2, 0.6 * cap3), "DRAM": (4.0 * cap3, math.inf)}
            for lvl, (lo, hi) in ranges.items():
                sel = [g for w, g in row if lo < w <= hi]
                if not sel:  # nearest point to the middle of the range
                    mid = math.sqrt(max(lo, 1.0) * (hi if hi != math.inf else 4 * lo + 1))
                    sel = [min(row, key=lambda p: abs(math.log(p[0] / mid)))[1]]
                self.measured[(lvl, t)] = _median(sel)
                pts[lvl].setdefault(t / n, []).append(_median(sel) / n)
        self._pts = {lvl: sorted((tau, _median(v)) for tau, v in d.items()) for lvl, d in pts.items()}
        #: GB/s the whole machine reads from DRAM (the all-threads DRAM rate)
        self.dram_total = self.measured[("DRAM", t_max)]

    def _n(self, t: int) -> int:
        return max(1, min(self.n_inst, _ceil_div(t, self.cpi)))

    def per_instance(self, level: str, tau: float) -> float:
        """GB/s of one instance with ``tau`` threads reading at ``level``: piecewise linear
        through (0, 0) and the measured points; beyond the last point L2 and LLC scale with
        threads, DRAM stays flat."""
        pts = [(0.0, 0.0)] + self._pts[level]
        if tau >= pts[-1][0]:
            t1, g1 = pts[-1]
            return g1 * (tau / t1 if level != "DRAM" else 1.0)
        for (t0, g0), (t1, g1) in zip(pts, pts[1:]):
            if tau <= t1:
                return g0 + (g1 - g0) * (tau - t0) / (t1 - t0)
        return pts[-1][1]  # pragma: no cover

    def read_gbs(self, level: str, cpus) -> float:
        """GB/s that ``cpus`` (one thread each) read at ``level`` together."""
        key = (level, tuple(cpus))
        if key not in self._memo:
            self._memo[key] = self._read_gbs(level, list(cpus))
        return self._memo[key]

    def _read_gbs(self, level: str, cpus: list[int]) -> float:
        if not cpus:
            return 0.0
        total = sum(self.per_instance(level, len(g)) for g in self.m.llc_groups(cpus))
        if level == "DRAM":
            nodes = {self.m.node_of(c) for c in cpus}
            total = min(total, self.dram_total * len(nodes) / max(1, len(self.m.numa)))
        return total
