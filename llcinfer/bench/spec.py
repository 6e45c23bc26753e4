"""Effective TPOT of speculative decoding (``llcinfer bench --spec``): ours plain and with
each drafter, optionally llama.cpp plain and ``llama-speculative-simple``, on chat
workloads, greedy.

Workloads (``WORKLOADS``):
  code-edit   a function from CPython's standard library (textwrap.dedent) with "rename
              this parameter, return the whole function": the answer copies most of the
              input (with TextWrapper._wrap_chunks SmolLM2-135M wrote new code instead)
  free-chat   an open question, nothing to copy

Effective TPOT is wall time per generated token after the first (ours: GenerationStats,
drafting and verification included, after an untimed short request on another prompt; llama.cpp: ``llama-completion``'s eval time per token,
``llama-speculative-simple``'s "decoded N tokens in T s").

The host's speed drifts by up to 1.4x within minutes, so every ratio is taken within a
repetition: each repetition runs every configuration once, in turn forwards and backwards
(A B C, C B A, ...: a steady drift weighs on both ends alike), and "vs our plain" is the
median over repetitions of a configuration's TPOT over our plain TPOT of the same
repetition.  TPOT columns are medians over repetitions.
"""

from __future__ import annotations

import inspect
import re
import statistics
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

from ..api import LLM
from ..engine.speculation_setup import build_speculator
from ..errors import UsageError
from ..jit import child_env
from ..model import catalog
from ..weights.repack_cache import wait_loaded
from . import llama_cpp

WORKLOADS = {
    "code-edit": "Rename the parameter `text` to `source` in this function. Return the whole function.\n\n"
                 + inspect.getsource(textwrap.dedent),
    "free-chat": "Why is the sky blue? Explain it to a curious ten-year-old, in a few paragraphs.",
}
SPEC_CTX = 4096  # context of every run, ours and llama.cpp's
WARM_UP = [{"role": "user", "content": "Name three colours."}]  # an untimed first request, unlike the workloads


def parse_specs(text: str) -> list[str]:
    """``ngram,suffix,draft:MODEL`` -> the modes; a one-line UsageError for anything else."""
    specs = [s for s in str(text).replace(" ", "").split(",") if s]
    for s in specs:
        if s not in ("ngram", "suffix", "auto") and not (s.startswith("draft:") and len(s) > 6):
            raise UsageError(f"--spec takes ngram, suffix, auto or draft:MODEL, comma-separated (got {s!r})")
    if not specs:
        raise UsageError("--spec needs at least one mode")
    return list(dict.fromkeys(specs))


def parse_workloads(text: str) -> list[str]:
    names = [w for w in str(text).replace(" ", "").split(",") if w]
    bad = [w for w in names if w not in WORKLOADS]
    if bad or not names:
        raise UsageError(f"--spec-workload takes {', '.join(WORKLOADS)} (got {text!r})")
    return list(dict.fromkeys(names))


def ours(model: str, spec: str, msgs: list, n: int, threads: int) -> dict:
    """One greedy chat generation of ``n`` tokens; spec "none" is plain decoding."""
    llm = LLM(model, threads=threads, n_ctx=SPEC_CTX, progress=False, speculative=None if spec == "none" else spec)
    try:
        wait_loaded()  # the steady state: weights on 2 MiB pages, not being copied there
        llm.chat(WARM_UP, max_tokens=16, temperature=0, ignore_eos=True)  # every program shape built once
        text = llm.chat(msgs, max_tokens=n, temperature=0, ignore_eos=True)
        s = llm.last_stats
        out = {"tpot_ms": s.tpot_ms, "n": s.n_generated, "text": text}
        st = llm.spec_stats
        if st is not None:
            out.update(accepted_per_verification=st.accepted_per_verification, wasted=st.wasted_share,
                       verifications=st.verifications, plain_steps=st.plain_steps,
                       k_max=llm.engine.speculator.cost.k_max)
        return out
    finally:
        llm.close()


def llama_tool(name: str) -> Path:
    exe = llama_cpp.binary("native", name) or llama_cpp.binary("portable", name)
    if exe is None:
        raise UsageError(f"llama.cpp's {name} is not built (run: python perf/llama_cpp.py build)")
    return exe


def run_llama_tool(name: str, args: list[str], timeout: float) -> tuple[subprocess.CompletedProcess, str]:
    """Run llama.cpp's tool ``name`` with ``args``: the native build, and where it was killed by a
    signal the portable one (on an Intel host with AMX the native build's tile kernels can die
    at their first batched matmul: perf/README.md, llama.cpp builds); (its result, the config)."""
    llama_tool(name)  # built in some config, or a one-line error
    builds = [(c, exe) for c in ("native", "portable") if (exe := llama_cpp.binary(c, name)) is not None]
    for config, exe in builds:
        out = subprocess.run([str(exe)] + args, capture_output=True, text=True, timeout=timeout,
                             env=child_env())  # not our OpenMP waiting policy
        if out.returncode >= 0:
            break
    return out, config


