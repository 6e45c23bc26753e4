"""The verification budget (planner/verify.py): the knee-and-slope fit, the planner's
predicted cost curve and how it responds to compute, context and cores, ``llcinfer plan``
showing it, and the engine's measurement leaving its sequences as they were."""

import json

import numpy as np
import pytest
from real_models import real_model_path
from tiny_models import isolated_runtime, write_tiny_model

from llcinfer.engine.runner import ModelRunner
from llcinfer.engine.transformer import Transformer
from llcinfer.engine.verify_timing import measure_verify_cost, verification_seconds
from llcinfer.kv import PagedSequence
from llcinfer.model.gguf_file import GGUFFile
from llcinfer.planner import Calibration, load_topology, make_plan, workload_from_gguf
from llcinfer.planner.verify import VERIFY_ROWS, VerifyCost, predict_verify_cost


def test_fit_recovers_knee_and_slope():
    rows = list(VERIFY_ROWS)
    for k, base, slope in [(8, 4e-3, 3e-4), (1, 2e-3, 1e-3), (64, 5e-3, 1e-3)]:
        sec = [base + slope * max(0, t - k) for t in rows]
        got = VerifyCost.fit(rows, sec, decode_s=2 * base)
        assert got.k_max == max(t for t in rows if base + slope * max(0, t - k) <= 1.25 * base)
        if got.k_max < 64:
            assert got.slope_s == pytest.approx(slope, rel=0.35)  # the knee sits past k: a shifted line
        assert got.base_s == base and got.break_even == pytest.approx(min(1.0, got.slope_s / (2 * base)))
        assert got.seconds(1) == base


def test_a_slower_decode_step_raises_the_bandwidth_bound_rows_only():
    """Measured with a 21 ms decode step; the host's weight stream then slows to 30 ms a
    step: one row costs 30/21 of what it did and no step less, the compute-bound steps
    (8 rows and more) are unchanged.  A faster decode step (15 ms) moves the plain step
    only, so drafts are judged to gain less, never more."""
    rows = [1, 2, 4, 8, 16]
    cost = VerifyCost.fit(rows, [0.020, 0.024, 0.030, 0.050, 0.090], decode_s=0.021)
    slow = cost.with_decode(0.030)
    first = 0.020 * 0.030 / 0.021
    assert slow.decode_s == 0.030 and slow.seconds(1) == pytest.approx(first)
    assert slow.seconds(2) == pytest.approx(first) and slow.seconds(4) == pytest.approx(0.030)
    assert slow.seconds(8) == 0.050 and slow.seconds(16) == 0.090
    assert slow.k_max >= cost.k_max and slow.break_even < cost.break_even
    fast = cost.with_decode(0.015)
    assert fast.decode_s == 0.015 and fast.curve_s == cost.curve_s and fast.k_max == cost.k_max
    assert fast.speedup(1, 0.002, 0.7) < cost.speedup(1, 0.002, 0.7) < slow.speedup(1, 0.002, 0.7)
    assert cost.with_decode(0.021) is cost


def _predicted(workload_args, topology="epyc-9684x", threads=8, cal=None):
    m = load_topology(topology)
    w = workload_from_gguf(real_model_path("qwen2.5-coder-1.5b"), **workload_args)
    plan = make_plan(m, w, threads=threads, calibration=cal or Calibration())
    return predict_verify_cost(plan, m, w, cal or Calibration())


def test_predicted_curve_grows_with_rows_and_responds_to_compute_and_context():
    base, sec = _predicted({"ctx": 512, "concurrency": 1})
    assert len(sec) == len(VERIFY_ROWS)
    assert all(b >= a - 1e-12 for a, b in zip(sec, sec[1:]))  # every row count has its own tile
    assert 1 <= base.k_max <= 64 and base.slope_s > 0 and base.decode_s > 0
    fast = Calibration(matmul_macs_per_core=4 * Calibration().matmul_macs_per_core,
                       unpack_weights_per_core=4 * Calibration().unpack_weights_per_core)
    quick, _ = _predicted({"ctx": 512, "concurrency": 1}, cal=fast)
    assert quick.k_max >= base.k_max and quick.slope_s < base.slope_s  # cheaper rows: a later knee, a flatter slope
    deep, _ = _predicted({"ctx": 32768, "concurrency": 1})
    assert deep.slope_s > base.slope_s  # every verified row reads the whole KV


