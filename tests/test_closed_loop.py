"""The per-machine calibration and the closed loop: the cache keyed by machine and kernel
version, measured kernel rates and work factors replacing the curve's, the feedback of
observed TPOTs per part (weight side, attention), and the switch to the faster plan when
a synthetic machine's measured order contradicts the predicted one.  Nothing is timed
here (timings are injected) but the in-step calibration's run on a tiny model."""

import dataclasses

import pytest
from test_planner import qwen_1p5b

from llcinfer import jit
from llcinfer.engine.calibrate import core_counts
from llcinfer.engine.placement import domains_from_plan
from llcinfer.planner import Calibration, cache_key, load_topology, make_plan, workload_key
from llcinfer.planner.closed_loop import close_loop, other_kind


def test_cache_is_keyed_by_machine_and_kernel_version(tmp_path, monkeypatch):
    monkeypatch.setenv("LLCINFER_HOME", str(tmp_path))
    m = load_topology("ci-2core")
    cal = Calibration(handoff_ns=321.0, matmul_stream_gbs={"Q4_K": {"1": 20.0, "2": 30.0}},
                      attention_stream_gbs={"12/2x128": {"1": 25.0}}, work_factor={"w": {"2x1": 1.1}})
    cal.record("w", "shared:s2", "shared", "shared", 0.01, 0.012, 0.004)
    path = cal.save(cache_key(m))
    assert path.startswith(str(tmp_path / "machine")) and Calibration.load(cache_key(m)) == cal
    others = [dataclasses.replace(m, cpu_id="family 23 model 49"), dataclasses.replace(m, isa=["avx2", "fma"]),
              dataclasses.replace(m, cpus=[0], core_of={0: 0}, package_of={0: 0}, numa={0: [0]})]
    for other in others:
        assert cache_key(other) != cache_key(m) and Calibration.load(cache_key(other)) == Calibration()
    monkeypatch.setattr(jit, "kernel_version", lambda: "edited-kernels")
    assert Calibration.load(cache_key(m)) == Calibration(), "a new kernel version starts from defaults"


def test_kernel_version_follows_only_modules_that_compile_kernels():
    """The sources hashed into the kernel version (numba's cache directory, the calibration's
    key): modules that name numba or import a kernel decorator from jit.py, not those that
    only take a helper from it (editing a benchmark driver recompiled every kernel)."""
    kernel_sources = [b"from ..jit import kernel, parallel_kernel\n", b"from ..jit import ordered_kernel\n",
                      b"import numba\n", b"from numba import prange\n", b"from .jit import set_threads, kernel\n"]
    helper_sources = [b"from ..jit import child_env\n", b"from .jit import set_threads\n",
                      b"from ..jit import default_threads, set_threads\n", b"x = 'the jit import kernel'\n"]
    assert all(jit.compiles_kernels(t) for t in kernel_sources)
    assert not any(jit.compiles_kernels(t) for t in helper_sources)


def test_measured_kernel_rates_replace_the_curve():
    m = load_topology("ci-2core")
    w = qwen_1p5b(ctx=16384, concurrency=1)
    w = w.with_(qtypes={"wq": "Q4_K", "wk": "Q4_K", "wv": "Q6_K", "wo": "Q4_K", "w_gate": "Q4_K",
                        "w_up": "Q4_K", "w_down": "Q6_K", "lm_head": "Q6_K"})
    base = make_plan(m, w, calibration=Calibration()).prediction
    slow = Calibration(matmul_stream_gbs={q: {"1": 1.0, "2": 2.0} for q in ("Q4_K", "Q6_K")})
    assert make_plan(m, w, calibration=slow).prediction.tpot_s > 2 * base.tpot_s
    slow_kv = Calibration(attention_stream_gbs={"12/2x128": {"1": 0.5, "2": 1.0}})
    assert make_plan(m, w, calibration=slow_kv).prediction.tpot_s > base.tpot_s
    seen = Calibration()
    for p in [plan := make_plan(m, w, calibration=Calibration())] + plan.runners_up:
        seen.record(workload_key(w, p.threads), p.shape, p.label, p.kind, p.prediction.model_s,
                    1.5 * p.prediction.model_s, p.prediction.attention_s)
    fed = make_plan(m, w, calibration=seen).prediction
    assert fed.tpot_s == pytest.approx(1.5 * base.tpot_s) and fed.model_s == pytest.approx(base.tpot_s)
    assert sum(fed.terms.values()) == pytest.approx(fed.tpot_s) and fed.terms["feedback"] > 0


