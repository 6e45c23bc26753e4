"""Throughput under concurrency: B requests on one LLM, next to llama-batched-bench.

    python perf/concurrency.py [--models smollm2-135m,qwen2.5-coder-0.5b] [--threads 2]
                               [--batch 1,2,4,8,16] [--gen 128] [--reps 3] [--vs llama.cpp]
                               [--json perf/results/concurrency-TAG.json]

Ours: an ``LLM(model, n_seq=B)`` (the plan made for B sequences) serves B requests of
mixed prompt lengths (drawn from --lengths, different text each), ``--gen`` generated
tokens each (greedy, end of text ignored), on its engine thread, in two arrival modes:
``burst`` (all submitted at once) and ``random`` (arrival times uniform over one single
request's generation time, seeded).  Per request: time to first token (from its arrival)
and TPOT (its generation time over its tokens after the first); per run: aggregate
generated tokens per second of wall time (first arrival to last finish, prefill
included).

llama.cpp: ``llama-batched-bench -npp P -ntg G -npl B`` with P the mean of our prompt
lengths (it runs B sequences of one length, no sharing): its S_TG (decode phase) and its
generated tokens per second of its whole run (prefill included), comparable to ours in
burst mode.  Ours and llama.cpp alternate per repetition (A B A B); figures are medians.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llcinfer import LLM  # noqa: E402
from llcinfer.bench import llama_cpp  # noqa: E402
from llcinfer.engine.sampling import SamplingParams  # noqa: E402
from llcinfer.jit import child_env  # noqa: E402
from llcinfer.weights.repack_cache import wait_loaded  # noqa: E402

TEXT = (ROOT / "README.md").read_text() + (ROOT / "perf" / "README.md").read_text()


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, np.float64), q)) if xs else float("nan")


def make_prompts(llm: LLM, n: int, lengths: list[int], seed: int) -> list[list[int]]:
    """n prompts of token lengths drawn from ``lengths``, each from another place of TEXT."""
    ids = llm.tokenize(TEXT)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.choice(lengths))
        start = int(rng.integers(0, len(ids) - length))
        out.append(ids[start:start + length])
    return out


def run_ours(llm: LLM, prompts: list[list[int]], gen: int, arrivals: list[float]) -> dict:
    """Submit prompts[i] at arrivals[i] seconds (engine thread running); per-request and
    aggregate figures."""
    params = SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True)
    handles, t_sub = [], []
    t0 = time.perf_counter()
    for p, at in zip(prompts, arrivals):
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t_sub.append(time.perf_counter())
        handles.append(llm.engine.submit(p, params))
    done = [h.result() for h in handles]
    ends = [ts + c.stats.ttft_s + c.stats.generation_seconds for ts, c in zip(t_sub, done)]
    ttft = [c.stats.ttft_s for c in done]
    tpot = [c.stats.tpot_ms for c in done if c.stats.n_generated > 1]
    n = sum(c.stats.n_generated for c in done)
    if any(c.error is not None for c in done):
        raise RuntimeError(f"a request failed: {next(c.error for c in done if c.error)}")
    return {"generated": n, "wall_s": max(ends) - t0, "tps": n / (max(ends) - t0),
            "ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99),
            "tpot_p50_ms": _pct(tpot, 50), "tpot_p99_ms": _pct(tpot, 99),
            "preemptions": sum(c.stats.n_preempted for c in done)}


def run_llama(binary: str, model_path: str, threads: int, B: int, P: int, gen: int, ctx: int) -> dict:
    """One llama-batched-bench run at batch B: S_TG and generated tokens / whole time."""
    cmd = [binary, "-m", model_path, "-t", str(threads), "-c", str(ctx), "-b", "2048", "-ub", "512",
           "-npp", str(P), "-ntg", str(gen), "-npl", str(B)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"llama-batched-bench failed ({out.returncode}): {out.stderr.strip()[-300:]}")
    # |    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
    for line in out.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 10 and re.fullmatch(r"\d+", cells[0] or "x"):
            t_pp, s_pp, t_tg, s_tg, t_all = (float(cells[i]) for i in (4, 5, 6, 7, 8))
            return {"t_pp_s": t_pp, "s_pp_tps": s_pp, "t_tg_s": t_tg, "s_tg_tps": s_tg, "wall_s": t_all,
                    "tps": B * gen / t_all}
    raise RuntimeError("no result row in llama-batched-bench output:\n" + out.stdout[-500:])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", default="1,2,4,8,16", help="request counts B")
    ap.add_argument("--gen", type=int, default=128, help="generated tokens per request")
    ap.add_argument("--lengths", default="16,32,64,128,256", help="prompt lengths to draw from")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--modes", default="burst,random")
    ap.add_argument("--vs", default="llama.cpp", choices=["llama.cpp", "none"])
    ap.add_argument("--kv-budget-mb", type=float, default=None,
                    help="cap our KV memory (requests past it are preempted and recomputed)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    batches = [int(b) for b in a.batch.split(",")]
    lengths = [int(n) for n in a.lengths.split(",")]
    modes = a.modes.split(",")
    binary = None
    if a.vs == "llama.cpp":
        binary = llama_cpp.binary("native", "llama-batched-bench")
        if binary is None:
            raise SystemExit("llama-batched-bench is not built: python perf/llama_cpp.py build")
    n_ctx = max(lengths) + a.gen + 16
    rows = []
    for model in a.models.split(","):
        tpot1 = None
        for B in batches:
            llm = LLM(model, threads=a.threads, n_seq=B, n_ctx=n_ctx, progress=False, kv_budget_mb=a.kv_budget_mb)
            wait_loaded()
            llm.start()
            run_ours(llm, make_prompts(llm, B, lengths, seed=0), 8, [0.0] * B)  # warm: programs, first touches
            prompts = {(rep, mode): make_prompts(llm, B, lengths, seed=1000 * B + 10 * rep + i)
                       for rep in range(a.reps) for i, mode in enumerate(modes)}  # fresh text: no prefix hits
            P = round(statistics.mean(len(p) for ps in prompts.values() for p in ps))
            row = {"model": model, "threads": a.threads, "B": B, "gen": a.gen, "mean_prompt": P,
                   "plan": llm.plan.label if llm.plan else None}
            res = {m: [] for m in modes}
            res["llama.cpp"] = []
            for rep in range(a.reps):
                for mode in modes:
                    if mode == "random":
                        span = a.gen * (tpot1 or 0.005)
                        arrivals = sorted(np.random.default_rng(100 + rep).uniform(0, span, B).tolist())
                        arrivals = [x - arrivals[0] for x in arrivals]
                    else:
                        arrivals = [0.0] * B
                    llm.reset()  # no cached prefix from an earlier run
                    res[mode].append(run_ours(llm, prompts[rep, mode], a.gen, arrivals))
                if binary is not None:
                    res["llama.cpp"].append(run_llama(str(binary), str(llm.model_path), a.threads, B, P, a.gen,
                                                      B * (P + a.gen) + 64))
            llm.close()
            for key, runs in res.items():
                if runs:
                    row[key] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                    row[key]["runs"] = runs
            if B == 1 and "burst" in row:
                tpot1 = row["burst"]["tpot_p50_ms"] / 1e3
            rows.append(row)
            _print_row(row)
    doc = {"settings": vars(a), "rows": rows}
    path = Path(a.json or f"perf/results/concurrency-{time.strftime('%Y-%m-%d')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")


def _print_row(r: dict) -> None:
    parts = [f"{r['model']:20s} B={r['B']:2d} P~{r['mean_prompt']:3d}"]
    for mode in ("burst", "random"):
        if mode in r:
            m = r[mode]
            parts.append(f"{mode} {m['tps']:6.1f} t/s ttft {m['ttft_p50_s']:.2f}/{m['ttft_p99_s']:.2f} s "
                         f"tpot {m['tpot_p50_ms']:.1f}/{m['tpot_p99_ms']:.1f} ms"
                         + (f" preempted {m['preemptions']:.0f}" if m["preemptions"] else ""))
    if "llama.cpp" in r:
        m = r["llama.cpp"]
        parts.append(f"llama.cpp {m['tps']:6.1f} t/s (S_TG {m['s_tg_tps']:.1f})")
    print(" | ".join(parts), flush=True)


if __name__ == "__main__":
    main()
