#!/usr/bin/env python3
"""The must-show run: llcinfer against llama.cpp on the catalog models, then the kernel evidence.

    python perf/must_show.py --dry-run                     # print the default set's commands
    python perf/must_show.py --tag 2026-12-05              # run it (hours; a quiet machine)
    python perf/must_show.py --tag 2026-12-05b --models qwen2.5-coder-0.5b --parts bench \\
        --merge perf/results/bench-2026-12-05-smollm2-135m.json

Run it on a quiet machine: nothing else CPU-heavy while it runs.  Every figure is a ratio
measured side by side in one run, but a busy host still widens the spread.  The commands
run one after another, in this order:

  warm-up   ``llcinfer generate`` of 4 tokens per model (with bench): compiles the kernels
            and writes the repack cache for this source tree, so that no timed run pays
            for them (warmup-TAG.log)
  bench     ``llcinfer bench --vs llama.cpp`` per model and thread count
            (bench-TAG-[tT-]MODEL[-dD].{json,md,log}):
              at the most threads: pp (``--n-prompt``) and tg (``--n-gen`` tokens) at the
              depths below ``--deep-from``, alternating per repetition (A B A B), the
              depth filled for real unless that would take over 600 s;
              at fewer threads: tg only, half as many tokens, synthetic fill;
              each depth from ``--deep-from`` on: one run of its own, ``--alternate
              block`` and synthetic fill (one llama.cpp depth fill per build instead of
              one per repetition), ``--deep-reps`` repetitions, a quarter of the tokens
              at fewer threads
  merge     perf/bench_report.py over those JSONs and ``--merge``: the table
            (bench-TAG.md), merged JSON (bench-TAG.json) and plot (bench-TAG.png)
  asm       perf/kernel_asm.py: the matmul kernel's assembly counts (asm-TAG-matmul.json)
  overlap   perf/overlap_ceiling.py --kernels: the DRAM share one core keeps while it
            computes, and the decode kernels on that curve (overlap-TAG.{json,log})
  attention perf/attention_bench.py at 4096 keys (attention-TAG.{json,log}); not default
  startup   perf/startup.py, process start to first token (startup-TAG.{json,log}); not
            default

Every file goes to perf/results/ with TAG in its name; the script refuses to overwrite
files of an earlier run with the same tag (``--force`` does).  A command that fails is
reported and the rest still run; the exit status is 1 if any failed.  The children run
with PYTHONPATH set to this checkout, so they measure this source tree.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path("perf/results")  # relative to ROOT: the names the commands print and the JSON keeps

# The default set: depths per model.  SmolLM2's context is 8192 tokens; the 1.5B stops at
# d0 to bound the run's length (its llama.cpp depth fills alone would take hours here).
DEPTHS = {
    "smollm2-135m": (0, 4096, 8000),
    "qwen2.5-coder-0.5b": (0, 4096, 16384),
    "qwen2.5-coder-1.5b": (0,),
}
PARTS = ("bench", "asm", "overlap", "attention", "startup")
DEFAULT_PARTS = ("bench", "asm", "overlap")


@dataclass
class Cmd:
    argv: list[str]        # as printed; "llcinfer" and "python" are resolved when run
    stdout: Path | None    # under ROOT; None: the terminal
    stderr: Path | None    # None: with stdout
    append: bool = False

    def shell(self) -> str:
        s = " ".join(_quote(a) for a in self.argv)
        if self.stdout is not None:
            s += f" {'>>' if self.append else '>'} {self.stdout}"
            s += f" 2> {self.stderr}" if self.stderr is not None else " 2>&1"
        return s


def _quote(a: str) -> str:
    return a if a and all(c.isalnum() or c in "-_./,=:@" for c in a) else "'" + a.replace("'", "'\\''") + "'"


def bench_runs(tag: str, models: list[str], threads: list[int], depths: dict[str, tuple[int, ...]],
               deep_from: int, n_prompt: int, n_gen: int, reps: int, deep_reps: int) -> list[Cmd]:
    """The ``llcinfer bench`` commands of the set, most threads first."""
    top = max(threads)
    cmds = []
    for model in models:
        for t in sorted(threads, reverse=True):
            full = t == top
            prefix = "" if full else f"t{t}-"
            near = [d for d in depths[model] if d < deep_from]
            far = [d for d in depths[model] if d >= deep_from]
            pp = n_prompt if full else 0
            tg = n_gen if full else max(1, n_gen // 2)
            if near or pp:
                name = f"bench-{tag}-{prefix}{model}"
                fill = ["--fill-limit", "600"] if full else ["--fill", "synthetic"]
                cmds.append(_bench(model, t, pp, tg if near else 0, near or [0], reps, fill, name))
            for d in far:
                name = f"bench-{tag}-{prefix}{model}-d{d}"
                tg_far = n_gen if full else max(1, n_gen // 4)
                cmds.append(_bench(model, t, 0, tg_far, [d], deep_reps,
                                   ["--alternate", "block", "--fill", "synthetic"], name))
    return cmds


def _bench(model, threads, pp, tg, depths, reps, extra, name) -> Cmd:
    argv = ["llcinfer", "bench", "-m", model, "--threads", str(threads), "-p", str(pp), "-n", str(tg),
            "--depth", ",".join(map(str, depths)), "-r", str(reps), "--vs", "llama.cpp", *extra,
            "--json", str(RESULTS / f"{name}.json")]
    return Cmd(argv, RESULTS / f"{name}.md", RESULTS / f"{name}.log")


def plan(a) -> list[tuple[str, Cmd]]:
    """(part, command) in the order they run."""
    tag, R = a.tag, RESULTS
    out: list[tuple[str, Cmd]] = []
    for m in a.models if "bench" in a.parts else []:
        out.append(("warm-up", Cmd(["llcinfer", "generate", "-m", m, "--temp", "0", "-n", "4", "warm the caches"],
                                   R / f"warmup-{tag}.log", None, append=True)))
    if "bench" in a.parts:
        runs = bench_runs(tag, a.models, a.threads, a.depth_table, a.deep_from, a.n_prompt, a.n_gen,
                          a.reps, a.deep_reps)
        out += [("bench", c) for c in runs]
        jsons = [c.argv[c.argv.index("--json") + 1] for c in runs] + list(a.merge)
        out.append(("merge", Cmd(["python", "perf/bench_report.py", *jsons, "--json", str(R / f"bench-{tag}.json"),
                                  "--plot", str(R / f"bench-{tag}.png")], R / f"bench-{tag}.md", None)))
    if "asm" in a.parts:
        out.append(("asm", Cmd(["python", "perf/kernel_asm.py", "--isa", a.isa],
                               R / f"asm-{tag}-matmul.json", R / f"asm-{tag}-matmul.log")))
    threads = [str(t) for t in sorted(set(a.threads) | {1})]  # --kernels needs the 1-thread curve
    if "overlap" in a.parts:
        out.append(("overlap", Cmd(["python", "perf/overlap_ceiling.py", "--threads", *threads,
                                    "--fmas", "0", "1", "2", "3", "4", "--ahead", "0", "1024", "4096", "--reps", "9",
                                    "--isa", a.isa, "--kernels", "--json", str(R / f"overlap-{tag}.json")],
                                   R / f"overlap-{tag}.log", None)))
    if "attention" in a.parts:
        out.append(("attention", Cmd(["python", "perf/attention_bench.py", "--ctx", "4096", "--threads", *threads,
                                      "--isa", a.isa, "--reps", "5", "--json", str(R / f"attention-{tag}.json")],
                                     R / f"attention-{tag}.log", None)))
    if "startup" in a.parts:
        out.append(("startup", Cmd(["python", "perf/startup.py", "--models", *a.models, "--warm-runs", "3",
                                    "--threads", str(max(a.threads)), "--no-baseline",
                                    "--json", str(R / f"startup-{tag}.json")], R / f"startup-{tag}.log", None)))
    return out


def outputs(cmds: list[Cmd]) -> list[Path]:
    files = []
    for c in cmds:
        files += [p for p in (c.stdout, c.stderr) if p is not None]
        files += [Path(c.argv[i + 1]) for i, x in enumerate(c.argv[:-1]) if x in ("--json", "--plot")]
    return sorted(set(files))


def best_isa() -> str:
    """The best SIMD path this CPU runs (what the engine itself would take)."""
    sys.path.insert(0, str(ROOT))
    from llcinfer.kernels.isa import supported_isas
    from llcinfer.kernels.simd import TAGS

    return next(i for i in supported_isas() if i in TAGS)


def resolve(argv: list[str]) -> list[str]:
    if argv[0] == "python":
        return [sys.executable, *argv[1:]]
    if argv[0] == "llcinfer":
        exe = Path(sys.executable).with_name("llcinfer")
        found = str(exe) if exe.exists() else shutil.which("llcinfer")
        if found is None:  # not installed as a script: run its entry point through this interpreter
            return [sys.executable, "-c", "import sys; from llcinfer.cli import main; sys.exit(main())", *argv[1:]]
        return [found, *argv[1:]]
    return argv


def run(cmds: list[tuple[str, Cmd]]) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    (ROOT / RESULTS).mkdir(parents=True, exist_ok=True)
    failed = []
    t_start = time.time()
    for part, c in cmds:
        if part == "merge":  # merge what the bench runs wrote; a failed run leaves no JSON
            files = c.argv[2:c.argv.index("--json")]
            have = [f for f in files if (ROOT / f).exists()]
            if not have:
                print(f"[{part}] skipped: no bench JSON to merge", flush=True)
                continue
            c = Cmd(c.argv[:2] + have + c.argv[c.argv.index("--json"):], c.stdout, c.stderr)
        print(f"[{part} {time.strftime('%H:%M:%S')}] {c.shell()}", flush=True)
        with contextlib.ExitStack() as files:
            out = files.enter_context(open(ROOT / c.stdout, "ab" if c.append else "wb")) if c.stdout else None
            err = files.enter_context(open(ROOT / c.stderr, "wb")) if c.stderr else subprocess.STDOUT if out else None
            rc = subprocess.run(resolve(c.argv), cwd=ROOT, env=env, stdout=out, stderr=err).returncode
        if rc != 0:
            failed.append((part, rc, c))
            print(f"[{part}] exit {rc}; see {c.stderr or c.stdout}", flush=True)
    print(f"must-show done in {(time.time() - t_start) / 60:.0f} min; {len(failed)} failed", flush=True)
    for part, rc, c in failed:
        print(f"  failed ({part}, exit {rc}): {c.shell()}")
    return 1 if failed else 0


def main(argv=None) -> int:
    head, examples, rest = __doc__.split("\n\n", 2)
    ap = argparse.ArgumentParser(description=f"{head}\n\n{examples}", epilog=rest,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tag", default=str(datetime.date.today()),
                    help="names the result files, e.g. 2026-12-05 or 2026-12-05b (default: today)")
    ap.add_argument("--models", nargs="+", default=list(DEPTHS), help="catalog names (default: %(default)s)")
    ap.add_argument("--threads", nargs="+", type=int, default=[2, 1], help="thread counts (default: %(default)s)")
    ap.add_argument("--depths", nargs="+", type=int, default=None,
                    help="KV depths for every model (default, per model: "
                         + "; ".join(f"{m} {' '.join(map(str, d))}" for m, d in DEPTHS.items()) + "; others 0 4096)")
    ap.add_argument("--deep-from", type=int, default=8192,
                    help="depths from here on run alone, block-alternated, synthetic fill (default: %(default)s)")
    ap.add_argument("-p", "--n-prompt", type=int, default=512, help="pp tokens at the most threads; 0: no pp (default: %(default)s)")
    ap.add_argument("-n", "--n-gen", type=int, default=128, help="tg tokens at the most threads (default: %(default)s)")
    ap.add_argument("-r", "--reps", type=int, default=4, help="repetitions per test (default: %(default)s)")
    ap.add_argument("--deep-reps", type=int, default=3, help="repetitions of the deep rows (default: %(default)s)")
    ap.add_argument("--merge", nargs="+", default=[], metavar="JSON",
                    help="bench JSONs of an earlier run to merge into this run's table (rows this run leaves out)")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(DEFAULT_PARTS),
                    help="what to run (default: %(default)s)")
    ap.add_argument("--isa", default=None, help="SIMD path for asm / overlap / attention (default: the best this CPU runs)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--force", action="store_true", help="overwrite the files of an earlier run with this tag")
    a = ap.parse_args(argv)
    if min(a.threads) < 1 or a.reps < 1 or a.deep_reps < 1 or a.n_gen < 1 or a.n_prompt < 0:
        ap.error("--threads, --reps, --deep-reps and --n-gen must be at least 1, --n-prompt at least 0")
    if not a.tag or any(c in a.tag for c in "/ \\"):
        ap.error("--tag must be a plain name (it goes into file names)")
    a.threads = sorted(set(a.threads), reverse=True)
    a.depth_table = {m: tuple(a.depths) if a.depths is not None else DEPTHS.get(m, (0, 4096)) for m in a.models}
    if a.isa is None:
        a.isa = best_isa() if set(a.parts) & {"asm", "overlap", "attention"} else "avx2"
    cmds = plan(a)
    if a.dry_run:
        for _, c in cmds:
            print(c.shell())
        return 0
    existing = [p for p in outputs([c for _, c in cmds]) if (ROOT / p).exists()]
    if existing and not a.force:
        print(f"error: {len(existing)} result files with tag {a.tag!r} exist (e.g. {existing[0]}); "
              "choose another --tag or pass --force", file=sys.stderr)
        return 2
    for p in existing:  # --force: start clean (the warm-up log appends)
        (ROOT / p).unlink()
    return run(cmds)


if __name__ == "__main__":
    sys.exit(main())
