#!/usr/bin/env python3
"""Effective TPOT of speculative decoding against plain decoding and llama.cpp.

Two chat workloads, greedy, 192 generated tokens (``--n``):
  code-edit   a function from CPython's standard library (textwrap.TextWrapper._wrap_chunks)
              with "rename this variable, return the whole function": the answer copies
              most of the input
  free-chat   an open question, nothing to copy

For each model and workload: ours plain, ours with each drafter (``--spec``), llama.cpp
plain (``llama-completion``, its eval time per token), ``llama-speculative-simple``'s ngram-simple mode and, with a
draft model, its draft-simple mode with the same draft; repetitions alternate the
configurations (A B C A B C) and the table shows medians.  Effective TPOT is wall time per
generated token after the first (ours: GenerationStats; llama.cpp: its "decoded N tokens
in T s" line).  Nothing else may run on the machine meanwhile.

    python perf/spec_bench.py -m smollm2-135m --spec ngram,suffix
    python perf/spec_bench.py -m qwen2.5-coder-1.5b --spec ngram,suffix,draft:qwen2.5-coder-0.5b
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import statistics
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

from llcinfer import LLM
from llcinfer.bench.llama_cpp import binary
from llcinfer.model import catalog

WORKLOADS = {
    "code-edit": "Rename the variable `chunks` to `pieces` in this function. Return the whole function.\n\n"
                 + inspect.getsource(textwrap.TextWrapper._wrap_chunks),
    "free-chat": "Why is the sky blue? Explain it to a curious ten-year-old, in a few paragraphs.",
}


def ours(model: str, spec: str, prompt_msgs, n: int, threads: int) -> dict:
    llm = LLM(model, threads=threads, n_ctx=4096, progress=False, speculative=None if spec == "none" else spec)
    try:
        text = llm.chat(prompt_msgs, max_tokens=n, temperature=0, ignore_eos=True)
        s = llm.last_stats
        out = {"tpot_ms": s.tpot_ms, "n": s.n_generated, "text": text}
        if llm.spec_stats is not None:
            st = llm.spec_stats
            out.update(accepted_per_verification=st.accepted_per_verification, wasted=st.wasted_share,
                       verifications=st.verifications, plain_steps=st.plain_steps,
                       k_max=llm.engine.speculator.cost.k_max)
        return out
    finally:
        llm.close()


def llama(model_path: Path, spec_type: str, draft: Path | None, prompt_text: str, n: int, threads: int) -> dict:
    tool = "llama-completion" if spec_type == "none" else "llama-speculative-simple"
    exe = binary("native", tool) or binary("portable", tool)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt_text)
    cmd = [str(exe), "-m", str(model_path), "-f", f.name, "-n", str(n), "-t", str(threads), "--temp", "0",
           "-c", "4096", "--ignore-eos"]
    cmd += ["-no-cnv"] if spec_type == "none" else ["--spec-type", spec_type]
    if draft is not None:
        cmd += ["-md", str(draft), "-td", str(threads), "--spec-draft-n-max", "8"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    log = out.stdout + out.stderr
    if spec_type == "none":  # common_perf_print: eval time = X ms / N runs
        m = re.search(r"\beval time =\s+([\d.]+) ms /\s+(\d+) runs", log)
        if m is None:
            raise RuntimeError(f"{tool} failed: {log[-800:]}")
        return {"tpot_ms": float(m.group(1)) / int(m.group(2)), "n": int(m.group(2)) + 1, "n_drafted": 0}
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
    if m is None:
        raise RuntimeError(f"{tool} failed: {log[-800:]}")
    acc = re.search(r"n_accept\s+=\s+(\d+)", log)
    drafted = re.search(r"n_drafted\s+=\s+(\d+)", log)
    return {"tpot_ms": 1000 * float(m.group(2)) / int(m.group(1)), "n": int(m.group(1)),
            "n_drafted": int(drafted.group(1)) if drafted else 0, "n_accept": int(acc.group(1)) if acc else 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--spec", default="ngram,suffix")
    ap.add_argument("--n", type=int, default=192)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=2)
    ap.add_argument("--workloads", default="code-edit,free-chat")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    path = catalog.resolve_model(a.model, progress=False)
    probe = LLM(a.model, threads=a.threads, n_ctx=4096, progress=False)
    specs = a.spec.split(",")
    drafts = [s[6:] for s in specs if s.startswith("draft:")]
    configs = [("ours", "none")] + [("ours", s) for s in specs] + [("llama.cpp", "none"), ("llama.cpp", "ngram-simple")]
    configs += [("llama.cpp", f"draft-simple:{d}") for d in drafts]
    results = {}
    for wl in a.workloads.split(","):
        msgs = [{"role": "user", "content": WORKLOADS[wl]}]
        prompt_text = probe.apply_chat_template(msgs)
        for rep in range(a.repetitions):
            for engine, spec in configs:
                t0 = time.time()
                if engine == "ours":
                    r = ours(a.model, spec, msgs, a.n, a.threads)
                else:
                    kind, _, d = spec.partition(":")
                    r = llama(path, kind, catalog.resolve_model(d, progress=False) if d else None, prompt_text,
                              a.n, a.threads)
                results.setdefault((wl, engine, spec), []).append(r)
                print(f"{wl:9s} rep {rep} {engine:9s} {spec:32s} TPOT {r['tpot_ms']:7.2f} ms "
                      f"({time.time() - t0:.0f}s)", flush=True)
    probe.close()
    print(f"\n{a.model}, {a.threads} threads, {a.n} tokens greedy, medians of {a.repetitions}")
    rows = []
    for wl in a.workloads.split(","):
        base = statistics.median(r["tpot_ms"] for r in results[(wl, "ours", "none")])
        for engine, spec in configs:
            rs = results[(wl, engine, spec)]
            tpot = statistics.median(r["tpot_ms"] for r in rs)
            extra = ""
            if "accepted_per_verification" in rs[-1]:
                r = rs[-1]
                extra = (f"acc/verif {r['accepted_per_verification']:.2f}, wasted {100 * r['wasted']:.0f}%, "
                         f"K_max {r['k_max']}")
                extra += "" if r["text"] == rs[-1]["text"] and _same_as_plain(results, wl, r) else " OUTPUT DIFFERS"
            elif engine == "llama.cpp" and rs[-1]["n_drafted"]:
                extra = f"accepted {rs[-1]['n_accept']}/{rs[-1]['n_drafted']}"
            print(f"{wl:9s} {engine:9s} {spec:32s} {tpot:7.2f} ms  {tpot / base:5.2f}x ours plain  {extra}")
            rows.append({"workload": wl, "engine": engine, "spec": spec, "tpot_ms": tpot, "vs_plain": tpot / base,
                         "runs": [{k: v for k, v in r.items() if k != "text"} for r in rs]})
    if a.json:
        Path(a.json).write_text(json.dumps({"model": a.model, "threads": a.threads, "n": a.n, "rows": rows}, indent=1))


def _same_as_plain(results, wl, r) -> bool:
    return r["text"] == results[(wl, "ours", "none")][-1]["text"]


if __name__ == "__main__":
    main()
