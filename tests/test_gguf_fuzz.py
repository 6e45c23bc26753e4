"""Fuzzing the model loader with seeded mutations of GGUF files (gguf_mutations.py).

Every case must either load and generate (``LLM(path).generate`` of 2 tokens, plus the chat
template when the file has one) or raise an ``llcinfer.errors`` exception with a one-line
message.  Any other exception, or a case running past its time limit (a hang), fails the
test, which lists them with what the mutation did.  (The limit is a SIGALRM: it interrupts
Python code, such as a parser looping on a bad length, not a compiled kernel; a segfault
ends the whole run.)

* default: ``N_CASES`` (``LLCINFER_FUZZ_CASES``, 6000) mutations of two tiny models written here (llama with F16 / BF16 /
  F32 / Q4_0 / Q8_0 matrices, an output matrix and rope_freqs; qwen2 with biases and
  Q4_1 / Q5_0), in-process, about a minute;
* ``-m fuzz`` (deselected by default): the same over the real catalog files, each for
  ``LLCINFER_FUZZ_SECONDS`` (default 120) seconds.

A table of cases by mutation kind and outcome is printed at the end (``-s`` shows it) and,
with ``LLCINFER_FUZZ_REPORT=path``, written there as JSON.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import time
from contextlib import contextmanager

import pytest

from llcinfer import LLM
from llcinfer.errors import LLCInferError
from llcinfer.model import gguf_file

from gguf_edit import GGUFMap
from gguf_mutations import KINDS, mutate
from tiny_models import isolated_runtime, write_tiny_model

N_CASES = int(os.environ.get("LLCINFER_FUZZ_CASES", "6000"))
SEED = 20240601
CASE_SECONDS = 10.0  # a tiny model loads in ~15 ms and errors in ~5 ms
REAL_CASE_SECONDS = 60.0  # a real file parses in 2-6 s
GENERATED = "loaded+generated"
LLAMA_TYPES = {"blk.0.attn_q.weight": "F16", "blk.1.attn_v.weight": "BF16", "blk.0.ffn_up.weight": "Q4_0",
               "blk.1.ffn_down.weight": "F32"}
QWEN_TYPES = {"blk.0.attn_output.weight": "Q4_1", "blk.1.ffn_gate.weight": "Q5_0"}


class CaseTimeout(Exception):
    """A case ran past its time limit."""


@contextmanager
def time_limit(seconds: float):
    """Raise CaseTimeout in this (the main) thread after ``seconds``."""
    def on_alarm(signum, frame):
        raise CaseTimeout(f"still running after {seconds:g} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def load_and_generate(path, seed: int) -> None:
    llm = LLM(str(path), threads=1, progress=False)
    try:
        llm.generate("hi there", max_tokens=2, seed=seed)
        if llm.chat_template is not None:
            llm.apply_chat_template([{"role": "user", "content": "hi"}])
    finally:
        llm.close()


def run_case(path, seed: int, limit: float) -> tuple[str, str | None]:
    """(outcome, problem): outcome is GENERATED or the llcinfer error's class; problem is
    None, or why the case fails the suite (an untyped exception, a hang, a multi-line message)."""
    try:
        with time_limit(limit):
            load_and_generate(path, seed)
        return GENERATED, None
    except LLCInferError as exc:
        msg = str(exc)
        bad = None if msg and "\n" not in msg and len(msg) < 500 else f"message not one short line: {msg[:300]!r}"
        return type(exc).__name__, bad
    except CaseTimeout as exc:
        return "hang", str(exc)
    except Exception as exc:  # noqa: BLE001 -- what the suite is looking for
        return f"untyped {type(exc).__name__}", f"{type(exc).__name__}: {str(exc)[:300]}"


class Fuzz:
    """Runs cases against seed files and tallies outcomes by mutation kind."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.table: collections.Counter = collections.Counter()  # (kind, outcome) -> cases
        self.problems: list[str] = []
        self.n = 0

    def case(self, seed_map: GGUFMap, label: str, i: int, limit: float) -> None:
        rng = random.Random(f"{SEED}-{label}-{i}")
        kind, what, data = mutate(rng, seed_map)
        path = self.workdir / f"case-{i}.gguf"  # a new name each time: an older map may still be open
        path.write_bytes(data)
        outcome, problem = run_case(path, i, limit)
        path.unlink()
        self.table[kind, outcome] += 1
        self.n += 1
        if problem:
            self.problems.append(f"{label} case {i} [{kind}: {what}] -> {problem}")

    def report(self, title: str, seconds: float) -> dict:
        outcomes = sorted({o for _, o in self.table}, key=lambda o: (o != GENERATED, o))
        rows = {k: {o: self.table[k, o] for o in outcomes if self.table[k, o]} for k in KINDS}
        width = max(len(k) for k in KINDS)
        lines = [f"{title}: {self.n} cases in {seconds:.1f} s",
                 " " * width + "".join(f"{o:>22}" for o in outcomes) + f"{'total':>8}"]
        for k in KINDS:
            lines.append(f"{k:<{width}}" + "".join(f"{self.table[k, o]:>22}" for o in outcomes)
                         + f"{sum(rows[k].values()):>8}")
        lines.append(f"{'total':<{width}}" + "".join(f"{sum(self.table[k, o] for k in KINDS):>22}" for o in outcomes)
                     + f"{self.n:>8}")
        print("\n" + "\n".join(lines))
        report = {"title": title, "cases": self.n, "seconds": round(seconds, 1), "by_kind": rows,
                  "problems": self.problems}
        out = os.environ.get("LLCINFER_FUZZ_REPORT")
        if out:
            with open(out, "a") as fh:
                fh.write(json.dumps(report) + "\n")
        return report


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    with isolated_runtime(tmp_path_factory.mktemp("llcinfer_home")):
        yield


