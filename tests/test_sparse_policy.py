"""The planner's sparse policy (planner/sparse_policy.py): the break-even context on every
shipped topology, its response to the selection cost and the top-k, and the selection cost
measured in the decode step and cached (engine/calibrate_sparse.py)."""

import json
import math

import pytest

from test_planner import machines, workloads  # noqa: F401  (fixture)
from test_closed_loop import reported_load
from tiny_models import isolated_runtime, write_tiny_model
from llcinfer.planner import Calibration, cache_key, make_plan
from llcinfer.planner.sparse_policy import BLOCK_SIZE, PAY_MARGIN, Layers, _Model, select_key, sparse_policy
from llcinfer.sparse import SparseConfig


@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_break_even_on_every_topology(workloads, name):  # noqa: F811
    """min_context is the first block multiple where sparse is predicted PAY_MARGIN faster,
    past the context where a row has more candidates than the top-k; above it sparse keeps
    paying, below it it does not."""
    w = workloads[name].with_(concurrency=1, ctx=16384)
    cfg = SparseConfig()
    for mname, m in machines().items():
        cal = Calibration()
        plan = make_plan(m, w, calibration=cal)
        pol = sparse_policy(plan, m, w, cfg, cal)
        model = _Model(plan, m, w, cal, cfg)
        assert pol.rates == "estimated" and pol.full_layers == w.config.n_layer - cfg.dense_layers
        assert pol.min_context is not None, mname  # on every shipped machine it pays at some context
        n = pol.min_context
        assert n % BLOCK_SIZE == 0 and model.lay.selects(n), mname
        assert model.sparse(n) < (1 - PAY_MARGIN) * model.dense(n), mname
        below = n - BLOCK_SIZE
        assert not (model.lay.selects(below) and model.sparse(below) < (1 - PAY_MARGIN) * model.dense(below)), mname
        for k in (2, 4, 8):
            assert model.sparse(k * n) < (1 - PAY_MARGIN) * model.dense(k * n), (mname, k)
        assert pol.dense_s == pytest.approx(model.dense(w.ctx)) and pol.sparse_s == pytest.approx(model.sparse(w.ctx))
        assert (pol.sparse_s < (1 - PAY_MARGIN) * pol.dense_s) == (w.ctx >= n), mname


def test_no_selection_below_the_kept_blocks(workloads):  # noqa: F811
    """A row whose candidates fit in the top-k attends every key: its sparse step is the dense one."""
    w = workloads["smollm2-135m"].with_(concurrency=1, ctx=1024)
    m = machines()["this"]
    plan = make_plan(m, w, calibration=Calibration())
    lay = Layers(w.config.n_layer, SparseConfig())
    assert lay.kept_blocks == 1 + 64 + 16 and not lay.selects(lay.kept_blocks * BLOCK_SIZE)
    pol = sparse_policy(plan, m, w, SparseConfig(), Calibration())
    assert pol.sparse_s == pol.dense_s and pol.min_context > lay.kept_blocks * BLOCK_SIZE
    assert lay.n_eff(1000) == 1000 and lay.candidates(100) == 0


def test_top_k_grows_with_the_context_unless_given():
    """for_context raises top_k to n_ctx / top_k_per in whole blocks; a top-k given on LLM
    or the CLI (from_options) stays; the planner's policy reports the top-k it planned."""
    assert SparseConfig().for_context(8192).top_k == 1024 and SparseConfig().for_context(32768).top_k == 2048
    assert SparseConfig().for_context(100000).top_k == 6256
    assert SparseConfig(top_k_per=0).for_context(1 << 20).top_k == 1024
    assert SparseConfig.from_options(top_k=512).for_context(32768).top_k == 512
    assert SparseConfig.from_options(indexers=3).for_context(32768) == SparseConfig(indexers=3, top_k=2048)
    lay = Layers(24, SparseConfig().for_context(32768))
    d = SparseConfig.dense_layers  # layers that attend every key
    assert lay.kept_blocks == 1 + 128 + 16 and lay.n_eff(32768) == (d * 32768 + (24 - d) * 145 * BLOCK_SIZE) / 24