def test_cli_plan_shows_the_verification_budget(capsys):
    from llcinfer.cli import main

    smol = real_model_path("smollm2-135m")
    for args in (["--topology", "epyc-9684x"], ["--no-probe"]):
        with pytest.raises(SystemExit) as exc:
            main(["plan", "-m", smol, "--ctx", "1024", *args])
        out = capsys.readouterr().out
        assert exc.value.code == 0 and "speculative verification" in out and "K_max = " in out
    with pytest.raises(SystemExit) as exc:
        main(["plan", "-m", smol, "--ctx", "1024", "--topology", "epyc-9684x", "--json"])
    d = json.loads(capsys.readouterr().out)["verify"]
    assert exc.value.code == 0 and set(d) == {"k_max", "slope_s", "base_s", "decode_s", "curve_rows", "curve_s"} and d["k_max"] >= 1


def test_measuring_a_verification_leaves_the_sequences_as_they_were(tmp_path):
    with isolated_runtime(tmp_path / "home"):
        m = Transformer(GGUFFile(write_tiny_model(tmp_path / "t.gguf", "llama", "Q8_0", n_layer=2, seed=5,
                                                  n_ctx=256)))
        pool, prefix = m.new_pool(256, 3)
        seqs = [PagedSequence(pool, 256, prefix, f"sequence {i}") for i in range(3)]
        for i, s in enumerate(seqs):
            m.forward([3 + i, 9, 27, 81, 11, 40, 2, 5, 17, 19, 23][: 5 + 3 * i], s)
        before = [(s.n_tokens, list(s.tokens), s.n_blocks) for s in seqs]
        free = pool.available_blocks
        reads = [s.read(1, 0, s.n_tokens) for s in seqs]
        for rows in (1, 7, 16):
            assert verification_seconds(m, seqs, rows, reps=2) > 0
        assert [(s.n_tokens, list(s.tokens), s.n_blocks) for s in seqs] == before
        assert pool.available_blocks == free
        for s, r in zip(seqs, reads):
            assert all(np.array_equal(a, b) for a, b in zip(s.read(1, 0, s.n_tokens), r))


def test_the_start_up_curve_ends_where_the_pool_runs_out(tmp_path):
    """measure_verify_cost on a sequence of 64 tokens in a pool of 128 token slots: the sizes
    that fit are timed (a prefix of VERIFY_ROWS, each step positive), the first that does
    not ends the curve, and the sequence and the pool are left as they were."""
    with isolated_runtime(tmp_path / "home"):
        m = Transformer(GGUFFile(write_tiny_model(tmp_path / "t.gguf", "llama", "Q8_0", n_layer=2, seed=5,
                                                  n_ctx=256)))
        pool, prefix = m.new_pool(128, 1, prefix_sharing=False)
        seq = PagedSequence(pool, 128, prefix, "sequence")
        m.forward_chunks([(seq, list(range(1, 65)))])
        before, free, kv = (seq.n_tokens, list(seq.tokens)), pool.available_blocks, seq.read(1, 0, 64)
        rows, seconds, decode_s = measure_verify_cost(m, ModelRunner(m, pool.kind, None), [seq])
        assert 1 <= len(rows) < len(VERIFY_ROWS) and tuple(rows) == VERIFY_ROWS[:len(rows)]
        assert len(seconds) == len(rows) and min(seconds) > 0 and decode_s > 0
        assert (seq.n_tokens, list(seq.tokens)) == before and pool.available_blocks == free
        assert all(np.array_equal(a, b) for a, b in zip(seq.read(1, 0, 64), kv))


def test_the_seconds_table_equals_the_curve_and_follows_k_max():
    """seconds_upto keeps t(0 .. n) for the step loop: every entry is seconds_of's, with a
    curve and with the fitted form only, and a budget override of k_max (set after the
    fit) is not answered from the old table."""
    curve = VerifyCost.fit([1, 2, 4, 8, 16, 32, 64], [0.010, 0.0105, 0.011, 0.020, 0.041, 0.083, 0.167], 0.010)
    bare = VerifyCost(k_max=4, slope_s=0.002, base_s=0.01, decode_s=0.01)
    for cost in (curve, bare):
        rows = np.arange(0, 301)
        assert np.array_equal(cost.seconds_upto(300)[:301], cost.seconds_of(rows))
        assert [cost.seconds(int(r)) for r in (1, 3, 65, 300)] == [float(cost.seconds_of(r)) for r in (1, 3, 65, 300)]
    before = bare.seconds(20)
    bare.k_max = 12
    assert bare.seconds(20) == float(bare.seconds_of(20)) < before
