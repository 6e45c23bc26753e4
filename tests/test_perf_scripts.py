"""Every perf/ script answers ``--help``: its imports resolve (the package moves under it) and
its usage says what it measures.

Each runs as a newcomer runs it, ``python perf/X.py --help`` in a fresh interpreter with
PYTHONPATH at the repository root; nothing is measured.  The purpose checked is the first
paragraph of the script's docstring, which each script passes to its argument parser.
Most of the time is ``import numba`` in each child.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PERF = ROOT / "perf"
SCRIPTS = sorted(p.name for p in PERF.glob("*.py"))

# Modules of perf/ that other scripts import and that have no command line of their own.
HELPERS = {
    "overlap_kernels.py": "the decode kernels on the overlap curve: run as perf/overlap_ceiling.py --kernels",
}


def _has_main(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'" for node in tree.body)


def _purpose(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
    assert doc, f"{path.name} has no module docstring"
    return doc.split("\n\n")[0]


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)  # argparse and click rewrap (and break after hyphens)


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_helpers_are_exactly_the_modules_without_a_main():
    assert {name for name in SCRIPTS if not _has_main(PERF / name)} == set(HELPERS)


@pytest.mark.parametrize("name", [name for name in SCRIPTS if name not in HELPERS])
def test_help(name):
    r = _run(str(PERF / name), "--help")
    assert r.returncode == 0, f"{name} --help exited {r.returncode}:\n{r.stderr[-3000:]}"
    assert "usage:" in r.stdout.lower(), r.stdout
    assert _squash(_purpose(PERF / name)) in _squash(r.stdout), f"{name}: the usage does not open with its docstring"


def test_must_show_dry_run_is_the_default_set():
    r = _run("perf/must_show.py", "--dry-run", "--tag", "T", "--isa", "avx2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    benches = [ln for ln in lines if ln.startswith("llcinfer bench")]
    assert len([ln for ln in lines if ln.startswith("llcinfer generate")]) == 3
    assert len(benches) == 8  # 3 models x 2 thread counts, plus Qwen2.5-0.5B d16384 at both
    assert all("--vs llama.cpp" in ln and "perf/results/bench-T-" in ln for ln in benches)
    assert ("llcinfer bench -m qwen2.5-coder-0.5b --threads 1 -p 0 -n 32 --depth 16384 -r 3 --vs llama.cpp "
            "--alternate block --fill synthetic") in r.stdout
    merge = next(ln for ln in lines if "bench_report.py" in ln)
    assert merge.count("perf/results/bench-T-") == 8 and "--plot perf/results/bench-T.png" in merge
    assert any(ln.startswith("python perf/kernel_asm.py --isa avx2") for ln in lines)
    assert any(ln.startswith("python perf/overlap_ceiling.py") and "--kernels" in ln for ln in lines)
