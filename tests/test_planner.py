"""The resource-domain planner: machine detection, topology files, workloads, plan
invariants on every shipped topology x the catalog models, the cost model's monotonicity,
JSON round trips and ``llcinfer plan``.  No bandwidth probe runs here except a tiny one."""

import json
import os
from functools import lru_cache

import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from real_models import real_model_path

from llcinfer.model.architectures.base import ModelConfig
from llcinfer.errors import UsageError
from llcinfer.planner import (Calibration, Plan, Rates, detect_machine, effective_llc_bytes, list_topologies,
                              load_topology, make_plan, predict, workload_from_gguf, workload_from_model)
from llcinfer.hw.bandwidth import probe_curve, synthetic_curve
from llcinfer.planner.candidates import budget_cores, layouts, split_layers
from llcinfer.hw.machine import Machine
from llcinfer.hw.sysfs import format_cpulist, parse_cpulist
from llcinfer.planner.plan import build
from llcinfer.planner.workload import LayerBytes, Workload

MIB = 1 << 20
# a curve with a cache that ends at 32 MiB: 100 GB/s below, 10 GB/s from DRAM
FAKE_CURVE = [(w << 20, t, (100.0 if w <= 32 else 10.0) * t) for t in (1, 2) for w in (1, 8, 32, 128, 512)]


def _bytes(rows, cols, qtype):
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    return rows * cols // block * size


def qwen_1p5b(ctx=8192, concurrency=4) -> Workload:
    """Qwen2.5-Coder-1.5B Q4_K_M from its configuration (the 1.1 GB file is not fetched here)."""
    d, q, kv, ff, vocab = 1536, 12 * 128, 2 * 128, 8960, 151936
    layer = LayerBytes(wq=_bytes(q, d, "Q4_K"), wk=_bytes(kv, d, "Q4_K"), wv=_bytes(kv, d, "Q6_K"),
                       wo=_bytes(d, q, "Q4_K"), w_gate=_bytes(ff, d, "Q4_K"), w_up=_bytes(ff, d, "Q4_K"),
                       w_down=_bytes(d, ff, "Q6_K"), attn_norm=4 * d, ffn_norm=4 * d, bias=4 * (q + 2 * kv))
    cfg = ModelConfig("qwen2", n_layer=28, d_model=d, n_head=12, n_kv_head=2, head_dim=128, d_ff=ff,
                      vocab_size=vocab, n_ctx_train=32768, rope_base=1e6, rope_dim=128, rope_neox=True,
                      rms_eps=1e-6, qkv_bias=True)
    return Workload("qwen2.5-coder-1.5b", cfg, [layer] * 28,
                    lm_head_bytes=_bytes(vocab, d, "Q6_K"), embedding_bytes=_bytes(vocab, d, "Q4_K"),
                    tied_embeddings=False, ctx=ctx, concurrency=concurrency)


@pytest.fixture(scope="module")
def workloads():
    out = {n: workload_from_gguf(real_model_path(n), ctx=8192, concurrency=4)
           for n in ("smollm2-135m", "qwen2.5-coder-0.5b")}
    out["qwen2.5-coder-1.5b"] = qwen_1p5b()
    return out


@lru_cache(maxsize=None)
def machines():
    return {name: load_topology(name) for name in list_topologies()} | {"this": detect_machine(bandwidth=FAKE_CURVE)}


# ---------------------------------------------------------------------------------------
# machine


