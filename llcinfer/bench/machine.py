"""What a benchmark ran on: CPU model, flags, cache sizes, threads; software versions."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

_CACHE_ROOT = Path("/sys/devices/system/cpu/cpu0/cache")
_INTERESTING_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                      "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


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


def cpu_info() -> tuple[str, list[str]]:
    """(model name, sorted flag list); py-cpuinfo when present, else /proc/cpuinfo."""
    model, flags = "", []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, val = line.partition(":")
            if key.strip() == "model name" and not model:
                model = val.strip()
            elif key.strip() == "flags" and not flags:
                flags = sorted(val.split())
    except OSError:
        pass
    if not model or not flags:
        try:
            import cpuinfo  # py-cpuinfo (slow: it may spawn a subprocess)

            info = cpuinfo.get_cpu_info()
            model = model or info.get("brand_raw", "")
            flags = flags or sorted(info.get("flags", []))
        except Exception:  # noqa: BLE001 - best effort only
            pass
    return model or platform.processor() or "unknown", flags


def machine_info(threads: list[int]) -> dict:
    model, flags = cpu_info()
    return {
        "cpu_model": model,
        "flags": flags,
        "key_flags": [f for f in _INTERESTING_FLAGS if f in flags],
        "caches": cache_sizes(),
        "logical_cpus": os.cpu_count(),
        "threads": list(threads),
        "platform": platform.platform(),
    }


def llama_cpp_version(exe: str | os.PathLike | None) -> str | None:
    """``llama-bench --version`` first line (e.g. "version: 0.6.0-dev (build 0, commit unknown)")."""
    if exe is None:
        return None
    try:
        p = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in (p.stdout + p.stderr).splitlines():
        if line.startswith("version"):
            return line.split(":", 1)[1].strip()
    return None


def versions(llama_bench: str | os.PathLike | None) -> dict:
    import llvmlite
    import numba
    import numpy

    from .. import __version__

    return {"llcinfer": __version__, "numba": numba.__version__, "llvmlite": llvmlite.__version__,
            "numpy": numpy.__version__, "python": platform.python_version(),
            "llama.cpp": llama_cpp_version(llama_bench)}
