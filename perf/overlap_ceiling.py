"""How much of the DRAM read bandwidth one core keeps while it also computes: a synthetic
stream whose arithmetic per byte is set by hand, timed from DRAM and from L1.

    python perf/overlap_ceiling.py                     # 1 thread, 0..48 FMAs per 64-byte line
    python perf/overlap_ceiling.py --threads 1 2 --fmas 0 1 2 3 4 --ahead 0 1024 4096 --json out.json

Each 64-byte line is read as 4 f16 vectors (vcvtph2ps, as attention reads its KV), added
into 4 accumulators, and fed to ``8 r`` more vector FMAs (r = --fmas, per line); a prefetch
towards L2 runs --ahead bytes ahead (1 KiB; 0: none).  Per r the script times

  * ``dram``: a pass over --mb MiB (2 MiB pages; every thread its own slice),
  * ``cache``: the same number of lines over a 16 KiB window (L1): the compute alone,
  * ``probe``: llcinfer's read-bandwidth probe (a vector sum) over the same size,

alternating the three, medians over --reps.  ``cache / probe`` says how fast the
arithmetic is against DRAM; ``dram / probe`` is the fraction of the roofline such a kernel
can reach.  Two bounds frame it: no overlap, 1 / (1/cache + 1/probe), and perfect
overlap, min(cache, probe).  A kernel whose in-cache rate is measured (matvec_ceiling.py,
ab_kernels.py attention) can be placed on this curve: at a given cache / probe it
cannot beat the stream's dram / probe by much.  ``--kernels`` does that for llcinfer's
decode kernels in the same run (overlap_kernels.py: the one-row matvec per weight type
and decode attention, from the caches and from DRAM, 1 thread).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numba
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "perf"))

from llcinfer.weights import hugepages  # noqa: E402
from llcinfer.hw.probe import ReadProbe  # noqa: E402
from llcinfer.kernels.isa import supported_isas  # noqa: E402
from llcinfer.jit import kernel, parallel_kernel, set_threads  # noqa: E402
from llcinfer.kernels.simd import TAGS, make_tag, prefetch_l2, vlane, vload_f16, vsplat  # noqa: E402
from llcinfer.kernels.simd_math import vadd, vfma  # noqa: E402

LINE = 64
WINDOW = 16 << 10  # bytes of the L1-resident window of the compute-alone pass
AHEAD = 1024  # default prefetch distance in bytes (a pure stream here: 1 KiB 20.0-20.7 GB/s, none 18.3, 4 KiB 17.8)


@kernel
def _stream(a, lo, nbytes, mask, r, ahead, tag):
    """Sum over the lines at byte offsets lo + (o & mask), o < nbytes: 4 f16 vectors per
    line added into accumulators, plus 8 r FMAs per line on them; prefetch ``ahead`` bytes on (0: none)."""
    z = vsplat(np.float32(0), tag)
    f0 = f1 = f2 = f3 = f4 = f5 = f6 = f7 = z  # [lane] accumulators
    q = vsplat(np.float32(1e-7), tag)
    for o in range(0, nbytes, LINE):
        p = lo + (o & mask)
        if ahead > 0:
            prefetch_l2(a, lo + ((o + ahead) & mask))
        k0 = vload_f16(a, p, tag)
        k1 = vload_f16(a, p + 16, tag)
        k2 = vload_f16(a, p + 32, tag)
        k3 = vload_f16(a, p + 48, tag)
        f0 = vadd(f0, k0)
        f1 = vadd(f1, k1)
        f2 = vadd(f2, k2)
        f3 = vadd(f3, k3)
        for _ in range(r):  # 8 independent chains hide the FMA latency; 13 ymm in use, no spills
            f0 = vfma(q, k0, f0)
            f1 = vfma(q, k1, f1)
            f2 = vfma(q, k2, f2)
            f3 = vfma(q, k3, f3)
            f4 = vfma(k0, q, f4)
            f5 = vfma(k1, q, f5)
            f6 = vfma(k2, q, f6)
            f7 = vfma(k3, q, f7)
    return vlane(vadd(vadd(vadd(f0, f1), vadd(f2, f3)), vadd(vadd(f4, f5), vadd(f6, f7))), 0)


@parallel_kernel
def _stream_threads(a, n_threads, slice_bytes, window, r, ahead, tag):
    """_stream on n_threads slices of slice_bytes each; window > 0: every thread reads
    slice_bytes from its own window of that many bytes instead (the compute alone)."""
    out = np.zeros(n_threads, np.float32)
    for t in numba.prange(n_threads):
        if window > 0:
            out[t] = _stream(a, t * window, slice_bytes, window - 1, r, ahead, tag)
        else:
            out[t] = _stream(a, t * slice_bytes, slice_bytes, slice_bytes - 1, r, ahead, tag)
    return out.sum()


def alternate_rates(runs: dict, reps: int, probe: ReadProbe) -> dict:
    """Median GB/s of each run (name: (fn, bytes it reads)) and of the probe, the order
    reversed every other repetition."""
    names = list(runs) + ["probe"]
    rates = {k: [] for k in names}
    for i in range(reps):
        for k in names if i % 2 == 0 else names[::-1]:
            if k == "probe":
                rates[k].append(probe.read(runs=1, min_seconds=0.1))
                continue
            fn, nbytes = runs[k]
            t0 = time.perf_counter()
            fn()
            rates[k].append(nbytes / (time.perf_counter() - t0))
    return {k: float(np.median(v)) / 1e9 for k, v in rates.items()}


def rates_row(med: dict) -> dict:
    """The cache / DRAM / probe figures of one measurement, and their ratios."""
    c, d, p = med["cache"], med["dram"], med["probe"]
    return {"dram_gbs": round(d, 2), "cache_gbs": round(c, 2), "probe_gbs": round(p, 2),
            "cache_over_probe": round(c / p, 2), "dram_over_probe": round(d / p, 3)}


def measure(buf, threads: int, r: int, ahead: int, reps: int, probe: ReadProbe, tag) -> dict:
    slice_bytes = 1 << ((buf.nbytes // threads).bit_length() - 1)  # a power of two: offsets wrap by a mask
    total = slice_bytes * threads
    _stream_threads(buf, threads, 1 << 16, WINDOW, r, ahead, tag)  # compile / warm
    med = alternate_rates({
        "dram": (lambda: _stream_threads(buf, threads, slice_bytes, 0, r, ahead, tag), total),
        "cache": (lambda: _stream_threads(buf, threads, slice_bytes, WINDOW, r, ahead, tag), total)}, reps, probe)
    c, p = med["cache"], med["probe"]
    return {"threads": threads, "ahead": ahead, "fmas_per_line": 8 * r, **rates_row(med),
            "no_overlap_over_probe": round(1 / (1 / c + 1 / p) / p, 3),
            "perfect_overlap_over_probe": round(min(c, p) / p, 3)}


def place_kernels(a, curve: list[dict]) -> list[dict]:
    """overlap_kernels' rows, each with the curve's dram / probe at its cache / probe."""
    import overlap_kernels as ok

    set_threads(1)
    probe = ReadProbe(a.mb << 20, 1)
    out = []
    print("\nkernel (1 thread)          cache GB/s  dram GB/s  probe GB/s  cache/probe  dram/probe  stream at that ratio")
    for row in ok.measure_kernels(ok.kernel_calls(a.mb, a.isa), a.reps, probe):
        row["stream_dram_over_probe"] = round(ok.curve_at(curve, row["cache_over_probe"]), 3)
        out.append(row)
        print(f"{row['kernel']:26s} {row['cache_gbs']:10.1f} {row['dram_gbs']:10.1f} {row['probe_gbs']:11.1f} "
              f"{row['cache_over_probe']:12.2f} {row['dram_over_probe']:11.2f} {row['stream_dram_over_probe']:12.2f}",
              flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fmas", nargs="*", type=int, default=[0, 1, 2, 3, 4, 6],
                    help="r: 8 r FMAs per 64-byte line (0 = the sum alone)")
    ap.add_argument("--threads", nargs="*", type=int, default=[1])
    ap.add_argument("--mb", type=int, default=256, help="MiB streamed from DRAM per pass")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--isa", default="avx2", help="a SIMD path of simd.TAGS that this CPU runs (ymm or zmm)")
    ap.add_argument("--ahead", nargs="*", type=int, default=[AHEAD], help="prefetch distances in bytes (0: none)")
    ap.add_argument("--kernels", action="store_true",
                    help="then place llcinfer's decode kernels on the 1-thread curve (overlap_kernels.py)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if (a.reps < 1 or a.mb < 1 or any(t < 1 for t in a.threads) or any(r < 0 or r > 64 for r in a.fmas)
            or any(d < 0 or d % 64 for d in a.ahead)):
        ap.error("--reps, --mb and --threads must be positive, --fmas in 0..64, --ahead whole lines")
    if a.kernels and 1 not in a.threads:
        ap.error("--kernels places the kernels on the 1-thread curve: --threads must include 1")
    simd = [i for i in supported_isas() if i in TAGS]
    if a.isa not in simd:
        print(f"error: --isa {a.isa!r} is not a SIMD path this CPU runs (one of: {', '.join(simd)})", file=sys.stderr)
        return 1
    tag = make_tag(a.isa)
    try:
        mm = hugepages.anonymous(a.mb << 20)
    except (OSError, OverflowError, MemoryError) as e:
        print(f"error: cannot map {a.mb} MiB: {e}", file=sys.stderr)
        return 1
    buf = np.frombuffer(mm, np.uint8)  # [bytes] f16 ones: finite sums
    buf.view(np.uint16)[:] = np.float16(1.0).view(np.uint16)
    lines = WINDOW // LINE
    got = _stream(buf, 0, WINDOW, WINDOW - 1, 0, 0, tag)
    if got != 4 * lines:  # every line's 4 vectors of ones, once each, in lane 0
        print(f"error: the stream read {got} for {4 * lines}: the kernel does not read what it should", file=sys.stderr)
        return 1
    rows = []
    print("threads  ahead  FMAs/line  dram GB/s  cache GB/s  probe GB/s  cache/probe  dram/probe  (no overlap .. perfect)")
    for threads in a.threads:
        set_threads(threads)
        probe = ReadProbe(a.mb << 20, threads)
        for r, ahead in ((r, ahead) for r in a.fmas for ahead in a.ahead):
            row = measure(buf, threads, r, ahead, a.reps, probe, tag)
            rows.append(row)
            print(f"{threads:7d}  {ahead:5d}  {row['fmas_per_line']:9d}  {row['dram_gbs']:9.1f}  {row['cache_gbs']:10.1f}  "
                  f"{row['probe_gbs']:10.1f}  {row['cache_over_probe']:11.2f}  {row['dram_over_probe']:10.2f}  "
                  f"({row['no_overlap_over_probe']:.2f} .. {row['perfect_overlap_over_probe']:.2f})", flush=True)
        del probe
    kernels = place_kernels(a, [r for r in rows if r["threads"] == 1]) if a.kernels else []
    if a.json:
        Path(a.json).write_text(json.dumps({"isa": a.isa, "mb": a.mb, "rows": rows, "kernels": kernels}, indent=1))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
