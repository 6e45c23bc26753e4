"""llcinfer's decode kernels placed on overlap_ceiling.py's curve: for each, the rate when
its data sit in the caches and when they come from DRAM, 1 thread, next to the probe
(``python perf/overlap_ceiling.py --kernels``).

  * one-row matvec (``vnni_matmul.group_rows``, the executor's tile call) per weight type
    at its usual row length: cache = 256 KiB of packed groups passed over again and again,
    dram = --mb MiB of them once;
  * decode attention (``paged_attention_serial``, one query row over 4096 keys, f16 KV) at
    SmolLM2 and Qwen2.5-0.5B shapes: cache = one layer (2-3 MiB of KV), dram = as many
    layers as make --mb MiB.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "perf"))
sys.path.insert(0, str(ROOT / "tests"))

from attention_bench import BLOCK, make_cache  # noqa: E402
from gguf.constants import GGMLQuantizationType as QT  # noqa: E402
from tiny_models import random_quant_bytes  # noqa: E402

from llcinfer.kernels import paged_attention as pa  # noqa: E402
from llcinfer.kernels.act_quant import ACT_Q8_0, ACT_Q8_K, quantize_activations_int  # noqa: E402
from llcinfer.jit import kernel  # noqa: E402
from llcinfer.weights.repack import repack  # noqa: E402
from llcinfer.kernels.simd import lanes, make_tag, vtag  # noqa: E402
from llcinfer.kernels.tables import F16_TO_F32  # noqa: E402
from llcinfer.kernels.vnni_matmul import group_rows  # noqa: E402

MATVECS = (("Q4_1", 576), ("Q8_0", 896), ("Q5_0", 896), ("Q4_K", 1536), ("Q6_K", 1536))
ATTENTION = {"attention smollm2": (9, 3), "attention qwen0.5b": (14, 2)}  # heads, kv heads; D 64
CTX = 4096
CACHE_BYTES = 256 << 10


@kernel
def _groups(qt, wa, stride, n_groups, passes, xa, xda, xsa, K, ya, ny, tag):
    """``passes`` passes of one activation row over n_groups packed groups at wa."""
    vt = vtag(tag)
    for _ in range(passes):
        for g in range(n_groups):
            group_rows(qt, wa + g * stride, g, xa, xda, xsa, 1, K, ya, ny, vt)


@kernel
def _layers(q, data, data_f32, lut, kind, group, so, table, L, KVH, bs, n_past, scale, out, tag):
    """Decode attention of q over every layer of the pool, one after the other."""
    for layer in range(L):
        pa.paged_attention_serial(q, data, data_f32, lut, kind, group, so, table, layer, KVH, bs, n_past, scale, 1,
                                  out, tag)


def _matvec_call(qname, K, n_bytes, isa, rng):
    """(fn(passes), bytes per pass) for about n_bytes of packed qname weights, row length K."""
    q = int(QT[qname])
    W = lanes(isa)
    per_row = len(random_quant_bytes(rng, qname, 1, K).reshape(-1))
    N = max(W, n_bytes // per_row // W * W)
    p = repack(random_quant_bytes(rng, qname, N, K), q, K, W)  # [groups, bytes]
    x = rng.standard_normal((1, K)).astype(np.float32)
    qx, dx, sx = quantize_activations_int(x, ACT_Q8_K if qname in ("Q4_K", "Q6_K") else ACT_Q8_0)
    y = np.empty((1, N), np.float32)
    tag = make_tag(isa)

    def fn(passes):  # the closure keeps the arrays behind the addresses alive
        _groups(q, p.ctypes.data, p.strides[0], p.shape[0], passes, qx.ctypes.data, dx.ctypes.data,
                sx.ctypes.data, K, y.ctypes.data, N, tag)

    return fn, p.nbytes


def _attention_call(H, KVH, layers, isa):
    D = 64
    pool, seq = make_cache(layers, KVH, D, CTX)
    table = seq.table[:seq.n_blocks]
    q = np.random.default_rng(1).standard_normal((1, H, D)).astype(np.float32)
    out = np.empty_like(q)
    tag = pa.attention_tag(isa)

    def fn(passes):
        for _ in range(passes):
            _layers(q, pool.data, pool.data_f32, F16_TO_F32, pool.kind, pool.group, pool.scale_offset, table, layers,
                    KVH, BLOCK, CTX - 1, np.float32(D ** -0.5), out, tag)

    return fn, layers * CTX * 2 * KVH * D * 2


def kernel_calls(mb: int, isa: str):
    """[(name, build)]: build() -> ((cache fn, bytes per pass), (dram fn, bytes per pass)),
    built one kernel at a time (the DRAM sets are --mb MiB each)."""
    rng = np.random.default_rng(0)
    calls = [(f"matvec {qname} K={K}", lambda qname=qname, K=K: (_matvec_call(qname, K, CACHE_BYTES, isa, rng),
                                                                 _matvec_call(qname, K, mb << 20, isa, rng)))
             for qname, K in MATVECS]
    for name, (H, KVH) in ATTENTION.items():
        layers = max(1, (mb << 20) // (CTX * 2 * KVH * 64 * 2))
        calls.append((name, lambda H=H, KVH=KVH, layers=layers: (_attention_call(H, KVH, 1, isa),
                                                                 _attention_call(H, KVH, layers, isa))))
    return calls


def measure_kernels(calls, reps: int, probe):
    """Per kernel: median GB/s from the caches and from DRAM, and the probe read between
    them (alternating, 1 thread); yields a row per kernel."""
    from overlap_ceiling import alternate_rates, rates_row

    for name, build in calls:
        (fc, bc), (fd, bd) = build()
        passes = max(1, int(20e6 // bc))  # about 20 MB per cache timing
        fc(1), fd(1)  # compile, warm
        med = alternate_rates({"cache": (lambda: fc(passes), bc * passes), "dram": (lambda: fd(1), bd)}, reps, probe)
        yield {"kernel": name, **rates_row(med)}


def curve_at(curve: list[dict], ratio: float) -> float:
    """The stream's best dram / probe at a cache / probe ratio (linear between the points of
    the curve, each r at its best prefetch distance, and (0, 0); flat past the lightest r)."""
    best: dict[int, dict] = {}
    for row in curve:
        r = row["fmas_per_line"]
        if r not in best or row["dram_over_probe"] > best[r]["dram_over_probe"]:
            best[r] = row
    pts = [(0.0, 0.0)] + sorted((b["cache_over_probe"], b["dram_over_probe"]) for b in best.values())
    xs, ys = [x for x, _ in pts], [y for _, y in pts]
    return float(np.interp(ratio, xs, ys))  # below the heaviest r: towards 0 (no arithmetic is free)
