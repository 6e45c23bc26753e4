"""AMX evidence: the tile instructions in the compiled AMX kernel, and AMX status here.

    python perf/amx_asm.py                 # JSON summary
    python perf/amx_asm.py --dump k.txt    # also the kernel's whole disassembly (objdump)

Compiles amx_matmul.py's kernel with real tile instructions but never runs it (safe on a
CPU without AMX), takes its machine code (ELF object from numba's LLVM module) and
  - counts the exact encodings of amx.ENCODINGS in it (no tool needed), and the same for
    the software-tile build (a control: it must have none);
  - disassembles it with objdump, when installed, and lists the tile instruction lines.
Then reports this machine's AMX decision (amx.amx_status(): on a CPU with AMX this asks
the kernel for the tile state, as the runtime would) and the kernel's XCOMP permission
mask (ARCH_GET_XCOMP_PERM, a harmless query).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile

os.environ["LLCINFER_NUMBA_CACHE"] = "0"  # the object code needs a fresh compile, not the disk cache

from llcinfer.kernels import amx, isa  # noqa: E402
from llcinfer.kernels.amx_matmul import object_code  # noqa: E402

TILE_OPS = re.compile(r"\b(ldtilecfg|tileloadd|tileloaddt1|tilestored|tilezero|tilerelease|tdpb[su][su]d)\b")


def disassemble(code: bytes) -> str | None:
    """objdump -d of an ELF object (None without objdump)."""
    tool = shutil.which("objdump")
    if tool is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".o") as f:
        f.write(code)
        f.flush()
        return subprocess.run([tool, "-d", f.name], capture_output=True, text=True, check=True).stdout


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def detection() -> dict:
    usable, reason = amx.amx_status()
    out = {"cpu": cpu_name(), "kernel": platform.release(),
           "cpu_has_amx": isa.cpu_has_amx(), "amx_usable": usable, "reason": reason}
    if platform.system() == "Linux" and platform.machine() == "x86_64":
        mask = ctypes.c_ulong(0)
        rc, err = amx.syscall(amx.SYS_arch_prctl, amx.ARCH_GET_XCOMP_PERM, ctypes.addressof(mask))
        out["xcomp_perm"] = f"{mask.value:#x}" if rc == 0 else f"error {err}"
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dump", default=None, help="write the kernel's whole disassembly here")
    args = ap.parse_args(argv)
    hw = object_code(emulate=False)
    asm = disassemble(hw)
    lines = [ln.strip() for ln in (asm or "").splitlines() if TILE_OPS.search(ln)]
    if args.dump and asm is not None:
        with open(args.dump, "w") as f:
            f.write(asm)
    s = {
        "encodings_in_kernel": amx.find_instructions(hw),
        "encodings_in_emulated_kernel": amx.find_instructions(object_code(emulate=True)),
        "objdump_tile_lines": lines if asm is not None else "objdump not installed",
        "detection": detection(),
    }
    json.dump(s, sys.stdout, indent=1)
    print()
    return s


if __name__ == "__main__":
    main()