def _seed_maps(root) -> dict[str, GGUFMap]:
    llama = write_tiny_model(root / "llama.gguf", "llama", "Q8_0", tied=False, rope_freqs=True,
                             tensor_type_override=LLAMA_TYPES)
    qwen = write_tiny_model(root / "qwen2.gguf", "qwen2", "Q8_0", tensor_type_override=QWEN_TYPES)
    return {"llama": GGUFMap(llama.read_bytes()), "qwen2": GGUFMap(qwen.read_bytes())}


def test_fuzz_tiny_models(tmp_path, runtime):
    seeds = _seed_maps(tmp_path)
    for label in seeds:  # the seeds themselves load (and compile the kernels, outside the limit)
        load_and_generate(tmp_path / f"{label}.gguf", 0)
    fuzz = Fuzz(tmp_path)
    t0 = time.perf_counter()
    for i in range(N_CASES):
        label = "llama" if i % 2 == 0 else "qwen2"
        fuzz.case(seeds[label], label, i, CASE_SECONDS)
    report = fuzz.report("tiny models", time.perf_counter() - t0)
    assert not fuzz.problems, "\n".join(fuzz.problems[:30])
    for kind, row in report["by_kind"].items():
        assert sum(row.values()) >= N_CASES // (2 * len(KINDS)), (kind, row)  # every kind ran
    total = collections.Counter()
    for row in report["by_kind"].values():
        total.update(row)
    assert total[GENERATED] > N_CASES // 10 and total["ModelFileError"] > N_CASES // 10, total


@pytest.mark.fuzz
@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_fuzz_catalog_file(name, tmp_path, monkeypatch):
    from real_models import real_model_path

    seed = GGUFMap(open(real_model_path(name), "rb").read())  # from the user's cache, before isolating
    monkeypatch.setenv("LLCINFER_REPACK_CACHE", "0")  # 100 MB and more per case otherwise
    monkeypatch.setattr(gguf_file, "INDEX_MIN_FILE_SIZE", 1 << 62)  # every case is a new file: no index cache
    budget = float(os.environ.get("LLCINFER_FUZZ_SECONDS", "120"))
    fuzz = Fuzz(tmp_path)
    with isolated_runtime(tmp_path / "home"):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < budget:
            fuzz.case(seed, name, fuzz.n, REAL_CASE_SECONDS)
        fuzz.report(name, time.perf_counter() - t0)
    assert not fuzz.problems, "\n".join(fuzz.problems[:30])
