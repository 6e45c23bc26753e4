"""Facts about this machine: the CPU (cpu.py, the one /proc/cpuinfo reader), its cores,
caches and NUMA nodes (machine.py from sysfs.py), and its read bandwidth by working-set
size (bandwidth.py, measured by probe.py and cached per machine).

    m = detect_machine()          # topology + the cached (or estimated) bandwidth curve
"""

from __future__ import annotations

import os

from .bandwidth import Curve, machine_curve, probe_curve, synthetic_curve
from .cpu import cpu_flags, cpu_info
from .machine import CacheLevel, Machine, detect_topology

__all__ = ["CacheLevel", "Curve", "Machine", "cpu_flags", "cpu_info", "detect_machine", "detect_topology",
           "machine_curve", "probe_curve", "synthetic_curve"]


def detect_machine(bandwidth=None, probe: bool = False, sys_root: str | os.PathLike | None = None) -> Machine:
    """This machine (``detect_topology``) with its read-bandwidth curve.

    ``bandwidth``: a curve to use as is (tests inject one).  Otherwise the curve cached for
    this machine under ``$LLCINFER_HOME/machine/`` is used; failing that, ``probe=True``
    measures it (a few seconds, then cached) and ``probe=False`` estimates it from the
    cache sizes (``bandwidth_source='estimated'``).
    """
    m = detect_topology(sys_root)
    m.bandwidth, m.bandwidth_source = machine_curve(m, bandwidth, probe)
    return m