def test_costly_selection_never_pays_and_cheap_one_pays_earlier(workloads):  # noqa: F811
    w = workloads["qwen2.5-coder-0.5b"].with_(concurrency=1, ctx=8192)
    m = machines()["this"]
    cfg = SparseConfig()
    plan = make_plan(m, w, calibration=Calibration())
    base = sparse_policy(plan, m, w, cfg, Calibration())
    costly = Calibration(sparse_select_ns={select_key(w.config, cfg): {"part_ns": 1e5, "token_ns": 1e4}})
    cheap = Calibration(sparse_select_ns={select_key(w.config, cfg): {"part_ns": 0.0, "token_ns": 0.01}})
    never = sparse_policy(plan, m, w, cfg, costly)
    assert never.min_context is None and never.rates == "measured" and "never" in never.explain()
    assert never.sparse_s > never.dense_s
    early = sparse_policy(plan, m, w, cfg, cheap)
    assert early.min_context < base.min_context and "pays from" in early.explain()
    wider = sparse_policy(plan, m, w, SparseConfig(top_k=4096), Calibration())
    assert wider.min_context > base.min_context  # more kept keys: more context before it pays


def tiny_sparse_model(tmp_path):
    """(model, machine, sparse config) of a 3-layer qwen2-shaped tiny model, one dense layer."""
    from llcinfer.engine.transformer import Transformer
    from llcinfer.hw import detect_machine
    from llcinfer.model.gguf_file import GGUFFile

    path = write_tiny_model(tmp_path / "tiny.gguf", arch="qwen2", qtype="Q8_0", n_layer=3, d_model=128,
                            n_head=4, n_kv_head=2, d_ff=96)
    return Transformer(GGUFFile(path)), detect_machine(probe=False), SparseConfig(dense_layers=1)


def test_selection_cost_measured_in_the_step_and_cached(tmp_path, monkeypatch):
    """The selection cost is measured once in the decode step (cached per machine, kernel
    version and sparse configuration); LLM(sparse=True) runs rows sparse from the planner's
    context and says so in kv_stats."""
    from llcinfer import LLM
    from llcinfer.engine import calibrate_sparse
    from llcinfer.engine.calibrate_sparse import ensure_sparse_calibration
    from llcinfer.engine.sparse_setup import NEVER, planned_sparse

    monkeypatch.setattr(calibrate_sparse, "OtherLoad", reported_load(0.0))  # a quiet machine, whatever runs beside
    with isolated_runtime(tmp_path / "home"):
        tm, m, cfg = tiny_sparse_model(tmp_path)
        said = []
        cal = ensure_sparse_calibration(tm, cfg, m, 1, said.append)
        key = select_key(tm.config, cfg)
        got = cal.sparse_select_ns[key]
        assert set(got) == {"part_ns", "token_ns"} and all(math.isfinite(v) and v >= 0 for v in got.values())
        assert got["part_ns"] + got["token_ns"] > 0 and len(said) == 1 and key in said[0]
        assert Calibration.load(cache_key(m)).sparse_select_ns[key] == got  # saved
        assert ensure_sparse_calibration(tm, cfg, m, 1, said.append).sparse_select_ns[key] == got and len(said) == 1

        # LLCINFER_CALIBRATE=0 here
        llm = LLM(str(tmp_path / "tiny.gguf"), threads=1, n_ctx=64, sparse=True, progress=False)
        pol = llm.sparse_policy
        assert pol.ctx == 64 and pol.full_layers == 3 - SparseConfig.dense_layers
        assert llm.engine.sparse.config.min_context == (pol.min_context or NEVER) == llm.kv_stats()["sparse_min_context"]
        run, measured = planned_sparse(tm, llm.plan, 64, 1, cfg, False, said.append)
        assert measured.rates == "measured" and run.min_context == (measured.min_context or NEVER)


