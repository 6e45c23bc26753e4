"""Every environment variable llcinfer reads, read here and nowhere else.

Each is read when asked (tests and users may change it between calls); a value that
cannot be understood is a ``UsageError`` naming the variable.

    LLCINFER_HOME            models, repacked weights, compiled kernels, machine facts
                             (default ~/.cache/llcinfer)
    LLCINFER_ISA             force a kernel path: avx512vnni, avxvnni, avx2, generic
    LLCINFER_AMX             0: never use AMX tiles; 1: ask for them and warn if refused
    LLCINFER_EXECUTOR        0: decode rows on the batched forward pass, not the executor
    LLCINFER_CALIBRATE       0: no first-use kernel calibration and no start-up plan check
                             (plan from what is cached, else estimates)
    LLCINFER_PIN             executor workers pinned to their domain (default), core or none
    LLCINFER_HUGEPAGES       0: no 2 MiB pages for weights and the KV pool
    LLCINFER_REPACK_CACHE    0: repack weights in memory; a path: keep the repacks there
    LLCINFER_NUMBA_CACHE     0: compile kernels afresh, no on-disk cache
    LLCINFER_THREADING_LAYER numba's threading layer (default: its own choice)
    LLCINFER_LLAMA_SRC       a llama.cpp source tree for the comparisons
    LLCINFER_LLAMA_SDIST     a llama.cpp source archive for the comparisons
    CC, CXX                  compilers for the llama.cpp build
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import UsageError

_ON, _OFF = ("1", "on", "yes", "true"), ("0", "off", "no", "false")


def _raw(name: str) -> str:
    return os.environ.get(name, "").strip()


def _switch(name: str, default: bool) -> bool:
    value = _raw(name).lower()
    if value == "":
        return default
    if value not in _ON + _OFF:
        raise UsageError(f"{name} must be 1 or 0 (got {value!r})")
    return value in _ON


def home() -> Path:
    """``$LLCINFER_HOME``, or ``~/.cache/llcinfer``."""
    value = _raw("LLCINFER_HOME")
    return Path(value).expanduser() if value else Path.home() / ".cache" / "llcinfer"


def isa() -> str | None:
    """The kernel path asked for by LLCINFER_ISA (None: the best this CPU runs)."""
    return _raw("LLCINFER_ISA").lower() or None


def amx() -> str:
    """LLCINFER_AMX: '' (use AMX when the CPU and OS allow), '0' or '1'."""
    value = _raw("LLCINFER_AMX").lower()
    if value not in ("", "0", "1"):
        raise UsageError(f"LLCINFER_AMX={value!r}: expected 0 or 1")
    return value


def executor_enabled() -> bool:
    return _switch("LLCINFER_EXECUTOR", True)


def calibrate_enabled() -> bool:
    """LLCINFER_CALIBRATE: measure this machine's kernels at first use and check the plan at
    start-up (default on)."""
    return _switch("LLCINFER_CALIBRATE", True)


def pin_mode() -> str:
    """LLCINFER_PIN: 'domain' (default), 'core' or 'none' (also '0', 'off')."""
    value = _raw("LLCINFER_PIN").lower() or "domain"
    if value not in ("domain", "core", "0", "none", "off"):
        raise UsageError(f"LLCINFER_PIN must be domain, core or none (got {value!r})")
    return "none" if value in ("0", "off") else value


def hugepages_enabled() -> bool:
    return _switch("LLCINFER_HUGEPAGES", True)


def repack_cache() -> str | None:
    """LLCINFER_REPACK_CACHE: None (default place), 'off', or a directory."""
    value = _raw("LLCINFER_REPACK_CACHE")
    if value.lower() in _OFF:
        return "off"
    return None if value in ("", "1") else os.path.expanduser(value)


def numba_cache_enabled() -> bool:
    return _switch("LLCINFER_NUMBA_CACHE", True)


def numba_cache_dir_set_by_user() -> bool:
    return bool(_raw("NUMBA_CACHE_DIR"))


def threading_layer() -> str | None:
    return _raw("LLCINFER_THREADING_LAYER") or None


def set_omp_waiting(defaults: dict[str, str]) -> list[str]:
    """Set the OpenMP waiting variables ``defaults`` (OMP_WAIT_POLICY, GOMP_SPINCOUNT) the
    user has not set, before the OpenMP runtime loads; returns the names set here."""
    mine = [k for k in defaults if k not in os.environ]
    for k in mine:
        os.environ[k] = defaults[k]
    return mine


def child_environment(drop: list[str]) -> dict[str, str]:
    """The environment for programs we start, without the variables ``drop`` we set."""
    env = dict(os.environ)
    for k in drop:
        env.pop(k, None)
    return env


def llama_source() -> str | None:
    return _raw("LLCINFER_LLAMA_SRC") or None


def llama_sdist() -> str | None:
    return _raw("LLCINFER_LLAMA_SDIST") or None


def compiler(name: str) -> str | None:
    """$CC or $CXX (``name``) for the llama.cpp build."""
    return _raw(name) or None
