"""The paged KV cache's must-show numbers (issue 6), printed and written as JSON.

    python perf/kv_cache_report.py                         # every section, SmolLM2, 2 threads
    python perf/kv_cache_report.py --sections tpot,blocks  # a subset

Sections:
  rss     resident memory of one generation at 0, 1K and 8K tokens of real context (text:
          CPython's inspect.py), and after the sequence ends (blocks returned to the OS)
  tpot    decode time per token at d4096 / d8000, paged f16 vs paged f32
          cache, alternating A B A B, medians (synthetic K/V: attention cost does not
          depend on the values)
  blocks  the same at d4096 for block sizes 16 / 32 / 64
  prefix  prefix-sharing hits and prefill time saved: a multi-turn chat (new sequence per
          turn, as a server would) and a batch of prompts with a common system prompt, each
          against the same run with sharing off
  int8    int8 vs f16 KV: top-1 agreement and max logit error over >= 4K real tokens
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import psutil

from llcinfer import LLM
from llcinfer.engine.loop import Engine
from llcinfer.weights.repack_cache import wait_loaded
from llcinfer.engine.sampling import SamplingParams

MiB = 2**20


def log(*a):
    print(*a, flush=True)


def rss() -> int:
    return psutil.Process().memory_info().rss


def real_tokens(llm: LLM, n: int) -> list[int]:
    import inspect

    with open(inspect.__file__, encoding="utf-8") as fh:
        text = fh.read()
    ids = llm.tokenize(text)
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


def section_rss(llm: LLM, out: dict) -> None:
    eng, model = llm.engine, llm.model
    ids = real_tokens(llm, 8192)
    model.forward([1], eng.new_sequence())  # compile; the temporary sequence frees itself
    eng.pool.drop_cached()
    base = rss()
    rows = []

    def gen(n_ctx_tokens: int) -> None:
        t0 = time.perf_counter()
        eng.prefill(ids[:max(1, n_ctx_tokens)])
        for tok in ids[n_ctx_tokens:n_ctx_tokens + 8]:  # 8 decode steps on top
            model.forward([tok], eng.cache)
        r = rss()
        row = {"context": n_ctx_tokens, "rss_mib": r / MiB, "rss_minus_base_mib": (r - base) / MiB,
               "kv_committed_mib": eng.pool.committed_bytes / MiB, "tokens_held": eng.cache.n_tokens,
               "seconds": time.perf_counter() - t0}
        rows.append(row)
        log(f"  rss at context {n_ctx_tokens}: {row}")

    for n in (0, 1024, 8192 - 16):
        gen(n)
    eng.reset()
    eng.pool.drop_cached()
    r = rss()
    rows.append({"context": "after release", "rss_mib": r / MiB, "rss_minus_base_mib": (r - base) / MiB,
                 "kv_committed_mib": eng.pool.committed_bytes / MiB})
    log(f"  after the sequence ends: {rows[-1]}")
    out["rss"] = {"base_rss_mib": base / MiB, "reserved_mib": eng.pool.reserved_bytes / MiB,
                  "kv_bytes_per_token": eng.pool.block_bytes / eng.pool.block_size, "rows": rows}


def fill_synthetic(model, cache, depth: int, rng) -> None:
    c = model.config
    cache.truncate(0)
    for li in range(c.n_layer):
        k = (rng.standard_normal((depth, c.n_kv_head, c.head_dim), dtype=np.float32) * 2).astype(np.float16)
        v = rng.standard_normal((depth, c.n_kv_head, c.head_dim), dtype=np.float32).astype(np.float16)
        cache.store(li, 0, k.astype(np.float32), v.astype(np.float32))
    cache.n_tokens = depth


def decode_ms(model, cache, depth: int, n: int) -> float:
    cache.truncate(depth)
    t0 = time.perf_counter()
    for i in range(n):
        model.forward([100 + i], cache)
    dt = time.perf_counter() - t0
    cache.truncate(depth)
    return dt / n * 1000


def ab(model, caches: dict, depth: int, n: int, reps: int) -> dict:
    rng = np.random.default_rng(0)
    for cache in caches.values():
        fill_synthetic(model, cache, depth, rng)
        decode_ms(model, cache, depth, 2)  # warm
    times = {name: [] for name in caches}
    for _ in range(reps):
        for name, cache in caches.items():
            times[name].append(decode_ms(model, cache, depth, n))
    return {name: {"median_ms": statistics.median(t), "runs_ms": t} for name, t in times.items()}


def section_tpot(llm: LLM, out: dict, depths, n: int, reps: int) -> None:
    model = llm.model
    res = {}
    for d in depths:
        caches = {f"paged_{t}": model.new_cache(d + n + 8, kv_type=t) for t in ("f16", "f32")}
        res[f"d{d}"] = ab(model, caches, d, n, reps)
        log(f"  TPOT d{d}: " + ", ".join(f"{k} {v['median_ms']:.1f} ms" for k, v in res[f"d{d}"].items()))
        del caches
    out["tpot"] = res


def section_blocks(llm: LLM, out: dict, depth: int, n: int, reps: int) -> None:
    model = llm.model
    caches = {f"bs{bs}": model.new_cache(depth + n + 8, kv_type="f16", block_size=bs) for bs in (16, 32, 64)}
    out["blocks"] = ab(model, caches, depth, n, reps)
    log(f"  block sweep d{depth}: " + ", ".join(f"{k} {v['median_ms']:.1f} ms" for k, v in out["blocks"].items()))


def section_prefix(llm: LLM, out: dict) -> None:
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=False)
    system = ("You are a careful assistant for a software team that maintains a large Python code base. "
              "Answer in one short paragraph. Cite the relevant function names from the standard library. "
              "Never invent APIs; say so when you do not know. Prefer examples over prose, keep code "
              "snippets under ten lines, use the names the user used, and mention the Python version "
              "when behaviour changed between versions. ") * 3
    llm.generate("warm up", max_tokens=4, temperature=0)  # compile every kernel path first
    res = {}
    for sharing in (True, False):
        eng = Engine(llm.model, llm.tokenizer, llm.n_ctx, n_seq=4, prefix_sharing=sharing)
        # multi-turn chat, one new sequence per turn (server style)
        msgs = [{"role": "system", "content": system}]
        turns = []
        for q in ("What does inspect.signature return?", "And for a builtin without a signature?",
                  "How do I get the source lines of a function?"):
            msgs.append({"role": "user", "content": q})
            ids = llm.tokenize(llm.apply_chat_template(msgs), special=True)
            r = eng.generate_batch([ids], params)[0]  # a new sequence for this turn
            st = r.stats
            msgs.append({"role": "assistant", "content": llm.detokenize(r.token_ids)})
            turns.append({"prompt_tokens": st.n_prompt, "evaluated": st.n_prompt_evaluated,
                          "reused": st.n_prompt - st.n_prompt_evaluated, "prefill_s": st.prompt_seconds})
        # a batch of prompts with a common system prompt
        users = ["Summarise inspect.getsource.", "What is a frame object?", "Explain inspect.isclass.",
                 "How does inspect.unwrap work?"]
        batch = [[{"role": "system", "content": system}, {"role": "user", "content": u}] for u in users]
        ids = [llm.tokenize(llm.apply_chat_template(m), special=True) for m in batch]
        results = eng.generate_batch(ids, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        brow = [{"prompt_tokens": r.stats.n_prompt, "evaluated": r.stats.n_prompt_evaluated,
                 "reused": r.stats.n_prompt - r.stats.n_prompt_evaluated, "prefill_s": r.stats.prompt_seconds}
                for r in results]
        key = "sharing" if sharing else "no_sharing"
        res[key] = {"chat_turns": turns, "batch": brow,
                    "prefix_stats": vars(eng.prefix.stats) if eng.prefix else None,
                    "chat_prefill_s": sum(t["prefill_s"] for t in turns),
                    "batch_prefill_s": sum(b["prefill_s"] for b in brow)}
        log(f"  prefix {key}: chat {turns}\n    batch {brow}\n    stats {res[key]['prefix_stats']}")
    res["chat_prefill_saved_s"] = res["no_sharing"]["chat_prefill_s"] - res["sharing"]["chat_prefill_s"]
    res["batch_prefill_saved_s"] = res["no_sharing"]["batch_prefill_s"] - res["sharing"]["batch_prefill_s"]
    log(f"  prefill saved: chat {res['chat_prefill_saved_s']:.2f} s, batch {res['batch_prefill_saved_s']:.2f} s")
    out["prefix"] = res


def section_int8(llm: LLM, out: dict, n_tokens: int, chunk: int = 32) -> None:
    model = llm.model
    ids = real_tokens(llm, n_tokens)
    a = model.new_cache(n_tokens + 8, kv_type="f16")
    b = model.new_cache(n_tokens + 8, kv_type="int8")
    agree = 0
    max_err = 0.0
    max_rel = 0.0
    sum_err = 0.0
    t0 = time.perf_counter()
    for i in range(0, n_tokens, chunk):
        la = model.forward(ids[i:i + chunk], a, all_logits=True)
        lb = model.forward(ids[i:i + chunk], b, all_logits=True)
        agree += int((la.argmax(-1) == lb.argmax(-1)).sum())
        err = np.abs(la - lb).max(-1)
        max_err = max(max_err, float(err.max()))
        max_rel = max(max_rel, float((err / np.abs(la).max(-1)).max()))
        sum_err += float(np.abs(la - lb).mean(-1).sum())
        if i % 1024 == 0:
            log(f"  int8 {i}/{n_tokens} tokens, {time.perf_counter() - t0:.0f} s, agree {agree / (i + len(la)):.4f}")
    out["int8"] = {"tokens": n_tokens, "top1_agreement": agree / n_tokens, "max_abs_logit_err": max_err,
                   "max_rel_logit_err": max_rel, "mean_abs_logit_err": sum_err / n_tokens,
                   "kv_bytes_per_token_f16": a.pool.block_bytes / a.block_size,
                   "kv_bytes_per_token_int8": b.pool.block_bytes / b.block_size}
    log(f"  int8 vs f16: {out['int8']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sections", default="blocks,tpot,prefix,int8,rss")
    ap.add_argument("--depths", default="4096,8000")
    ap.add_argument("--decode", type=int, default=16, help="decode steps per timed run")
    ap.add_argument("--reps", type=int, default=4, help="A B alternations")
    ap.add_argument("--int8-tokens", type=int, default=4096)
    ap.add_argument("--out", default="perf/results/kv_cache_report.json")
    args = ap.parse_args()
    llm = LLM(args.model, threads=args.threads, n_ctx=8192 + 64, progress=False)
    wait_loaded()  # weights on 2 MiB pages before timing
    out = {"model": args.model, "threads": args.threads, "block_size": llm.engine.pool.block_size}
    sections = args.sections.split(",")
    for s in sections:
        log(f"[{s}]")
        t0 = time.perf_counter()
        if s == "rss":
            section_rss(llm, out)
        elif s == "tpot":
            section_tpot(llm, out, [int(d) for d in args.depths.split(",")], args.decode, args.reps)
        elif s == "blocks":
            section_blocks(llm, out, 4096, args.decode, args.reps)
        elif s == "prefix":
            section_prefix(llm, out)
        elif s == "int8":
            section_int8(llm, out, args.int8_tokens)
        log(f"[{s}] {time.perf_counter() - t0:.0f} s")
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=1, default=str)
    json.dump(out, sys.stdout, indent=1, default=str)


if __name__ == "__main__":
    main()
