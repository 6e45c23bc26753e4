#!/usr/bin/env python3
"""The pacer's settings (speculative/pacer.py) against plain decoding: one ``LLM``, one
speculator per arm, and plain decoding, in rotating order.

    python perf/spec_margin_ab.py -m smollm2-135m --spec ngram --workload free-chat -r 16 --arms 0.02:0,0.005:4

An arm is ``MARGIN[:COPY_STEPS]`` (COPY_STEPS as the module has it where left out; 0:
no drafting on repeating text while overdrawn, inf: no limit to it).  The margin is
what drafting may cost beyond what it gains; with the copies' allowance it decides how
soon drafting notices text it can copy again.  Each round runs plain and every arm once
(the order rotated, backwards on odd rounds); per arm the figure is the median over
rounds of its TPOT over plain's in the same round, beside the time its speculator's
per-step calls took per request (``extend`` and ``record_step``: drafting, the pacer's
and the budget's work; not a draft model's reads of prompts beside the target's
prefill) and their share of the request's decode time: on free chat the differences
between arms are smaller than the host's noise between adjacent runs, their own time is
not.  Every arm has its own drafter (a draft model loaded once per arm) and shares the
start-up verification cost; a suffix drafter's history is emptied before each of its
runs.  Every output must equal plain greedy decoding's.  Nothing else may run on the
machine meanwhile.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from llcinfer import LLM
from llcinfer.bench.spec import SPEC_CTX, WARM_UP, WORKLOADS
from llcinfer.engine.speculation_setup import build_speculator
from llcinfer.errors import LLCInferError
from llcinfer.speculative import pacer
from llcinfer.weights.repack_cache import wait_loaded

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_trees import quartiles  # noqa: E402

N_GEN = 192  # tokens a request generates, as in spec_bench


def parse_arms(text: str) -> list[tuple[float, float]]:
    """``0.02:0,0.005`` -> [(0.02, 0.0), (0.005, pacer.COPY_STEPS)]; ValueError for anything else."""
    arms = []
    for arm in (a for a in text.replace(" ", "").split(",") if a):
        margin, _, copy_steps = arm.partition(":")
        arms.append((float(margin), float(copy_steps) if copy_steps else float(pacer.COPY_STEPS)))
    if not arms or any(not 0 <= m < 1 or not c >= 0 for m, c in arms) or len(set(arms)) < len(arms):
        raise ValueError(text)
    return arms


def run(model: str, spec: str, workload: str, rounds: int, arms: list[tuple[float, float]], threads: int) -> list[str]:
    llm = LLM(model, threads=threads, n_ctx=SPEC_CTX, progress=False, speculative=spec)
    own_s = {arm: 0.0 for arm in arms}  # seconds in the speculator's per-step calls, drafting included

    def timed(arm, method):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                own_s[arm] += time.perf_counter() - t0
        return call

    try:
        wait_loaded()
        first = llm.engine.speculator
        specs = {}
        vocab = list(llm.gguf.metadata.get("tokenizer.ggml.tokens", []))
        for arm in arms:
            sp = build_speculator(spec, llm.model, vocab, SPEC_CTX, 1, progress=False)
            sp.cost, sp.executor = first.cost, first.executor
            if hasattr(sp.drafter, "price"):  # as Speculator.measure_cost readies a draft model
                sp.drafter.use_executor(first.executor)
                sp.drafter.price(first.cost.decode_s, first.cost.slope_s, llm.model.weights.nbytes)
            sp.extend, sp.record_step = timed(arm, sp.extend), timed(arm, sp.record_step)
            specs[arm] = sp
        configs = [None, *arms]  # None: plain
        msgs = [{"role": "user", "content": WORKLOADS[workload]}]

        def generate(c, prompt, n):
            llm.engine.speculator = None if c is None else specs[c]
            if c is not None:
                pacer.MARGIN, pacer.COPY_STEPS = c
                if hasattr(specs[c].drafter, "forget_history"):
                    specs[c].drafter.forget_history()
            text = llm.chat(prompt, max_tokens=n, temperature=0, ignore_eos=True)
            return text, llm.last_stats.tpot_ms

        for c in configs:  # every program shape built once, each way
            generate(c, WARM_UP, 16)
        own_s.update((arm, 0.0) for arm in arms)
        tpot = {c: [] for c in configs}
        for r in range(rounds):
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            texts = {}
            for c in order if r % 2 == 0 else order[::-1]:
                texts[c], t = generate(c, msgs, N_GEN)
                tpot[c].append(t)
            if len(set(texts.values())) != 1:
                raise SystemExit("error: a speculative output differs from plain greedy decoding")
        plain_ms = statistics.median(tpot[None])
        lines = [f"{model} {spec} {workload}: plain TPOT median {plain_ms:.2f} ms, {rounds} rounds"]
        for arm in arms:
            median, q1, q3 = quartiles([a / b for a, b in zip(tpot[arm], tpot[None])])
            st = specs[arm].stats
            lines.append(f"  MARGIN {arm[0]} COPY_STEPS {arm[1]:g}: spec / plain median {median:.3f} "
                         f"(quartiles {q1:.3f}-{q3:.3f}), "
                         f"{st.verifications} verifications, {st.accepted} accepted, "
                         f"{st.draft_seconds * 1e3:.0f} ms drafting; speculator {own_s[arm] / rounds * 1e3:.1f} ms "
                         f"a request, {100 * own_s[arm] / sum(t * 1e-3 * N_GEN for t in tpot[arm]):.2f} % of its time")
        return lines
    finally:
        llm.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--spec", default="ngram", help="ngram, suffix or draft:MODEL")
    ap.add_argument("--workload", default="free-chat", choices=list(WORKLOADS))
    ap.add_argument("-r", "--rounds", type=int, default=12)
    ap.add_argument("--arms", default="0.02:0,0.005", help="MARGIN[:COPY_STEPS], comma-separated")
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()
    try:
        arms = parse_arms(a.arms)
    except ValueError:
        ap.error(f"--arms takes distinct MARGIN[:COPY_STEPS], MARGIN in [0, 1), COPY_STEPS >= 0 or inf (got {a.arms!r})")
    if a.spec not in ("ngram", "suffix") and not (a.spec.startswith("draft:") and len(a.spec) > 6):
        ap.error(f"--spec takes ngram, suffix or draft:MODEL (got {a.spec!r})")
    if a.rounds < 1 or a.threads < 1:
        ap.error("--rounds and --threads: at least 1")
    try:
        print("\n".join(run(a.model, a.spec, a.workload, a.rounds, arms, a.threads)))
    except LLCInferError as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
