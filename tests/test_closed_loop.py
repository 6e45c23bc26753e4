"""The per-machine calibration and the closed loop: the cache keyed by machine and kernel
version, measured kernel rates replacing the curve's, the feedback correction, and the
switch to the faster plan when a synthetic machine's measured order contradicts the
predicted one.  Nothing is timed here: timings are injected."""

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
                      attention_stream_gbs={"12/2x128": {"1": 25.0}}, correction={"shared:s2": 1.1})
    cal.record("w", "shared:s2", "shared", "shared", 0.01, 0.012)
    path = cal.save(cache_key(m))
    assert path.startswith(str(tmp_path / "machine")) and Calibration.load(cache_key(m)) == cal
    others = [dataclasses.replace(m, cpu_id="family 23 model 49"), dataclasses.replace(m, isa=["avx2", "fma"]),
              dataclasses.replace(m, cpus=[0], core_of={0: 0}, package_of={0: 0}, numa={0: [0]})]
    for other in others:
        assert cache_key(other) != cache_key(m) and Calibration.load(cache_key(other)) == Calibration()
    monkeypatch.setattr(jit, "kernel_version", lambda: "edited-kernels")
    assert Calibration.load(cache_key(m)) == Calibration(), "a new kernel version starts from defaults"


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
    fed = make_plan(m, w, calibration=Calibration(correction={"shared:s2": 1.5, "split:w1+a1": 1.5})).prediction
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
    assert cal.factor(plan.shape) == pytest.approx(3.0) and cal.factor(rival.shape) == pytest.approx(0.8)
    again = make_plan(m, w, calibration=cal)
    assert again.kind != wrong, "the fed-back error reorders the plans"
    assert again.prediction.tpot_s == pytest.approx(measured[again.label])
    assert again.observed is not None and "observed TPOT" in again.explain()
    kept2, _ = close_loop(again, w, cal, machine)
    assert kept2.label == again.label and cal.factor(plan.shape) == pytest.approx(3.0)
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
