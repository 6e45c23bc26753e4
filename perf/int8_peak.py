"""The int8 dot-product peak of this core: int8 multiply-accumulates per second that
independent vpdpbusd chains on register-resident data issue, per core and for 1..N threads.

    python perf/int8_peak.py                      # every VNNI path, 1 and 2 threads
    python perf/int8_peak.py --isa avx512vnni --threads 1 2 --json perf/results/int8-peak.json

Each thread runs 12 independent accumulator chains (vpdpbusd's latency is about 4-5 cycles
and the core issues one or two a cycle, so 12 cover it), nothing loaded from memory.  One
vpdpbusd of W 32-bit lanes does 4 W MACs (u8 x s8 pairs summed into each i32 lane):
    MAC/s = 12 chains * n_iter * 4 W * threads / wall time         (median of --reps)
On AVX2 (no VNNI) the same loop is vpmaddubsw + vpmaddwd + vpaddd per chain step
(simd_math._dot_ir), which is what the 'avx2' path of the matmul kernels issues.
``smallrow_bench.py`` divides the matmuls' achieved MAC/s by this figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numba  # noqa: E402

from llcinfer.errors import LLCInferError  # noqa: E402
from llcinfer.jit import parallel_kernel, set_threads  # noqa: E402
from llcinfer.kernels.isa import supported_isas  # noqa: E402
from llcinfer.kernels.simd import lanes, make_tag, vlane, vsplat  # noqa: E402
from llcinfer.kernels.simd_math import vadd, vdot_u4  # noqa: E402

CHAINS = 12


@parallel_kernel
def _dot_chains(n_iter, n_threads, tag):
    """12 chains of acc = vpdpbusd(acc, acc, x) per thread (the accumulator as the u8
    operand, so that no product is loop-invariant and hoisted, as the AVX2 emulation's
    would be); returns a sum so none is dead."""
    part = np.zeros(n_threads, np.int64)  # [thread] keeps the chains alive
    for t in numba.prange(n_threads):
        x = (vsplat(0x05060708, tag),)  # s8 operand; the u8 operand is the chain itself
        a0 = vsplat(t, tag)
        a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11 = a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0
        for _ in range(n_iter):
            a0 = vdot_u4(a0, (a0,), x, tag)
            a1 = vdot_u4(a1, (a1,), x, tag)
            a2 = vdot_u4(a2, (a2,), x, tag)
            a3 = vdot_u4(a3, (a3,), x, tag)
            a4 = vdot_u4(a4, (a4,), x, tag)
            a5 = vdot_u4(a5, (a5,), x, tag)
            a6 = vdot_u4(a6, (a6,), x, tag)
            a7 = vdot_u4(a7, (a7,), x, tag)
            a8 = vdot_u4(a8, (a8,), x, tag)
            a9 = vdot_u4(a9, (a9,), x, tag)
            a10 = vdot_u4(a10, (a10,), x, tag)
            a11 = vdot_u4(a11, (a11,), x, tag)
        s = vadd(vadd(vadd(a0, a1), vadd(a2, a3)), vadd(vadd(a4, a5), vadd(a6, a7)))
        s = vadd(s, vadd(vadd(a8, a9), vadd(a10, a11)))
        part[t] = vlane(s, 0)
    return part.sum()


def int8_peak(isa: str, threads: int, reps: int = 7, n_iter: int = 4_000_000) -> float:
    """int8 MACs per second that ``threads`` threads issue on ``isa``'s dot product, median."""
    tag = make_tag(isa)
    threads = set_threads(threads)  # clamped to numba's pool: more chains than threads would not add up
    _dot_chains(10, threads, tag)  # compile
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        _dot_chains(n_iter, threads, tag)
        ts.append(time.perf_counter() - t0)
    return CHAINS * n_iter * 4 * lanes(isa) * threads / float(np.median(ts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    simd = [i for i in supported_isas() if i != "generic"]
    ap.add_argument("--isa", nargs="+", default=simd, choices=simd)
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()
    bad = [t for t in args.threads if not 1 <= t <= numba.config.NUMBA_NUM_THREADS]
    if bad:
        ap.error(f"--threads {bad[0]}: numba's pool has 1..{numba.config.NUMBA_NUM_THREADS}")
    rows = []
    print(f"{'path':12s} {'threads':>7s} {'GMAC/s':>9s} {'per core':>9s}")
    for isa in args.isa:
        for th in args.threads:
            v = int8_peak(isa, th, args.reps)
            rows.append({"isa": isa, "threads": th, "macs_per_s": round(v), "macs_per_s_per_core": round(v / th)})
            print(f"{isa:12s} {th:7d} {v / 1e9:9.1f} {v / th / 1e9:9.1f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"chains": CHAINS, "peaks": rows}, indent=1) + "\n")


if __name__ == "__main__":
    try:
        main()
    except LLCInferError as e:
        raise SystemExit(f"error: {e}") from None
