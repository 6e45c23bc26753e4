"""Predicted vs measured TPOT: the planner's analytical model against the executor.

    python perf/plan_vs_measured.py [--threads 2] [--reps 5] [--tokens 16] [--quick]
                                    [--json perf/results/plan-vs-measured-DATE.json]

For each configuration (catalog model x context depth x concurrent sequences) the planner
plans for this machine (cached bandwidth curve, saved calibration: perf/calibrate.py); the
executor then runs the chosen plan's domains, and the best plan of the other kind (shared
vs split) too, each measured as the median step time over repetitions (``measure_tpot``).
A row reports both predictions and measurements; error = predicted / measured - 1 of the
chosen plan, and whether the chosen kind was also the faster one measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llcinfer.model import catalog  # noqa: E402
from llcinfer.engine.placement import domains_from_plan  # noqa: E402
from llcinfer.model.gguf_file import GGUFFile  # noqa: E402
from llcinfer.jit import set_threads  # noqa: E402
from llcinfer.engine.transformer import Transformer  # noqa: E402
from llcinfer.executor import DecodeExecutor, Domains  # noqa: E402
from llcinfer.kv import PagedSequence  # noqa: E402
from llcinfer.planner import detect_machine, make_plan, workload_from_model  # noqa: E402
from llcinfer.weights.repack_cache import wait_loaded  # noqa: E402

CONFIGS = {  # model -> [(ctx, concurrency)]
    "smollm2-135m": [(256, 1), (4096, 1), (256, 2), (256, 4), (2048, 4)],
    "qwen2.5-coder-0.5b": [(256, 1), (4096, 1), (256, 4), (2048, 2)],
    "qwen2.5-coder-1.5b": [(256, 1), (256, 2)],
}


def measure_tpot(model, domains: Domains, ctx: int, concurrency: int, n_tokens: int = 16, reps: int = 5,
                 executor: DecodeExecutor | None = None) -> dict:
    """Decode TPOT of the executor under ``domains``: each of ``concurrency`` sequences is
    grown to ``ctx`` tokens without running a prompt (zeros in the pool: attention costs the
    same whatever the keys), then ``n_tokens`` steps of one token per sequence run; the
    sequences are rolled back before each repetition.  {'tpot_s': median step time,
    'steps_s': [per repetition], 'tokens_per_s': ...}"""
    own = executor is None
    ex = executor or DecodeExecutor(model, domains)
    n_ctx = ctx + n_tokens + 1
    pool, _ = model.new_pool(n_ctx, concurrency, prefix_sharing=False)
    seqs = [PagedSequence(pool, n_ctx, None, f"s{i}") for i in range(concurrency)]
    rng = np.random.default_rng(0)
    try:
        for s in seqs:
            s.n_tokens = ctx
        toks = rng.integers(0, model.config.vocab_size, concurrency).tolist()
        ex.step(seqs, toks)  # warm: compile, first touch of the new blocks
        wait_loaded()  # and the weights on 2 MiB pages: the steady state
        per_rep = []
        for _ in range(reps):
            for s in seqs:
                s.truncate(ctx)
            t0 = time.perf_counter()
            for _ in range(n_tokens):
                ex.step(seqs, toks)
            per_rep.append((time.perf_counter() - t0) / n_tokens)
    finally:
        for s in seqs:
            s.free()
        if own:
            ex.close()
    tpot = statistics.median(per_rep)
    return {"tpot_s": tpot, "steps_s": per_rep, "tokens_per_s": concurrency / tpot}


def other_kind(plan):
    """The best runner-up whose kind differs from the chosen plan's (None if none)."""
    for p in plan.runners_up:
        if p.kind != plan.kind and len({d.stage for d in p.domains}) == 1:
            return p
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="one config per model")
    ap.add_argument("--models", default=",".join(CONFIGS))
    ap.add_argument("--json")
    a = ap.parse_args()
    threads = set_threads(a.threads)
    machine = detect_machine(probe=False)
    rows = []
    for name in a.models.split(","):
        model = Transformer(GGUFFile(catalog.resolve_model(name, progress=False)))
        for ctx, conc in CONFIGS[name][:1 if a.quick else None]:
            plan = make_plan(machine, workload_from_model(model, ctx=ctx, concurrency=conc), threads=threads)
            row = {"model": name, "ctx": ctx, "concurrency": conc, "threads": threads}
            for tag, p in (("chosen", plan), ("other", other_kind(plan))):
                if p is None:
                    continue
                dom = domains_from_plan(p, model.config)
                meas = measure_tpot(model, dom, ctx, conc, n_tokens=a.tokens, reps=a.reps)
                row[tag] = {"kind": p.kind, "label": p.label, "weight_cores": list(dom.weight),
                            "attention_cores": list(dom.attention), "micro_batches": dom.micro_batches,
                            "predicted_ms": p.prediction.tpot_s * 1e3, "measured_ms": meas["tpot_s"] * 1e3,
                            "measured_reps_ms": [t * 1e3 for t in meas["steps_s"]]}
            c = row["chosen"]
            row["error"] = c["predicted_ms"] / c["measured_ms"] - 1
            if "other" in row:
                row["chosen_faster_measured"] = c["measured_ms"] <= row["other"]["measured_ms"]
            rows.append(row)
            o = row.get("other", {})
            print(f"{name:20s} ctx {ctx:5d} x{conc}  {c['kind']:6s} pred {c['predicted_ms']:7.2f} ms  "
                  f"meas {c['measured_ms']:7.2f} ms  err {row['error']:+6.1%}   "
                  f"{o.get('kind', '-'):6s} pred {o.get('predicted_ms', float('nan')):7.2f}  "
                  f"meas {o.get('measured_ms', float('nan')):7.2f}", flush=True)
    out = Path(a.json or f"perf/results/plan-vs-measured-{datetime.date.today()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine.summary(), "rows": rows}, indent=1) + "\n")
    ok = sum(abs(r["error"]) <= 0.15 for r in rows)
    print(f"{ok}/{len(rows)} within 15%; wrote {out}")


if __name__ == "__main__":
    main()
