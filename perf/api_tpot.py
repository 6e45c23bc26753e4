"""The API's own decode TPOT next to ``llcinfer bench``'s, in one process and alternated:
``LLM(model)`` with its defaults (the context and plan ``llcinfer bench`` also uses at d0),
greedy generation of N tokens past a short prompt (``last_stats``), then the bench's tg of
N tokens on the same engine (``OursBench.tg``: the step loop's runner, no sampling), per
repetition.  It shows whether the bench measures the configuration a user gets.

    python perf/api_tpot.py -m qwen2.5-coder-1.5b [-n 128] [-r 5] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llcinfer.bench.ours import OursBench, default_ctx  # noqa: E402
from llcinfer.errors import LLCInferError  # noqa: E402
from llcinfer.model import catalog  # noqa: E402

PROMPT = "def fibonacci(n):"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.n < 2 or a.r < 1:
        sys.exit("api_tpot.py: -n must be at least 2 and -r at least 1")
    try:
        path = catalog.resolve_model(a.model, progress=False)
        bench = OursBench(str(path), a.threads, default_ctx(path))
    except LLCInferError as exc:
        sys.exit(f"api_tpot.py: {exc}")
    llm = bench.llm
    llm.generate(PROMPT, max_tokens=8, temperature=0)  # first token paths warm
    bench.warmup()
    api, tg = [], []
    for _ in range(a.r):
        llm.reset()
        llm.generate(PROMPT, max_tokens=a.n, temperature=0, ignore_eos=True)
        api.append(llm.last_stats.generation_tps)
        tg.append(a.n / bench.tg(a.n))
        print(f"  rep: api {api[-1]:.2f} t/s, bench tg{a.n} {tg[-1]:.2f} t/s", file=sys.stderr, flush=True)
    doc = {"model": a.model, "threads": a.threads, "n_ctx": llm.n_ctx, "plan": llm.plan.label,
           "executor_note": llm.executor_note, "samples_tps": api, "bench_tg_samples_tps": tg,
           "tps_median": statistics.median(api), "tpot_ms": 1e3 / statistics.median(api),
           "bench_tg_tps_median": statistics.median(tg),
           "api_over_bench_tpot": statistics.median(tg) / statistics.median(api)}
    llm.close()
    print(f"{a.model}: API {doc['tps_median']:.2f} t/s (TPOT {doc['tpot_ms']:.2f} ms), bench tg{a.n} "
          f"{doc['bench_tg_tps_median']:.2f} t/s, API TPOT / bench TPOT {doc['api_over_bench_tpot']:.3f}; "
          f"n_ctx {doc['n_ctx']}, plan: {doc['plan']}")
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
