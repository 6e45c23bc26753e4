#!/usr/bin/env python3
"""The speculative verification cost curve: time of one verification step of T = 1..64
rows, on one sequence and spread over several, measured beside the planner's prediction
and its K_max, per model and thread count.

    python perf/verify_cost.py                                   # every catalog model, 1 and 2 threads
    python perf/verify_cost.py -m smollm2-135m -t 2 --spread 4 --plot verify.png --json out.json

Each step is one as the step loop verifies: drafted chains after a ``--depth``-token
committed prefix in one executor step (where the model runs on it; else one batched pass
with tree attention), the logits of every row; with ``--spread S`` the T rows are shared
by S sequences.  The steps are timed as the engine's start-up times them
(engine/verify_timing.py ``measure_verify_cost``): ``-r`` rounds of a plain decode step
(the executor's, where it runs), every size once and another decode step, each size the
median of its ratios to its round's decode steps.  The knee is fitted the same way on
both curves (planner/verify.py): the largest T costing at most 1.25x a 1-row forward.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from llcinfer import LLM
from llcinfer.errors import LLCInferError
from llcinfer.engine.verify_timing import measure_verify_cost
from llcinfer.planner import Calibration, cache_key, detect_machine, make_plan, workload_from_gguf
from llcinfer.planner.verify import VERIFY_ROWS, VerifyCost, predict_verify_cost

MODELS = ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]


def measure(model: str, threads: int, spread: list[int], depth: int, reps: int) -> dict:
    llm = LLM(model, threads=threads, n_ctx=depth + 2048, n_seq=max(spread), progress=False)
    try:
        eng = llm.engine
        seqs = [eng.new_sequence(f"verify {i}") for i in range(max(spread))]
        for s in seqs:
            llm.model.forward_chunks([(s, [1 + (j % 500) for j in range(depth)])])
        curves, decode = {}, {}
        for s in spread:
            rows, sec, decode[s] = measure_verify_cost(llm.model, eng.runner, seqs[:s], eng.runner.executor,
                                                       [t for t in VERIFY_ROWS if t >= s], rounds=reps)
            curves[s] = (rows, sec)
        for s in seqs:
            s.free()
        return {"curves": curves, "decode_s": decode[1], "path": str(llm.model_path)}
    finally:
        llm.close()


def predicted(path: str, model: str, threads: int, depth: int, spread: int) -> tuple[VerifyCost, list[float]]:
    m = detect_machine()
    w = workload_from_gguf(path, ctx=depth, concurrency=spread, kv_itemsize=2, name=model)
    plan = make_plan(m, w, threads=threads)
    return predict_verify_cost(plan, m, w, Calibration.load(cache_key(m)))  # the executor's hand-offs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", action="append", help="catalog name or .gguf (repeatable; default: all three)")
    ap.add_argument("-t", "--threads", type=int, action="append", help="repeatable (default: 1 and 2)")
    ap.add_argument("--spread", type=int, default=4, help="also spread the rows over this many sequences")
    ap.add_argument("--depth", type=int, default=256, help="committed prefix of each sequence")
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None, help="PNG: the curves with the measured and predicted knees")
    a = ap.parse_args()
    if a.repetitions < 1 or a.depth < 1 or a.spread < 1 or any(t < 1 for t in a.threads or []):
        ap.error("-r/--repetitions, --depth, --spread and -t/--threads take positive numbers")
    if a.plot:
        from llcinfer.bench.plot import require_matplotlib

        require_matplotlib()
    spread = sorted({1, max(1, a.spread)})
    out = []
    for model in a.model or MODELS:
        for th in a.threads or [1, 2]:
            got = measure(model, th, spread, a.depth, a.repetitions)
            for s in spread:
                rows, sec = got["curves"][s]  # [T] the sizes that fitted the pool, [T] seconds
                fit = VerifyCost.fit(rows, sec, got["decode_s"]) if rows[0] == 1 else None
                pred, psec = predicted(got["path"], model, th, a.depth, s)
                psec = [p for t, p in zip(VERIFY_ROWS, psec) if t in rows]
                out.append({"model": model, "threads": th, "spread": s, "rows": rows, "measured_s": sec,
                            "predicted_s": psec, "decode_s": got["decode_s"],
                            "measured": fit.to_dict() if fit else None, "predicted": pred.to_dict()})
                knee = f"K_max measured {fit.k_max:2d} / " if fit else ""
                print(f"{model} t={th} spread={s}: decode {got['decode_s'] * 1e3:.2f} ms; {knee}predicted "
                      f"{pred.k_max}", flush=True)
                print("   T  " + " ".join(f"{t:7d}" for t in rows))
                print("  ms  " + " ".join(f"{x * 1e3:7.2f}" for x in sec))
                print("  pred" + " ".join(f"{x * 1e3:7.2f}" for x in psec))
    if a.json:
        Path(a.json).write_text(json.dumps({"depth": a.depth, "results": out}, indent=1))
    if a.plot:
        plot(out, a.plot)


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in results))
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        for r in (r for r in results if r["model"] == model):
            label = f"{r['threads']} thr" + (f", {r['spread']} seqs" if r["spread"] > 1 else "")
            line, = ax.plot(r["rows"], np.array(r["measured_s"]) * 1e3, marker="o", label=f"measured {label}")
            ax.plot(r["rows"], np.array(r["predicted_s"]) * 1e3, ls="--", color=line.get_color())
            if r["spread"] == 1:
                ax.axvline(r["predicted"]["k_max"], ls=":", color=line.get_color())
        ax.set(xscale="log", yscale="log", xlabel="rows verified (T)", ylabel="ms per forward", title=model)
        ax.legend(fontsize=7)
    fig.suptitle("verification cost: measured (solid), planner (dashed), predicted K_max (dotted)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    try:
        main()
    except LLCInferError as e:
        raise SystemExit(f"error: {e}") from None
