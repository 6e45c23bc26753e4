"""The API's own decode TPOT: ``LLM(model)`` with its defaults, greedy generation of N
tokens past a short prompt, ``last_stats`` per repetition.  Next to ``llcinfer bench`` at
d0 it shows whether the bench measures the configuration a user gets.

    python perf/api_tpot.py -m qwen2.5-coder-1.5b [-n 128] [-r 5] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llcinfer import LLM  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    llm = LLM(a.model, threads=a.threads, progress=False)
    llm.generate("def fibonacci(n):", max_tokens=8, temperature=0)  # first token paths warm
    tps = []
    for _ in range(a.r):
        llm.reset()
        llm.generate("def fibonacci(n):", max_tokens=a.n, temperature=0, ignore_eos=True)
        tps.append(llm.last_stats.generation_tps)
        print(f"  api rep: {tps[-1]:.2f} t/s", file=sys.stderr, flush=True)
    doc = {"model": a.model, "threads": a.threads, "n_ctx": llm.n_ctx, "plan": llm.plan.label,
           "executor_note": llm.executor_note, "samples_tps": tps,
           "tps_median": statistics.median(tps), "tpot_ms": 1e3 / statistics.median(tps)}
    llm.close()
    print(f"{a.model}: API {doc['tps_median']:.2f} t/s (TPOT {doc['tpot_ms']:.2f} ms), n_ctx {doc['n_ctx']}, "
          f"plan: {doc['plan']}")
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
