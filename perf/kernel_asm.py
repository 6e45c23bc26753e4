"""Dump the assembly numba emits for the SIMD matmul kernel and count what matters.

    python perf/kernel_asm.py                    # avx512vnni, summary as JSON
    python perf/kernel_asm.py --isa avx2 --dump /tmp/k.s

Compiles ``vnni_matmul`` for the path's tag (one small call), takes numba's
``inspect_asm`` of that specialization (the parfor body is in the same listing) and
counts vpdpbusd / vpmaddubsw / vpmaddwd / vpaddw instructions, vector loads and stores
on the stack (spills), calls, distinct zmm / ymm registers, and zmm loads.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

os.environ["LLCINFER_NUMBA_CACHE"] = "0"  # inspect_asm needs a fresh compile, not the disk cache

import numpy as np  # noqa: E402

from llcinfer.kernels.act_quant import ACT_Q8_0, quantize_activations_int  # noqa: E402
from llcinfer.weights.repack import repack  # noqa: E402
from llcinfer.kernels.simd import lanes, make_tag  # noqa: E402
from llcinfer.kernels.vnni_matmul import vnni_matmul  # noqa: E402


def kernel_asm(isa: str) -> str:
    W = lanes(isa)
    K, N = 64, W
    raw = np.zeros((N, K // 32 * 20), np.uint8)
    p = repack(raw, 3, K, W)  # Q4_1
    qx, dx, sx = quantize_activations_int(np.ones((1, K), np.float32), ACT_Q8_0)
    y = np.empty((1, N), np.float32)
    tag = make_tag(isa)
    vnni_matmul(qx, dx, sx, p, 3, y, tag)
    sig = [s for s in vnni_matmul.signatures if str(s[-1].dtype) == str(tag.dtype)][0]
    return vnni_matmul.inspect_asm(sig)


def summarize(asm: str) -> dict:
    lines = [ln.strip() for ln in asm.splitlines()]
    ins = [ln for ln in lines if ln and not ln.startswith((".", "#")) and not ln.endswith(":")]
    return {
        "instructions": len(ins),
        "vpdpbusd": sum(ln.startswith("vpdpbusd") for ln in ins),
        "vpdpbusd_zmm": sum(ln.startswith("vpdpbusd") and "zmm" in ln for ln in ins),
        "vpdpbusd_bcst": sum(ln.startswith("vpdpbusd") and "1to" in ln for ln in ins),
        "vpmaddubsw": sum(ln.startswith("vpmaddubsw") for ln in ins),
        "vpmaddwd": sum(ln.startswith("vpmaddwd") for ln in ins),
        "vpaddw": sum(ln.startswith("vpaddw") for ln in ins),
        "vcvtph2ps": sum(ln.startswith("vcvtph2ps") for ln in ins),
        "vpmulld": sum(ln.startswith("vpmulld") for ln in ins),
        "vector_stack_accesses": sum("(%rsp)" in ln and ("ymm" in ln or "zmm" in ln) for ln in ins),
        "calls": sum(ln.startswith("call") for ln in ins),
        "zmm_registers": len(set(re.findall(r"zmm\d+", asm))),
        "ymm_registers": len(set(re.findall(r"ymm\d+", asm))),
        "zmm_loads": sum(bool(re.match(r"vmovdq[au](8|16|32|64)?\s+\S*\(|vmovdqu\d*\s+-?\d*\(", ln)) and "zmm" in ln for ln in ins),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--isa", default="avx512vnni")
    ap.add_argument("--dump", default=None, help="write the full listing here")
    args = ap.parse_args(argv)
    asm = kernel_asm(args.isa)
    if args.dump:
        with open(args.dump, "w") as f:
            f.write(asm)
    s = {"isa": args.isa, **summarize(asm)}
    json.dump(s, sys.stdout, indent=1)
    print()
    return s


if __name__ == "__main__":
    main()
