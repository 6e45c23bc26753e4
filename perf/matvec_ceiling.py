"""The compute ceiling of the one-row (decode) matvec kernels: GB/s of packed weights when
they come from the caches, next to the read bandwidth from DRAM, per type.

    python perf/matvec_ceiling.py                       # Q8_0 Q5_0 Q4_K Q6_K, avx2, 1 thread
    python perf/matvec_ceiling.py --types Q4_K --isa avx512vnni --threads 2 --json out.json

A kernel whose in-cache rate is not well above the DRAM bandwidth cannot hide the loads
under its arithmetic, so it reads DRAM below the probe however it prefetches.  The
in-cache rate is the slope between two cache-resident sizes (N = n_small and 2 n_small
rows of the type's usual row length K): the extra bytes over the extra time, so the fixed
cost of a call (dispatch, threads) drops out; the two sizes alternate and the figure is
the median over the pairs (this host's speed drifts within seconds).  The DRAM figure is
kernel_bench.py's probe (a vector sum) over a 256 MiB array, in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "perf"))
sys.path.insert(0, str(ROOT / "tests"))

import kernel_bench  # noqa: E402

from llcinfer.jit import set_threads  # noqa: E402

ROW_LENGTH = {"Q8_0": 896, "Q5_0": 896, "Q4_0": 576, "Q4_1": 576, "Q4_K": 1536, "Q6_K": 1536}


def ceiling(qname: str, isa: str, n_small: int, reps: int, rng) -> dict:
    """In-cache GB/s of type qname: calls of n_small and 2 n_small rows alternate (small,
    large, large, small, ...; each timed as the median of 20 calls), the figure is the
    median over the pairs of extra bytes / extra time."""
    K = ROW_LENGTH[qname]
    (f1, b1, _), (f2, b2, _) = (kernel_bench.make_call(qname, n, K, isa, 1, rng) for n in (n_small, 2 * n_small))

    def timed(fn):
        ts = []
        for _ in range(20):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts))

    f1(), f2()
    rates, t_small, t_large = [], [], []
    for r in range(reps):
        for which in ((0, 1) if r % 2 == 0 else (1, 0)):
            (t_small if which == 0 else t_large).append(timed(f1 if which == 0 else f2))
        dt = t_large[-1] - t_small[-1]
        rates.append((b2 - b1) / dt / 1e9 if dt > 0 else float("inf"))
    q1, med, q3 = (float(v) for v in np.percentile(rates, [25, 50, 75]))
    return {"type": qname, "K": K, "rows": [n_small, 2 * n_small], "bytes": [b1, b2],
            "us": [round(1e6 * float(np.median(t_small)), 2), round(1e6 * float(np.median(t_large)), 2)],
            "gbs": round(med, 2), "gbs_q1_q3": [round(q1, 2), round(q3, 2)]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", nargs="+", default=["Q8_0", "Q5_0", "Q4_K", "Q6_K"])
    ap.add_argument("--isa", default="avx2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, default=1024, help="n_small (multiple of 16)")
    ap.add_argument("-r", "--reps", type=int, default=15, help="pairs of (small, large) timings")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    bad = [t for t in args.types if t not in ROW_LENGTH]
    if bad:
        sys.exit(f"error: unknown type {bad[0]!r} (of {', '.join(ROW_LENGTH)})")
    if args.threads < 1 or args.reps < 1 or args.rows < 16 or args.rows % 16:
        ap.error("--threads and --reps must be at least 1, --rows a positive multiple of 16")
    set_threads(args.threads)
    rng = np.random.default_rng(0)
    dram = kernel_bench.probe_gbs(256 << 20, args.isa)
    out = {"isa": args.isa, "threads": args.threads, "dram_probe_gbs": round(dram, 2), "kernels": []}
    print(f"DRAM probe (256 MiB, {args.threads} thread(s)): {dram:.1f} GB/s")
    for qname in args.types:
        r = ceiling(qname, args.isa, args.rows, args.reps, rng)
        out["kernels"].append(r)
        print(f"{qname} K={r['K']}: {r['gbs']:.1f} GB/s from the caches (q1 {r['gbs_q1_q3'][0]:.1f}, q3 "
              f"{r['gbs_q1_q3'][1]:.1f}) = {r['gbs'] / dram:.2f}x the DRAM probe (calls {r['us'][0]:.1f} / "
              f"{r['us'][1]:.1f} us)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
