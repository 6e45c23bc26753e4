#!/usr/bin/env python3
"""Passkey retrieval: does the model find a 5-digit key hidden at a depth of a long filler
prompt, with dense attention and with sparse attention (the Landmark-attention / LongLoRA test).

    python perf/passkey.py -m qwen2.5-coder-0.5b --lengths 4096,8192,16384 --depths 10
    python perf/passkey.py -m smollm2-135m --lengths 8192 --modes dense,sparse --sparse-top-k 512 \
        --seed 1 --json perf/results/passkey-smollm2.json

Each trial's prompt: an instruction, the filler "The grass is green. The sky is blue. The
sun is yellow. Here we go. There and back again." repeated to the length (prompt tokens,
at most), the needle "The pass key is NNNNN. Remember it. NNNNN is the pass key." after the
given fraction of the filler (``--depths N``: N fractions evenly spaced over 0 .. 1), and
"What is the pass key? The pass key is"; 8 tokens are generated greedily and the key is
found when its digits are in them.  Every mode sees the same prompts and keys (random per
trial from ``--seed``).  One LLM per mode, loaded in turn and reused over the trials.
The trials of a length run from the deepest needle to the shallowest, so a prompt adopts
the cached filler before its needle from the one before (prefix caching: the rows before
the needle compute the same in either order); the first prompt of each length starts
from an empty cache, and its time to first token is that mode's cold TTFT at the length.
Sparse attention engages on rows with at least the planner's min_context keys only (the
context from which it pays on this machine, printed): shorter prompts run dense.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np

from llcinfer import LLM
from llcinfer.errors import LLCInferError, UsageError

INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
         "I will quiz you about the important info there.")
FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
N_GEN = 8
MODES = ("dense", "sparse")


def build_prompt(llm: LLM, length: int, depth: float, key: int) -> tuple[str, int]:
    """The prompt of at most ``length`` tokens with the needle after ``depth`` of the filler,
    and its token count."""
    needle = NEEDLE.format(key=key)
    fixed = len(llm.tokenize(INTRO + needle + QUESTION))
    per = len(llm.tokenize(FILLER * 8)) / 8  # tokens per repetition, away from the edges
    n_rep = int((length - fixed) / per)
    if n_rep < 1:
        raise UsageError(f"--lengths {length} is too short: the instruction, needle and question take {fixed} tokens")
    while True:
        at = round(depth * n_rep)
        prompt = INTRO + FILLER * at + needle + FILLER * (n_rep - at) + QUESTION
        n = len(llm.tokenize(prompt))
        if n <= length or n_rep == 1:
            return prompt, n
        n_rep -= 1 + (n - length) // max(1, int(per))


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--lengths", default="4096,8192", help="prompt tokens per trial, comma-separated")
    ap.add_argument("--depths", type=int, default=10, help="needle depths, evenly spaced over 0 .. 1")
    ap.add_argument("--modes", default="dense,sparse", help="dense, sparse or both")
    ap.add_argument("--sparse-top-k", type=int, default=None, help="tokens the sparse indexer picks (default 1024)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="seed of the random 5-digit keys")
    ap.add_argument("--json", default=None, help="write the trials here")
    return ap.parse_args(argv)


def check(a: argparse.Namespace) -> tuple[list[int], list[float], list[str]]:
    try:
        lengths = [int(x) for x in a.lengths.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--lengths must be comma-separated integers (got {a.lengths!r})") from None
    if not lengths or min(lengths) < 1:
        raise UsageError(f"--lengths must be positive integers (got {a.lengths!r})")
    if a.depths < 1:
        raise UsageError(f"--depths must be >= 1 (got {a.depths})")
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES) or len(set(modes)) != len(modes):
        raise UsageError(f"--modes takes dense and/or sparse, once each (got {a.modes!r})")
    if a.sparse_top_k is not None and "sparse" not in modes:
        raise UsageError("--sparse-top-k needs the sparse mode in --modes")
    if a.sparse_top_k is not None and a.sparse_top_k < 1:
        raise UsageError(f"--sparse-top-k must be >= 1 (got {a.sparse_top_k})")
    if a.threads < 1:
        raise UsageError(f"--threads must be >= 1 (got {a.threads})")
    depths = [float(d) for d in np.linspace(0.0, 1.0, a.depths)] if a.depths > 1 else [0.0]
    return list(dict.fromkeys(lengths)), depths, [m for m in MODES if m in modes]


def run_mode(a, mode: str, trials: list[dict], n_ctx: int) -> dict:
    """Every trial on one LLM of ``mode``; fills trial[mode]; returns the LLM's notes."""
    sparse = mode == "sparse"
    llm = LLM(a.model, threads=a.threads, n_ctx=n_ctx, progress=True, sparse=sparse,
              sparse_top_k=a.sparse_top_k if sparse else None)
    try:
        notes = {"n_ctx_train": llm.config.n_ctx_train,
                 "sparse_top_k": llm.engine.sparse.config.top_k if sparse else None,
                 "sparse_min_context": llm.engine.sparse.config.min_context if sparse else None}
        length = None
        for t in trials:
            if t["length"] != length:  # a cold prompt: nothing cached from the last length
                length = t["length"]
                llm.engine.scheduler.release_retained()
                llm.engine.pool.drop_cached()
            prompt, n = build_prompt(llm, t["length"], t["depth"], t["key"])
            out = llm.generate(prompt, max_tokens=N_GEN, temperature=0)
            s = llm.last_stats
            t["prompt_tokens"] = n
            t[mode] = {"found": str(t["key"]) in out, "output": out, "ttft_s": s.ttft_s,
                       "prompt_evaluated": s.n_prompt_evaluated}
            print(f"  {mode} {t['length']} d{t['depth']:.2f}: {'found' if t[mode]['found'] else 'missed'} "
                  f"{out!r} ({s.n_prompt_evaluated} prompt tokens run, first token after {s.ttft_s:.1f} s)",
                  file=sys.stderr, flush=True)
        if sparse:
            notes["sparse_keys_fraction"] = llm.kv_stats()["sparse_keys_fraction"]
        return notes
    finally:
        llm.close()


