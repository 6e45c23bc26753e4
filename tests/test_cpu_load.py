"""hw/cpu_load.py: the share of the machine's CPU time other processes take, read from the
kernel's counters around a block."""

import os
import subprocess
import sys
import time

import pytest

from llcinfer.hw.cpu_load import OtherLoad

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux /proc")


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_busy_processes_are_seen_and_this_process_is_not():
    n = len(os.sched_getaffinity(0))
    with OtherLoad() as idle:
        time.sleep(0.5)
    assert idle.share is not None
    if idle.share > 0.3:
        pytest.skip(f"other processes already take {100 * idle.share:.0f} % of this machine's CPU time")
    with OtherLoad() as own:
        spin(1.0)  # this process keeps one core busy
    assert own.share < idle.share + 0.15  # its own time is not counted
    busy = [subprocess.Popen([sys.executable, "-c", "import time\nt = time.time() + 3\nwhile time.time() < t: pass"])
            for _ in range(n)]
    try:
        time.sleep(0.3)  # the children are running
        with OtherLoad() as other:
            time.sleep(1.0)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert other.share > 0.6  # every core was busy with another process


def test_unknown_without_counters(monkeypatch):
    from llcinfer.hw import cpu_load

    def unreadable():
        raise OSError("no /proc")

    monkeypatch.setattr(cpu_load, "_machine_ticks", unreadable)
    with OtherLoad() as load:
        pass
    assert load.share is None
