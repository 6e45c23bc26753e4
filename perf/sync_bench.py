"""Synchronisation microbenchmark: one dependency hand-off vs one barrier, and barriers
per generated token before (a thread-pool region per operator) and after (the executor).

    python perf/sync_bench.py [--model smollm2-135m] [--threads 2] [--json perf/results/sync-DATE.json]

Figures are medians over repetitions, measured in this run:
  handoff      a chain of tasks alternating between workers (each edge waits on a counter)
  spin barrier all workers meet on one atomic counter (what a barrier per operator costs
               at best)
  pool region  a numba prange region launched and joined (the batched path's barrier:
               one per operator)
Per token: pool regions the batched forward pass launches (counted by wrapping the parallel
kernels) vs executor jobs (1) and the dependency waits in its program.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import numba
import numpy as np
from numba import prange

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from llcinfer.executor import WorkerPool, default_domains  # noqa: E402
from llcinfer.jit import parallel_kernel, set_threads  # noqa: E402
from task_graphs import barrier_ns, handoff_ns  # noqa: E402  (tests/task_graphs.py)


@parallel_kernel
def _empty_region(out):
    for i in prange(out.shape[0]):
        out[i] += 1


def region_ns(threads: int, n: int = 20000, reps: int = 5) -> float:
    out = np.zeros(threads, np.int64)
    _empty_region(out)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            _empty_region(out)
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times) * 1e9


def regions_per_token(model_name: str, threads: int) -> dict:
    """Pool regions per decode token on the batched forward pass, and the executor's figures."""
    import llcinfer.kernels as K
    import llcinfer.kernels.paged_attention as PA
    from llcinfer.api import LLM
    from llcinfer.weights.repack_cache import wait_loaded

    llm = LLM(model_name, threads=threads, n_ctx=512, progress=False)
    wait_loaded()  # weights on 2 MiB pages before timing
    model, cache, executor = llm.model, llm.engine.new_sequence("sync"), llm.engine.runner.executor
    count = [0]

    def counted(fn):
        def wrapper(*a, **k):
            count[0] += 1
            return fn(*a, **k)
        return wrapper

    saved = (K.vnni_matmul, K.vnni_matmul3, PA.paged_attention_parallel)
    K.vnni_matmul, K.vnni_matmul3, PA.paged_attention_parallel = (counted(f) for f in saved)
    try:
        model.forward([1, 2, 3], cache)
        count[0] = 0
        model.forward([4], cache)  # a decode row on the batched forward pass
        simple = count[0]
    finally:
        K.vnni_matmul, K.vnni_matmul3, PA.paged_attention_parallel = saved
    executor.step([cache], [5])
    prog = executor.last_program
    return {"batched_path_regions_per_token": simple, "executor_jobs_per_token": 1,
            "executor_barriers_per_token": 0, "executor_dependency_waits_per_token": prog.waits_per_step,
            "executor_operators_per_token": int(prog.ops.shape[0])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    threads = set_threads(a.threads)
    pool = WorkerPool(list(default_domains(threads).cores))
    res = {"threads": threads, "numba_threading_layer": None}
    res["handoff_ns"] = handoff_ns(pool)
    res["spin_barrier_ns"] = barrier_ns(pool)
    res["pool_region_ns"] = region_ns(threads)
    res["numba_threading_layer"] = numba.threading_layer()
    pool.close()
    res |= regions_per_token(a.model, threads)
    res["model"] = a.model
    print(f"threads {threads}: hand-off {res['handoff_ns']:.0f} ns, spin barrier {res['spin_barrier_ns']:.0f} ns, "
          f"pool region ({res['numba_threading_layer']}) {res['pool_region_ns']:.0f} ns")
    print(f"{a.model}: batched path {res['batched_path_regions_per_token']} pool regions (barriers) per token; "
          f"executor 1 job, 0 barriers, {res['executor_dependency_waits_per_token']} dependency waits "
          f"over {res['executor_operators_per_token']} operators per token")
    out = Path(a.json or f"perf/results/sync-{datetime.date.today()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
