"""Reading this machine's topology from sysfs and py-cpuinfo (for ``detect_topology``), and
the CPU-list and size formats sysfs and the topology files write.

Every reader returns None or an empty result when a file is missing or malformed: detection
never raises on a partial ``/sys``.
"""

from __future__ import annotations

from pathlib import Path

import re

# ---------------------------------------------------------------------------------------
# CPU lists ("0-3,8,10-11") as sysfs writes them


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8' -> [0, 1, 2, 3, 8]; raises ValueError on anything else."""
    out: list[int] = []
    for part in str(text).strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if sep:
            a, b = int(lo), int(hi)
            if b < a:
                raise ValueError(f"bad cpu range {part!r}")
            out.extend(range(a, b + 1))
        else:
            out.append(int(lo))
    return sorted(set(out))


def format_cpulist(cpus) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8'."""
    cpus = sorted(set(int(c) for c in cpus))
    runs: list[str] = []
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        runs.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(runs)


def parse_size(text) -> int:
    """'32K' / '96M' / '1G' / 1048576 -> bytes (sysfs and topology-file sizes)."""
    if isinstance(text, (int, float)):
        return int(text)
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)(i?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"bad size {text!r}")
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * mult)


SYS_CPU = Path("/sys/devices/system/cpu")
SYS_NODE = Path("/sys/devices/system/node")


def read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def detect_caches(cpus: list[int], sys_cpu: Path) -> list[tuple[int, int, list[list[int]]]]:
    """Data/unified cache levels from cpu*/cache/index*, as (level, bytes per instance,
    instances), each instance the CPUs of ``cpus`` sharing it."""
    by_level: dict[int, dict[tuple[int, ...], int]] = {}
    for c in cpus:
        for idx in sorted((sys_cpu / f"cpu{c}" / "cache").glob("index*")):
            level, kind = read(idx / "level"), read(idx / "type")
            size, shared = read(idx / "size"), read(idx / "shared_cpu_list")
            if None in (level, kind, size, shared) or kind == "Instruction":
                continue
            try:
                members = tuple(x for x in parse_cpulist(shared) if x in cpus) or (c,)
                by_level.setdefault(int(level), {})[members] = parse_size(size)
            except ValueError:
                continue
    levels = []
    for lvl, inst in sorted(by_level.items()):
        levels.append((lvl, max(inst.values()), [list(m) for m in sorted(inst)]))
    return levels


def cpuinfo_dict() -> dict:
    try:
        import cpuinfo  # py-cpuinfo

        return cpuinfo.get_cpu_info()
    except Exception:  # noqa: BLE001 - best effort
        return {}


def fallback_caches(cpus: list[int], info: dict) -> list[tuple[int, int, list[list[int]]]]:
    """One shared last-level cache from py-cpuinfo (or 32 MiB when it says nothing)."""
    size = info.get("l3_cache_size") or info.get("l2_cache_size") or (32 << 20)
    try:
        size = parse_size(size)
    except ValueError:
        size = 32 << 20
    return [(3, size, [list(cpus)])]
