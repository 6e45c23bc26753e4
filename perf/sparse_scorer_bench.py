"""The sparse indexer's selection alone (kernels/sparse_rows.select_rows): ms per layer
for one decode row, on random index entries in blocks scattered over the pool, at the
shapes of SmolLM2-135M (3 KV heads x 3) and Qwen2.5-0.5B (2 KV heads x 7), rank 16.

    python perf/sparse_scorer_bench.py [--threads 2] [--phi exp] [--reps 100]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llcinfer import jit  # noqa: E402
from llcinfer.kernels.paged_attention import attention_tag  # noqa: E402
from llcinfer.sparse import SparseConfig  # noqa: E402
from llcinfer.kernels.sparse_rows import select_rows  # noqa: E402

SHAPES = [("smollm2-135m", 3, 3, 8000), ("qwen2.5-0.5b", 2, 7, 16384), ("qwen2.5-0.5b", 2, 7, 32768)]


def one(KVH, G, n_keys, phi, threads, reps, r=16, bs=16, D=64, top_k=1024):
    rng = np.random.default_rng(0)
    nb = -(-n_keys // bs)
    NB = nb + 100
    table = rng.permutation(NB)[:nb].astype(np.int32)  # [nb] scattered pool blocks
    idx = rng.integers(0, 256, (1, NB, KVH, r // 4, bs, 4)).astype(np.uint8)  # [slot, block, kvh, r/4, token, 4]
    isc = rng.uniform(0.001, 0.02, (1, NB, KVH, bs)).astype(np.float32)  # [slot, block, kvh, token]
    H = KVH * G
    q = rng.standard_normal((H, D)).astype(np.float32)  # [H, D]
    hb = (rng.standard_normal((H, r, D)) / 8).astype(np.float32)  # [H, r, D]
    w = np.ones(H, np.float32)  # [H]
    scores, out = np.empty((1, NB), np.float32), np.empty((1, NB), np.int32)  # [1, >= candidates], [1, >= gathered]
    keys = np.empty(1, np.int64)  # [1] keys of the gathered table
    conf = SparseConfig(top_k=top_k, sink=bs, window=256, min_context=0, phi=phi, agg="sum",
                        reuse_steps=0).kernel_conf(bs)  # SP_*: 1 sink block, window 256, no reuse
    args = (q[None], hb, 0.125, idx, isc, 0, table, n_keys - 1, bs, conf, w, threads, scores, out, keys,
            attention_tag())
    select_rows(*args)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        select_rows(*args)
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e3


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
