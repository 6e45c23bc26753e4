"""Majority vote and best-of-N against greedy on generated arithmetic word problems, and the
wall time of N batched samples against N sequential generations.

    python perf/controllers.py [--model qwen2.5-coder-1.5b] [--problems 100] [--n 8]
                               [--max-tokens 96] [--threads 2] [--seed 0]
                               [--strategies greedy,vote,best,sequential]
                               [--sequential-problems K] [--separate-best]
                               [--json perf/results/controllers-TAG.json]

Problems: made from templates with a fixed seed (two or three steps of +, -, x, / on small
integers, with names and items), each with its integer answer.  Each is asked through the
model's chat template with a system message asking for brief reasoning and a last line
"Answer: <number>".  Strategies, each a controller built from its config:
  greedy      ``generate`` at temperature 0
  vote        ``majority_vote`` of n samples at --temperature, answer = the last line's number
  best        ``best_of_n`` of n samples scored by their mean token log-probability
  sequential  the n samples of ``vote`` as n plain requests, each waited for before the next
              is submitted (the wall-time baseline; its answers are vote's, not counted)
Per problem the strategies run one after another in that order (so drift hits all alike);
accuracy is the share of problems whose chosen answer equals the known one; wall time is
summed per strategy.  One LLM with n_seq = n runs everything.

With vote and best both asked for, best is by default chosen from vote's n samples (the
same child config and run seed, so the very samples ``best_of_n`` would draw; its wall
time is then vote's): ``--separate-best`` runs it as its own controller instead.  The
sequential baseline runs on the first ``--sequential-problems`` problems (default: all);
its ratio to the batched samples (vote's, or best's when vote did not run) is taken over
those problems only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llcinfer import LLM  # noqa: E402
from llcinfer.controllers import from_config  # noqa: E402

SYSTEM = ("Solve the arithmetic word problem. Think step by step in a few short sentences, "
          "then give the final line as 'Answer: <number>'.")
ANSWER = r"Answer:\s*\$?\s*(-?[\d,]+)"
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jun", "Kofi", "Lena"]
ITEMS = ["apples", "marbles", "stickers", "pencils", "cookies", "stamps", "shells", "cards"]


def problems(n: int, seed: int) -> list[tuple[str, int]]:
    """``n`` (question, answer) pairs from four templates, seeded."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        name, item = NAMES[rng.integers(len(NAMES))], ITEMS[rng.integers(len(ITEMS))]
        a, b, c = (int(x) for x in rng.integers(2, 20, 3))
        kind = i % 4
        if kind == 0:
            q = (f"{name} has {a + c} {item}. {name} buys {b} more, then gives {c} to a friend. "
                 f"How many {item} does {name} have now?")
            ans = a + b
        elif kind == 1:
            q = (f"{name} buys {a} bags of {item} with {b} {item} in each bag, then loses {c} of them. "
                 f"How many {item} are left?")
            ans = a * b - c
        elif kind == 2:
            q = (f"{name} shares {a * b} {item} equally among {a} children. Each child then finds {c} more. "
                 f"How many {item} does each child have?")
            ans = b + c
        else:
            q = (f"A shop has {a} boxes of {item} with {b} in each box and {c} loose {item}. "
                 f"{name} buys half of the boxes' {item}, rounded down. How many {item} are left in the shop?")
            ans = a * b - (a * b) // 2 + c
        out.append((q, ans))
    return out


def parse_answer(text: str | None) -> int | None:
    if text is None:
        return None
    found = re.findall(ANSWER, text) if "Answer" in text else [text]
    try:
        return int(found[-1].replace(",", "")) if found else None
    except ValueError:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--problems", type=int, default=100)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strategies", default="greedy,vote,best,sequential")
    ap.add_argument("--sequential-problems", type=int, default=None)
    ap.add_argument("--separate-best", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    strategies = args.strategies.split(",")
    sample = {"type": "generate", "temperature": args.temperature, "max_tokens": args.max_tokens}
    configs = {
        "greedy": {"type": "generate", "temperature": 0, "max_tokens": args.max_tokens},
        "vote": {"type": "majority_vote", "n": args.n, "extract": ANSWER, "child": sample},
        "best": {"type": "best_of_n", "n": args.n, "reward": "logprob", "child": sample},
    }
    llm = LLM(args.model, threads=args.threads, n_seq=args.n, n_ctx=1024, progress=False)
    ctls = {k: from_config(v, llm) for k, v in configs.items()}
    seq_params = {k: v for k, v in sample.items() if k != "type"}
    rows, wall = [], {s: 0.0 for s in strategies}
    for i, (question, answer) in enumerate(problems(args.problems, args.seed)):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        row = {"question": question, "answer": answer}
        voted = None
        for s in strategies:
            if s == "sequential" and args.sequential_problems is not None and i >= args.sequential_problems:
                continue
            if s == "best" and voted is not None and not args.separate_best:
                chosen = max(voted.candidates, key=lambda c: c.mean_logprob)
                row[s] = {"answer": parse_answer(chosen.text), "seconds": None, "from": "vote's samples"}
                continue
            llm.reset()  # no strategy reuses another's prompt blocks
            t0 = time.perf_counter()
            if s == "sequential":
                for j in range(args.n):
                    llm.submit(messages, seed=args.seed + j, **seq_params).result()
                got = None
            else:
                outcome = ctls[s].run(messages, seed=args.seed)
                got = parse_answer(outcome.answer if s == "vote" else outcome.text)
                voted = outcome if s == "vote" else voted
            dt = time.perf_counter() - t0
            wall[s] += dt
            row[s] = {"answer": got, "seconds": dt}
        rows.append(row)
        marks = " ".join(f"{s}={'ok' if row[s]['answer'] == answer else row[s]['answer']}"
                         for s in strategies if s != "sequential")
        batched = next((b for b in ("vote", "best") if row.get(b, {}).get("seconds") is not None), None)
        if "sequential" in row and batched:
            marks += f" | {batched} {row[batched]['seconds']:.1f} s, sequential {row['sequential']['seconds']:.1f} s"
        print(f"[{i + 1}/{args.problems}] answer {answer}: {marks}", file=sys.stderr, flush=True)
    summary = {"model": args.model, "problems": args.problems, "n": args.n, "threads": llm.threads,
               "max_tokens": args.max_tokens, "temperature": args.temperature, "wall_s": wall,
               "accuracy": {s: sum(r[s]["answer"] == r["answer"] for r in rows) / len(rows)
                            for s in strategies if s != "sequential"}}
    batched = "vote" if "vote" in strategies else "best"
    timed = [r for r in rows if "sequential" in r and r.get(batched, {}).get("seconds") is not None]
    if timed:
        summary["sequential_problems"] = len(timed)
        summary["sequential_batched_by"] = batched
        summary["sequential_over_batched"] = (sum(r["sequential"]["seconds"] for r in timed)
                                              / sum(r[batched]["seconds"] for r in timed))
    for s in strategies:
        acc = summary["accuracy"].get(s)
        shared = s == "best" and "vote" in strategies and not args.separate_best
        print(f"{s:10s} accuracy {'-' if acc is None else f'{acc:.1%}':>6s}  "
              f"wall {'(vote' + chr(39) + 's samples)' if shared else f'{wall[s]:8.1f} s'}", flush=True)
    if "sequential_over_batched" in summary:
        print(f"{args.n} sequential / {args.n} batched samples ({batched}), over {summary['sequential_problems']} "
              f"problems: {summary['sequential_over_batched']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "summary": summary, "rows": rows}, indent=1))
        print(f"wrote {args.json}")
    llm.close()


if __name__ == "__main__":
    main()