def test_selection_slope_never_below_the_scorer_alone(tmp_path, monkeypatch):
    """Step timings whose differences shrink with the context (a busy host) would fit a
    negative cost per candidate key; the fit is held at what the scorer and top-k cost
    alone (scorer_seconds, timed on the model's head shape)."""
    from dataclasses import replace

    from llcinfer.engine import calibrate_sparse

    with isolated_runtime(tmp_path / "home"):
        tm, m, cfg = tiny_sparse_model(tmp_path)
        c = tm.config
        alone = calibrate_sparse.scorer_seconds(c.n_kv_head, c.n_head // c.n_kv_head, c.head_dim, cfg.rank, 4096,
                                                replace(cfg, min_context=0, reuse_steps=0).kernel_conf(16), 1, reps=3)
        assert 0 < alone < 0.1
        n = len(calibrate_sparse.CONTEXTS)
        shrinking = [{"tpot_s": t} for i in range(n) for t in (0.010 - 0.001 * i, 0.002)]  # sparse, dense per context
        monkeypatch.setattr(calibrate_sparse, "measure_alternating", lambda *a, **k: shrinking)
        monkeypatch.setattr(calibrate_sparse, "scorer_seconds", lambda *a, **k: 1e-3)
        got = calibrate_sparse.measure_select(tm, cfg, [0])
        cand = calibrate_sparse.Layers(c.n_layer, cfg).candidates(calibrate_sparse.CONTEXTS[-1])
        assert got["token_ns"] == pytest.approx(1e-3 / cand * 1e9)  # the floor: the fit's slope is negative
        assert got["part_ns"] >= 0


def test_selection_cost_measured_under_load_is_not_cached(tmp_path, monkeypatch):
    """A measurement during which other processes took much of the CPU time serves this
    process only: it is not cached, and the next call measures again."""
    from llcinfer.engine import calibrate_sparse
    from llcinfer.engine.calibrate import OTHER_LOAD_MAX

    monkeypatch.setattr(calibrate_sparse, "OtherLoad", reported_load(OTHER_LOAD_MAX + 0.3))
    with isolated_runtime(tmp_path / "home"):
        tm, m, cfg = tiny_sparse_model(tmp_path)
        said = []
        cal = calibrate_sparse.ensure_sparse_calibration(tm, cfg, m, 1, said.append)
        key = select_key(tm.config, cfg)
        assert key in cal.sparse_select_ns  # this process plans from it
        assert len(said) == 2 and said[1].startswith("  not saved: other processes took 50 %")
        assert key not in Calibration.load(cache_key(m)).sparse_select_ns
        calibrate_sparse.ensure_sparse_calibration(tm, cfg, m, 1, said.append)
        assert len(said) == 4  # measured again


def test_cli_plan_shows_the_sparse_policy(tmp_path, monkeypatch, capsys):
    """`llcinfer plan --sparse` prints the break-even and both predictions, and its JSON
    carries them; a measured selection cost is used and said."""
    from real_models import real_model_path

    from llcinfer.cli import main
    from llcinfer.planner import load_topology, workload_from_gguf

    monkeypatch.setenv("LLCINFER_HOME", str(tmp_path))
    model = real_model_path("smollm2-135m")
    args = ["plan", "-m", model, "--ctx", "16384", "--topology", "ci-2core", "--sparse"]
    with pytest.raises(SystemExit) as exc:
        main(args)
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "sparse attention (top-k 1024" in out and "pays from" in out
    assert "selection costs estimated" in out
    m = load_topology("ci-2core")
    cfg = SparseConfig(top_k=512)
    w = workload_from_gguf(model, ctx=16384, concurrency=1)
    Calibration(sparse_select_ns={select_key(w.config, cfg): {"part_ns": 1e4, "token_ns": 20.0}}).save(cache_key(m))
    with pytest.raises(SystemExit) as exc:
        main(args + ["--sparse-top-k", "512", "--json"])
    d = json.loads(capsys.readouterr().out)
    want = sparse_policy(make_plan(m, w, calibration=Calibration.load(cache_key(m))), m, w, cfg,
                         Calibration.load(cache_key(m)))
    assert exc.value.code == 0 and d["sparse"]["rates"] == "measured" and d["sparse"]["top_k"] == 512
    assert d["sparse"]["min_context"] == want.min_context and d["sparse"]["ctx"] == 16384
    with pytest.raises(SystemExit) as exc:
        main(["plan", "-m", model, "--topology", "ci-2core", "--sparse-top-k", "64"])
    assert exc.value.code != 0 and "needs --sparse" in capsys.readouterr().err
