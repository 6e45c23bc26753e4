"""Pinning a whole process to a core set (a replica's share of the machine)."""

from __future__ import annotations

import os


def pin_process(cpus) -> list[int]:
    """Set the CPU affinity of every thread of this process to ``cpus`` (threads started
    later inherit it from their creator); returns the affinity now in force.  A thread that
    ends meanwhile is skipped; where the OS has no affinity calls, nothing changes."""
    want = set(int(c) for c in cpus)
    if not want:
        raise ValueError("pin_process(): empty CPU set")
    if not hasattr(os, "sched_setaffinity"):  # pragma: no cover - non-Linux
        return sorted(want)
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # pragma: no cover - no /proc: this thread only
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, want)
        except (ProcessLookupError, PermissionError):
            pass
    return sorted(os.sched_getaffinity(0))
