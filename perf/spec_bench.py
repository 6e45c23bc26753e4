#!/usr/bin/env python3
"""Effective TPOT of speculative decoding against plain decoding and llama.cpp: the
``llcinfer bench --spec`` measurement (llcinfer/bench/spec.py) with llama.cpp beside it
by default, for the closing tables.

    python perf/spec_bench.py -m smollm2-135m --spec ngram,suffix
    python perf/spec_bench.py -m qwen2.5-coder-1.5b --spec ngram,suffix,draft:qwen2.5-coder-0.5b \
        --workloads code-edit --json perf/results/spec-1.5b-code.json

Nothing else may run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from llcinfer.bench.spec import markdown, parse_specs, parse_workloads, run_spec_bench
from llcinfer.errors import LLCInferError


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--spec", default="ngram,suffix")
    ap.add_argument("--n", type=int, default=192)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=2)
    ap.add_argument("--workloads", default="code-edit,free-chat")
    ap.add_argument("--no-llama", action="store_true", help="ours only")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    try:
        rows = run_spec_bench(a.model, parse_specs(a.spec), parse_workloads(a.workloads), a.n, a.threads,
                              a.repetitions, not a.no_llama, lambda msg: print(msg, file=sys.stderr, flush=True))
    except LLCInferError as exc:
        sys.exit(f"error: {exc}")
    print(markdown(rows, a.model, a.threads, a.n))
    if a.json:
        Path(a.json).write_text(json.dumps({"model": a.model, "threads": a.threads, "n": a.n, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