def test_closed_loop_switches_when_the_predicted_order_is_wrong():
    """A synthetic machine on which the chosen kind runs 3x its prediction and the other
    0.8x: the loop keeps the other, records both, and the next plan comes out right."""
    m = load_topology("ci-2core")
    w = qwen_1p5b(ctx=64, concurrency=1)
    cal = Calibration()
    plan = make_plan(m, w, calibration=cal)
    rival = other_kind(plan)
    assert rival is not None and rival.kind != plan.kind
    wrong = plan.kind

    def machine(p):  # seconds per step this synthetic machine takes for plan p
        return p.prediction.model_s * (3.0 if p.kind == wrong else 0.8)

    kept, measured = close_loop(plan, w, cal, machine)
    assert kept.label == rival.label and measured[rival.label] < measured[plan.label]
    assert kept.runners_up[0].label == plan.label
    key = workload_key(w, plan.threads)
    assert cal.observation(key, plan.label)["measured_s"] == pytest.approx(measured[plan.label])
    assert cal.feedback(key, plan.shape) == pytest.approx((3.0, 3.0))
    assert cal.feedback(key, rival.shape) == pytest.approx((0.8, 0.8))
    again = make_plan(m, w, calibration=cal)
    assert again.kind != wrong, "the fed-back error reorders the plans"
    assert again.prediction.tpot_s == pytest.approx(measured[again.label])
    assert again.observed is not None and "observed TPOT" in again.explain()
    kept2, _ = close_loop(again, w, cal, machine)
    assert kept2.label == again.label and cal.feedback(key, plan.shape) == pytest.approx((3.0, 3.0))
    timed = []
    kept3, _ = close_loop(make_plan(m, w, calibration=cal), w, cal, lambda p: timed.append(p) or 1.0, reuse=True)
    assert kept3.label == again.label and not timed, "observed plans are not timed again"


def test_closed_loop_keeps_a_right_plan_and_skips_what_ifs():
    m = load_topology("epyc-9684x")
    w = qwen_1p5b(ctx=4096, concurrency=4)
    cal = Calibration()
    plan = make_plan(m, w, calibration=cal)
    rival = other_kind(plan)
    assert rival is not None and not rival.what_if
    kept, measured = close_loop(plan, w, cal, lambda p: p.prediction.tpot_s)
    assert kept is plan and set(measured) == {plan.label, rival.label}
    stages = next(r for r in plan.runners_up if r.what_if)
    with pytest.raises(ValueError, match="layer-group"):
        domains_from_plan(stages)


def test_core_counts_cover_every_domain_size():
    m = load_topology("ci-2core")
    assert core_counts(m, 2) == [1, 2]
    assert core_counts(m, 1) == [1]
    from llcinfer.planner.candidates import sensible_k

    assert set(sensible_k(24)) | {24 - k for k in sensible_k(24)} | {24} == set(core_counts(m, 24))