def report(trials: list[dict], modes: list[str], notes: dict) -> dict:
    print("| length | prompt tokens | depth | key | " + " | ".join(modes) + " |")
    print("|---|---|---|---|" + "---|" * len(modes))
    for t in trials:
        cells = ["found" if t[m]["found"] else "missed" for m in modes]
        print(f"| {t['length']} | {t['prompt_tokens']} | {t['depth']:.2f} | {t['key']} | " + " | ".join(cells) + " |")
    for t in trials:
        if all(t[m]["prompt_evaluated"] == t["prompt_tokens"] for m in modes):  # a cold prompt
            print(f"time to first token, {t['prompt_tokens']} prompt tokens from cold: " +
                  ", ".join(f"{m} {t[m]['ttft_s']:.1f} s" for m in modes))
    found = {m: sum(t[m]["found"] for t in trials) for m in modes}
    print("\nkeys found: " + ", ".join(f"{m} {found[m]}/{len(trials)}" for m in modes))
    summary = {"found": found}
    if len(modes) == 2:
        covers = all(t["sparse"]["found"] for t in trials if t["dense"]["found"])
        summary["sparse_covers_dense"] = covers
        print(f"sparse finds every key dense finds: {'yes' if covers else 'no'}")
    if "sparse" in notes:
        frac = notes["sparse"]["sparse_keys_fraction"]
        print(f"sparse top-k {notes['sparse']['sparse_top_k']}: " + (
            f"no row reached {notes['sparse']['sparse_min_context']} keys, every row ran dense" if frac is None else
            f"rows from {notes['sparse']['sparse_min_context']} keys on ran sparse and attended {100 * frac:.1f} % "
            "of their keys"))
    return summary


def main(argv=None) -> None:
    a = parse_args(argv)
    try:
        lengths, depths, modes = check(a)
        rng = random.Random(a.seed)
        trials = [{"length": n, "depth": d, "key": rng.randint(10000, 99999)} for n in lengths for d in depths]
        trials.sort(key=lambda t: (lengths.index(t["length"]), -t["depth"]))  # deepest needle first
        n_ctx = max(lengths) + N_GEN + 16
        notes = {m: run_mode(a, m, trials, n_ctx) for m in modes}
    except LLCInferError as exc:
        sys.exit(f"error: {exc}")
    train = next(iter(notes.values()))["n_ctx_train"]
    if train and n_ctx > train:
        print(f"note: n_ctx {n_ctx} is past the model's training context {train}", file=sys.stderr)
    summary = report(trials, modes, notes)
    if a.json:
        doc = {"model": a.model, "threads": a.threads, "seed": a.seed, "n_ctx": n_ctx, "modes": modes,
               "sparse_top_k": notes.get("sparse", {}).get("sparse_top_k"), "notes": notes, **summary,
               "trials": trials}
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {a.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
