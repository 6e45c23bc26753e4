"""Microbenchmark of the quantized matmul kernels: GB/s of weight bytes per type, shape,
ISA path and thread count, next to a read-bandwidth probe of the same working-set size.

    python perf/kernel_bench.py                       # all types, all paths, 1 and 2 threads
    python perf/kernel_bench.py --types Q4_1 --isa avx512vnni --threads 1 --m 1 4 16
    python perf/kernel_bench.py --json out.json

GB/s counts the bytes the kernel reads for the weights (repacked bytes for the SIMD
paths, GGML bytes for 'generic'); 'probe' is a numba parallel sum (explicit vector loads, simd.py) over an
array of the same size, measured in the same run; pct = GB/s / probe.  Times are medians.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import numba  # noqa: E402
from numba import prange  # noqa: E402

from llcinfer.kernels import isa as isa_mod  # noqa: E402
from llcinfer.kernels.act_quant import ACT_Q8_0, ACT_Q8_K, quantize_activations, quantize_activations_int  # noqa: E402
from llcinfer.jit import parallel_kernel, set_threads  # noqa: E402
from llcinfer.kernels.quant_matmul import quant_matmul  # noqa: E402
from llcinfer.weights.repack import repack  # noqa: E402
from llcinfer.kernels.simd import lanes, make_tag, vlane, vlanes, vloadf  # noqa: E402
from llcinfer.kernels.simd_math import vadd, vzero_f  # noqa: E402
from llcinfer.kernels.tables import F16_TO_F32  # noqa: E402
from llcinfer.kernels.vnni_matmul import vnni_matmul  # noqa: E402
from tiny_models import random_quant_bytes  # noqa: E402
from gguf.constants import GGMLQuantizationType as QT  # noqa: E402

# (type, label, N, K): SmolLM2-135M (Q4_1 layers, Q8_0 output), Qwen2.5-0.5B / 1.5B layers
SHAPES = [
    ("Q4_1", "smollm2 q/o 576x576", 576, 576),
    ("Q4_1", "smollm2 gate/up 1536x576", 1536, 576),
    ("Q4_1", "smollm2 down 576x1536", 576, 1536),
    ("Q8_0", "smollm2 output 49152x576", 49152, 576),
    ("Q4_0", "(synthetic) 1536x576", 1536, 576),
    ("Q5_0", "qwen0.5b q/o 896x896", 896, 896),
    ("Q5_0", "qwen0.5b gate/up 4864x896", 4864, 896),
    ("Q4_K", "qwen0.5b down 896x4864", 896, 4864),
    ("Q6_K", "qwen0.5b down 896x4864", 896, 4864),
    ("Q8_0", "qwen0.5b output 151936x896", 151936, 896),
    ("Q4_K", "qwen1.5b q/o 1536x1536", 1536, 1536),
    ("Q4_K", "qwen1.5b gate/up 8960x1536", 8960, 1536),
    ("Q6_K", "qwen1.5b down 1536x8960", 1536, 8960),
]


@parallel_kernel
def _probe_sum(a, out, tag):
    """out[c] = sum of chunk c of a: 4 vector accumulators of aligned-width float loads
    (zmm on avx512vnni), i.e. a pure read stream at the kernel's vector width."""
    n_chunks = out.shape[0]
    W = vlanes(tag)
    per = a.shape[0] // n_chunks // (4 * W) * (4 * W)
    for c in prange(n_chunks):
        s0 = vzero_f(tag)
        s1 = vzero_f(tag)
        s2 = vzero_f(tag)
        s3 = vzero_f(tag)
        for i in range(c * per, (c + 1) * per, 4 * W):
            s0 = vadd(s0, vloadf(a, i, tag))
            s1 = vadd(s1, vloadf(a, i + W, tag))
            s2 = vadd(s2, vloadf(a, i + 2 * W, tag))
            s3 = vadd(s3, vloadf(a, i + 3 * W, tag))
        out[c] = vlane(vadd(vadd(s0, s1), vadd(s2, s3)), 0)


