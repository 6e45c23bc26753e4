"""Decode attention over the f16 paged KV cache: the scalar loops ('generic') against the
explicit-SIMD path, in GB/s of KV read next to a read-bandwidth probe of the same size.

    python perf/attention_bench.py                          # SmolLM2 + Qwen2.5-0.5B shapes, 4k/8k/16k, 1 and 2 threads
    python perf/attention_bench.py --ctx 4096 --threads 1 --models smollm2 --reps 5
    python perf/attention_bench.py --isa avx512vnni avx2 generic --no-asm

One "token" is what a decode step does: attention of one query row over ``ctx`` cached
positions, for every layer, through ``paged_attention`` (what the sequences call; the
thread count picks serial or split-over-the-pool).  The paths run alternately, one token
each per repetition, and the table shows medians.  KV bytes per token = layers x ctx x
2 (K, V) x kv_heads x head_dim x 2 bytes; GB/s = that / time; 'probe' is
llcinfer.bench.probe.read_bandwidth over the same number of bytes with the same threads,
measured in the same run right after each case; '% probe' = GB/s / probe.

'% FMA peak' tells whether a case is bound by bandwidth or by arithmetic: the vector FMAs
the SIMD path must issue per token (``attention_fmas``: 2 D / lanes per key and query head,
so G times more per KV byte with G query heads per KV head) per second, against the FMA
throughput of the same threads measured in the run (``fma_peak``: 8 independent chains per
thread).  On Zen 4 a zmm FMA issues once per cycle, so with G = 7 (Qwen2.5-0.5B) 56 FMAs
per 256 KV bytes cap the read rate at peak * 256 / 56 per thread, under the bandwidth of
one core here.  With 2 threads the paths split each layer over the numba pool (one parallel
region per layer: the standalone path, not the executor's workers).

The assembly check compiles the SIMD task afresh (in a child process, disk cache off)
and counts vcvtph2ps, zmm/ymm FMAs, shuffles (none since K is stored transposed) and prefetches in its listing.
Results go to perf/results/attention-<date>.json (``--json`` to change).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

# name: (layers, heads, kv heads, head dim)
MODELS = {"smollm2-135m": (30, 9, 3, 64), "qwen2.5-0.5b": (24, 14, 2, 64)}
BLOCK = 16


def make_cache(L, KVH, D, ctx, seed=0):
    """A pool holding ``ctx`` positions of f16 K/V (normal values) and its sequence."""
    from llcinfer.kv import KVPool, PagedSequence

    pool = KVPool(L, KVH, D, BLOCK, -(-ctx // BLOCK) + 1, "f16", budget_bytes=16 << 30)
    seq = PagedSequence(pool, ctx + BLOCK, None, "bench")
    seq.n_tokens = ctx
    rng = np.random.default_rng(seed)
    for b in seq.table[:seq.n_blocks]:
        pool.data[b] = rng.standard_normal(pool.data.shape[1], dtype=np.float32).astype(np.float16).view(np.uint16)
    return pool, seq


def bench_case(L, H, KVH, D, ctx, threads, isas, reps):
    """(KV bytes per token, {path: median seconds per token}, probe bytes/s)."""
    from llcinfer.hw.probe import read_bandwidth

    times = _time_paths(L, H, KVH, D, ctx, threads, isas, reps)
    kv_bytes = L * ctx * 2 * KVH * D * 2
    return kv_bytes, times, read_bandwidth(kv_bytes, threads)  # the cache is gone: same memory footprint


def _time_paths(L, H, KVH, D, ctx, threads, isas, reps):
    from llcinfer.jit import set_threads
    from llcinfer.kernels.paged_attention import paged_attention
    from llcinfer.kernels.tables import F16_TO_F32

    pool, seq = make_cache(L, KVH, D, ctx)
    table = seq.table[:seq.n_blocks]
    q = np.random.default_rng(1).standard_normal((1, H, D)).astype(np.float32)
    out = np.empty_like(q)
    scale = np.float32(1 / np.sqrt(D))
    set_threads(threads)

    def token(isa):
        for layer in range(L):
            paged_attention(q, pool.data, pool.data_f32, F16_TO_F32, pool.kind, pool.group, pool.scale_offset, table,
                            layer, KVH, BLOCK, ctx - 1, scale, out, threads=threads, isa=isa)
        return out.copy()

    results = {isa: token(isa) for isa in isas}  # compile, warm
    ref = results[isas[-1]]
    for isa in isas:  # every path computes the same attention
        assert np.abs(results[isa] - ref).max() < 1e-4, isa
    times = {isa: [] for isa in isas}
    for _ in range(reps):
        for isa in isas:
            t0 = time.perf_counter()
            token(isa)
            times[isa].append(time.perf_counter() - t0)
    return {isa: float(np.median(ts)) for isa, ts in times.items()}


def _fma_chains():
    """A kernel of 8 independent FMA chains per thread (enough to cover the FMA latency),
    one prange iteration per thread: the machine's vector FMA throughput."""
    import numba

    from llcinfer.jit import parallel_kernel
    from llcinfer.kernels.simd import vlane, vsplat
    from llcinfer.kernels.simd_math import vfma

    @parallel_kernel
    def chains(n_iter, n_threads, tag):
        part = np.zeros(n_threads, np.float32)  # [thread] keeps the chains alive
        for t in numba.prange(n_threads):
            one = vsplat(np.float32(0.999999), tag)
            c = vsplat(np.float32(1e-7), tag)
            a0 = vsplat(np.float32(t), tag)
            a1, a2, a3, a4, a5, a6, a7 = a0, a0, a0, a0, a0, a0, a0
            for _ in range(n_iter):
                a0 = vfma(a0, one, c)
                a1 = vfma(a1, one, c)
                a2 = vfma(a2, one, c)
                a3 = vfma(a3, one, c)
                a4 = vfma(a4, one, c)
                a5 = vfma(a5, one, c)
                a6 = vfma(a6, one, c)
                a7 = vfma(a7, one, c)
            part[t] = vlane(a0, 0) + vlane(a1, 1) + vlane(a2, 2) + vlane(a3, 3) + vlane(a4, 4) + vlane(a5, 5) \
                + vlane(a6, 6) + vlane(a7, 7)
        return part.sum()

    return chains


