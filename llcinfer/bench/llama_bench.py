"""Running llama.cpp's ``llama-bench`` and reading its JSON output.

A run that dies by a signal (SIGILL from AMX kernels on the native build of an AMX CPU,
SIGSEGV, ...) is reported as ``crashed``; any other failure (non-zero exit, unreadable
output, timeout) as ``failed``.  Neither raises: the comparison goes on without it.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..jit import child_env
from . import llama_cpp


@dataclass
class LlamaBenchRun:
    status: str  # ok, crashed, failed
    entries: list[dict] = field(default_factory=list)  # llama-bench's JSON objects, one per test
    returncode: int | None = None
    message: str | None = None  # why it crashed or failed, one line
    stderr: str = ""

    @property
    def samples_tps(self) -> list[float]:
        """tokens/s of every repetition of every entry (we run one test per invocation)."""
        out: list[float] = []
        for e in self.entries:
            out += [float(s) for s in e.get("samples_ts") or [e["avg_ts"]]]
        return out


def parse_json(text: str) -> list[dict]:
    """llama-bench ``-o json`` output: a list of test objects, each with ``n_prompt``,
    ``n_gen``, ``n_depth``, ``n_threads``, ``avg_ts``, ``stddev_ts``, ``samples_ts``,
    ``build_commit`` ... .  Raises ValueError when it is not that."""
    start = text.find("[")
    if start < 0:
        raise ValueError("no JSON array in llama-bench output")
    data = json.loads(text[start:])
    if not isinstance(data, list) or not all(isinstance(e, dict) for e in data):
        raise ValueError("llama-bench JSON is not a list of objects")
    for e in data:
        for key in ("n_prompt", "n_gen", "avg_ts", "stddev_ts"):
            if key not in e:
                raise ValueError(f"llama-bench JSON entry lacks {key!r}")
    return data


def _signal_name(returncode: int) -> str | None:
    """SIGILL for -4 (killed by signal 4), or for 132 (a shell's 128 + 4)."""
    num = -returncode if returncode < 0 else (returncode - 128 if 128 < returncode < 160 else 0)
    if num <= 0:
        return None
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def run(exe: str | os.PathLike, model: str | os.PathLike, threads: int, n_prompt: int, n_gen: int,
        depth: int, reps: int, timeout: float = 3600.0, extra: list[str] | None = None) -> LlamaBenchRun:
    """One llama-bench invocation for one test (pp: n_gen=0, tg: n_prompt=0)."""
    cmd = [str(exe), "-m", str(model), "-t", str(threads), "-p", str(n_prompt), "-n", str(n_gen),
           "-d", str(depth), "-r", str(reps), "-o", "json", *(extra or [])]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, errors="replace",
                              env=child_env())
    except subprocess.TimeoutExpired:
        return LlamaBenchRun("failed", message=f"timed out after {timeout:.0f} s")
    except OSError as exc:
        return LlamaBenchRun("failed", message=f"could not run {exe}: {exc}")
    rc = proc.returncode
    tail = " | ".join(ln.strip() for ln in proc.stderr.strip().splitlines()[-3:])
    sig = _signal_name(rc)
    if sig is not None and rc != 0:
        return LlamaBenchRun("crashed", returncode=rc, message=f"killed by {sig}", stderr=proc.stderr)
    if rc != 0:
        return LlamaBenchRun("failed", returncode=rc, message=f"exit {rc}: {tail}", stderr=proc.stderr)
    try:
        entries = parse_json(proc.stdout)
    except ValueError as exc:
        return LlamaBenchRun("failed", returncode=rc, message=f"bad output: {exc}", stderr=proc.stderr)
    if not entries:
        return LlamaBenchRun("failed", returncode=rc, message="no results in output", stderr=proc.stderr)
    return LlamaBenchRun("ok", entries=entries, returncode=rc, stderr=proc.stderr)


def find_builds(user_exe: str | os.PathLike | None = None, build: bool = False, jobs: int = 2,
                log=None) -> tuple[dict[str, Path], list[str]]:
    """The llama-bench binaries to compare with, {build name: path}, and notes for the user.

    ``user_exe`` (``--llama-bench PATH``) replaces the provisioned builds.  Otherwise every
    built configuration (native, portable) is used; with ``build`` the missing ones are
    built first.  A failed build leaves a note, never an exception.
    """
    notes: list[str] = []
    if user_exe is not None:
        p = Path(user_exe).expanduser()
        if not (p.is_file() and os.access(p, os.X_OK)):
            notes.append(f"--llama-bench {p}: not an executable file; measuring llcinfer only")
            return {}, notes
        return {"user": p}, notes
    builds: dict[str, Path] = {}
    for config in llama_cpp.CONFIGS:
        exe = llama_cpp.binary(config, "llama-bench")
        if exe is None and build:
            if log:
                log(f"building llama.cpp {config} (log: {llama_cpp.log_path(config)}) ...")
            try:
                llama_cpp.build(config, jobs=jobs)
                exe = llama_cpp.binary(config, "llama-bench")
            except llama_cpp.LlamaCppError as exc:
                notes.append(f"llama.cpp {config} build failed: {exc}")
        if exe is not None:
            builds[config] = exe
    if not builds and not build:
        notes.append("no llama.cpp build found; measuring llcinfer only "
                     "(add --build-llama-cpp, or --llama-bench PATH, or run: python perf/llama_cpp.py build)")
    elif not builds:
        notes.append("no llama.cpp build available; measuring llcinfer only")
    return builds, notes


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llcinfer")
    except PackageNotFoundError:  # running from a source tree that was not installed
        return "unknown"


def llama_cpp_version(exe: str | os.PathLike | None) -> str | None:
    """``llama-bench --version`` first line (e.g. "version: 0.6.0-dev (build 0, commit unknown)")."""
    if exe is None:
        return None
    try:
        p = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in (p.stdout + p.stderr).splitlines():
        if line.startswith("version"):
            return line.split(":", 1)[1].strip()
    return None


def versions(llama_bench: str | os.PathLike | None) -> dict:
    import llvmlite
    import numba
    import numpy

    return {"llcinfer": _package_version(), "numba": numba.__version__, "llvmlite": llvmlite.__version__,
            "numpy": numpy.__version__, "python": platform.python_version(),
            "llama.cpp": llama_cpp_version(llama_bench)}
