"""Start-to-first-token time of a fresh process, cold and warm, with a breakdown.

    python perf/startup.py                                  # the three catalog models
    python perf/startup.py --models smollm2-135m --warm-runs 5 --threads 2
    python perf/startup.py --json perf/results/startup-X.json   # the table goes to stdout

Per model, in fresh subprocesses:

* **cold**: NUMBA_CACHE_DIR and LLCINFER_REPACK_CACHE point at new empty temporary
  directories (every kernel compiles, every matrix is repacked and its cache file
  written); the GGUF header index ($LLCINFER_HOME/gguf-index) and the OS page cache are
  left as they are: the model is downloaded and has been opened before.
* **warm**: the same directories again (second and later runs); medians of --warm-runs.
* **warm, no repack cache**: as warm with LLCINFER_REPACK_CACHE=0 (every matrix repacked
  at every start, as before the cache existed); skipped with --no-baseline.

Every run also records its CPU time (user + system, ``cpu_s``): on a shared machine wall
times drift with the load (the JSON keeps the load average before each model).

Two kinds of run, each cold once and warm --warm-runs times:

* ``cli``: ``llcinfer generate --temp 0 -n 1 -t T -m MODEL "Hello"``; ``first_token_s``
  is the time from starting the process to the first byte of the completion on its
  stdout (the CLI flushes every piece), ``exit_s`` to the process's end.
* ``probe``: this script with ``--probe MODEL``: ``LLM(MODEL)`` then ``generate("Hello",
  max_tokens=1, temperature=0)`` with timers wrapped around the steps of the start
  (exclusive times, nested timers subtracted):

      interpreter   process start until this script's first line runs
      import        import llcinfer.api (numpy, numba, gguf, ...)
      gguf_index    GGUFFile(): the header index (cached pickle) and the memory map
      weights       Transformer(): binding the tensors to Linear objects
      tokenizer     Tokenizer.from_metadata
      repack        Linear.prepare(): map the repack cache (warm) / repack and write it (cold)
      numba_init    numba's one-time set-up in the process: its typing and target contexts
                    refresh() (registries of every numba module, which imports scipy.linalg)
      numba         numba Dispatcher.compile of our kernels: load from the disk cache (warm)
                    or compile (cold)
      numba_rt      Dispatcher.compile of numba's own jitted helpers (numba.typed.List's
                    constructor and append, ...): compiled in every process, never cached
      warm_up       LLM's warm-up forward passes, less the repack and numba time in them
      other         the rest of LLM() (engine, KV pool, chat template)
      prefill       generate(): tokenize, prefill the prompt, sample the first token
      first_token   process start to the first token (the sum)

Output: a Markdown table on stdout and JSON (``--json``, default
perf/results/startup-<date>.json).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import inspect
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
PROMPT = "Hello"
PHASES = ("interpreter", "import", "gguf_index", "weights", "tokenizer", "repack", "numba_init", "numba", "numba_rt",
          "warm_up", "other", "prefill")


# ----------------------------------------------------------------------------- the probe
class _Clock:
    """Exclusive time per phase: a timer's time less that of the timers nested in it."""

    def __init__(self):
        self.phases = dict.fromkeys(PHASES, 0.0)
        self.stack: list[list[float]] = []  # [start, time of nested timers]

    @contextlib.contextmanager
    def phase(self, name: str):
        self.stack.append([time.monotonic(), 0.0])
        try:
            yield
        finally:
            t0, nested = self.stack.pop()
            dt = time.monotonic() - t0
            self.phases[name] += dt - nested
            if self.stack:
                self.stack[-1][1] += dt

    def wrap(self, owner, attr: str, name) -> None:
        """Time every call of owner.attr (a function or classmethod) as phase ``name``
        (a string, or a function of the call's arguments that returns one)."""
        raw = inspect.getattr_static(owner, attr)
        fn = raw.__func__ if isinstance(raw, classmethod) else raw

        def timed(*args, **kw):
            with self.phase(name(*args) if callable(name) else name):
                return fn(*args, **kw)

        setattr(owner, attr, classmethod(timed) if isinstance(raw, classmethod) else timed)