def fma_peak(threads: int, isa: str, reps: int = 7) -> float:
    """Vector FMAs per second (of ``isa``'s width) that ``threads`` threads issue, median."""
    from llcinfer.jit import set_threads
    from llcinfer.kernels.simd import make_tag

    chains, tag = _fma_chains(), make_tag(isa)
    set_threads(threads)
    n_iter = 2_000_000
    chains(10, threads, tag)  # compile
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        chains(n_iter, threads, tag)
        ts.append(time.perf_counter() - t0)
    return 8 * n_iter * threads / float(np.median(ts))


def attention_fmas(L, H, D, ctx, lanes):
    """Vector FMAs per token of the SIMD path: per layer, key and query head, D / lanes for
    the scores (K stored transposed: a broadcast query value times 16 keys) and D / lanes
    for P V (a broadcast probability times a V row); conversions and exp come on top."""
    return L * ctx * H * 2 * D // lanes


def asm_summary(isa: str) -> dict:
    """Compile the SIMD task for ``isa`` (disk cache off) and count what matters in its
    assembly (numba's inspect_asm of _task_simd, callees linked in)."""
    os.environ["LLCINFER_NUMBA_CACHE"] = "0"
    from llcinfer.kernels import paged_attention as pa
    from llcinfer.kernels.tables import F16_TO_F32

    L, H, KVH, D = 1, 14, 2, 64
    pool, seq = make_cache(L, KVH, D, 64)
    q = np.ones((1, H, D), np.float32)
    out = np.empty_like(q)
    pa.paged_attention_serial(q, pool.data, pool.data_f32, F16_TO_F32, 1, pool.group, pool.scale_offset,
                              seq.table[:seq.n_blocks], 0, KVH, BLOCK, 63, np.float32(0.125), 1, out,
                              pa.attention_tag(isa))
    asm = pa._task_simd.inspect_asm(pa._task_simd.signatures[0])
    ins = []  # (mnemonic, operands)
    for ln in asm.splitlines():
        if ln.startswith("\t") and not ln.strip().startswith("."):
            parts = ln.split(None, 1)
            ins.append((parts[0], parts[1] if len(parts) > 1 else ""))

    def count(pred):
        return sum(1 for op, args in ins if pred(op, args))

    return {
        "isa": isa,
        "instructions": len(ins),
        "vcvtph2ps": count(lambda op, a: op == "vcvtph2ps"),
        "vcvtph2ps_zmm": count(lambda op, a: op == "vcvtph2ps" and "zmm" in a),
        "vcvtph2ps_ymm": count(lambda op, a: op == "vcvtph2ps" and "ymm" in a and "zmm" not in a),
        "fma_zmm": count(lambda op, a: op.startswith("vfmadd") and op.endswith("ps") and "zmm" in a),
        "fma_ymm": count(lambda op, a: op.startswith("vfmadd") and op.endswith("ps") and "ymm" in a and "zmm" not in a),
        "shuffles_zmm": count(lambda op, a: re.match(r"v(perm|shuf|insert|unpck)", op) is not None and "zmm" in a),
        "vrndscaleps (vector exp)": count(lambda op, a: op == "vrndscaleps" or op == "vroundps"),
        "prefetcht1": count(lambda op, a: op == "prefetcht1"),
        "vector_spills": count(lambda op, a: "(%rsp)" in a and ("zmm" in a or "ymm" in a)),
        "zmm_registers": len(set(re.findall(r"zmm\d+", asm))),
        "ymm_registers": len(set(re.findall(r"ymm\d+", asm))),
    }