def _median_time(fn, min_time=0.25, min_reps=5):
    fn()
    ts = []
    t_end = time.perf_counter() + min_time
    while len(ts) < min_reps or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def probe_gbs(nbytes: int, isa: str) -> float:
    tag = make_tag(isa if isa != "generic" else isa_mod.supported_isas()[0] if isa_mod.supported_isas()[0] != "generic" else "avx2")
    n_chunks = 64
    per = max(nbytes // 4 // n_chunks // 64, 1) * 64
    a = np.ones(per * n_chunks, np.float32)
    out = np.empty(n_chunks, np.float32)
    t = _median_time(lambda: _probe_sum(a, out, tag))
    return a.nbytes / t / 1e9


def bench_one(qname, N, K, isa, M, rng):
    fn, nbytes, extra = make_call(qname, N, K, isa, M, rng)
    return _median_time(fn), nbytes, extra


def make_call(qname, N, K, isa, M, rng):
    """(fn, weight bytes it reads, extra): fn() runs the M x K by K x N product of random
    weights of type qname on the path isa (repacked for the SIMD paths)."""
    q = int(QT[qname])
    raw = random_quant_bytes(rng, qname, N, K)
    kind = ACT_Q8_K if qname in ("Q4_K", "Q6_K") else ACT_Q8_0
    x = rng.standard_normal((M, K)).astype(np.float32)
    y = np.empty((M, N), np.float32)
    if isa == "generic":
        xr = quantize_activations(x, kind)
        fn = lambda: quant_matmul(xr, raw, q, F16_TO_F32, y)  # noqa: E731
        nbytes = raw.nbytes
        extra = {}
    else:
        t0 = time.perf_counter()
        p = repack(raw, q, K, lanes(isa))
        extra = {"repack_ms": round(1e3 * (time.perf_counter() - t0), 2)}
        qx, dx, sx = quantize_activations_int(x, kind)
        tag = make_tag(isa)
        fn = lambda: vnni_matmul(qx, dx, sx, p, q, y, tag)  # noqa: E731
        nbytes = p.nbytes
    return fn, nbytes, extra


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", nargs="*", default=None)
    ap.add_argument("--isa", nargs="*", default=None, help="paths (default: all this CPU runs)")
    ap.add_argument("--threads", nargs="*", type=int, default=[1, 2])
    ap.add_argument("--m", nargs="*", type=int, default=[1], help="activation rows")
    ap.add_argument("--shapes", default=None, help="substring filter on the shape label")
    ap.add_argument("--json", default=None, help="write results here (default: stdout only)")
    args = ap.parse_args(argv)
    isas = args.isa or isa_mod.supported_isas()
    rng = np.random.default_rng(0)
    rows = []
    probes: dict[tuple[int, int], float] = {}
    for qname, label, N, K in SHAPES:
        if args.types and qname not in args.types:
            continue
        if args.shapes and args.shapes not in label:
            continue
        for th in args.threads:
            set_threads(th)
            for isa in isas:
                for M in args.m:
                    t, nbytes, extra = bench_one(qname, N, K, isa, M, rng)
                    key = (nbytes // (1 << 16), th)
                    if key not in probes:
                        probes[key] = probe_gbs(nbytes, isas[0])
                    gbs = nbytes / t / 1e9
                    r = dict(type=qname, shape=label, N=N, K=K, M=M, isa=isa, threads=th, us=round(t * 1e6, 1),
                             weight_bytes=nbytes, gbs=round(gbs, 2), probe_gbs=round(probes[key], 2),
                             pct_probe=round(100 * gbs / probes[key], 1), **extra)
                    rows.append(r)
                    print(f"{qname:5s} {label:28s} M={M:<3d} {isa:11s} t={th} {t*1e6:9.1f} us "
                          f"{gbs:7.2f} GB/s  probe {probes[key]:6.1f}  {r['pct_probe']:5.1f}%", flush=True)
    res = {"cpu_isas": isa_mod.supported_isas(), "numba": numba.__version__, "results": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
