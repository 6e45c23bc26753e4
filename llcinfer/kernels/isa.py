"""Which instruction-set path the quantized matmul kernels take (read in this one place).

    avx512vnni   512-bit vectors, vpdpbusd (u8 x s8 -> i32), 16 weight rows per group
    avxvnni      256-bit vectors, vpdpbusd on ymm (AVX-VNNI, or AVX512-VNNI + VL), 8 rows
    avx2         256-bit vectors, vpdpbusd emulated by vpmaddubsw (partial sums kept in i16)
                 + vpmaddwd, 8 rows
    generic      the portable numba kernels of quant_matmul.py (float activations)

The best path the CPU supports is chosen at run time; ``LLCINFER_ISA`` forces one (a path
the CPU cannot run falls back to the best one it can, with a warning).

AMX int8 tiles (``cpu_has_amx``) are not a path of their own: on top of avx512vnni, batches
of 16+ rows may take amx_matmul.py once amx.py has the OS's permission (``LLCINFER_AMX``).
"""

from __future__ import annotations

import os
import warnings

from .. import settings
from ..errors import UsageError
from ..hw.cpu import cpu_flags

ISAS = ("avx512vnni", "avxvnni", "avx2", "generic")


def supported_isas(flags: set[str] | None = None) -> list[str]:
    """Paths this CPU can run, best first (always ends with 'generic')."""
    f = cpu_flags() if flags is None else flags
    out = []
    avx2 = {"avx2", "fma", "f16c"} <= f
    if avx2 and {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= f:
        out.append("avx512vnni")
    if avx2 and ("avx_vnni" in f or {"avx512vl", "avx512_vnni"} <= f):
        out.append("avxvnni")
    if avx2:
        out.append("avx2")
    out.append("generic")
    return out


def cpu_has_amx(flags: set[str] | None = None) -> bool:
    """The CPU has AMX int8 tiles (amx_tile + amx_int8); usable only once the OS grants the
    tile state to the process (amx.py asks)."""
    f = cpu_flags() if flags is None else flags
    return {"amx_tile", "amx_int8"} <= f


_CHOSEN: str | None = None


def select_isa(name: str | None = None) -> str:
    """The path to use: ``name``, else $LLCINFER_ISA, else the best supported."""
    avail = supported_isas()
    want = name if name is not None else settings.isa()
    if want is None:
        return avail[0]
    if want not in ISAS:
        raise UsageError(f"LLCINFER_ISA={want!r}: expected one of {', '.join(ISAS)}")
    if want not in avail:
        warnings.warn(f"LLCINFER_ISA={want}: this CPU cannot run it; using {avail[0]}", RuntimeWarning, stacklevel=2)
        return avail[0]
    return want


def current_isa() -> str:
    """The process-wide choice (computed once; ``reset_isa()`` re-reads the environment)."""
    global _CHOSEN
    if _CHOSEN is None:
        _CHOSEN = select_isa()
    return _CHOSEN


def reset_isa() -> None:
    global _CHOSEN
    _CHOSEN = None
