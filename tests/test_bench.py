"""Tests for ``llcinfer bench`` (llcinfer.bench): llama-bench output parsing (fixtures
recorded from real runs on this machine's llama.cpp builds), the ratio and roofline maths,
the table, no llama.cpp available, a crashed llama.cpp run, and a quick real run."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cli_run import CHILD_SECONDS
from llcinfer.bench import compare, llama_bench, report
from llcinfer.bench import llama_cpp as lc
from llcinfer.bench.report import LLAMA, OURS, Record

FIXTURES = Path(__file__).parent / "fixtures"
PP_FIXTURE = FIXTURES / "llama_bench_pp64_smollm2.json"  # portable build, -p 64 -n 0 -r 2 -t 2
TG_FIXTURE = FIXTURES / "llama_bench_tg16_d512_smollm2.json"  # native build, -p 0 -n 16 -d 512 -r 2 -t 2


def _exe(path: Path, body: str) -> Path:
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _fake_llama_bench(tmp_path: Path, fixture: Path) -> Path:
    """A llama-bench stand-in that prints a recorded JSON output."""
    return _exe(tmp_path / "llama-bench-ok", f"#!/bin/sh\ncat '{fixture}'\n")


def _sigill_llama_bench(tmp_path: Path) -> Path:
    """A llama-bench stand-in that dies of SIGILL, as the native build on AMX CPUs does."""
    return _exe(tmp_path / "llama-bench-sigill", "#!/bin/sh\necho 'ggml: tilezero' >&2\nkill -ILL $$\n")


# ------------------------------------------------------------------ llama-bench JSON


def test_parse_pp_fixture():
    (e,) = llama_bench.parse_json(PP_FIXTURE.read_text())
    assert (e["n_prompt"], e["n_gen"], e["n_depth"], e["n_threads"]) == (64, 0, 0, 2)
    assert e["avg_ts"] == pytest.approx(362.527055)
    assert e["stddev_ts"] == pytest.approx(0.705329)
    assert e["samples_ts"] == [363.026, 362.028]
    assert e["model_type"] == "llama 256M Q4_1" and e["build_commit"] == "unknown"


def test_parse_tg_depth_fixture():
    (e,) = llama_bench.parse_json(TG_FIXTURE.read_text())
    assert (e["n_prompt"], e["n_gen"], e["n_depth"]) == (0, 16, 512)
    assert e["avg_ts"] == pytest.approx(115.606743)
    assert report.mean_std(e["samples_ts"])[0] == pytest.approx(e["avg_ts"], rel=1e-4)
    assert report.mean_std(e["samples_ts"])[1] == pytest.approx(e["stddev_ts"], rel=1e-3)  # n-1, as llama-bench


def test_parse_tolerates_leading_noise_and_rejects_garbage():
    assert llama_bench.parse_json("build: x\n" + PP_FIXTURE.read_text())[0]["n_prompt"] == 64
    for bad in ("", "no json here", '{"a": 1}', '[{"n_prompt": 1}]'):
        with pytest.raises(ValueError):
            llama_bench.parse_json(bad)


def test_run_ok_with_recorded_output(tmp_path):
    run = llama_bench.run(_fake_llama_bench(tmp_path, TG_FIXTURE), "m.gguf", 2, 0, 16, 512, 2)
    assert run.status == "ok" and run.samples_tps == [115.077, 116.137]


# ------------------------------------------------------------------------- maths


def test_test_names_as_llama_bench():
    assert report.test_name("pp", 512, 0) == "pp512"
    assert report.test_name("tg", 128, 0) == "tg128"
    assert report.test_name("tg", 128, 4096) == "tg128 @ d4096"


def test_mean_std():
    assert report.mean_std([10.0]) == (10.0, 0.0)
    m, s = report.mean_std([9.0, 10.0, 11.0])
    assert m == pytest.approx(10.0) and s == pytest.approx(1.0)


def test_tpot_ratio():
    # ours 20 t/s (50 ms), llama.cpp 40 t/s (25 ms): our TPOT is 2x theirs
    assert report.tpot_ratio(20.0, 40.0) == pytest.approx(2.0)
    assert report.tpot_ratio(50.0, 25.0) == pytest.approx(0.5)
    assert report.tpot_ratio(None, 25.0) is None and report.tpot_ratio(20.0, 0.0) is None


def test_roofline_maths():
    # SmolLM2-like: 30 layers, 3 KV heads of 64, f32 cache, 4096 tokens -> 188.7 MB of KV
    kv = report.kv_bytes_read(30, 3, 64, 4096)
    assert kv == 2 * 30 * 4096 * 3 * 64 * 4
    # 100 MB per token in 10 ms is 10 GB/s; against a 25 GB/s probe that is 40 %
    assert report.roofline_fraction(100e6, 0.010, 25e9) == pytest.approx(0.4)
    assert report.roofline_fraction(100e6, 0.0, 25e9) is None
    rec = Record(OURS, None, "m", "tg", 2, 0, 128, samples_tps=[100.0, 100.0], bytes_per_token=100e6, bandwidth=25e9)
    assert rec.tpot_ms == pytest.approx(10.0) and rec.roofline_fraction == pytest.approx(0.4)
    assert Record(LLAMA, "native", "m", "tg", 2, 0, 128, samples_tps=[100.0]).roofline_fraction is None
    # a probe per repetition: each repetition against its own probe, then the median
    # (100 t/s x 100 MB = 10 GB/s against 20, 10 and 12.5 GB/s -> 50 %, 100 %, 80 %)
    rec = Record(OURS, None, "m", "tg", 2, 0, 128, samples_tps=[100.0, 100.0, 100.0], bytes_per_token=100e6,
                 bandwidth=12.5e9, samples_bw=[20e9, 10e9, 12.5e9])
    assert rec.roofline_fraction == pytest.approx(0.8)
    again = Record.from_json(rec.to_json())
    assert again.samples_bw == pytest.approx(rec.samples_bw) and again.roofline_fraction == pytest.approx(0.8)


def test_anchor_is_best_build_and_table_names_it():
    recs = [
        Record(OURS, None, "m", "tg", 2, 4096, 128, samples_tps=[20.0, 20.0], bytes_per_token=1e8, bandwidth=2e10),
        Record(LLAMA, "native", "m", "tg", 2, 4096, 128, status="crashed", error="killed by SIGILL"),
        Record(LLAMA, "portable", "m", "tg", 2, 4096, 128, samples_tps=[30.0, 30.0]),
    ]
    report.mark_anchors(recs)
    assert [r.anchor for r in recs] == [False, False, True]
    (row,) = report.table_rows(recs)
    assert row[1] == "tg128 @ d4096" and row[3].startswith("20.00")
    assert "portable" in row[4] and "native crashed" in row[4]
    assert row[5] == "1.50" and row[6] == "10%"  # 1e8 B / 50 ms = 2 GB/s of 20 GB/s
    doc = [r.to_json() for r in recs]
    assert doc[1]["status"] == "crashed" and doc[1]["tps_mean"] is None and doc[1]["build"] == "native"
    assert doc[0]["engine"] == "llcinfer" and doc[0]["build"] is None and doc[0]["roofline_fraction"] == 0.1
    assert set(doc[0]) >= {"engine", "build", "model", "test", "threads", "depth", "n_tokens", "tps_mean",
                           "tps_std", "tpot_ms", "roofline_fraction", "status"}


# ------------------------------------------------------------- no llama.cpp / crashes


def test_no_llama_cpp_available(tmp_path, monkeypatch):
    monkeypatch.setenv("LLCINFER_HOME", str(tmp_path / "home"))
    builds, notes = llama_bench.find_builds()
    assert builds == {} and len(notes) == 1 and "measuring llcinfer only" in notes[0]
    builds, notes = llama_bench.find_builds(tmp_path / "missing-llama-bench")
    assert builds == {} and "not an executable" in notes[0]


def test_failed_build_is_a_note_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("LLCINFER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(lc.shutil, "which", lambda *a, **k: None)  # no cmake
    builds, notes = llama_bench.find_builds(build=True)
    assert builds == {}
    assert any("cmake not found" in n for n in notes) and any("measuring llcinfer only" in n for n in notes)


def test_crashed_run_is_reported_as_crashed(tmp_path):
    run = llama_bench.run(_sigill_llama_bench(tmp_path), "m.gguf", 2, 512, 0, 0, 1)
    assert run.status == "crashed" and "SIGILL" in run.message and run.returncode < 0
    assert "tilezero" in run.stderr


def test_exit_codes(tmp_path):
    shell_sigill = _exe(tmp_path / "a", "#!/bin/sh\nexit 132\n")  # a wrapper shell's 128 + SIGILL
    assert llama_bench.run(shell_sigill, "m", 1, 1, 0, 0, 1).status == "crashed"
    fails = _exe(tmp_path / "b", "#!/bin/sh\necho 'error: failed to load model' >&2\nexit 1\n")
    run = llama_bench.run(fails, "m", 1, 1, 0, 0, 1)
    assert run.status == "failed" and "failed to load model" in run.message
    garbage = _exe(tmp_path / "c", "#!/bin/sh\necho hello\n")
    assert llama_bench.run(garbage, "m", 1, 1, 0, 0, 1).status == "failed"


class _FakeOurs:
    """Stands in for OursBench: fixed timings, no model."""

    def __init__(self, model, threads, n_ctx, sparse=False, sparse_top_k=None, sparse_indexers=None):
        self.depth = 0
        self.plan = f"fake plan for n_ctx {n_ctx}"
        self.sparse_top_k = (sparse_top_k or 1024) if sparse else None  # as OursBench: the top-k that runs
        self.sparse_min_context = 2400 if sparse else None  # as OursBench: the planner's threshold

    def warmup(self):
        pass

    def set_depth(self, depth, mode, limit):
        self.depth = depth
        return "real"

    def pp(self, n):
        return n / 100.0  # 100 t/s

    def tg(self, n):
        return n / 50.0  # 50 t/s

    def bytes_per_token(self, depth, n):
        return 1e6


class _FakeProbe:
    """A probe that reads 1 GB/s; it checks it is sized to the bytes per token."""

    def __init__(self, n_bytes, threads):
        assert n_bytes == 1e6 and threads >= 1

    def read(self):
        return 1e9


def test_crashed_build_does_not_stop_the_comparison(tmp_path, monkeypatch):
    monkeypatch.setattr(compare, "OursBench", _FakeOurs)
    monkeypatch.setattr(compare, "default_ctx", lambda path: 4096)  # the model's own context
    monkeypatch.setattr(compare.catalog, "resolve_model", lambda m, progress=True: Path(m))
    monkeypatch.setattr(compare, "ReadProbe", _FakeProbe)
    builds = {"native": _sigill_llama_bench(tmp_path), "portable": _fake_llama_bench(tmp_path, PP_FIXTURE)}
    s = compare.BenchSettings(models=["m"], threads=[2], n_prompt=64, n_gen=16, depths=[0, 512], reps=2)
    recs = compare.run_bench(s, builds, [])
    by = {(r.engine, r.build, r.test): r for r in recs}
    assert [k[2] for k in by if k[0] == OURS] == ["pp64", "tg16", "tg16 @ d512"]
    for test in ("pp64", "tg16", "tg16 @ d512"):
        assert by[(LLAMA, "native", test)].status == "crashed"
        port = by[(LLAMA, "portable", test)]
        assert port.status == "ok" and port.anchor and len(port.samples_tps) == 4  # 2 reps x 2 samples
        assert by[(OURS, None, test)].samples_tps == [pytest.approx(100.0 if test == "pp64" else 50.0)] * 2
    assert by[(OURS, None, "tg16")].roofline_fraction == pytest.approx(1e6 / 0.02 / 1e9)
    assert by[(OURS, None, "tg16")].samples_bw == [1e9, 1e9] and by[(OURS, None, "pp64")].samples_bw == []
    table = report.markdown_table(recs)
    assert "native crashed" in table and "(portable" in table
    assert "plan (m, 2 threads, n_ctx 4096): fake plan for n_ctx 4096" in table, "planned for the model's context"


def test_sparse_reaches_ours_and_the_report(tmp_path, monkeypatch):
    monkeypatch.setattr(compare, "OursBench", _FakeOurs)
    monkeypatch.setattr(compare, "default_ctx", lambda path: 4096)
    monkeypatch.setattr(compare.catalog, "resolve_model", lambda m, progress=True: Path(m))
    monkeypatch.setattr(compare, "ReadProbe", _FakeProbe)
    s = compare.BenchSettings(models=["m"], threads=[2], n_prompt=0, n_gen=16, depths=[0], reps=1, sparse=True,
                              sparse_top_k=512)
    (rec,) = compare.run_bench(s, {}, [])
    assert rec.sparse_top_k == 512 and rec.to_json()["sparse"] and rec.to_json()["sparse_top_k"] == 512
    again = Record.from_json(rec.to_json())
    assert again.sparse_top_k == 512 and again.sparse_min_context == rec.sparse_min_context == 2400
    assert "plan (m, 2 threads, n_ctx 4096, sparse top-k 512 from 2400 keys): fake plan" in report.markdown_table([rec])
    never = Record.from_json({**rec.to_json(), "sparse_min_context": 1 << 40})
    assert "sparse top-k 512 predicted never to pay: every row dense" in report.markdown_table([never])
    (dense,) = compare.run_bench(compare.BenchSettings(models=["m"], threads=[2], n_prompt=0, n_gen=16, reps=1), {}, [])
    assert dense.to_json()["sparse"] is False and "sparse" not in report.markdown_table([dense])


def test_block_alternation_runs_llama_bench_once_per_build(tmp_path, monkeypatch):
    monkeypatch.setattr(compare, "OursBench", _FakeOurs)
    monkeypatch.setattr(compare, "default_ctx", lambda path: 4096)  # the model's own context
    monkeypatch.setattr(compare.catalog, "resolve_model", lambda m, progress=True: Path(m))
    monkeypatch.setattr(compare, "ReadProbe", _FakeProbe)
    calls = tmp_path / "calls"
    exe = _exe(tmp_path / "lb", f"#!/bin/sh\necho \"$@\" >> '{calls}'\ncat '{TG_FIXTURE}'\n")
    s = compare.BenchSettings(models=["m"], threads=[1], n_prompt=0, n_gen=16, depths=[512], reps=3, alternate="block")
    recs = compare.run_bench(s, {"user": exe}, [])
    lines = calls.read_text().splitlines()
    assert len(lines) == 1 and "-r 3" in lines[0] and "-d 512" in lines[0] and "-p 0" in lines[0]
    assert [r.status for r in recs] == ["ok", "ok"]


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    from llcinfer.bench.plot import plot_tpot

    recs = [Record(e, b, "m", "tg", 2, d, 16, samples_tps=[v, v * 1.01]) for e, b, v in
            ((OURS, None, 20.0), (LLAMA, "portable", 30.0)) for d in (0, 4096)]
    plot_tpot(recs, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


# --------------------------------------------------------------------------- CLI


def _cli(*args, **env):
    return subprocess.run([sys.executable, "-c", "from llcinfer.cli import main; main()", *args],
                          capture_output=True, text=True, env={**os.environ, **env}, timeout=CHILD_SECONDS)


@pytest.mark.parametrize("args", [["--threads", "two"], ["--depth", "-1"], ["-r", "0"], ["-p", "0", "-n", "0"],
                                  ["--ctx", "100", "-p", "512"], ["--spec", "bogus"], ["--spec", ""],
                                  ["--spec", "ngram", "--spec-workload", "poetry"], ["--spec", "ngram", "-n", "1"],
                                  ["--sparse", "--sparse-top-k", "0"], ["--sparse-top-k", "5"],
                                  ["--sparse", "--spec", "ngram"]])
def test_cli_usage_errors(args):
    r = _cli("bench", *args)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error:") and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_cli_quick_real_run(tmp_path):
    from real_models import real_model_path

    out = tmp_path / "b.json"
    # an empty LLCINFER_HOME holds no llama.cpp build; the model is given by path
    r = _cli("bench", "-m", real_model_path("smollm2-135m"), "-p", "16", "-n", "8", "-r", "1", "--threads", "1",
             "--depth", "0,32", "--vs", "llama.cpp", "--json", str(out), LLCINFER_HOME=str(tmp_path / "home"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "note: no llama.cpp build found; measuring llcinfer only" in r.stderr
    assert all(x["engine"] == "llcinfer" for x in json.loads(out.read_text())["results"])
    doc = json.loads(out.read_text())
    assert set(doc) >= {"machine", "versions", "results"}
    assert doc["machine"]["threads"] == [1] and doc["machine"]["caches"]
    assert {"llcinfer", "numba", "llvmlite", "llama.cpp"} <= set(doc["versions"])
    tests = [(x["engine"], x["test"], x["status"]) for x in doc["results"]]
    assert ("llcinfer", "pp16", "ok") in tests and ("llcinfer", "tg8 @ d32", "ok") in tests
    assert "| smollm2-135m | tg8 @ d32 | 1 |" in r.stdout
    ours = [x for x in doc["results"] if x["engine"] == "llcinfer"]
    assert all(x["n_ctx"] == 8192 and x["plan"] for x in ours), "planned for the model's context, not d + n"
    assert f"plan (smollm2-135m, 1 threads, n_ctx 8192): {ours[0]['plan']}" in r.stdout


@pytest.mark.slow
def test_cli_spec_bench_real_model(tmp_path):
    """--spec: effective TPOT of plain and each drafter on the code edit, outputs equal."""
    from real_models import real_model_path

    out = tmp_path / "s.json"
    r = _cli("bench", "-m", real_model_path("smollm2-135m"), "--spec", "ngram,suffix", "--spec-workload", "code-edit",
             "-n", "24", "-r", "1", "--threads", "2", "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    (doc,) = json.loads(out.read_text())
    rows = {(x["engine"], x["spec"]): x for x in doc["rows"]}
    assert set(rows) == {("ours", "none"), ("ours", "ngram"), ("ours", "suffix")}
    assert rows[("ours", "none")]["vs_plain"] == 1.0
    for spec in ("ngram", "suffix"):
        row = rows[("ours", spec)]
        assert row["same_as_plain"] and row["tpot_ms"] > 0, spec
        assert row["runs"][0]["verifications"] > 0, spec
    assert "| code-edit | ours | ngram |" in r.stdout


# ------------------------------------------------------------------ real llama.cpp


@pytest.mark.llamacpp
def test_build_and_run_real_llama_bench(tmp_path):
    """Builds the portable config if missing (minutes on 2 cores), then runs llama-bench."""
    from real_models import real_model_path

    lc.build("portable", jobs=2)
    exe = lc.binary("portable", "llama-bench")
    run = llama_bench.run(exe, real_model_path("smollm2-135m"), 1, 0, 4, 16, 1)
    assert run.status == "ok", run.message
    (e,) = run.entries
    assert (e["n_gen"], e["n_depth"]) == (4, 16) and e["avg_ts"] > 0
