#!/usr/bin/env python3
"""Speculation against plain decoding in pairs of adjacent generations of one process:
the least noisy form of ``spec_bench``'s "vs our plain" where the host's speed moves by
more than the difference (free chat).

One LLM with the drafter; each pair runs the workload once with the speculator and once
with it set aside (plain steps of the same engine, weights and threads), in alternating
order, so both halves of a pair see the host within seconds of each other.  The
speculator keeps its state across the pairs, as a server's would across requests, but for
a suffix drafter's history of finished requests, emptied before each pair: it would copy
the previous pair's answer to the same prompt.
Reports each pair's spec / plain TPOT, their median and spread.

    python perf/spec_paired.py -m qwen2.5-coder-1.5b --spec draft:qwen2.5-coder-0.5b --workload free-chat -r 10

Nothing else may run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from llcinfer import LLM
from llcinfer.bench.spec import SPEC_CTX, WARM_UP, WORKLOADS, parse_specs, parse_workloads
from llcinfer.errors import LLCInferError
from llcinfer.weights.repack_cache import wait_loaded


def run(model: str, spec: str, workload: str, n: int, threads: int, pairs: int, log) -> dict:
    llm = LLM(model, threads=threads, n_ctx=SPEC_CTX, progress=False, speculative=spec)
    try:
        wait_loaded()
        speculator = llm.engine.speculator
        msgs = [{"role": "user", "content": WORKLOADS[workload]}]
        for on in (False, True):  # every program shape built once, both ways
            llm.engine.speculator = speculator if on else None
            llm.chat(WARM_UP, max_tokens=16, temperature=0, ignore_eos=True)
        rows, texts = [], {}
        for i in range(pairs):
            tpot = {}
            if hasattr(speculator.drafter, "forget_history"):  # a suffix drafter would copy the last pair's answer
                speculator.drafter.forget_history()
            before = (speculator.stats.verifications, speculator.stats.accepted, speculator.stats.draft_seconds)
            for on in ((False, True) if i % 2 == 0 else (True, False)):
                llm.engine.speculator = speculator if on else None
                texts[on] = llm.chat(msgs, max_tokens=n, temperature=0, ignore_eos=True)
                tpot[on] = llm.last_stats.tpot_ms
            verifications, accepted, draft_s = (now - was for now, was in zip(
                (speculator.stats.verifications, speculator.stats.accepted, speculator.stats.draft_seconds), before))
            rows.append({"plain_ms": tpot[False], "spec_ms": tpot[True], "ratio": tpot[True] / tpot[False],
                         "verifications": verifications, "accepted": accepted, "draft_s": draft_s,
                         "same_as_plain": texts[True] == texts[False]})
            log(f"pair {i}: plain {tpot[False]:.2f} ms, spec {tpot[True]:.2f} ms, {rows[-1]['ratio']:.3f}x "
                f"({verifications} verifications, {accepted} accepted, {draft_s * 1e3:.0f} ms drafting)")
        llm.engine.speculator = speculator
        st = llm.spec_stats
        ratios = [r["ratio"] for r in rows]
        return {"model": model, "spec": spec, "workload": workload, "n": n, "threads": threads, "pairs": rows,
                "median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios),
                "accepted_per_verification": st.accepted_per_verification, "verifications": st.verifications,
                "plain_steps": st.plain_steps}
    finally:
        llm.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--spec", default="draft:qwen2.5-coder-0.5b")
    ap.add_argument("--workload", default="free-chat")
    ap.add_argument("--n", type=int, default=192)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--pairs", type=int, default=10)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    try:
        specs, workloads = parse_specs(a.spec), parse_workloads(a.workload)
        if len(specs) != 1 or len(workloads) != 1 or a.pairs < 1:
            sys.exit("error: --spec and --workload take one name each, -r at least 1")
        out = run(a.model, specs[0], workloads[0], a.n, a.threads, a.pairs,
                  lambda m: print(m, file=sys.stderr, flush=True))
    except LLCInferError as exc:
        sys.exit(f"error: {exc}")
    print(f"{a.model} {specs[0]} {workloads[0]}: spec / plain TPOT median {out['median_ratio']:.3f}x "
          f"({out['min_ratio']:.3f}-{out['max_ratio']:.3f}) over {a.pairs} pairs, "
          f"{out['accepted_per_verification']:.2f} accepted per verification, "
          f"greedy output same as plain in {sum(r['same_as_plain'] for r in out['pairs'])}/{a.pairs}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
