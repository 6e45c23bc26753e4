"""Reading this machine's topology from sysfs and py-cpuinfo (for ``detect_machine``).

Every reader returns None or an empty result when a file is missing or malformed: detection
never raises on a partial ``/sys``.
"""

from __future__ import annotations

from pathlib import Path

from .machine import CacheLevel, parse_cpulist, parse_size

SYS_CPU = Path("/sys/devices/system/cpu")
SYS_NODE = Path("/sys/devices/system/node")


def read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def detect_caches(cpus: list[int], sys_cpu: Path) -> list[CacheLevel]:
    """Data/unified cache levels from cpu*/cache/index*; instances restricted to ``cpus``."""
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
        levels.append(CacheLevel(lvl, max(inst.values()), [list(m) for m in sorted(inst)]))
    return levels


def cpuinfo_dict() -> dict:
    try:
        import cpuinfo  # py-cpuinfo

        return cpuinfo.get_cpu_info()
    except Exception:  # noqa: BLE001 - best effort
        return {}


def fallback_caches(cpus: list[int], info: dict) -> list[CacheLevel]:
    """One shared last-level cache from py-cpuinfo (or 32 MiB when it says nothing)."""
    size = info.get("l3_cache_size") or info.get("l2_cache_size") or (32 << 20)
    try:
        size = parse_size(size)
    except ValueError:
        size = 32 << 20
    return [CacheLevel(3, size, [list(cpus)])]
