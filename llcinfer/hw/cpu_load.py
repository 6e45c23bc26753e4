"""CPU time that other processes take while this one measures itself.

A calibration is cached and planned from until the kernels change, so one measured while
another process ran misleads every later start on the machine.  ``OtherLoad`` reads the
kernel's CPU-time counters (/proc/stat for the machine, /proc/self/stat for this
process, threads included) around a measurement and gives the share of the machine's CPU
time spent on anything but this process, time stolen by the hypervisor included.
Without /proc (not Linux) the share is None: nothing can be told.
"""

from __future__ import annotations

_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # of /proc/stat's "cpu" line: user nice system irq softirq steal
_ALL_FIELDS = 8  # ... with idle and iowait (guest time is already counted in user)


def _machine_ticks() -> tuple[int, int]:
    """(busy, all) clock ticks of every CPU since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return sum(fields[i] for i in _BUSY_FIELDS), sum(fields[:_ALL_FIELDS])


def _own_ticks() -> int:
    """User + system clock ticks of this process, every thread."""
    with open("/proc/self/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": the comm may hold spaces
    return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)


def _snapshot() -> tuple[int, int, int] | None:
    try:
        return (*_machine_ticks(), _own_ticks())
    except (OSError, ValueError, IndexError):
        return None


class OtherLoad:
    """``with OtherLoad() as load: ...`` then ``load.share``: the fraction (0 .. 1) of the
    machine's CPU time that went to other processes during the block (None: unknown, or a
    block too short to tell)."""

    def __init__(self):
        self.share: float | None = None
        self._start = None

    def __enter__(self) -> "OtherLoad":
        self._start = _snapshot()
        return self

    def __exit__(self, *exc) -> None:
        end = _snapshot()
        if self._start is None or end is None:
            return
        busy, total, own = (b - a for a, b in zip(self._start, end))
        if total > 0:
            self.share = min(1.0, max(0.0, (busy - own) / total))