def _asm_in_child(isa: str) -> dict:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, LLCINFER_NUMBA_CACHE="0", PYTHONPATH=path)
    r = subprocess.run([sys.executable, __file__, "--asm-only", isa], capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode:
        return {"isa": isa, "error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="*", default=list(MODELS), help=f"of {', '.join(MODELS)} (prefixes work)")
    ap.add_argument("--ctx", nargs="*", type=int, default=[4096, 8192, 16384])
    ap.add_argument("--threads", nargs="*", type=int, default=[1, 2])
    ap.add_argument("--isa", nargs="*", default=None, help="paths, new first (default: the best one and generic)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", default=None, help="default perf/results/attention-<date>.json")
    ap.add_argument("--no-asm", action="store_true")
    ap.add_argument("--asm-only", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.asm_only:
        print(json.dumps(asm_summary(args.asm_only)))
        return None

    import numba

    from llcinfer.hw.cpu import machine_info
    from llcinfer.kernels import isa as isa_mod
    from llcinfer.kernels.simd import lanes

    load0 = os.getloadavg()
    best = isa_mod.current_isa()
    isas = args.isa or ([best, "generic"] if best != "generic" else ["generic"])
    models = {n: MODELS[n] for m in args.models for n in MODELS if n.startswith(m)}
    rows = []
    simd = [i for i in isas if i != "generic"]
    peaks = {(i, th): fma_peak(th, i) for i in simd for th in args.threads}  # vector FMAs/s
    for (i, th), v in peaks.items():
        print(f"FMA peak {i}, {th} thread(s): {v / 1e9:.2f} G vector FMAs/s", flush=True)
    head = (f"{'model':13s} {'ctx':>6s} {'thr':>3s} {'KV MiB':>7s}  " + "  ".join(f"{i + ' ms':>15s}" for i in isas)
            + "  " + "  ".join(f"{i + ' GB/s':>17s}" for i in isas) + f"  {'probe GB/s':>10s}  "
            + "  ".join(f"{i + ' %probe':>19s}" for i in isas) + (f"  {'speedup':>7s}" if len(isas) > 1 else "")
            + "".join(f"  {i + ' %FMA peak':>22s}" for i in simd))
    print(head, flush=True)
    for name, (L, H, KVH, D) in models.items():
        for ctx in args.ctx:
            for th in args.threads:
                kv_bytes, t, probe = bench_case(L, H, KVH, D, ctx, th, isas, args.reps)
                gbs = {i: kv_bytes / t[i] / 1e9 for i in isas}
                r = {"model": name, "layers": L, "heads": H, "kv_heads": KVH, "head_dim": D, "ctx": ctx,
                     "threads": th, "kv_bytes_per_token": kv_bytes, "probe_gbs": round(probe / 1e9, 2),
                     "paths": {i: {"ms": round(t[i] * 1e3, 3), "gbs": round(gbs[i], 2),
                                   "pct_probe": round(100 * gbs[i] * 1e9 / probe, 1)} for i in isas}}
                if len(isas) > 1:
                    r["speedup"] = round(t[isas[-1]] / t[isas[0]], 2)
                for i in simd:  # FMAs issued per second against the machine's FMA throughput
                    fmas = attention_fmas(L, H, D, ctx, lanes(i))
                    r["paths"][i]["pct_fma_peak"] = round(100 * fmas / t[i] / peaks[i, th], 1)
                rows.append(r)
                print(f"{name:13s} {ctx:6d} {th:3d} {kv_bytes / 2**20:7.1f}  "
                      + "  ".join(f"{t[i] * 1e3:15.2f}" for i in isas) + "  "
                      + "  ".join(f"{gbs[i]:17.2f}" for i in isas) + f"  {probe / 1e9:10.2f}  "
                      + "  ".join(f"{r['paths'][i]['pct_probe']:18.1f}%" for i in isas)
                      + (f"  {r['speedup']:6.2f}x" if len(isas) > 1 else "")
                      + "".join(f"  {r['paths'][i]['pct_fma_peak']:21.1f}%" for i in simd), flush=True)
    asm = []
    if not args.no_asm:
        for i in isas:
            if i != "generic":
                asm.append(_asm_in_child(i))
                print("asm", json.dumps(asm[-1]), flush=True)
    res = {"date": datetime.date.today().isoformat(), "machine": machine_info(args.threads),
           "cpu_isas": isa_mod.supported_isas(),
           "numba": numba.__version__, "block_size": BLOCK, "kv_type": "f16", "reps": args.reps,
           "method": "median per-token time (all layers, 1 query row, ctx keys) via paged_attention, paths alternating",
           "fma_peak_per_s": {f"{i}/{th}": round(v) for (i, th), v in peaks.items()},
           "loadavg_before_after": [round(load0[0], 2), round(os.getloadavg()[0], 2)],  # shared host
           "results": rows, "asm": asm}
    path = Path(args.json) if args.json else ROOT / "perf" / "results" / f"attention-{res['date']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {path}")
    return res


if __name__ == "__main__":
    main()