def test_cli_plan_shows_the_observed_tpot(tmp_path, monkeypatch, capsys):
    from real_models import real_model_path

    from llcinfer.cli import main
    from llcinfer.planner import workload_from_gguf

    monkeypatch.setenv("LLCINFER_HOME", str(tmp_path))
    m = load_topology("ci-2core")
    w = workload_from_gguf(real_model_path("smollm2-135m"), ctx=2048, concurrency=1)
    plan = make_plan(m, w, calibration=Calibration())
    cal = Calibration()
    cal.record(workload_key(w, plan.threads), plan.shape, plan.label, plan.kind, plan.prediction.model_s, 0.0123)
    cal.save(cache_key(m))
    with pytest.raises(SystemExit) as exc:
        main(["plan", "-m", real_model_path("smollm2-135m"), "--ctx", "2048", "--topology", "ci-2core"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "observed TPOT 12.3 ms" in out and "feedback" in out


def test_rows_and_work_factors_interpolate():
    cal = Calibration(attention_stream_gbs={"9/3x64": {"1": 10.0, "2": 20.0}, "9/3x64@4": {"1": 16.0, "2": 32.0}},
                      work_factor={"m": {"1x1": 1.2, "1x4": 0.9, "2x1": 1.1, "2x4": 0.6}})
    assert cal.attention_gbs("9/3x64", 2) == pytest.approx(20.0)
    assert cal.attention_gbs("9/3x64", 2, rows=4) == pytest.approx(32.0)
    assert cal.attention_gbs("9/3x64", 2, rows=2) == pytest.approx(24.0)
    assert cal.attention_gbs("9/3x64", 2, rows=16) == pytest.approx(32.0), "flat beyond 4 rows"
    assert cal.attention_gbs("12/2x128", 2) is None
    assert Calibration(attention_stream_gbs={"s": {"2": 20.0}}).attention_gbs("s", 2, rows=4) == 20.0
    assert cal.work_scale("m", 1, 1) == pytest.approx(1.2) and cal.work_scale("m", 2, 4) == pytest.approx(0.6)
    assert cal.work_scale("m", 2, 3) == pytest.approx(1.1 + (0.6 - 1.1) * 2 / 3)
    assert cal.work_scale("m", 8, 1) == pytest.approx(1.1), "flat beyond the measured cores, as a factor"
    assert cal.work_scale("other", 2, 1) == 1.0


def test_work_factor_scales_the_weight_side_only():
    m = load_topology("ci-2core")
    w = qwen_1p5b(ctx=16384, concurrency=1)
    base = make_plan(m, w, calibration=Calibration()).prediction
    table = {f"{c}x{r}": 2.0 for c in (1, 2) for r in (1, 4)}
    plan = make_plan(m, w, calibration=Calibration(work_factor={w.name: table}))
    fed = plan.prediction
    assert "shared's weight-side work x2.00 (this model's decode step measured here)" in plan.explain()
    host = base.terms["step_overhead"]
    weight_side = base.tpot_s - base.attention_s - host
    assert base.attention_s > 0.3 * base.tpot_s
    assert fed.tpot_s == pytest.approx(base.tpot_s + weight_side, rel=0.02)
    assert fed.attention_s == pytest.approx(base.attention_s, rel=0.02)


def test_attention_part_is_what_the_context_adds():
    m = load_topology("ci-2core")
    short = make_plan(m, qwen_1p5b(ctx=1, concurrency=4), calibration=Calibration()).prediction
    for ctx in (4096, 16384, 32768):
        p = make_plan(m, qwen_1p5b(ctx=ctx, concurrency=4), calibration=Calibration()).prediction
        assert 0 < p.attention_s < p.tpot_s
        # the rest is the step without context: no KV streamed, no DRAM floor from it
        assert p.tpot_s - p.attention_s == pytest.approx(short.tpot_s, rel=0.35)


def _observe(cal, w, plan, a, b):
    """Record the TPOT a machine whose weight side runs a x and attention b x the model takes."""
    p = plan.prediction
    cal.record(workload_key(w, plan.threads), plan.shape, plan.label, plan.kind, p.model_s,
               a * (p.model_s - p.attention_s) + b * p.attention_s, p.attention_s)


def test_feedback_fits_the_weight_and_attention_parts():
    """Observations at some contexts of one model and concurrency predict another context of
    it (per part: weight side a, attention b); an observed workload predicts itself; other
    concurrencies and models get no correction."""
    m = load_topology("ci-2core")
    cal = Calibration()
    for ctx in (64, 4096, 16384):
        w = qwen_1p5b(ctx=ctx, concurrency=4)
        _observe(cal, w, make_plan(m, w, calibration=Calibration()), 0.9, 0.7)
    w = qwen_1p5b(ctx=8192, concurrency=4)
    plan = make_plan(m, w, calibration=Calibration())
    a, b = cal.feedback(workload_key(w, plan.threads), plan.shape)
    assert a == pytest.approx(0.9, abs=0.03) and b == pytest.approx(0.7, abs=0.05)
    fed = make_plan(m, w, calibration=cal).prediction
    p = plan.prediction
    assert fed.tpot_s == pytest.approx(0.9 * (p.model_s - p.attention_s) + 0.7 * p.attention_s, rel=0.03)
    assert fed.terms["feedback"] < 0 and sum(fed.terms.values()) == pytest.approx(fed.tpot_s)
    assert "fed back from observed TPOTs: weight side x0.9" in make_plan(m, w, calibration=cal).explain()
    w16 = qwen_1p5b(ctx=16384, concurrency=4)
    seen = make_plan(m, w16, calibration=cal)
    expect = 0.9 * (seen.prediction.model_s - seen.prediction.attention_s) + 0.7 * seen.prediction.attention_s
    assert seen.prediction.tpot_s == pytest.approx(expect)
    w1 = qwen_1p5b(ctx=8192, concurrency=1)
    one = make_plan(m, w1, calibration=cal)
    assert cal.feedback(workload_key(w1, one.threads), one.shape) == (1.0, 1.0)
    assert one.prediction.tpot_s == pytest.approx(one.prediction.model_s)


def test_streamed_sets_are_sized_from_the_measured_llc():
    """A guest told of 480 MiB of LLC whose reads fall to DRAM level near 100 MiB (the
    curve measured on such a host, 2026-12-07): the calibration's streamed working sets
    follow the curve, not the report; with no curve, the report."""
    from llcinfer.engine.calibrate import stream_llc_bytes
    from llcinfer.hw.machine import CacheLevel

    m = load_topology("ci-2core")
    big = CacheLevel(3, 480 << 20, [list(m.cpus)])
    sizes = [256 << 10, 840 << 10, 2756 << 10, 9044 << 10, 29678 << 10, 97386 << 10, 319557 << 10, 1 << 30]
    gbs = {1: [89.9, 91.2, 79.6, 42.9, 27.8, 17.5, 14.6, 14.6], 2: [272.4, 172.0, 171.8, 119.4, 54.8, 42.3, 28.4, 28.1]}
    curve = [(w, t, g[i]) for t, g in gbs.items() for i, w in enumerate(sizes)]
    guest = dataclasses.replace(m, caches=[c for c in m.caches if c.level < 3] + [big], bandwidth=curve)
    assert 30 << 20 < stream_llc_bytes(guest) < 100 << 20
    assert stream_llc_bytes(dataclasses.replace(guest, bandwidth=[])) == 480 << 20


def test_decode_step_calibration_fills_rates_and_factors(tmp_path, monkeypatch):
    """The in-step calibration on a tiny model, one core: work factors for 1 and 4 rows and
    streamed attention rates of its head shape, within their clamps and positive."""
    from tiny_models import isolated_runtime, write_tiny_model

    from llcinfer.engine import calibrate
    from llcinfer.engine.transformer import Transformer
    from llcinfer.model.gguf_file import GGUFFile
    from llcinfer.planner import detect_machine

    with isolated_runtime(tmp_path):
        path = write_tiny_model(tmp_path / "t.gguf", n_ctx=1024)
        model = Transformer(GGUFFile(path))
        m = detect_machine(probe=False)
        monkeypatch.setattr(calibrate, "STREAM_MIN_CTX", 256)
        monkeypatch.setattr(calibrate, "STEP_TOKENS", 2)
        cal = Calibration()
        note = calibrate._decode_step(cal, model, m, m.physical_cores()[:1], llc=1 << 14)
        name = workload_key(calibrate.workload_from_model(model, ctx=16), 1).split("|")[0]
        assert set(cal.work_factor[name]) == {"1x1", "1x4"} and "work factor" in note
        assert all(0.25 <= f <= 4.0 for f in cal.work_factor[name].values())
        shape = calibrate.attention_shape(model.config)
        assert set(cal.attention_stream_gbs) == {shape, f"{shape}@4"}
        assert all(g > 0 for t in cal.attention_stream_gbs.values() for g in t.values())


def reported_load(share):
    """An OtherLoad stand-in that reports ``share`` of the CPU time taken by other processes."""

    class Load:
        def __enter__(self):
            self.share = None
            return self

        def __exit__(self, *exc):
            self.share = share

    return Load


@pytest.mark.parametrize("share", [0.0, 0.6])
def test_calibration_is_cached_only_when_the_machine_was_quiet(tmp_path, monkeypatch, share):
    """ensure_calibration keeps what it measured on a machine that other processes kept
    busy (share of its CPU time above OTHER_LOAD_MAX) for this process only: neither the
    calibration nor the bandwidth curve is written.  The measurements are stand-ins here."""
    from tiny_models import isolated_runtime, write_tiny_model

    from llcinfer.engine import calibrate
    from llcinfer.engine.transformer import Transformer
    from llcinfer.hw.bandwidth import curve_path
    from llcinfer.model.gguf_file import GGUFFile
    from llcinfer.planner import detect_machine

    def fake_bandwidth(m, counts):
        m.bandwidth, m.bandwidth_source = [(1 << 30, t, 10.0 * t) for t in counts], "measured"
        return "stand-in"

    def fake_step(cal, *a, **k):
        cal.measured["step"] = 0.0
        return "stand-in"

    def fake_decode_step(cal, model, *a, **k):
        cal.work_factor[calibrate.workload_from_model(model, ctx=16).name] = {"1x1": 1.0}
        shape = calibrate.attention_shape(model.config)
        cal.attention_stream_gbs.update({shape: {"1": 10.0}, f"{shape}@4": {"1": 10.0}})
        return "stand-in"

    def fake_attention(cal, config):
        cal.attention_flops[calibrate.attention_shape(config)] = 1e9
        return "stand-in"

    def fake_matmul(cal, lins, counts, llc):
        for q in {lin.qtype.name for lin in lins}:
            cal.matmul_stream_gbs.update({q: {"1": 10.0}, f"{q}@4": {"1": 10.0}})
        return "stand-in"

    for name, fn in (("OtherLoad", reported_load(share)), ("_bandwidth", fake_bandwidth), ("_step_overhead", fake_step),
                     ("_decode_step", fake_decode_step), ("_attention", fake_attention), ("_matmul", fake_matmul)):
        monkeypatch.setattr(calibrate, name, fn)
    with isolated_runtime(tmp_path):
        model = Transformer(GGUFFile(write_tiny_model(tmp_path / "t.gguf")))
        m = detect_machine(probe=False)
        said = []
        cal = calibrate.ensure_calibration(model, m, 1, said.append)
        assert cal.attention_flops and m.bandwidth_source == "measured"  # this process plans from it
        quiet = share <= calibrate.OTHER_LOAD_MAX
        assert curve_path(m).exists() == quiet
        assert (Calibration.load(cache_key(m)) == cal) == quiet
        assert any(line.startswith("  not saved: other processes took 60 %") for line in said) != quiet
