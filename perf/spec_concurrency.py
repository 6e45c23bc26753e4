#!/usr/bin/env python3
"""Speculation under concurrency: ECHO's super-tree against per-sequence trees with the
same total budget and against no speculation.

C requests run at once (``n_seq`` = C; with ``--queue Q``, Q x C requests through the C
slots, each freed slot taken by the next: a sequence that finishes sooner then lets
another start, as in serving, where with C requests at once the batch ends with its
slowest), each a code-edit chat prompt on a different
function of CPython's standard library, "rename its first parameter, return the whole
function" (192 tokens, greedy): the edit of ``llcinfer bench --spec``'s code-edit workload,
one function per request, so every answer copies its own prompt.  (With "add type hints"
SmolLM2-135M wrote new code for most of these functions: 0.001 verifications per token at
C = 4 and 8, nothing to compare.)  Per policy: aggregate throughput (generated tokens / wall
time of the batch, prompt included for all alike), verification steps per generated token,
share of verified draft tokens wasted, and the requests' mean TPOT (each request's time
per token after its first) against plain's.  All three configurations run on one ``LLM`` per
concurrency (the per-sequence speculator shares the super-tree one's drafter and measured
cost; each keeps its measured acceptance and pacer account from run to run, as a
server's would), in turn, backwards on odd repetitions, each run with fresh statistics and
a suffix drafter's history emptied first: a fresh ``LLM`` per run differed from the next by as much
as speculation changes under load.  Throughput is the median over repetitions, "x plain"
the median of the ratios to plain within each repetition.  Before the timed repetitions
the weights are waited for on their 2 MiB pages and every configuration serves one short
request on another prompt and the batch once, untimed (the first batch builds the step
programs of its shapes).

    python perf/spec_concurrency.py -m smollm2-135m --spec ngram --concurrency 1,4,8
    python perf/spec_concurrency.py -m qwen2.5-coder-1.5b --spec draft:qwen2.5-coder-0.5b
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import statistics
import sys
import time
from pathlib import Path

from llcinfer import LLM
from llcinfer.bench.spec import WARM_UP, parse_specs
from llcinfer.engine.sampling import SamplingParams
from llcinfer.engine.speculation import SpecStats, Speculator
from llcinfer.errors import LLCInferError, UsageError
from llcinfer.weights.repack_cache import wait_loaded


FUNCTIONS = ["textwrap.TextWrapper._wrap_chunks", "textwrap.dedent", "json.encoder.py_encode_basestring",
             "shlex.split", "fnmatch.translate", "heapq.nlargest", "glob.glob", "string.capwords",
             "difflib.get_close_matches", "base64.b64encode",
             # the queued requests of --queue (each prompt once: a suffix drafter would copy a repeat)
             "textwrap.indent", "textwrap.shorten", "statistics.median", "statistics.mode", "calendar.isleap",
             "colorsys.rgb_to_hls", "colorsys.hls_to_rgb", "heapq.nsmallest", "shlex.quote", "fnmatch.filter",
             "glob.escape", "difflib.unified_diff", "string.Template.substitute", "random.Random.shuffle",
             "fractions.Fraction.limit_denominator", "textwrap.TextWrapper._split",
             "json.encoder.py_encode_basestring_ascii", "calendar.monthrange", "statistics.variance",
             "ipaddress.ip_address", "csv.Sniffer.sniff", "urllib.parse.urljoin"]


def _function(dotted: str):
    """The object at ``dotted`` (module, then attributes or submodules)."""
    mod, _, rest = dotted.partition(".")
    obj = importlib.import_module(mod)
    for part in rest.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(f"{mod}.{part}")
            mod = f"{mod}.{part}"
    return obj


def edit_prompt(dotted: str) -> str:
    """The code-edit request on function ``dotted``: rename its first parameter (after self)."""
    fn = _function(dotted)
    param = [p for p in inspect.signature(fn).parameters if p != "self"][0]
    return (f"Rename the parameter `{param}` to `{param}_arg` in this function. Return the whole function.\n\n"
            + inspect.getsource(fn))


def _batch(llm, speculator, prompts: list, n: int) -> dict:
    """The C prompts at once under ``speculator`` (None: plain): throughput and statistics."""
    llm.engine.speculator = speculator
    if speculator is not None:
        speculator.stats = SpecStats()
        if hasattr(speculator.drafter, "forget_history"):  # a suffix drafter would copy the last run's answers
            speculator.drafter.forget_history()
    t0 = time.perf_counter()
    done = llm.engine.generate(prompts, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    wall = time.perf_counter() - t0
    gen = sum(d.stats.n_generated for d in done)
    out = {"tokens_per_s": gen / wall, "generated": gen, "outputs": [d.token_ids for d in done],
           "request_tpot_ms": statistics.mean(d.stats.tpot_ms for d in done)}
    if speculator is not None:
        st = speculator.stats
        out.update(verifications_per_token=st.verifications / gen, wasted=st.wasted_share,
                   accepted_per_tree=st.accepted_per_verification, plain_steps=st.plain_steps,
                   k_max=speculator.cost.k_max)
    return out


def run_level(a, spec: str, c: int, configs: list[tuple[str, str]]) -> dict:
    """{(spec, policy): [result per repetition]} of C = ``c`` requests, every configuration
    on one LLM."""
    llm = LLM(a.model, threads=a.threads, n_ctx=2048, n_seq=c, progress=False, speculative=spec,
              spec_policy="super-tree", spec_budget=a.budget)
    try:
        tree = llm.engine.speculator
        per_seq = Speculator(tree.drafter, "per-sequence", a.budget)
        per_seq.cost, per_seq.executor = tree.cost, tree.executor
        speculators = {"none": None, "super-tree": tree, "per-sequence": per_seq}
        key = {cfg: speculators["none" if cfg[0] == "none" else cfg[1]] for cfg in configs}
        wait_loaded()  # the steady state: weights on 2 MiB pages
        prompts = []
        for f in FUNCTIONS[:c * a.queue]:
            msgs = [{"role": "user", "content": edit_prompt(f)}]
            prompts.append(llm.tokenize(llm.apply_chat_template(msgs), special=True))
        for cfg in configs:  # untimed: program shapes built
            llm.engine.speculator = key[cfg]
            llm.chat(WARM_UP, max_tokens=16, temperature=0, ignore_eos=True)
            _batch(llm, key[cfg], prompts, a.n)
        res = {}
        for rep in range(a.repetitions):
            for cfg in (configs if rep % 2 == 0 else configs[::-1]):
                res.setdefault(cfg, []).append(_batch(llm, key[cfg], prompts, a.n))
        return res
    finally:
        llm.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--spec", default="ngram")
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--n", type=int, default=192)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=1)
    ap.add_argument("--budget", type=int, default=None, help="tokens per verification (default: measured knee)")
    ap.add_argument("--queue", type=int, default=1,
                    help="Q x C requests through C sequence slots: one that finishes frees its slot for the next")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    try:
        specs = parse_specs(a.spec)
        spec = specs[0] if len(specs) == 1 else None
        levels = [int(x) for x in a.concurrency.split(",") if x.strip().isdigit() and int(x) > 0]
        if a.queue < 1 or max(levels, default=0) * a.queue > len(FUNCTIONS):
            raise UsageError(f"--queue takes 1 to {len(FUNCTIONS) // max(levels, default=1)} here "
                             f"({len(FUNCTIONS)} prompts; got {a.queue})")
        if spec is None or len(levels) != len(a.concurrency.split(",")):
            raise UsageError(f"--spec takes one mode and --concurrency positive integers (got {a.spec!r}, "
                             f"{a.concurrency!r})")
        configs = [("none", "super-tree"), (spec, "super-tree"), (spec, "per-sequence")]
        rows = measure(a, levels, configs)
    except LLCInferError as exc:
        sys.exit(f"error: {exc}")
    if a.json:
        doc = {"model": a.model, "threads": a.threads, "n": a.n, "queue": a.queue, "rows": rows}
        Path(a.json).write_text(json.dumps(doc, indent=1))


def measure(a, levels: list[int], configs: list[tuple[str, str]]) -> list[dict]:
    """Every configuration at every concurrency in ``levels`` (``a``: the parsed
    arguments), printed as it goes; the rows of the JSON."""
    rows = []
    spec = next(s for s, _ in configs if s != "none")
    for c in levels:
        res = run_level(a, spec, c, configs)
        plain = res[("none", "super-tree")]
        want = plain[-1]["outputs"]
        for spec, policy in configs:
            rs = res[(spec, policy)]
            tps = statistics.median(r["tokens_per_s"] for r in rs)
            vs_plain = statistics.median(r["tokens_per_s"] / p["tokens_per_s"] for r, p in zip(rs, plain))
            tpot_vs_plain = statistics.median(r["request_tpot_ms"] / p["request_tpot_ms"] for r, p in zip(rs, plain))
            r = rs[-1]
            label = "plain" if spec == "none" else f"{spec} {policy}"
            extra = ""
            if "wasted" in r:
                extra = (f"verif/token {r['verifications_per_token']:.3f}, wasted {100 * r['wasted']:.0f}%, "
                         f"acc/tree {r['accepted_per_tree']:.2f}, K_max {r['k_max']}"
                         + ("" if r["outputs"] == want else ", OUTPUT DIFFERS"))
            print(f"C={c} {label:40s} {tps:7.1f} tok/s  {vs_plain:5.2f}x plain  request TPOT {tpot_vs_plain:5.2f}x  "
                  f"{extra}", flush=True)
            rows.append({"concurrency": c, "spec": spec, "policy": policy, "tokens_per_s": tps,
                         "vs_plain": vs_plain, "request_tpot_vs_plain": tpot_vs_plain,
                         **{k: v for k, v in r.items() if k not in ("outputs",)}})
    return rows


if __name__ == "__main__":
    main()
