#!/usr/bin/env python3
"""The pacer's margin (speculative/pacer.py ``MARGIN``) against plain decoding: one
``LLM``, one lookup speculator per margin, and plain decoding, in rotating order.

    python perf/spec_margin_ab.py -m smollm2-135m --spec ngram --workload free-chat -r 16 --margins 0.02,0.005

The margin is what drafting may cost beyond what it gains; it prices how soon drafting
notices text it can copy again.  Each round runs plain and every margin once (the order
rotated, backwards on odd rounds); per margin the figure is the median over rounds of its
TPOT over plain's in the same round.  The speculators share the start-up verification
cost; a suffix drafter's history is emptied before each of its runs.  Every output must
equal plain greedy decoding's.  Nothing else may run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from llcinfer import LLM
from llcinfer.bench.spec import SPEC_CTX, WARM_UP, WORKLOADS
from llcinfer.engine.speculation import Speculator
from llcinfer.errors import LLCInferError
from llcinfer.speculative import pacer
from llcinfer.speculative.lookup import NgramDrafter, SuffixDrafter
from llcinfer.weights.repack_cache import wait_loaded

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_trees import quartiles  # noqa: E402


def run(model: str, spec: str, workload: str, rounds: int, margins: list[float], threads: int) -> list[str]:
    llm = LLM(model, threads=threads, n_ctx=SPEC_CTX, progress=False, speculative=spec)
    try:
        wait_loaded()
        first = llm.engine.speculator
        specs = {}
        for m in margins:
            sp = Speculator(NgramDrafter() if spec == "ngram" else SuffixDrafter())
            sp.cost, sp.executor = first.cost, first.executor
            specs[m] = sp
        configs = [None, *margins]  # None: plain
        msgs = [{"role": "user", "content": WORKLOADS[workload]}]

        def generate(c, prompt, n):
            llm.engine.speculator = None if c is None else specs[c]
            if c is not None:
                pacer.MARGIN = c
                if hasattr(specs[c].drafter, "forget_history"):
                    specs[c].drafter.forget_history()
            text = llm.chat(prompt, max_tokens=n, temperature=0, ignore_eos=True)
            return text, llm.last_stats.tpot_ms

        for c in configs:  # every program shape built once, each way
            generate(c, WARM_UP, 16)
        tpot = {c: [] for c in configs}
        for r in range(rounds):
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            texts = {}
            for c in order if r % 2 == 0 else order[::-1]:
                texts[c], t = generate(c, msgs, 192)
                tpot[c].append(t)
            if len(set(texts.values())) != 1:
                raise SystemExit("error: a speculative output differs from plain greedy decoding")
        plain_ms = statistics.median(tpot[None])
        lines = [f"{model} {spec} {workload}: plain TPOT median {plain_ms:.2f} ms, {rounds} rounds"]
        for m in margins:
            median, q1, q3 = quartiles([a / b for a, b in zip(tpot[m], tpot[None])])
            st = specs[m].stats
            lines.append(f"  MARGIN {m}: spec / plain median {median:.3f} (quartiles {q1:.3f}-{q3:.3f}), "
                         f"{st.verifications} verifications, {st.accepted} accepted, "
                         f"{st.draft_seconds * 1e3:.0f} ms drafting")
        return lines
    finally:
        llm.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--spec", default="ngram", choices=["ngram", "suffix"])
    ap.add_argument("--workload", default="free-chat", choices=list(WORKLOADS))
    ap.add_argument("-r", "--rounds", type=int, default=12)
    ap.add_argument("--margins", default="0.02,0.005")
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()
    try:
        margins = [float(m) for m in a.margins.split(",") if m]
    except ValueError:
        ap.error(f"--margins takes comma-separated numbers (got {a.margins!r})")
    if not margins or any(not 0 <= m < 1 for m in margins) or a.rounds < 1:
        ap.error("--margins: numbers in [0, 1); --rounds: at least 1")
    try:
        print("\n".join(run(a.model, a.spec, a.workload, a.rounds, margins, a.threads)))
    except LLCInferError as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
