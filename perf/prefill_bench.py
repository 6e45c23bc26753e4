"""Time to first token of an N-token prompt: our prefill with the blocked prefill attention
('new'), with every row on the decode kernels as before it ('old'), and llama.cpp's
``llama-bench -p N -n 0`` on the same GGUF file, in prompt tokens per second.

    python perf/prefill_bench.py --model smollm2-135m --n 512 2048 8192
    python perf/prefill_bench.py --model qwen2.5-coder-0.5b --n 8192 --reps 2 --paths new llama
    python perf/prefill_bench.py --model smollm2-135m --n 512 --json out.json

Our prompt runs as the step loop runs it: random tokens in chunks of the engine's step
budget (``--n-batch``, the LLM default), each chunk one ``Transformer.forward`` on a fresh
sequence (cache empty, so every repetition is a cold prompt).  'old' swaps
``PagedSequence.attention`` in this script only for the decode kernels' call
(``paged_attention`` on all rows, the code before the prefill kernel); the library has no
switch for it.  Repetitions go path after path (A B A B ...) so drift on a shared machine
hits all alike; one llama-bench run (``-r 1``, its own warm-up) per repetition.  The table
shows medians; the JSON keeps every time.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import numba
import numpy as np

ROOT = Path(__file__).resolve().parent.parent

from llcinfer import LLM  # noqa: E402
from llcinfer.bench import llama_bench  # noqa: E402
from llcinfer.kernels.paged_attention import paged_attention  # noqa: E402
from llcinfer.kernels.tables import F16_TO_F32  # noqa: E402
from llcinfer.kv import PagedSequence  # noqa: E402
from llcinfer.model.catalog import resolve_model  # noqa: E402
from llcinfer.weights.repack_cache import wait_loaded  # noqa: E402


def _old_attention(self, layer, q, n_past, scale, out):
    """PagedSequence.attention before the prefill kernel: every row on the decode kernels."""
    p = self.pool
    paged_attention(q, p.data, p.data_f32, F16_TO_F32, p.kind, p.group, p.scale_offset, self.table[:self.n_blocks],
                    layer, p.n_kv_head, self.block_size, n_past, np.float32(scale), out,
                    threads=numba.get_num_threads())


@contextlib.contextmanager
def _attention(path: str):
    new = PagedSequence.attention
    if path == "old":
        PagedSequence.attention = _old_attention
    try:
        yield
    finally:
        PagedSequence.attention = new


def ours(llm: LLM, n: int, n_batch: int, path: str, rng) -> float:
    """Seconds to prefill ``n`` random tokens on a fresh sequence."""
    toks = rng.integers(0, llm.model.config.vocab_size, n).tolist()
    seq = llm.engine.new_sequence("prefill-bench")
    try:
        with _attention(path):
            t0 = time.perf_counter()
            for i in range(0, n, n_batch):
                llm.model.forward(toks[i:i + n_batch], seq)
            return time.perf_counter() - t0
    finally:
        seq.free()


def llama(exe, gguf, n: int, threads: int) -> float:
    """Seconds llama-bench reports for one ``-p n -n 0`` repetition."""
    run = llama_bench.run(exe, gguf, threads, n, 0, 0, 1, timeout=3600)
    if run.status != "ok":
        raise RuntimeError(f"llama-bench {run.status}: {run.message}")
    return n / float(run.entries[0]["avg_ts"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, nargs="+", default=[512, 2048, 8192], help="prompt lengths")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--paths", nargs="+", default=["new", "old", "llama"], choices=["new", "old", "llama"])
    ap.add_argument("--n-batch", type=int, default=None, help="prompt tokens per forward (the LLM default)")
    ap.add_argument("--llama-bench", default=None, help="llama-bench binary (default: the provisioned builds' first)")
    ap.add_argument("--json", default=None, help="results file (default perf/results/prefill-<date>-<model>.json)")
    a = ap.parse_args(argv)

    gguf = resolve_model(a.model)
    exe = None
    if "llama" in a.paths:
        builds, notes = llama_bench.find_builds(a.llama_bench)
        for note in notes:
            print(note, file=sys.stderr)
        exe = next(iter(builds.values()), None)
        if exe is None:
            a.paths = [p for p in a.paths if p != "llama"]
    ours_paths = [p for p in a.paths if p != "llama"]
    llm = None
    if ours_paths:
        n_ctx = max(a.n) + 16
        llm = LLM(a.model, threads=a.threads, n_ctx=n_ctx, progress=False,
                  **({} if a.n_batch is None else {"n_batch": a.n_batch}))
        wait_loaded()
        n_batch = llm.engine.scheduler.max_step_tokens
        for p in ours_paths:  # compile / load every kernel both paths use
            ours(llm, 2 * n_batch + 3, n_batch, p, np.random.default_rng(1))
    rng = np.random.default_rng(0)
    times: dict[str, dict[str, list[float]]] = {str(n): {p: [] for p in a.paths} for n in a.n}
    for n in a.n:
        for rep in range(a.reps):
            for p in a.paths:
                dt = llama(exe, gguf, n, a.threads) if p == "llama" else ours(llm, n, n_batch, p, rng)
                times[str(n)][p].append(dt)
                print(f"N={n} rep {rep} {p}: {dt:.2f} s  {n / dt:.1f} tok/s", file=sys.stderr, flush=True)
    print(f"\n{a.model}, {a.threads} threads, prompt tokens/s (median of {a.reps})"
          + (f", our chunks of {n_batch}" if llm else ""))
    print(f"{'N':>7} " + " ".join(f"{p:>9}" for p in a.paths) + ("   new/old  new/llama" if len(a.paths) > 1 else ""))
    rows = {}
    for n in a.n:
        tps = {p: n / statistics.median(times[str(n)][p]) for p in a.paths}
        rows[str(n)] = tps
        ratios = ""
        if "new" in tps:
            ratios = "".join(f"  {tps['new'] / tps[o]:8.2f}x" for o in ("old", "llama") if o in tps)
        print(f"{n:>7} " + " ".join(f"{tps[p]:9.1f}" for p in a.paths) + ratios)
    out = Path(a.json) if a.json else ROOT / "perf" / "results" / f"prefill-{datetime.date.today()}-{a.model}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    rec = {"model": a.model, "gguf": str(gguf), "threads": a.threads, "reps": a.reps, "n_batch": n_batch if llm else None,
           "llama_bench": str(exe) if exe else None, "seconds": times, "tokens_per_s_median": rows}
    out.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"wrote {out}")
    if llm is not None:
        llm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
