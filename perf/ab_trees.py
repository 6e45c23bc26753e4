"""Decode TPOT (or prefill time) of two llcinfer source trees in one process, alternating: new / old.

    python perf/ab_trees.py --old HEAD --new worktree qwen2.5-coder-0.5b --threads 1 2 --depth 0 4096
    python perf/ab_trees.py --old 627c2a9 --new HEAD smollm2-135m --depth 4096 -r 20
    python perf/ab_trees.py --old HEAD qwen2.5-coder-0.5b --pp -n 512 -r 6
    python perf/ab_trees.py --old HEAD smollm2-135m --api -n 64    # LLM.generate's own TPOT
    python perf/ab_trees.py --old HEAD qwen2.5-coder-1.5b --verify 8 -n 1  # a speculative verification step
    python perf/ab_trees.py --old HEAD smollm2-135m --verify 8 -n 1 --depth 512  # ... after 512 tokens

This host's speed drifts by up to 1.5x within minutes (other tenants), so two processes
run one after the other can differ by more than a kernel change does.  Here both trees are
loaded at once, as two packages (``ab_old``, ``ab_new``: the package imports itself only
relatively), and tg runs alternate old, new, new, old, ...; the figure is the median of
the per-pair ratios new / old, with its quartiles.  Both engines keep their workers; a
worker only spins a few ms after its engine's last step, then blocks.

Which engine loads first matters here: Qwen2.5-0.5B at d4096, 1 thread, the same pair of
trees gave 1.045 with the old one loaded first and 0.971 with the new one first (memory
placement: which model and KV pool got the 2 MiB pages, say).  So by default each thread
count is run twice, once per load order, and the geometric mean of the two is the figure.

A tree is a git revision (``git archive``) or ``worktree`` (the checkout as it is, edits
included), copied to ``$LLCINFER_HOME/ab/ab_old`` and ``ab_new``: fixed paths, so numba's
on-disk cache (keyed by the sources, see llcinfer/jit.py) is reused when a tree is run
again; a tree seen for the first time compiles for minutes.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def materialise(tree: str, dest: Path, name: str) -> Path:
    """Copy the llcinfer package of ``tree`` to dest/name."""
    target = dest / name
    shutil.rmtree(target, ignore_errors=True)
    if tree == "worktree":
        shutil.copytree(ROOT / "llcinfer", target, ignore=shutil.ignore_patterns("__pycache__"))
        return target
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", tree, "llcinfer"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    (dest / "llcinfer").rename(target)
    return target


def prepare_trees(trees: dict) -> None:
    """Materialise {name: tree} as packages ab_<name> under $LLCINFER_HOME/ab, importable."""
    sys.path.insert(0, str(ROOT))
    from llcinfer import paths

    trees_dir = paths.home() / "ab"
    trees_dir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(trees_dir))
    for name, tree in trees.items():
        materialise(tree, trees_dir, f"ab_{name}")


class ApiBench:
    """TPOT as a user gets it: ``LLM.generate`` (greedy, end of text ignored) of a tree's
    package, its own ``last_stats`` (sampling, detokenizing and the step loop included)."""

    NO_DEPTH = "--api runs from an empty context (--depth 0)"

    def __init__(self, package, model: str, threads: int, n_ctx: int):
        self.llm = importlib.import_module(f"{package}.api").LLM(model, threads=threads, n_ctx=n_ctx, progress=False)
        self.depth = 0

    def set_depth(self, depth: int, mode: str = "auto") -> None:
        if depth:
            raise SystemExit(self.NO_DEPTH)

    def warmup(self) -> None:
        self.tg(8)

    def tg(self, n: int) -> float:
        """Seconds per token after the first, times n (what compare() divides by n)."""
        self.llm.generate("The three primary colors are", max_tokens=n, temperature=0, ignore_eos=True)
        return self.llm.last_stats.tpot_ms / 1e3 * n


class VerifyBench(ApiBench):
    """One speculative verification step of ``rows`` rows (a drafted chain after a prefix
    of --depth tokens, 64 at depth 0; every row's logits) as the step loop runs it:
    engine/speculation.py ``verification_seconds`` of the tree's package, one step per call."""

    def __init__(self, package, model: str, threads: int, n_ctx: int, rows: int):
        super().__init__(package, model, threads, n_ctx + 128)
        self.verification_seconds = importlib.import_module(f"{package}.engine.speculation").verification_seconds
        self.rows = rows
        self.seq = None

    def set_depth(self, depth: int, mode: str = "auto") -> None:
        if self.seq is not None:
            self.seq.free()
        self.seq = self.llm.engine.new_sequence("verify")
        self.llm.model.forward_chunks([(self.seq, list(range(1, max(depth, 64) + 1)))])

    def tg(self, n: int) -> float:
        """Seconds of n verification steps (each the median of 1)."""
        return sum(self.verification_seconds(self.llm.model, [self.seq], self.rows, 1, self.llm.engine.runner.executor)
                   for _ in range(n))


def quartiles(xs) -> tuple[float, float, float]:
    return tuple(float(v) for v in np.percentile(xs, [50, 25, 75]))


def compare(benches: dict, depth: int, n: int, reps: int, pp: bool = False) -> dict:
    """tg (or with pp, prefill of an n-token prompt) at depth, trees alternating."""
    for b in benches.values():
        b.set_depth(depth, mode="synthetic" if depth else "auto")
        b.warmup()
        b.tg(min(n, 8))
    ratios, per = [], {name: [] for name in benches}
    for r in range(reps):
        order = ("old", "new") if r % 2 == 0 else ("new", "old")
        t = {name: (benches[name].pp(n) if pp else benches[name].tg(n)) / n for name in order}
        for name in benches:
            per[name].append(t[name])
        ratios.append(t["new"] / t["old"])
    med, q1, q3 = quartiles(ratios)
    return {"test": "pp" if pp else "tg", "depth": depth, "n": n, "reps": reps,
            "ratio_new_old": med, "q1": q1, "q3": q3,
            "ms_per_token": {name: 1e3 * float(np.median(ts)) for name, ts in per.items()}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--old", default="HEAD", help="git revision or 'worktree'")
    ap.add_argument("--new", default="worktree", help="git revision or 'worktree'")
    ap.add_argument("--threads", type=int, nargs="+", default=[2])
    ap.add_argument("--depth", type=int, nargs="+", default=[0])
    ap.add_argument("-n", type=int, default=32, help="tokens per tg run")
    ap.add_argument("--pp", action="store_true", help="time prefill of an n-token prompt instead of tg")
    ap.add_argument("--api", action="store_true", help="TPOT of LLM.generate (the step loop) instead of raw decode steps")
    ap.add_argument("--verify", type=int, default=None, metavar="T",
                    help="time a speculative verification step of T rows (-n steps per run) instead of tg")
    ap.add_argument("-r", "--reps", type=int, default=12, help="tg runs per tree (alternating)")
    ap.add_argument("--load-first", choices=("old", "new", "both"), default="both",
                    help="which tree loads its model and KV pool first; both: each once (see below)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.verify is not None and args.verify < 1:
        ap.error(f"--verify takes a positive number of rows (got {args.verify})")
    trees = {"old": args.old, "new": args.new}
    prepare_trees(trees)
    ours = {name: importlib.import_module(f"ab_{name}.bench.ours") for name in trees}

    def make(name, threads, n_ctx):
        if args.api:
            return ApiBench(f"ab_{name}", args.model, threads, n_ctx)
        if args.verify:
            return VerifyBench(f"ab_{name}", args.model, threads, n_ctx, args.verify)
        return ours[name].OursBench(args.model, threads, n_ctx)

    n_ctx = max(args.depth) + args.n + 64
    rows = []
    orders = {"old": [("old", "new")], "new": [("new", "old")]}.get(args.load_first, [("old", "new"), ("new", "old")])
    test = "pp" if args.pp else "api-tg" if args.api else f"verify{args.verify}x" if args.verify else "tg"
    label = f"{args.model} {test}{args.n}"
    for threads in args.threads:
        by_depth = {d: [] for d in args.depth}
        for order in orders:
            benches = {name: make(name, threads, n_ctx) for name in order}
            for depth in args.depth:
                row = {"threads": threads, "loaded_first": order[0],
                       **compare(benches, depth, args.n, args.reps, args.pp), "test": test}
                rows.append(row)
                by_depth[depth].append(row["ratio_new_old"])
                print(f"{label} t={threads} d{depth} ({order[0]} loaded first): new/old {row['ratio_new_old']:.3f} "
                      f"(q1 {row['q1']:.3f}, q3 {row['q3']:.3f}; {args.reps} pairs of {args.n} tokens)", flush=True)
            del benches
        if len(orders) == 2:
            for depth, rs in by_depth.items():
                print(f"{label} t={threads} d{depth}: new/old {float(np.sqrt(rs[0] * rs[1])):.3f} "
                      "(geometric mean of both load orders)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "old": args.old, "new": args.new,
                                               "results": rows}, indent=1))


if __name__ == "__main__":
    try:
        main()
    except subprocess.CalledProcessError as exc:  # git archive of an unknown revision
        sys.exit(f"error: {' '.join(exc.cmd[:5])}: {exc.stderr.decode(errors='replace').strip().splitlines()[-1]}")
    except Exception as exc:  # the engine's own errors (unknown model, bad GGUF) as one line
        if type(exc).__module__.split(".")[0] not in ("ab_old", "ab_new", "llcinfer"):
            raise
        sys.exit(f"error: {exc}")
