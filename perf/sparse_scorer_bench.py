"""The sparse indexer's selection alone (kernels/sparse_rows.select_rows): ms per layer
for one decode row, on random index entries in blocks scattered over the pool, at the
shapes of SmolLM2-135M (3 KV heads x 3) and Qwen2.5-0.5B (2 KV heads x 7), rank 16.

    python perf/sparse_scorer_bench.py [--threads 2] [--phi exp] [--reps 100]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llcinfer import jit  # noqa: E402
from llcinfer.engine.calibrate_sparse import scorer_seconds  # noqa: E402
from llcinfer.sparse import SparseConfig  # noqa: E402

SHAPES = [("smollm2-135m", 3, 3, 8000), ("qwen2.5-0.5b", 2, 7, 16384), ("qwen2.5-0.5b", 2, 7, 32768)]


def one(KVH, G, n_keys, phi, threads, reps, r=16, D=64, top_k=1024):
    conf = SparseConfig(top_k=top_k, sink=16, window=256, min_context=0, phi=phi, agg="sum",
                        reuse_steps=0).kernel_conf(16)  # SP_*: 1 sink block, window 256, no reuse
    return scorer_seconds(KVH, G, D, r, n_keys, conf, threads, reps) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--phi", choices=["exp", "relu"], default="exp")
    ap.add_argument("--reps", type=int, default=100)
    a = ap.parse_args()
    if a.threads < 1 or a.reps < 1:
        ap.error(f"--threads and --reps must be positive (got {a.threads}, {a.reps})")
    jit.set_threads(a.threads)
    for name, KVH, G, n in SHAPES:
        ms = one(KVH, G, n, a.phi, a.threads, a.reps)
        print(f"{name} d{n} ({KVH}x{G} heads) threads {a.threads} phi {a.phi}: {ms:.3f} ms/layer, "
              f"{ms * 1e6 / -(-n // 16):.0f} ns/block")


if __name__ == "__main__":
    main()
