"""The per-level read rates the cost model takes from a machine's bandwidth curve
(hw/bandwidth.py measures, caches and estimates the curves).

The reported LLC size is not the effective one (MACHINE.md: 480 MiB reported, about
100 MiB behaves as cache, the rest is taken by other tenants), so ``effective_llc_bytes``
finds where the curve falls to DRAM level, and ``Rates`` classifies the points of each
thread count into L2 / LLC / DRAM to get per-level bandwidth for any set of cores.
"""

from __future__ import annotations

import math

from ..hw.bandwidth import Curve, synthetic_curve
from ..hw.machine import Machine


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


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
