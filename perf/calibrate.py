"""Measure the planner's calibration constants on this machine and save them.

    python perf/calibrate.py [--threads 2] [--dry-run]

Measured here, each a median over repetitions in this run:
  handoff_ns                one dependency hand-off between two workers (executor/graph.py)
  barrier_ns                one numba thread-pool region (the simple path's per-operator barrier)
  attention_flops_per_core  decode attention over an f16 paged cache (SmolLM2 and Qwen shapes,
                            ctx 4096, one thread): 4 * H * D * ctx flops per layer / time
The matmul rates (unpack_weights_per_core, matmul_macs_per_core) and the rest keep the
defaults of cost.py, fitted to one-core kernel runs on this machine.  Writes the calibration to
$LLCINFER_HOME/machine/calibration-<machine key>.json and prints it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llcinfer.executor import WorkerPool, default_domains  # noqa: E402
from llcinfer.executor.graph import handoff_ns  # noqa: E402
from llcinfer.kernels.jit import set_threads  # noqa: E402
from llcinfer.planner import detect_machine  # noqa: E402
from llcinfer.planner.cost import Calibration  # noqa: E402


def _median_time(fn, reps: int = 7, inner: int = 1) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        ts.append((time.perf_counter() - t0) / inner)
    return statistics.median(ts)


def attention_rate(ctx: int = 4096) -> float:
    """flops/s of one thread on decode attention (f16 paged pool), median of two shapes."""
    from llcinfer.kernels.paged_attention import paged_attention
    from llcinfer.kernels.tables import F16_TO_F32
    from llcinfer.kv import new_pool, PagedSequence

    rates = []
    for H, KVH, D in ((9, 3, 64), (14, 2, 64), (12, 2, 128)):
        pool, _ = new_pool(1, KVH, D, ctx + 1, 1, "f16", 16, 1 << 31, False)
        seq = PagedSequence(pool, ctx + 1)
        seq.n_tokens = ctx
        rng = np.random.default_rng(0)
        k = rng.standard_normal((ctx, KVH, D)).astype(np.float32)
        seq.store(0, 0, k, k)
        q = rng.standard_normal((1, H, D)).astype(np.float32)
        out = np.empty_like(q)
        table = seq.table[:seq.n_blocks]

        def run():
            paged_attention(q, pool.data, pool.data_f32, F16_TO_F32, pool.kind, pool.group, pool.scale_offset, table,
                            0, KVH, 16, ctx - 1, np.float32(0.125), out, threads=1)

        rates.append(4.0 * H * D * ctx / _median_time(run, inner=5))
        seq.free()
    return float(statistics.median(rates))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dry-run", action="store_true", help="print, do not save")
    a = ap.parse_args()
    threads = set_threads(a.threads)
    cal = Calibration()
    pool = WorkerPool(list(default_domains(threads).cores))
    cal.handoff_ns = handoff_ns(pool)
    pool.close()
    from sync_bench import region_ns

    cal.barrier_ns = region_ns(threads)
    set_threads(1)
    cal.attention_flops_per_core = attention_rate()
    set_threads(threads)
    key = detect_machine(probe=False).key()
    for k in ("handoff_ns", "barrier_ns", "attention_flops_per_core"):
        print(f"{k:28s} {getattr(cal, k):.4g}")
    if not a.dry_run:
        print("saved", cal.save(key))
    else:
        print(asdict(cal))


if __name__ == "__main__":
    main()
