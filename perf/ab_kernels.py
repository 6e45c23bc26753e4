"""One kernel of two llcinfer source trees in one process, alternating: new / old time.

    python perf/ab_kernels.py attention --old HEAD --new worktree --model qwen2.5-0.5b --ctx 4096
    python perf/ab_kernels.py attention --model smollm2 --ctx 4096 --evict-mb 0 -r 40
    python perf/ab_kernels.py matvec --old HEAD --types Q8_0 Q5_0 --threads 1 2

The trees are materialised as perf/ab_trees.py does (``$LLCINFER_HOME/ab/ab_old``,
``ab_new``); both compute on the same data (the results must match) and run old, new,
new, old, ...; the figure is the median of the per-pair ratios new / old, with quartiles.

attention: decode attention of one query row over ``ctx`` keys for every layer of the
model's shapes (f16 KV pool, the SIMD path; the first of ``--threads``: 1 runs the serial
loop, more the thread pool, as ``paged_attention`` dispatches), timed per layer call; between two
layers a read of ``--evict-mb`` MiB (what the weights stream through the caches in a decode
step) so that, as in the engine, each layer's K/V come from DRAM.

matvec: M = --rows (1) products of repacked random weights with the catalog models' row lengths and
enough rows (about 70-145 MB) that the weights come from DRAM, on ``--threads`` threads;
GB/s = packed bytes / median time.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "perf"))

from ab_trees import prepare_trees, quartiles  # noqa: E402

ATTN_SHAPES = {"qwen2.5-0.5b": (24, 14, 2, 64), "smollm2-135m": (30, 9, 3, 64)}  # layers, heads, kv heads, head dim
MATVEC_SHAPES = {"Q8_0": (151936, 896), "Q5_0": (4864 * 24, 896), "Q6_K": (896 * 24, 4864), "Q4_K": (896 * 24, 4864),
                 "Q4_1": (1536 * 60, 576), "Q4_0": (1536 * 60, 576)}


def alternate(fns: dict, reps: int) -> tuple[float, float, float, dict]:
    """Median, q1, q3 of new / old over reps pairs (order swapped every pair); median seconds."""
    ratios, per = [], {"old": [], "new": []}
    for r in range(reps):
        for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
            per[name].append(fns[name]())
        ratios.append(per["new"][-1] / per["old"][-1])
    return (*quartiles(ratios), {k: float(np.median(v)) for k, v in per.items()})


def attention(mods, args) -> None:
    model = next((m for m in ATTN_SHAPES if m.startswith(args.model)), None)
    if model is None:
        sys.exit(f"error: unknown attention shapes {args.model!r} (of {', '.join(ATTN_SHAPES)})")
    L, H, KVH, D = ATTN_SHAPES[model]
    bs, ctx = 16, args.ctx
    kv = mods["old"]["kv"]
    pool = kv.KVPool(L, KVH, D, bs, -(-ctx // bs) + 1, "f16", budget_bytes=16 << 30)
    seq = kv.PagedSequence(pool, ctx + bs, None, "ab")
    seq.n_tokens = ctx
    rng = np.random.default_rng(0)
    for b in seq.table[:seq.n_blocks]:
        pool.data[b] = rng.standard_normal(pool.data.shape[1], dtype=np.float32).astype(np.float16).view(np.uint16)
    table = seq.table[:seq.n_blocks]
    q = rng.standard_normal((1, H, D)).astype(np.float32)
    scale = np.float32(1 / np.sqrt(D))
    evict = np.ones(max(1, args.evict_mb << 17))  # [n] f64, read between layers
    outs = {name: np.empty_like(q) for name in mods}

    threads = args.threads[0]

    def token(name):
        pa = mods[name]["paged_attention"]
        lut, out = mods[name]["tables"].F16_TO_F32, outs[name]
        mods[name]["jit"].set_threads(threads)
        t = 0.0
        for layer in range(L):
            if args.evict_mb:
                evict.sum()
            t0 = time.perf_counter()
            pa.paged_attention(q, pool.data, pool.data_f32, lut, pool.kind, pool.group, pool.scale_offset, table,
                               layer, KVH, bs, ctx - 1, scale, out, threads, args.isa)
            t += time.perf_counter() - t0
        return t

    for name in mods:
        token(name)
    diff = float(np.abs(outs["old"] - outs["new"]).max())
    if diff > 1e-4:
        sys.exit(f"error: the trees' attention outputs differ by {diff:.3g}")
    med, q1, q3, t = alternate({name: (lambda name=name: token(name)) for name in mods}, args.reps)
    print(f"attention {model} ctx {ctx} t={threads} evict {args.evict_mb} MiB: old {1e3 * t['old']:.2f} ms, "
          f"new {1e3 * t['new']:.2f} ms; new/old {med:.3f} (q1 {q1:.3f}, q3 {q3:.3f}; {args.reps} pairs)", flush=True)


def matvec(mods, args) -> None:
    from kernel_bench import QT, random_quant_bytes

    lanes = 16 if args.isa == "avx512vnni" else 8
    rng = np.random.default_rng(0)
    for threads in args.threads:
        for qname in args.types:
            if qname not in MATVEC_SHAPES:
                sys.exit(f"error: unknown type {qname!r} (of {', '.join(MATVEC_SHAPES)})")
            N, K = MATVEC_SHAPES[qname]
            qt = int(QT[qname])
            old = mods["old"]
            packed = old["repack"].repack(random_quant_bytes(rng, qname, N, K), qt, K, lanes)
            kind = old["act_quant"].ACT_Q8_K if qname in ("Q4_K", "Q6_K") else old["act_quant"].ACT_Q8_0
            x = rng.standard_normal((args.rows, K)).astype(np.float32)
            qx, dx, sx = old["act_quant"].quantize_activations_int(x, kind)
            ys, fns = {}, {}
            for name, mod in mods.items():
                mod["jit"].set_threads(threads)
                # [rows, N + 16]: output rows N floats apart would all map to one L1 set (N a multiple of 1024)
                tag, ys[name] = mod["simd"].make_tag(args.isa), np.empty((args.rows, N + 16), np.float32)

                def run(mod=mod, tag=tag, y=ys[name]):
                    t0 = time.perf_counter()
                    mod["vnni_matmul"].vnni_matmul(qx, dx, sx, packed, qt, y, tag)
                    return time.perf_counter() - t0

                fns[name] = run
                run()
            if not np.array_equal(ys["old"][:, :N], ys["new"][:, :N]):  # the padding is never written
                sys.exit(f"error: the trees' {qname} products differ")
            med, q1, q3, t = alternate(fns, args.reps)
            gb = packed.nbytes / 1e9
            print(f"matvec {qname} {N}x{K} M={args.rows} t={threads}: old {gb / t['old']:.2f} GB/s, "
                  f"new {gb / t['new']:.2f} GB/s; "
                  f"new/old {med:.3f} (q1 {q1:.3f}, q3 {q3:.3f}; {args.reps} pairs)", flush=True)


# The modules both trees are run through, by where they live in the package; the first
# place that a tree has is taken (jit and repack moved out of kernels/ in the reorganisation,
# so older revisions find them in the second place).
MODULES = {"paged_attention": ("kernels.paged_attention",), "tables": ("kernels.tables",), "kv": ("kv",),
           "repack": ("weights.repack", "kernels.repack"), "act_quant": ("kernels.act_quant",),
           "simd": ("kernels.simd",), "jit": ("jit", "kernels.jit"), "vnni_matmul": ("kernels.vnni_matmul",)}


def _module(package: str, places: tuple[str, ...]):
    for i, place in enumerate(places):
        try:
            return importlib.import_module(f"{package}.{place}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{package}.{place}" or i == len(places) - 1:
                raise


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kernel", choices=("attention", "matvec"))
    ap.add_argument("--old", default="HEAD", help="git revision or 'worktree'")
    ap.add_argument("--new", default="worktree", help="git revision or 'worktree'")
    ap.add_argument("--isa", default="avx2", help="the SIMD path both trees run")
    ap.add_argument("-r", "--reps", type=int, default=15)
    ap.add_argument("--model", default="qwen2.5-0.5b", help=f"attention shapes: {', '.join(ATTN_SHAPES)} (prefixes work)")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--evict-mb", type=int, default=14)
    ap.add_argument("--types", nargs="+", default=["Q8_0", "Q5_0", "Q6_K", "Q4_K"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--rows", type=int, default=1, help="matvec: rows of activations (a verification's M)")
    args = ap.parse_args(argv)
    if min(args.ctx, args.reps, args.rows, *args.threads) < 1 or args.evict_mb < 0:
        ap.error("--ctx, --reps, --rows and --threads must be at least 1, --evict-mb at least 0")
    prepare_trees({"old": args.old, "new": args.new})
    mods = {name: {m: _module(f"ab_{name}", places) for m, places in MODULES.items()} for name in ("old", "new")}
    (attention if args.kernel == "attention" else matvec)(mods, args)


if __name__ == "__main__":
    try:
        main()
    except subprocess.CalledProcessError as exc:  # git archive of an unknown revision, as ab_trees reports it
        sys.exit(f"error: {' '.join(exc.cmd[:5])}: {exc.stderr.decode(errors='replace').strip().splitlines()[-1]}")
