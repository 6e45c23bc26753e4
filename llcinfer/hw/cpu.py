"""The CPU's name, feature flags and cache sizes: the one reader of /proc/cpuinfo."""

from __future__ import annotations

import os
import platform
from functools import lru_cache
from pathlib import Path

_CACHE_ROOT = Path("/sys/devices/system/cpu/cpu0/cache")
INTERESTING_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                     "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")
# llvmlite's host-feature names where they differ from /proc/cpuinfo's
_LLVM_NAMES = {"avx512vnni": "avx512_vnni", "avxvnni": "avx_vnni", "amx-tile": "amx_tile", "amx-int8": "amx_int8"}


@lru_cache(maxsize=1)
def _proc_cpuinfo() -> tuple[str, frozenset]:
    """(model name, flags) of the first CPU in /proc/cpuinfo (empty when unreadable)."""
    model, flags = "", frozenset()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = val.strip()
                elif key == "flags" and not flags:
                    flags = frozenset(val.split())
                if model and flags:
                    break
    except OSError:  # pragma: no cover - non-Linux
        pass
    return model, flags


@lru_cache(maxsize=1)
def cpu_signature() -> str:
    """'family F model M' of the first CPU in /proc/cpuinfo ('' when unreadable): CPUs of
    one name string can differ (steppings, cloud SKUs), so machine keys include it."""
    got: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key in ("cpu family", "model") and key not in got:
                    got[key] = val.strip()
                if len(got) == 2 or not line.strip():
                    break
    except OSError:  # pragma: no cover - non-Linux
        pass
    return f"family {got['cpu family']} model {got['model']}" if len(got) == 2 else ""


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo names; llvmlite's host features as a fallback)."""
    flags = _proc_cpuinfo()[1]
    if flags:
        return set(flags)
    try:  # pragma: no cover - non-Linux
        from llvmlite import binding as llvm

        return {_LLVM_NAMES.get(k, k) for k, v in llvm.get_host_cpu_features().items() if v}
    except Exception:  # pragma: no cover  # noqa: BLE001
        return set()


def cpu_info() -> tuple[str, list[str]]:
    """(model name, sorted flag list); py-cpuinfo when /proc/cpuinfo says nothing."""
    model, flags = _proc_cpuinfo()
    flags = sorted(flags)
    if not model or not flags:
        try:
            import cpuinfo  # py-cpuinfo (slow: it may spawn a subprocess)

            info = cpuinfo.get_cpu_info()
            model = model or info.get("brand_raw", "")
            flags = flags or sorted(info.get("flags", []))
        except Exception:  # noqa: BLE001 - best effort only
            pass
    return model or platform.processor() or "unknown", flags


def cache_sizes(root: Path = _CACHE_ROOT) -> dict[str, str]:
    """{"L1d": "32K", "L1i": ..., "L2": "1024K", "L3": "32768K"} from sysfs (empty if unreadable)."""
    out: dict[str, str] = {}
    for idx in sorted(root.glob("index*")):
        try:
            level = (idx / "level").read_text().strip()
            kind = (idx / "type").read_text().strip()
            size = (idx / "size").read_text().strip()
        except OSError:
            continue
        suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
        out[f"L{level}{suffix}"] = size
    return out


def machine_info(threads: list[int]) -> dict:
    """What a benchmark ran on: CPU model, flags, cache sizes, threads, platform."""
    model, flags = cpu_info()
    return {
        "cpu_model": model,
        "flags": flags,
        "key_flags": [f for f in INTERESTING_FLAGS if f in flags],
        "caches": cache_sizes(),
        "logical_cpus": os.cpu_count(),
        "threads": list(threads),
        "platform": platform.platform(),
    }