def llama(model_path: Path, spec_type: str, draft: Path | None, prompt_text: str, n: int, threads: int) -> dict:
    """llama.cpp on the same prompt: ``llama-completion`` for spec_type "none", else
    ``llama-speculative-simple --spec-type spec_type`` (with ``draft``: -md, 8 drafted)."""
    tool = "llama-completion" if spec_type == "none" else "llama-speculative-simple"
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt_text)
    args = ["-m", str(model_path), "-f", f.name, "-n", str(n), "-t", str(threads),
            "--temp", "0", "-c", str(SPEC_CTX), "--ignore-eos"]
    args += ["-no-cnv"] if spec_type == "none" else ["--spec-type", spec_type]
    if draft is not None:
        args += ["-md", str(draft), "-td", str(threads), "--spec-draft-n-max", "8"]
    try:
        out, build = run_llama_tool(tool, args, timeout=900)
    finally:
        Path(f.name).unlink(missing_ok=True)
    log = out.stdout + out.stderr
    if spec_type == "none":  # common_perf_print: eval time = X ms / N runs
        m = re.search(r"\beval time =\s+([\d.]+) ms /\s+(\d+) runs", log)
        if m is None:
            raise RuntimeError(f"{tool} ({build}, exit {out.returncode}) failed: {log[-800:]}")
        return {"tpot_ms": float(m.group(1)) / int(m.group(2)), "n": int(m.group(2)) + 1, "n_drafted": 0,
                "build": build}
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
    if m is None:
        raise RuntimeError(f"{tool} ({build}, exit {out.returncode}) failed: {log[-800:]}")
    acc = re.search(r"n_accept\s+=\s+(\d+)", log)
    drafted = re.search(r"n_drafted\s+=\s+(\d+)", log)
    return {"tpot_ms": 1000 * float(m.group(2)) / int(m.group(1)), "n": int(m.group(1)),
            "n_drafted": int(drafted.group(1)) if drafted else 0, "n_accept": int(acc.group(1)) if acc else 0,
            "build": build}


def configurations(specs: list[str], vs_llama: bool) -> list[tuple[str, str]]:
    """(engine, mode) in the order each repetition runs them."""
    configs = [("ours", "none")] + [("ours", s) for s in specs]
    if vs_llama:
        configs += [("llama.cpp", "none"), ("llama.cpp", "ngram-simple")]
        configs += [("llama.cpp", f"draft-simple:{s[6:]}") for s in specs if s.startswith("draft:")]
    return configs


def run_spec_bench(model: str, specs: list[str], workloads: list[str], n: int, threads: int, reps: int,
                   vs_llama: bool, log) -> list[dict]:
    """Every configuration on every workload, ``reps`` repetitions (module doc); one row per
    (workload, engine, mode) with the median TPOT and the median of its per-repetition
    ratios to our plain decoding."""
    configs = configurations(specs, vs_llama)
    if vs_llama:
        for tool in ("llama-completion", "llama-speculative-simple"):
            llama_tool(tool)
    path = catalog.resolve_model(model, progress=False)
    drafts = {s: catalog.resolve_model(s.partition(":")[2], progress=False) for _, s in configs if ":" in s}
    probe = LLM(model, threads=threads, n_ctx=SPEC_CTX, progress=False)
    try:
        texts = {wl: probe.apply_chat_template([{"role": "user", "content": WORKLOADS[wl]}]) for wl in workloads}
        vocab = list(probe.gguf.metadata.get("tokenizer.ggml.tokens", []))
        for spec in specs:  # a draft that cannot draft for this model fails here, before any run
            if spec.startswith("draft:"):
                build_speculator(spec, probe.model, vocab, SPEC_CTX, 1, progress=False)
    finally:
        probe.close()
    results: dict[tuple, list[dict]] = {}
    for wl in workloads:
        msgs = [{"role": "user", "content": WORKLOADS[wl]}]
        for rep in range(reps):
            for engine, spec in (configs if rep % 2 == 0 else configs[::-1]):
                t0 = time.time()
                if engine == "ours":
                    r = ours(model, spec, msgs, n, threads)
                else:
                    r = llama(path, spec.partition(":")[0], drafts.get(spec), texts[wl], n, threads)
                results.setdefault((wl, engine, spec), []).append(r)
                log(f"{wl} rep {rep} {engine} {spec}: TPOT {r['tpot_ms']:.2f} ms ({time.time() - t0:.0f} s)")
    rows = []
    for wl in workloads:
        plain = results[(wl, "ours", "none")]
        plain_text = plain[-1]["text"]
        for engine, spec in configs:
            rs = results[(wl, engine, spec)]
            tpot = statistics.median(r["tpot_ms"] for r in rs)
            vs_plain = statistics.median(r["tpot_ms"] / p["tpot_ms"] for r, p in zip(rs, plain))  # within each repetition
            row = {"workload": wl, "engine": engine, "spec": spec, "tpot_ms": tpot, "vs_plain": vs_plain,
                   "runs": [{k: v for k, v in r.items() if k != "text"} for r in rs]}
            if engine == "ours" and spec != "none":
                row["same_as_plain"] = all(r["text"] == plain_text for r in rs)
            rows.append(row)
    return rows


def markdown(rows: list[dict], model: str, threads: int, n: int) -> str:
    lines = [f"{model}, {threads} threads, {n} tokens greedy, effective TPOT (medians; 'vs our plain': the "
             "median of the ratios within each repetition)", "",
             "| workload | engine | speculation | TPOT ms | vs our plain | notes |", "|---|---|---|---|---|---|"]
    for r in rows:
        last, note = r["runs"][-1], ""
        if "accepted_per_verification" in last:
            note = (f"{last['accepted_per_verification']:.2f} accepted/verification, {100 * last['wasted']:.0f}% "
                    f"wasted, K_max {last['k_max']}" + ("" if r.get("same_as_plain") else ", OUTPUT DIFFERS"))
        elif last.get("n_drafted"):
            note = f"accepted {last['n_accept']}/{last['n_drafted']}"
        lines.append(f"| {r['workload']} | {r['engine']} | {r['spec']} | {r['tpot_ms']:.2f} | {r['vs_plain']:.2f}x "
                     f"| {note} |")
    return "\n".join(lines)