def probe(model: str, threads: int | None, t_spawn: float) -> dict:
    """One start, timed phase by phase (runs in the child process)."""
    clock = _Clock()
    clock.phases["interpreter"] = time.monotonic() - t_spawn
    with clock.phase("import"):
        import numba.core.base as numba_base
        import numba.core.dispatcher as nd
        import numba.core.typing.context as numba_typing

        import llcinfer.api as api
        from llcinfer.engine import transformer as model_mod
        from llcinfer.kernels import Linear
        from llcinfer.weights import repack_cache
        from llcinfer.model.gguf_file import GGUFFile
        from llcinfer.model.tokenizer import Tokenizer
    clock.wrap(GGUFFile, "__init__", "gguf_index")
    clock.wrap(model_mod.Transformer, "__init__", "weights")
    clock.wrap(Tokenizer, "from_metadata", "tokenizer")
    clock.wrap(Linear, "prepare", "repack")
    clock.wrap(nd.Dispatcher, "compile",
               lambda disp, *a: "numba_rt" if disp.py_func.__module__.startswith("numba.") else "numba")
    clock.wrap(model_mod.Transformer, "warm_up", "warm_up")
    clock.wrap(numba_typing.BaseContext, "refresh", "numba_init")
    clock.wrap(numba_base.BaseContext, "refresh", "numba_init")
    with clock.phase("other"):
        llm = api.LLM(model, threads=threads)
    with clock.phase("prefill"):
        text = llm.generate(PROMPT, max_tokens=1, temperature=0)
    return {"first_token_s": time.monotonic() - t_spawn, "phases": clock.phases, "text": text,
            "threads": llm.threads, "repack_cache": dict(repack_cache.STATS)}


# ----------------------------------------------------------------------------- the parent
def _cli_command(model: str, threads: int | None) -> list[str]:
    """The installed ``llcinfer`` script next to this interpreter (not a pyenv shim, which
    adds its own start-up), else the same entry point through ``python -c``."""
    exe = Path(sys.executable).parent / "llcinfer"
    head = [str(exe)] if exe.exists() else [sys.executable, "-c", "from llcinfer.cli import main; main()"]
    opts = ["-t", str(threads)] if threads else []
    return head + ["generate", "--temp", "0", "-n", "1", "-m", model, *opts, PROMPT]


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_cli(model: str, threads: int | None, env: dict) -> dict:
    """One ``llcinfer generate`` process: time to its first stdout byte and to its exit."""
    cpu0 = _cpu_children()
    with tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        p = subprocess.Popen(_cli_command(model, threads), stdout=subprocess.PIPE, stderr=err, env=env, cwd=ROOT)
        first = os.read(p.stdout.fileno(), 1)
        t_first = time.monotonic()
        rest = p.stdout.read()
        rc = p.wait()
        t_exit = time.monotonic()
        err.seek(0)
        if rc != 0 or not first:
            raise RuntimeError(f"llcinfer generate failed (exit {rc}): {err.read().decode(errors='replace')[-2000:]}")
    return {"first_token_s": t_first - t0, "exit_s": t_exit - t0, "cpu_s": _cpu_children() - cpu0,
            "text": (first + rest).decode(errors="replace").strip()}


def run_probe(model: str, threads: int | None, env: dict) -> dict:
    """One probe process (``--probe``); its JSON line."""
    cpu0 = _cpu_children()
    t0 = time.monotonic()
    opts = ["--threads", str(threads)] if threads else []
    cmd = [sys.executable, __file__, "--probe", model, "--t-spawn", repr(t0), *opts]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"probe failed (exit {p.returncode}): {p.stderr[-2000:]}")
    return {**json.loads(p.stdout.strip().splitlines()[-1]), "cpu_s": _cpu_children() - cpu0}


