"""Predicted vs measured TPOT: the planner's model against the executor, with the closed loop.

    python perf/plan_vs_measured.py [--threads 2] [--reps 5] [--tokens 16] [--models a,b]
                                    [--json perf/results/plan-vs-measured-DATE.json] [--append]

For each configuration (catalog model x context x concurrent sequences) the planner plans
for this machine with the calibration measured at first use (engine/calibrate.py: run here
if the cache lacks it, its cost reported); then the chosen plan and the best runner-up of
the other kind (shared vs split) run on the executor, every configuration of a model in one
alternation (``measure_alternating``: A B C ... A B C ..., median step over repetitions, on
written KV), so that a noisy host's slow minutes fall on all rows of the model alike, not on
whichever row ran then; the faster of each row's two is kept, as ``LLM`` does at start-up.

The feedback starts empty for every run of the script (the cache's observations are not
used), and each row's measurements are fed back only after the row: a row's
``predicted_ms`` is the planner's prediction with what the earlier rows fed back
(``Calibration.feedback``: the same model and number of sequences at other contexts),
never its own measurement; ``model_ms`` is the model with no feedback at all and
``attention_ms`` its attention part.  Errors are predicted / measured - 1 of the chosen
plan.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llcinfer.engine.calibrate import ensure_calibration  # noqa: E402
from llcinfer.engine.placement import domains_from_plan  # noqa: E402
from llcinfer.engine.plan_check import measure_alternating  # noqa: E402
from llcinfer.engine.transformer import Transformer  # noqa: E402
from llcinfer.errors import LLCInferError  # noqa: E402
from llcinfer.jit import set_threads  # noqa: E402
from llcinfer.model import catalog  # noqa: E402
from llcinfer.model.gguf_file import GGUFFile  # noqa: E402
from llcinfer.planner import detect_machine, make_plan, workload_from_model, workload_key  # noqa: E402
from llcinfer.planner.closed_loop import other_kind  # noqa: E402

MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
CONFIGS = [(ctx, conc) for ctx in (64, 4096, 16384) for conc in (1, 4)]


def _side(p, meas: dict, dom) -> dict:
    return {"kind": p.kind, "label": p.label, "shape": p.shape, "weight_cores": list(dom.weight),
            "attention_cores": list(dom.attention), "micro_batches": dom.micro_batches,
            "predicted_ms": p.prediction.tpot_s * 1e3, "model_ms": p.prediction.model_s * 1e3,
            "attention_ms": p.prediction.attention_s * 1e3,
            "measured_ms": meas["tpot_s"] * 1e3, "measured_reps_ms": [t * 1e3 for t in meas["steps_s"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--json")
    ap.add_argument("--append", action="store_true",
                    help="add rows to the JSON file and take its observations as the start")
    a = ap.parse_args()
    if a.threads < 1 or a.reps < 1 or a.tokens < 1:
        ap.error("--threads, --reps and --tokens take positive integers")
    threads = set_threads(a.threads)
    machine = detect_machine(probe=False)
    out = Path(a.json or f"perf/results/plan-vs-measured-{datetime.date.today()}.json")
    doc = json.loads(out.read_text()) if a.append and out.exists() else {"rows": [], "calibration_s": {}}
    for name in a.models.split(","):
        model = Transformer(GGUFFile(catalog.resolve_model(name, progress=False)))
        t0 = time.perf_counter()
        cal = ensure_calibration(model, machine, threads)
        doc["calibration_s"][name] = round(time.perf_counter() - t0, 2)
        cal.observed = list(doc.get("observed", []))  # what the earlier rows fed back
        workloads = [workload_from_model(model, ctx=ctx, concurrency=conc) for ctx, conc in CONFIGS]
        # every configuration's chosen plan and other kind, as the planner sees them before
        # this model's rows feed back, timed in one alternation (all see the same moments)
        setups = {}  # (ctx, conc, label) -> (plan, domains)
        for (ctx, conc), w in zip(CONFIGS, workloads):
            plan = make_plan(machine, w, threads=threads, calibration=cal)
            for p in filter(None, (plan, other_kind(plan))):
                setups[(ctx, conc, p.label)] = (p, domains_from_plan(p, model.config))
        t1 = time.perf_counter()
        measured = dict(zip(setups, measure_alternating(
            model, [(dom, ctx, conc) for (ctx, conc, _), (_, dom) in setups.items()], n_tokens=a.tokens, reps=a.reps)))
        doc["measure_wall_s"] = {**doc.get("measure_wall_s", {}), name: round(time.perf_counter() - t1, 2)}
        for (ctx, conc), w in zip(CONFIGS, workloads):
            plan = make_plan(machine, w, threads=threads, calibration=cal)  # with the earlier rows' feedback
            row = {"model": name, "ctx": ctx, "concurrency": conc, "threads": threads}
            sides = [(tag, p, domains_from_plan(p, model.config))
                     for tag, p in (("chosen", plan), ("other", other_kind(plan))) if p is not None]
            missing = [(dom, ctx, conc) for _, p, dom in sides if (ctx, conc, p.label) not in measured]
            if missing:  # the feedback changed a plan: time the new one(s) with the row's others
                row["retimed"] = True
                got = measure_alternating(model, [(dom, ctx, conc) for _, _, dom in sides], n_tokens=a.tokens,
                                          reps=a.reps)
                measured.update({(ctx, conc, p.label): g for (_, p, _), g in zip(sides, got)})
            for tag, p, dom in sides:
                row[tag] = _side(p, measured[(ctx, conc, p.label)], dom)
            c, o = row["chosen"], row.get("other")
            row["error"] = c["predicted_ms"] / c["measured_ms"] - 1
            row["model_error"] = c["model_ms"] / c["measured_ms"] - 1
            row["chosen_faster_measured"] = o is None or c["measured_ms"] <= o["measured_ms"]
            row["kept"] = c["label"] if row["chosen_faster_measured"] else o["label"]
            for side in filter(None, (c, o)):  # feed back after the row
                cal.record(workload_key(w, threads), side["shape"], side["label"], side["kind"],
                           side["model_ms"] / 1e3, side["measured_ms"] / 1e3, side["attention_ms"] / 1e3)
            doc["rows"].append(row)
            doc["observed"] = cal.observed
            print(f"{name:20s} ctx {ctx:5d} x{conc}  {c['label'][:28]:28s} pred {c['predicted_ms']:7.2f} "
                  f"(model {c['model_ms']:7.2f}) meas {c['measured_ms']:7.2f} ms err {row['error']:+6.1%}  | "
                  f"{(o or {}).get('label', '-')[:28]:28s} pred {(o or {}).get('predicted_ms', float('nan')):7.2f} "
                  f"meas {(o or {}).get('measured_ms', float('nan')):7.2f}", flush=True)
        doc["machine"] = machine.summary()
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")
    rows = doc["rows"]
    ok = sum(abs(r["error"]) <= 0.15 for r in rows)
    ok_model = sum(abs(r["model_error"]) <= 0.15 for r in rows)
    faster = sum(r["chosen_faster_measured"] for r in rows)
    print(f"{ok}/{len(rows)} within 15% ({ok_model} without feedback); chosen plan measured fastest in "
          f"{faster}/{len(rows)}; wrote {out}")


if __name__ == "__main__":
    try:
        main()
    except LLCInferError as exc:
        sys.exit(f"error: {exc}")
