"""llama.cpp on a long real prompt: time to first token (its prompt eval) and TPOT at that
depth (its eval time per token), with the text perf/sparse_bench.py fills our KV with.

    python perf/llama_long.py -m qwen2.5-coder-0.5b --lengths 32768 [-n 16] [--threads 2] [--json OUT]

The prompt is the first N tokens (this model's tokenizer, the same as llama.cpp's) of
CPython's standard library sources read from the end (sparse_bench.eval_tokens), decoded
to text and given to ``llama-completion -f``; -c is N + n + 64.  One run per length: the
prompt eval is the whole prefill (llama-completion's own timer), the eval time covers the
n - 1 tokens after the first.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llcinfer.bench.spec import run_llama_tool  # noqa: E402
from llcinfer.errors import LLCInferError  # noqa: E402
from llcinfer.model import catalog  # noqa: E402
from llcinfer.model.gguf_file import GGUFFile  # noqa: E402
from llcinfer.model.tokenizer import Tokenizer  # noqa: E402
from llcinfer.sparse import stdlib_text  # noqa: E402


def run(model_path: Path, text: str, n_ctx: int, n: int, threads: int) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    args = ["-m", str(model_path), "-f", f.name, "-n", str(n), "-t", str(threads),
            "--temp", "0", "-c", str(n_ctx), "--ignore-eos", "-no-cnv"]
    try:
        out, build = run_llama_tool("llama-completion", args, timeout=3600)
    finally:
        Path(f.name).unlink(missing_ok=True)
    log = out.stdout + out.stderr
    pp = re.search(r"prompt eval time =\s+([\d.]+) ms /\s+(\d+) tokens", log)
    tg = re.search(r"\beval time =\s+([\d.]+) ms /\s+(\d+) runs", log)
    if pp is None or tg is None:
        raise SystemExit(f"llama-completion ({build}, exit {out.returncode}) failed: {log[-800:]}")
    return {"build": build, "prompt_tokens": int(pp.group(2)), "ttft_s": float(pp.group(1)) / 1e3,
            "prompt_tokens_per_s": int(pp.group(2)) / (float(pp.group(1)) / 1e3),
            "tpot_ms": float(tg.group(1)) / int(tg.group(2)), "eval_runs": int(tg.group(2))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--lengths", default="32768", help="prompt tokens, comma-separated")
    ap.add_argument("-n", type=int, default=16, help="tokens to generate (>= 2)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    try:
        lengths = [int(x) for x in a.lengths.split(",")]
    except ValueError:
        raise SystemExit(f"error: --lengths must be integers (got {a.lengths!r})") from None
    if min(lengths) < 1 or a.n < 2 or a.threads < 1:
        raise SystemExit("error: --lengths and --threads must be >= 1 and -n >= 2")
    path = catalog.resolve_model(a.model, progress=False)
    tok = Tokenizer.from_metadata(GGUFFile(path).metadata)
    out = {"model": a.model, "threads": a.threads, "n": a.n, "runs": {}}
    for length in lengths:
        text = tok.decode(tok.encode(stdlib_text(8 * length, reverse=True))[:length])
        r = run(path, text, length + a.n + 64, a.n, a.threads)
        out["runs"][str(length)] = r
        print(f"{a.model} {length} tokens, {a.threads} threads: llama.cpp TTFT {r['ttft_s']:.1f} s "
              f"({r['prompt_tokens_per_s']:.0f} tokens/s, {r['prompt_tokens']} tokens), TPOT {r['tpot_ms']:.1f} ms",
              flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    try:
        main()
    except LLCInferError as e:
        raise SystemExit(f"error: {e}") from None
