"""Weights on 2 MiB pages against the repack cache file's 4 KiB page-cache pages: one
thread runs every repacked matrix of a model once (M = 1, the decode step's matmuls in
order), from the file mapping and from an anonymous copy advised onto huge pages
(llcinfer/weights/hugepages.py), alternately (A B A B), medians.

    python perf/hugepages_bench.py                       # the three catalog models
    python perf/hugepages_bench.py --models smollm2-135m --reps 9 --json out.json

GB/s = packed weight bytes / time of the chain.  The matmul kernel and the bytes are the
same in both columns; only the pages differ.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llcinfer.weights import hugepages  # noqa: E402
from llcinfer.api import LLM  # noqa: E402
from llcinfer.kernels.act_quant import quantize_activations_int  # noqa: E402
from llcinfer.kernels.simd import make_tag  # noqa: E402
from llcinfer.kernels.vnni_matmul import vnni_matmul  # noqa: E402

MODELS = ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]


def _anon_huge_kb() -> int:
    m = re.search(r"AnonHugePages:\s+(\d+)", Path("/proc/self/smaps_rollup").read_text())
    return int(m.group(1)) if m else -1


def bench(model: str, reps: int) -> dict:
    os.environ["LLCINFER_HUGEPAGES"] = "0"  # the cache maps its file: the 4 KiB baseline
    llm = LLM(model, threads=1, progress=False)
    w = llm.model.weights
    lins = [m for lw in w.layers for m in (lw.wq, lw.wk, lw.wv, lw.wo, lw.w_gate, lw.w_up, lw.w_down)] + [w.output]
    tag = make_tag(lins[0].isa)
    packed = [lin.prepare() for lin in lins]
    total = sum(p.nbytes for p in packed)
    arena = hugepages.anonymous(total + len(packed) * 64)
    os.environ.pop("LLCINFER_HUGEPAGES")
    advised = hugepages.advise(arena)
    big = np.frombuffer(arena, np.uint8)
    file_calls, huge_calls, off = [], [], 0
    rng = np.random.default_rng(0)
    for lin, p in zip(lins, packed):
        x = rng.standard_normal((1, lin.cols)).astype(np.float32)
        q, d, s = quantize_activations_int(x, lin.act_kind)
        h = big[off:off + p.nbytes].reshape(p.shape)
        h[:] = p
        off += -(-p.nbytes // 64) * 64
        y = np.empty((1, lin.rows), np.float32)
        file_calls.append((q, d, s, p, int(lin.qtype), y))
        huge_calls.append((q, d, s, h, int(lin.qtype), y))

    def run(calls):
        for q, d, s, p, qt, y in calls:
            vnni_matmul(q, d, s, p, qt, y, tag)

    run(file_calls)
    run(huge_calls)
    times = {"file_4k": [], "anon_2m": []}
    for _ in range(reps):
        for key, calls in (("file_4k", file_calls), ("anon_2m", huge_calls)):
            t0 = time.perf_counter()
            run(calls)
            times[key].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"model": model, "bytes": total, "matrices": len(lins), "advised": advised,
            "anon_huge_kb": _anon_huge_kb(), "ms": {k: v * 1e3 for k, v in med.items()},
            "gbs": {k: total / v / 1e9 for k, v in med.items()}, "speedup": med["file_4k"] / med["anon_2m"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="*", default=MODELS)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from llcinfer.jit import set_threads
    set_threads(1)
    rows = []
    print("| model | MiB | file (4 KiB) GB/s | anon (2 MiB) GB/s | speedup |\n|---|---|---|---|---|")
    for m in a.models:
        r = bench(m, a.reps)
        rows.append(r)
        print(f"| {m} | {r['bytes'] / 2**20:.0f} | {r['gbs']['file_4k']:.1f} | {r['gbs']['anon_2m']:.1f} | "
              f"{r['speedup']:.2f}x |", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"threads": 1, "reps": a.reps, "results": rows}, indent=1))


if __name__ == "__main__":
    main()