def test_cpulists_and_detection_of_this_machine():
    assert parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpulist([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    m = machines()["this"]
    assert m.cpus == sorted(os.sched_getaffinity(0))
    assert set(m.core_of) == set(m.cpus) and set(m.package_of) == set(m.cpus)
    assert sorted(c for cpus in m.numa.values() for c in cpus) == m.cpus
    assert m.llc is not None and all(m.llc.instance_of(c) is not None for c in m.cpus)
    assert m.bandwidth == FAKE_CURVE and m.bandwidth_source == "given"
    assert Machine.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    assert m.key() == Machine.from_dict(m.to_dict()).key() and f"-{len(m.cpus)}c-" in m.key()


def test_detection_without_sysfs_falls_back(tmp_path):
    m = detect_machine(bandwidth=FAKE_CURVE, sys_root=tmp_path)  # an empty /sys/devices/system
    assert len(m.caches) == 1 and m.llc.instances == [m.cpus]
    assert list(m.numa) == [0] and m.numa[0] == m.cpus
    assert all(m.core_of[c] == c for c in m.cpus)


def test_shipped_topologies():
    assert {"epyc-9684x", "xeon-6980p", "2x-epyc-9654", "ci-2core"} <= set(list_topologies())
    epyc = load_topology("epyc-9684x")
    assert len(epyc.physical_cores()) == 96 and epyc.llc.level == 3
    assert len(epyc.llc.instances) == 12 and epyc.llc.size_bytes == 96 * MIB
    assert len(epyc.llc_groups(epyc.cpus)) == 12 and epyc.private_level.size_bytes == 1 * MIB
    xeon = load_topology("xeon-6980p")
    assert len(xeon.cpus) == 128 and xeon.llc.size_bytes * len(xeon.llc.instances) == 504 * MIB
    assert "amx_int8" in xeon.isa
    two = load_topology("2x-epyc-9654")
    assert two.n_sockets == 2 and len(two.numa) == 2
    ci = load_topology("ci-2core")  # MACHINE.md's measured curve: ~100 MiB of 480 behaves as cache
    assert ci.bandwidth_source.startswith("measured")
    assert 64 * MIB < Rates(ci).llc_eff_instance < 200 * MIB


def test_effective_llc_and_rates():
    assert 32 * MIB <= effective_llc_bytes(FAKE_CURVE) < 128 * MIB
    assert effective_llc_bytes(FAKE_CURVE, cap_bytes=16 * MIB) == 16 * MIB
    epyc = load_topology("epyc-9684x")
    r = Rates(epyc)
    one_ccd, two_ccds = epyc.cpus[:8], epyc.cpus[:16]
    assert r.read_gbs("LLC", two_ccds) == pytest.approx(2 * r.read_gbs("LLC", one_ccd))
    assert r.read_gbs("L2", one_ccd) > r.read_gbs("LLC", one_ccd) > r.read_gbs("DRAM", one_ccd)
    assert r.read_gbs("DRAM", epyc.cpus) <= r.dram_total + 1e-9
    spread = [g[0] for g in epyc.llc_groups(epyc.cpus)][:8]  # 8 cores on 8 CCDs read more L3 than on one
    assert r.read_gbs("LLC", spread) > r.read_gbs("LLC", one_ccd)


def test_tiny_probe_and_synthetic_curve():
    pts = probe_curve(load_topology("ci-2core"), sizes=[256 << 10, 1 << 20], threads=[1])
    assert [(w, t) for w, t, _ in pts] == [(256 << 10, 1), (1 << 20, 1)] and all(g > 0 for _, _, g in pts)
    curve = synthetic_curve(load_topology("epyc-9684x"))
    big = [g for w, t, g in curve if t == 96]
    assert max(big) > 5 * min(big)  # cache levels show as steps


# ---------------------------------------------------------------------------------------
# workload


def test_workload_from_gguf_matches_the_loaded_model():
    from llcinfer.model.gguf_file import GGUFFile
    from llcinfer.engine.transformer import Transformer

    path = real_model_path("smollm2-135m")
    w = workload_from_gguf(path, ctx=1024, concurrency=2)
    model = Transformer(GGUFFile(path))
    assert workload_from_model(model, ctx=1024, concurrency=2) == w
    assert w.kv_bytes_per_token_layer == 2 * 3 * 64 * 2  # 3 KV heads x 64, f16
    assert w.kv_bytes_per_step == 1024 * 2 * 768 * 30
    assert w.tied_embeddings and w.lm_head_bytes == w.embedding_bytes
    assert w.layer_weight_bytes + w.lm_head_bytes == model.weights.nbytes + sum(
        lw.attn_norm.nbytes + lw.ffn_norm.nbytes for lw in model.weights.layers)
    assert len(w.operators()) == 30 * 8 + 2
    assert w.op_macs("qkv") == (9 + 6) * 64 * 576 * 2


def test_split_layers_balances_bytes():
    w = qwen_1p5b()
    groups = split_layers(w, [40, 40, 8])
    assert sum(groups, []) == list(range(28)) and all(groups)
    assert len(groups[0]) > len(groups[2])


# ---------------------------------------------------------------------------------------
# plans


def check_invariants(plan: Plan, m: Machine, w: Workload, cores: list[int]):
    used = [c for d in plan.domains for c in d.cores]
    assert len(used) == len(set(used)), "a core is in two domains"
    assert sorted(used) == sorted(cores), "the plan does not use exactly its thread budget"
    for d in plan.domains:
        assert d.resident_bytes <= d.cache_share_bytes, f"{d.name}: resident bytes exceed its share"
        assert all(v % 16 == 0 and v > 0 for v in d.tiles.values())
    ops = [op for d in plan.domains for op in d.ops]
    assert sorted(ops) == sorted(w.operators()), "an operator is missing or assigned twice"
    p = plan.prediction
    assert p.tpot_s > 0 and sum(p.terms.values()) == pytest.approx(p.tpot_s, rel=1e-6)


@pytest.mark.parametrize("topology", sorted(list_topologies()) + ["this"])
@pytest.mark.parametrize("model", ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_plan_invariants(topology, model, workloads):
    m = machines()[topology]
    w = workloads[model]
    cal = Calibration()
    for threads in (None, 7):
        if threads and threads > len(m.physical_cores()):
            continue
        best = make_plan(m, w, threads=threads, calibration=cal)
        cores = budget_cores(m, threads)
        assert not best.what_if, "a plan the executor cannot run was chosen"
        for plan in [best] + best.runners_up:
            check_invariants(plan, m, w, cores)
            assert plan.what_if == (plan.stages > 1)
            if not plan.what_if:
                assert plan.prediction.tpot_s >= best.prediction.tpot_s
        text = best.explain()
        assert text.count("\n") > 8
        assert text.count("[what-if") == sum(r.what_if for r in best.runners_up)


def test_two_cores_include_one_attention_core():
    m = load_topology("ci-2core")
    w = qwen_1p5b(ctx=4096, concurrency=2)
    kinds = [(kind, [len(d.cores) for d in doms if d.role == "attention"]) for _, kind, _, doms in
             layouts(m, w, budget_cores(m, None))]
    assert ("split", [1]) in kinds and ("shared", []) in kinds
    assert len(make_plan(m, w, threads=1, calibration=Calibration()).domains) == 1


def test_plans_for_the_shipped_topologies_are_sensible(workloads):
    cal = Calibration()
    epyc = load_topology("epyc-9684x")
    small = make_plan(epyc, workloads["smollm2-135m"].with_(ctx=4096, concurrency=1), calibration=cal)
    weights = [d for d in small.domains if d.role != "attention"]
    assert not any(g != "kv" for d in weights for g, _ in d.streamed), "SmolLM2 should be fully resident"
    assert len(epyc.llc_groups(sum((d.cores for d in weights), []))) == 12, "across all 12 CCDs"
    big = make_plan(epyc, workloads["qwen2.5-coder-1.5b"], calibration=cal)  # 935 MiB of weights + 896 of KV
    weights = [d for d in big.domains if d.role != "attention"]
    resident = [g for d in weights for g, _ in d.resident if g.startswith("blk.")]
    streamed = [g for d in weights for g, _ in d.streamed if g != "kv"]
    assert resident and streamed, "Qwen-1.5B: some layer groups resident, the others streamed"
    for d in weights:
        assert d.resident_bytes > 0.9 * d.cache_share_bytes  # the share is used
    xeon = make_plan(load_topology("xeon-6980p"), workloads["smollm2-135m"], calibration=cal)
    assert any(lvl == "L2" for d in xeon.domains for lvl in d.resident_level.values())  # 2 MiB L2 x 128


def test_threads_spread_over_llcs_and_bad_threads():
    epyc = load_topology("epyc-9684x")
    cores = budget_cores(epyc, 12)
    assert len(cores) == 12 and len(epyc.llc_groups(cores)) == 12
    with pytest.raises(UsageError):
        budget_cores(epyc, 97)
    with pytest.raises(UsageError):
        budget_cores(epyc, 0)


@pytest.mark.parametrize("topology", ["epyc-9684x", "ci-2core", "2x-epyc-9654"])
def test_prediction_is_monotone_in_context_and_bytes(topology):
    m, cal = load_topology(topology), Calibration()
    base = qwen_1p5b(ctx=512, concurrency=2)
    last = 0.0
    for ctx in (512, 8192, 32768):
        t = make_plan(m, base.with_(ctx=ctx), calibration=cal).prediction.tpot_s
        assert t >= last
        last = t
    last = 0.0
    for scale in (0.5, 1.0, 2.0):
        lb = base.layers[0]
        layer = LayerBytes(**{k: int(getattr(lb, k) * scale) for k in LayerBytes.__dataclass_fields__})
        w = base.with_(layers=[layer] * base.config.n_layer, lm_head_bytes=int(base.lm_head_bytes * scale))
        t = make_plan(m, w, calibration=cal).prediction.tpot_s
        assert t >= last
        last = t
    # one fixed layout: barriers cost more than hand-offs
    dom = layouts(m, base, budget_cores(m, None))[0][3]
    plan = build(m, base, dom, "shared", "shared", Rates(m), cal)
    assert predict(plan, m, base, cal, sync="barrier").tpot_s > predict(plan, m, base, cal).tpot_s


def test_plan_json_round_trip(workloads):
    plan = make_plan(load_topology("2x-epyc-9654"), workloads["smollm2-135m"], calibration=Calibration())
    text = plan.to_json()
    again = Plan.from_json(text)
    assert again == plan and again.to_json() == text
    d = json.loads(text)
    assert d["kind"] in ("shared", "split") and d["prediction"]["tpot_s"] > 0 and d["runners_up"]


def test_calibration_save_and_load(tmp_path, monkeypatch):
    monkeypatch.setenv("LLCINFER_HOME", str(tmp_path))
    assert Calibration.load("nothing-saved") == Calibration()
    cal = Calibration(handoff_ns=123.0, attn_stream_reserve_bytes=1 << 20)
    path = cal.save("k1")
    assert path.startswith(str(tmp_path)) and Calibration.load("k1") == cal
    with open(path, "w") as fh:
        json.dump({"handoff_ns": 50, "not_a_field": 1}, fh)
    assert Calibration.load("k1") == Calibration(handoff_ns=50.0)


# ---------------------------------------------------------------------------------------
# command line


def run_cli(capsys, *args):
    from llcinfer.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["plan", *args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_cli_plan_on_topologies(capsys):
    smol = real_model_path("smollm2-135m")
    code, out, err = run_cli(capsys, "--model", smol, "--ctx", "8192", "--concurrency", "4",
                             "--topology", "epyc-9684x")
    assert code == 0, err
    assert "AMD EPYC 9684X" in out and "predicted TPOT" in out and "runners-up:" in out
    code, out, err = run_cli(capsys, "-m", smol, "--topology", "xeon-6980p", "--threads", "64", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["threads"] == 64 and sum(len(x["cores"]) for x in d["domains"]) == 64


def test_cli_plan_on_this_machine_without_probe(capsys):
    code, out, err = run_cli(capsys, "-m", real_model_path("smollm2-135m"), "--no-probe", "--ctx", "2048")
    assert code == 0, err
    assert out.startswith("machine: ") and "plan: " in out


def test_cli_plan_errors(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    for text in ("{", '{"name": "x"}', '{"cpus": "0-3", "caches": [{"level": 3, "size": "1M", "instances": ["0-1"]}]}'):
        bad.write_text(text)
        code, out, err = run_cli(capsys, "--topology", str(bad), "-m", real_model_path("smollm2-135m"))
        assert code == 2 and err.startswith("error: bad topology file") and err.count("\n") == 1, err
    code, _, err = run_cli(capsys, "--topology", "no-such-machine")
    assert code == 2 and "shipped topology" in err
    code, _, err = run_cli(capsys, "--topology", "ci-2core", "--ctx", "0")
    assert code == 2 and err.startswith("error:")


# ---------------------------------------------------------------------------------------
# replicas


def test_replica_core_sets_follow_llc_instances_and_nodes():
    from llcinfer.planner.replicas import replica_core_sets

    epyc = load_topology("epyc-9684x")
    auto = replica_core_sets(epyc, "auto")
    assert len(auto) == 12 and all(len(s) == 8 for s in auto) and auto[1] == list(range(8, 16))
    assert replica_core_sets(epyc, 3) == [list(range(i * 32, (i + 1) * 32)) for i in range(3)]  # 4 CCDs each
    assert [len(s) for s in replica_core_sets(epyc, 24)] == [4] * 24  # more replicas than CCDs: split cores
    ci = load_topology("ci-2core")
    assert replica_core_sets(ci, "auto") == [ci.physical_cores()]  # one LLC, one node: one replica
    assert replica_core_sets(ci, 2) == [[c] for c in ci.physical_cores()]
    for bad in (0, -1, "x", 1.5, True):
        with pytest.raises(UsageError):
            replica_core_sets(ci, bad)
    with pytest.raises(UsageError, match="at least 3 cores"):
        replica_core_sets(ci, 3)


def test_restricted_machine_and_replica_plans():
    from llcinfer.planner.replicas import plan_replicas

    epyc = load_topology("epyc-9684x")
    ccd = epyc.restricted(range(8, 16))
    assert ccd.cpus == list(range(8, 16)) and len(ccd.llc.instances) == 1 and ccd.numa == {0: list(range(8, 16))}
    rp = plan_replicas(epyc, workload_from_gguf(real_model_path("smollm2-135m"), ctx=4096), "auto")
    assert len(rp.plans) == 12 and all(p.cores == s for p, s in zip(rp.plans, rp.core_sets))
    assert rp.throughput == pytest.approx(12 / rp.tpot_s(0)) and rp.single.concurrency == 12
    assert "replicas: 12 x 8 cores (one per LLC instance)" in rp.explain()
    d = rp.to_dict()
    assert d["replicas"] == 12 and d["core_sets"][0] == "0-7" and d["throughput_tok_s"] > 0


def test_cli_plan_shows_replicas(capsys):
    smol = real_model_path("smollm2-135m")
    code, out, err = run_cli(capsys, "-m", smol, "--topology", "epyc-9684x")
    assert code == 0 and "replicas: 12 x 8 cores" in out and "predicted throughput" in out, err
    code, out, err = run_cli(capsys, "-m", smol, "--topology", "ci-2core")
    assert code == 0 and "replicas:" not in out  # auto is one replica there: nothing to add
    code, out, err = run_cli(capsys, "-m", smol, "--topology", "ci-2core", "--replicas", "2", "--json")
    assert code == 0 and json.loads(out)["replicas"]["core_sets"] == ["0", "1"]
    code, _, err = run_cli(capsys, "-m", smol, "--topology", "ci-2core", "--replicas", "many")
    assert code == 2 and err.startswith("error: replicas must be") and err.count("\n") == 1
