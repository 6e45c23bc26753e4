"""Where a decode step's time goes on the executor: cycles per operator kind, working and
waiting for input, per worker, over ``n`` tokens at a depth.

    python perf/step_profile.py qwen2.5-coder-1.5b --threads 2
    python perf/step_profile.py smollm2-135m --threads 2 --depth 4096 --json out.json

The tile waits of ROPE / ATTN (a head's projections, its rope) count as waiting.  'MB/s' is the
bytes the operator kind reads per token (weights, or KV for ATTN) over its work time on
the workers that ran it (sum of bytes / mean of the workers' work seconds): a per-kind
stream rate to set next to a read-bandwidth probe.  The cycle counter is RDTSC (constant
rate); its rate is measured against perf_counter.
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

from llcinfer.bench.ours import OursBench  # noqa: E402
from llcinfer.hw.probe import read_bandwidth  # noqa: E402
from llcinfer.bench.report import kv_bytes_read  # noqa: E402
from llcinfer.executor.tiles import (ATTN, DOWN, F_KIND, F_LAYER, F_MAT0, F_MAT1, F_MAT2, GATE_UP, LM_HEAD,  # noqa: E402
                                           MERGE, QKV, ROPE, SELECT, TOPK, WO)

KINDS = {QKV: "qkv", ROPE: "rope", SELECT: "select", TOPK: "topk", ATTN: "attn", MERGE: "merge", WO: "wo",
         GATE_UP: "gate_up", DOWN: "down", LM_HEAD: "lm_head"}


def tsc_hz() -> float:
    from numba import njit

    from llcinfer.executor.atomics import cycle_counter

    f = njit(lambda: cycle_counter())
    f()
    c0, t0 = f(), time.perf_counter()
    time.sleep(0.2)
    return (f() - c0) / (time.perf_counter() - t0)


def op_bytes(ex, ops: np.ndarray, o: int, kv_per_layer: float) -> float:
    kind = int(ops[o, F_KIND])
    if kind == ATTN:
        return kv_per_layer
    mats = [int(ops[o, f]) for f in (F_MAT0, F_MAT1, F_MAT2) if ops[o, f] >= 0 and kind != ROPE]
    return float(sum(ex.mats[m].nbytes for m in mats)) if kind in (QKV, WO, GATE_UP, DOWN, LM_HEAD) else 0.0


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--depth", type=int, default=0)
    ap.add_argument("-n", type=int, default=64, help="tokens per repetition")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    b = OursBench(a.model, a.threads, max(512, a.depth + a.n + 64))
    b.warmup()
    if a.depth:
        b.set_depth(a.depth, "synthetic")
    ex = b.runner.executor
    if ex is None:
        raise SystemExit("this model does not run on the executor")
    hz = tsc_hz()
    c = b.cfg
    kv_layer = kv_bytes_read(1, c.n_kv_head, c.head_dim, a.depth + (a.n - 1) / 2.0, b.cache.itemsize)
    rows = []
    for rep in range(a.reps):
        ex.start_profile()
        dt = b.tg(a.n)
        probe = read_bandwidth(int(b.bytes_per_token(a.depth, a.n)), a.threads)
        kinds: dict[str, dict] = {}
        for prog, prof in ex.profile.values():
            ops = prog.ops
            for o in range(ops.shape[0]):
                k = KINDS[int(ops[o, F_KIND])]
                e = kinds.setdefault(k, {"wait": np.zeros(prof.shape[0]), "work": np.zeros(prof.shape[0]), "bytes": 0.0})
                e["wait"] += prof[:, o, 0] / hz / a.n
                e["work"] += prof[:, o, 1] / hz / a.n
                e["bytes"] += op_bytes(ex, ops, o, kv_layer) if ops[o, F_LAYER] >= 0 else 0.0
        ex.profile = None
        tpot = dt / a.n
        print(f"rep {rep}: {a.n / dt:.1f} t/s, tpot {tpot * 1e3:.2f} ms, probe {probe / 1e9:.1f} GB/s, "
              f"{b.bytes_per_token(a.depth, a.n) / tpot / probe * 100:.0f}% of it")
        print(f"  {'kind':8s} {'work ms':>9s} {'wait ms':>9s} {'MB':>8s} {'GB/s':>7s} {'% probe':>8s}   (per token; per worker)")
        for k, e in kinds.items():
            work = float(e["work"].mean())
            gbs = e["bytes"] / work / 1e9 if work > 0 and e["bytes"] else 0.0
            print(f"  {k:8s} {work * 1e3:9.3f} {float(e['wait'].mean()) * 1e3:9.3f} {e['bytes'] / 1e6:8.1f} {gbs:7.1f} "
                  f"{gbs * 1e9 / probe * 100 if gbs else 0:7.0f}%   "
                  + " ".join(f"{w * 1e3:.2f}/{x * 1e3:.2f}" for w, x in zip(e["work"], e["wait"])))
        rows.append({"rep": rep, "tpot_ms": tpot * 1e3, "probe_gbs": probe / 1e9,
                     "kinds": {k: {"work_ms": (e["work"] * 1e3).tolist(), "wait_ms": (e["wait"] * 1e3).tolist(),
                                   "bytes": e["bytes"]} for k, e in kinds.items()}})
    out = {"model": a.model, "threads": a.threads, "depth": a.depth, "n": a.n, "rows": rows}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
