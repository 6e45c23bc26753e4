"""This machine's read bandwidth by working-set size: the probe, its per-machine cache, and
curves estimated from cache sizes where nothing was measured.

A curve is a list of ``(working_set_bytes, threads, read_GBps)`` points.  The probe
(``probe_curve``) reads log-spaced working sets from 256 KiB to several times the LLC with
1 thread, the cores of one LLC instance, and all cores; it takes a few seconds and is
cached as JSON in ``$LLCINFER_HOME/machine/bandwidth-<machine key>.json``.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from .. import paths
from .machine import Machine
from .probe import read_bandwidth_curve

Curve = list[tuple[int, int, float]]  # (working_set_bytes, threads, GB/s)

# Per-level figures for curves estimated without a probe (a generic current x86 server
# core; topology files give their own in "bandwidth_model").
DEFAULT_MODEL = {
    "l2_gbs_per_core": 80.0, "llc_gbs_per_core": 30.0, "llc_gbs_per_instance": 200.0,
    "dram_gbs_per_core": 12.0, "dram_gbs_per_instance": 60.0, "dram_gbs": 60.0,
    "llc_effective_fraction": 0.8,
}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------------------
# Probe and cache


def probe_sizes(m: Machine, n_points: int = 8) -> list[int]:
    """Log-spaced working sets from 256 KiB to 4x the LLC (256 MiB .. 1 GiB)."""
    top = min(1 << 30, max(256 << 20, 4 * m.llc_total_bytes()))
    lo = 256 << 10
    return [int(lo * (top / lo) ** (i / (n_points - 1))) for i in range(n_points)]


def probe_threads(m: Machine) -> list[int]:
    """1 thread, the cores of one LLC instance, and all cores (deduplicated)."""
    n = len(m.physical_cores())
    return sorted({1, min(n, m.cores_per_llc()), n})


def probe_curve(m: Machine, sizes=None, threads=None) -> Curve:
    """Measure the curve (a few seconds).  GB/s are rounded to 0.1."""
    pts = read_bandwidth_curve(sizes or probe_sizes(m), threads or probe_threads(m))
    return [(w, t, round(b / 1e9, 1)) for w, t, b in pts]


def curve_path(m: Machine) -> Path:
    return paths.machine_dir() / f"bandwidth-{m.key()}.json"


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