def _env(tmp: Path) -> dict:
    """Our environment with the numba and repack caches in ``tmp`` (empty at first: cold)."""
    env = dict(os.environ)
    env["NUMBA_CACHE_DIR"] = str(tmp / "numba")
    env["LLCINFER_REPACK_CACHE"] = str(tmp / "repack")
    env.pop("LLCINFER_NUMBA_CACHE", None)
    return env


def measure(model: str, threads: int | None, warm_runs: int, baseline: bool = True, log=print) -> dict:
    """Cold and warm runs of both kinds for ``model`` (and warm without the repack cache)."""
    out: dict = {"loadavg": os.getloadavg(), "cold": {}, "warm": {}}
    if baseline:
        out["warm_no_repack_cache"] = {}
    for kind, fn in (("cli", run_cli), ("probe", run_probe)):
        with tempfile.TemporaryDirectory(prefix=f"llcinfer-startup-{kind}-") as tmp:
            env = _env(Path(tmp))
            cold = fn(model, threads, env)
            log(f"{model} {kind} cold: {cold['first_token_s']:.2f} s")
            out["cold"][kind] = cold
            states = [("warm", env)]
            if baseline:
                states.append(("warm_no_repack_cache", {**env, "LLCINFER_REPACK_CACHE": "0"}))
            for state, e in states:
                runs = []
                for i in range(warm_runs):
                    runs.append(fn(model, threads, e))
                    log(f"{model} {kind} {state} {i + 1}: {runs[-1]['first_token_s']:.2f} s")
                out[state][kind] = _median_of(runs)
    return out


def _median_of(runs: list[dict]) -> dict:
    med = {k: statistics.median(r[k] for r in runs) for k in ("first_token_s", "exit_s", "cpu_s") if k in runs[0]}
    if "phases" in runs[0]:
        med["phases"] = {p: statistics.median(r["phases"][p] for r in runs) for p in PHASES}
        med["repack_cache"] = runs[-1]["repack_cache"]
    med["samples"] = runs
    return med


def table(results: dict) -> str:
    """Markdown: a row per model and cold/warm (seconds)."""
    head = ["model", "start", "CLI first token", "CLI exit", "CLI cpu", "probe first token", *PHASES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    names = {"cold": "cold", "warm": "warm", "warm_no_repack_cache": "warm, repack cache off"}
    for model, r in results.items():
        for state, name in names.items():
            if state not in r:
                continue
            cli, pr = r[state]["cli"], r[state]["probe"]
            cells = [model, name, f"{cli['first_token_s']:.2f}", f"{cli['exit_s']:.2f}", f"{cli['cpu_s']:.2f}",
                     f"{pr['first_token_s']:.2f}", *(f"{pr['phases'][p]:.2f}" for p in PHASES)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _machine() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    try:
        rev = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                             cwd=ROOT).stdout.strip()
    except OSError:
        rev = None
    import numba
    import numpy

    return {"cpu_model": cpu, "logical_cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": numpy.__version__, "numba": numba.__version__, "git": rev}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--threads", type=int, default=None, help="kernel threads (default: llcinfer's)")
    ap.add_argument("--warm-runs", type=int, default=3)
    ap.add_argument("--no-baseline", action="store_true", help="skip the warm runs without the repack cache")
    ap.add_argument("--json", default=None, help="default: perf/results/startup-<date>.json")
    ap.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--t-spawn", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(args.probe, args.threads, args.t_spawn)))
        return 0
    from llcinfer.model import catalog

    for m in args.models:  # downloads happen here, not inside a timed run
        catalog.resolve_model(m, progress=True)
    log = lambda s: print(s, file=sys.stderr)  # noqa: E731
    results = {m: measure(m, args.threads, args.warm_runs, not args.no_baseline, log) for m in args.models}
    doc = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": _machine(),
           "settings": {"threads": args.threads, "warm_runs": args.warm_runs, "prompt": PROMPT, "medians": True,
                        "cli": _cli_command("MODEL", args.threads)},
           "results": results}
    path = Path(args.json or ROOT / "perf" / "results" / f"startup-{datetime.date.today().isoformat()}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(table(results))
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
