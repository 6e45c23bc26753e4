"""Measure the planner's calibration constants on this machine and save them.

    python perf/calibrate.py [--threads 2] [--dry-run]

Measured here, each a median over repetitions in this run:
  handoff_ns                one dependency hand-off between two workers (tests/task_graphs.py)
  barrier_ns                one numba thread-pool region (the batched forward pass's per-operator barrier)
  attention_flops_per_core  decode attention over an f16 paged cache (SmolLM2 and Qwen shapes,
                            ctx 4096, one thread): 4 * H * D * ctx flops per layer / time
  unpack_weights_per_core,  the repacked int8 matmul (Qwen2.5-0.5B's Q5_0 ffn_gate rows, L2-
  matmul_macs_per_core      resident) on one core: t(rows) = W / unpack + rows * W / macs, from
                            1 and 4 activation rows
  matmul_read_efficiency    the same matrices streamed from DRAM (all 24 layers, 2 threads):
                            the matmul's GB/s over the machine curve's DRAM rate
  step_overhead_ns,         an executor step on SmolLM2 minus its workers' time, with 1 and
  step_overhead_seq_ns      4 sequences
The rest keep the defaults of cost.py.  Writes the calibration to
$LLCINFER_HOME/machine/calibration-<machine key>.json and prints it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from llcinfer.executor import WorkerPool, default_domains  # noqa: E402
from llcinfer.jit import set_threads  # noqa: E402
from task_graphs import handoff_ns  # noqa: E402  (tests/task_graphs.py)
from llcinfer.planner import detect_machine  # noqa: E402
from llcinfer.jit import kernel  # noqa: E402
from llcinfer.kernels.simd import addr, vtag  # noqa: E402
from llcinfer.kernels.vnni_matmul import group_rows, vnni_matmul  # noqa: E402
from llcinfer.planner.bandwidth import Rates  # noqa: E402
from llcinfer.planner.cost import Calibration  # noqa: E402


def _median_time(fn, reps: int = 7, inner: int = 1) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        ts.append((time.perf_counter() - t0) / inner)
    return statistics.median(ts)


def attention_rate(ctx: int = 4096) -> float:
    """flops/s of one thread on decode attention (f16 paged pool), median of two shapes."""
    from llcinfer.kernels.paged_attention import paged_attention
    from llcinfer.kernels.tables import F16_TO_F32
    from llcinfer.kv import new_pool, PagedSequence

    rates = []
    for H, KVH, D in ((9, 3, 64), (14, 2, 64), (12, 2, 128)):
        pool, _ = new_pool(1, KVH, D, ctx + 1, 1, "f16", 16, 1 << 31, False)
        seq = PagedSequence(pool, ctx + 1)
        seq.n_tokens = ctx
        rng = np.random.default_rng(0)
        k = rng.standard_normal((ctx, KVH, D)).astype(np.float32)
        seq.store(0, 0, k, k)
        q = rng.standard_normal((1, H, D)).astype(np.float32)
        out = np.empty_like(q)
        table = seq.table[:seq.n_blocks]

        def run():
            paged_attention(q, pool.data, pool.data_f32, F16_TO_F32, pool.kind, pool.group, pool.scale_offset, table,
                            0, KVH, 16, ctx - 1, np.float32(0.125), out, threads=1)

        rates.append(4.0 * H * D * ctx / _median_time(run, inner=5))
        seq.free()
    return float(statistics.median(rates))


def _qwen_gate():
    """(packed ffn_gate matrices of every layer, qtype, rows, cols, tag) of Qwen2.5-0.5B."""
    from llcinfer.model import catalog
    from llcinfer.model.gguf_file import GGUFFile
    from llcinfer.engine.transformer import Transformer
    from llcinfer.kernels.simd import make_tag

    model = Transformer(GGUFFile(catalog.resolve_model("qwen2.5-coder-0.5b", progress=False)))
    lins = [lw.w_gate for lw in model.weights.layers]
    # copies in anonymous memory: the repack cache's file mapping may still be paging in
    return [np.array(lin.prepare()) for lin in lins], int(lins[0].qtype), lins[0].rows, lins[0].cols, make_tag(lins[0].isa), lins


@kernel
def _serial_matmul(xq, xd, xs, w, qt, y, tag):
    """vnni_matmul on the calling thread (no pool launch in the timing)."""
    M, K = xq.shape
    vt = vtag(tag)
    for g in range(w.shape[0]):
        group_rows(qt, addr(w) + g * w.strides[0], g, addr(xq), addr(xd), addr(xs), M, K, addr(y), y.shape[1], vt)


def matmul_calibration(threads: int) -> dict:
    """unpack / MAC rates per core (in-L2, 1 thread) and the read-compute overlap (DRAM, all threads)."""
    from llcinfer.hw.probe import read_bandwidth
    from llcinfer.kernels.act_quant import quantize_activations_int

    packed, qt, rows, cols, tag, lins = _qwen_gate()
    rng = np.random.default_rng(0)

    def act(M):
        return quantize_activations_int(rng.standard_normal((M, cols)).astype(np.float32), lins[0].act_kind)

    small = np.ascontiguousarray(packed[0][:48])  # 768 rows: ~0.5 MB, stays in L2
    w_small = 48 * 16 * cols
    set_threads(1)
    t = {}
    for M in (1, 4):
        q, d, s = act(M)
        y = np.empty((M, 48 * 16), np.float32)
        t[M] = _median_time(lambda: _serial_matmul(q, d, s, small, qt, y, tag), inner=200)
    per_row = max(1e-12, (t[4] - t[1]) / 3)
    macs = w_small / per_row
    unpack = w_small / max(1e-12, t[1] - per_row)
    set_threads(threads)
    q, d, s = act(1)
    y = np.empty((1, rows), np.float32)

    def stream():
        for p in packed:
            vnni_matmul(q, d, s, p, qt, y, tag)

    t_stream = _median_time(stream, reps=15)
    nbytes = sum(p.nbytes for p in packed)
    bw = read_bandwidth(nbytes, threads)  # bytes/s for this working set, this run
    machine = detect_machine(probe=False)
    curve_gbs = Rates(machine).read_gbs("DRAM", machine.physical_cores()[:threads])
    stream_gbs = nbytes / t_stream / 1e9
    return {"unpack_weights_per_core": unpack, "matmul_macs_per_core": macs,
            "matmul_read_efficiency": min(1.0, stream_gbs / curve_gbs),
            "_stream_gbs": stream_gbs, "_probe_gbs": bw / 1e9, "_curve_gbs": curve_gbs}


def step_overhead(threads: int) -> tuple[float, float]:
    """(fixed ns, ns per sequence) of an executor step outside its workers (SmolLM2)."""
    from llcinfer.model import catalog
    from llcinfer.executor import DecodeExecutor
    from llcinfer.model.gguf_file import GGUFFile
    from llcinfer.engine.transformer import Transformer
    from llcinfer.kv import PagedSequence

    model = Transformer(GGUFFile(catalog.resolve_model("smollm2-135m", progress=False)))
    ex = DecodeExecutor(model, default_domains(threads))
    run = ex.workers.run_step
    inside = []

    def timed(args, counters):
        t0 = time.perf_counter()
        r = run(args, counters)
        inside.append(time.perf_counter() - t0)
        return r

    ex.workers.run_step = timed
    out = {}
    for n in (1, 4):
        pool, _ = model.new_pool(256, n, prefix_sharing=False)
        seqs = [PagedSequence(pool, 256, None, f"s{i}") for i in range(n)]
        for s in seqs:
            s.n_tokens = 64
        total = []
        inside.clear()
        for _ in range(60):
            t0 = time.perf_counter()
            ex.step(seqs, [5] * n)
            total.append(time.perf_counter() - t0)
        out[n] = statistics.median(np.array(total[10:]) - np.array(inside[10:])) * 1e9
        for s in seqs:
            s.free()
    ex.close()
    per_seq = max(0.0, (out[4] - out[1]) / 3)
    return out[1] - per_seq, per_seq


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dry-run", action="store_true", help="print, do not save")
    a = ap.parse_args()
    threads = set_threads(a.threads)
    cal = Calibration()
    pool = WorkerPool(list(default_domains(threads).cores))
    cal.handoff_ns = handoff_ns(pool)
    pool.close()
    from sync_bench import region_ns

    cal.barrier_ns = region_ns(threads)
    set_threads(1)
    cal.attention_flops_per_core = attention_rate()
    set_threads(threads)
    mm = matmul_calibration(threads)
    for k in ("unpack_weights_per_core", "matmul_macs_per_core", "matmul_read_efficiency"):
        setattr(cal, k, mm[k])
    print(f"matmul stream {mm['_stream_gbs']:.1f} GB/s; probe now {mm['_probe_gbs']:.1f} GB/s, "
          f"machine curve (DRAM) {mm['_curve_gbs']:.1f} GB/s")
    cal.step_overhead_ns, cal.step_overhead_seq_ns = step_overhead(threads)
    key = detect_machine(probe=False).key()
    for k in ("handoff_ns", "barrier_ns", "attention_flops_per_core", "unpack_weights_per_core",
              "matmul_macs_per_core", "matmul_read_efficiency", "step_overhead_ns", "step_overhead_seq_ns"):
        print(f"{k:28s} {getattr(cal, k):.4g}")
    if not a.dry_run:
        print("saved", cal.save(key))
    else:
        print(asdict(cal))


if __name__ == "__main__":
    main()
