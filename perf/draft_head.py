#!/usr/bin/env python3
"""One-row decode step of a draft model with its LM head cut to the first N token ids
(``DecodeExecutor(head_rows=N)``, what speculative/draft_model.py runs), against the whole
head, alternated.

Each repetition builds one executor per head size in turn on the same weights, reads a
prompt of ``--ctx`` tokens into a fresh sequence and times ``--steps`` one-token steps
(the median of those after the first 4); the figure per head size is the median over
repetitions.  Also prints the share of a greedy answer's tokens the cut head could not
propose, for the speculation workloads of ``llcinfer bench --spec`` answered by
``--target``.

    python perf/draft_head.py -m qwen2.5-coder-0.5b --rows 65536,32768 --target qwen2.5-coder-1.5b
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from llcinfer import LLM
from llcinfer.bench.spec import SPEC_CTX, WORKLOADS
from llcinfer.errors import LLCInferError, UsageError
from llcinfer.executor import DecodeExecutor, default_domains
from llcinfer.kv import PagedSequence
from llcinfer.weights.repack_cache import wait_loaded


def step_ms(model, head_rows: int | None, ctx: int, steps: int, threads: int, pool) -> float:
    """Median one-row step (ms) after a prompt of ``ctx`` tokens, the head cut to ``head_rows``."""
    ex = DecodeExecutor(model, default_domains(threads), head_rows=head_rows)
    seq = PagedSequence(pool, ctx + steps + 1, None, "draft_head")
    try:
        ex.step_rows([seq], [list(range(100, 100 + ctx))])
        times = []
        for i in range(steps):
            t0 = time.perf_counter()
            ex.step([seq], [5 + i])
            times.append(time.perf_counter() - t0)
        return statistics.median(times[4:]) * 1e3
    finally:
        seq.free()
        ex.close()


def uncovered_shares(target: str, rows: list[int], threads: int) -> dict:
    """{workload: {N: share of the target's greedy answer at ids >= N}}."""
    llm = LLM(target, threads=threads, n_ctx=SPEC_CTX, progress=False)
    try:
        out = {}
        for name, text in WORKLOADS.items():
            answer = llm.chat([{"role": "user", "content": text}], max_tokens=192, temperature=0, ignore_eos=True)
            ids = np.array(llm.tokenize(answer))
            out[name] = {n: float((ids >= n).mean()) for n in rows}
        return out
    finally:
        llm.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="qwen2.5-coder-0.5b", help="the draft model")
    ap.add_argument("--rows", default="65536,32768", help="head sizes to time beside the whole head")
    ap.add_argument("--ctx", type=int, default=600)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("-r", "--repetitions", type=int, default=4)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--target", default=None, help="also: the share of this model's answers the cut heads miss")
    a = ap.parse_args()
    try:
        run(a)
    except (LLCInferError, ValueError) as exc:  # ValueError: a head size off the vector lanes
        sys.exit(f"error: {exc}")


def run(a) -> None:
    parts = a.rows.split(",")
    if not all(x.strip().isdigit() and int(x) > 0 for x in parts):
        raise UsageError(f"--rows takes positive integers (got {a.rows!r})")
    if min(a.ctx, a.steps - 4, a.repetitions) < 1:
        raise UsageError("--ctx and --repetitions take at least 1, --steps at least 5 (the first 4 are not timed)")
    rows = [int(x) for x in parts]
    llm = LLM(a.model, threads=a.threads, n_ctx=a.ctx + a.steps + 1, progress=False)
    model = llm.engine.model
    wait_loaded()
    pool, _ = model.new_pool(a.ctx + a.steps + 1, 1, None, prefix_sharing=False)
    sizes = [None] + [n for n in rows if n < model.config.vocab_size]
    got = {n: [] for n in sizes}
    for _ in range(a.repetitions):
        for n in sizes:
            got[n].append(step_ms(model, n, a.ctx, a.steps, a.threads, pool))
    llm.close()
    full = statistics.median(got[None])
    for n in sizes:
        label = f"{model.config.vocab_size} (whole)" if n is None else str(n)
        med = statistics.median(got[n])
        print(f"head {label:>16}: {med:6.2f} ms  ({med / full:.2f}x; per repetition "
              f"{', '.join(f'{x:.2f}' for x in got[n])})")
    if a.target:
        for name, shares in uncovered_shares(a.target, rows, a.threads).items():
            print(f"{a.target} {name}: " + ", ".join(f"{100 * s:.1f} % of the answer at ids >= {n}"
                                                     for n, s in shares.items()))


if __name__ == "__main__":
    main()
