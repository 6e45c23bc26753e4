"""Greedy agreement with llama.cpp: the first N generated tokens for a set of prompts.

    python perf/greedy_vs_llamacpp.py [--model smollm2-135m] [-n 16] [--config portable]

For each prompt, llama.cpp's ``llama-completion`` (built by perf/llama_cpp.py) and
llcinfer both generate N tokens greedily (temperature 0, end-of-generation ignored) from
the raw prompt; the texts are compared, and llcinfer's tokens are re-tokenized to report
the first diverging position and our logit margin there (a near-tie explains a flip:
llama.cpp quantizes activations to 8 bits, llcinfer keeps them in float32).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_cpp  # noqa: E402  (perf/llama_cpp.py)

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n",
    "The three laws of thermodynamics are",
    "Water boils at 100 degrees Celsius because",
    "import numpy as np\n\n# Compute the mean of a list\n",
    "My favourite recipe for pancakes starts with",
    "The quick brown fox",
    "In 1969, Neil Armstrong",
    "A list of prime numbers: 2, 3, 5, 7,",
]


def llama_cpp_greedy(binary: str, model: str, prompt: str, n: int, threads: int) -> str:
    cmd = [binary, "-m", model, "-p", prompt, "-n", str(n), "-no-cnv", "--temp", "0", "--top-k", "1",
           "--ignore-eos", "--no-warmup", "--simple-io", "--no-display-prompt", "-t", str(threads), "-c", "512"]
    from llcinfer.jit import child_env

    out = subprocess.run(cmd, capture_output=True, timeout=300, env=child_env())
    if out.returncode != 0:
        raise RuntimeError(f"llama-completion exited {out.returncode}: {out.stderr.decode()[-300:]}")
    text = out.stdout.decode("utf-8", errors="replace")
    return text[:-2] if text.endswith("\n\n") else text  # the tool appends a blank line on exit


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--config", default=None, help="llama.cpp build (default: portable, else native)")
    ap.add_argument("--json", default=None, help="write the records here")
    args = ap.parse_args(argv)

    from llcinfer import LLM
    from llcinfer.engine.sampling import SamplingParams

    configs = [args.config] if args.config else ["portable", "native"]
    binary = next((llama_cpp.generator_binary(c) for c in configs if llama_cpp.generator_binary(c)), None)
    if binary is None:
        print("llama.cpp is not built: run python perf/llama_cpp.py build", file=sys.stderr)
        return 1
    llm = LLM(args.model, threads=args.threads, n_ctx=512)
    params = SamplingParams(temperature=0, max_tokens=args.n, ignore_eos=True)
    records, agree = [], 0
    for prompt in PROMPTS:
        theirs = llama_cpp_greedy(str(binary), str(llm.model_path), prompt, args.n, args.threads)
        prompt_ids = llm.tokenize(prompt)
        ours_ids = llm.engine.generate([prompt_ids], params)[0].token_ids
        ours = llm.detokenize(ours_ids)
        same = ours == theirs
        agree += same
        rec = {"prompt": prompt, "llcinfer": ours, "llama.cpp": theirs, "identical": same}
        if not same:  # where and how close: our top-2 margin at the first differing token
            theirs_ids = llm.tokenize(prompt + theirs)[len(prompt_ids):]
            k = next((i for i, (a, b) in enumerate(zip(ours_ids, theirs_ids)) if a != b), min(len(ours_ids), len(theirs_ids)))
            logits = llm.logits(prompt_ids + ours_ids[:k])
            top2 = np.sort(logits)[-2:]
            rec.update(first_difference=k, our_top2_margin=float(top2[1] - top2[0]))
        records.append(rec)
        mark = "same" if same else f"DIFF at token {rec['first_difference']} (our top-2 margin {rec['our_top2_margin']:.3f})"
        print(f"[{mark}] {prompt!r}\n   llcinfer : {ours!r}\n   llama.cpp: {theirs!r}")
    print(f"\n{agree}/{len(PROMPTS)} prompts: first {args.n} greedy tokens identical "
          f"({args.model}, llama.cpp {binary.parent.parent.name} build)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"model": args.model, "n": args.n, "agree": agree, "records": records}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
