"""Small-row quantized matmuls on a model's real matrices: achieved int8 MAC/s at M rows
as a fraction of the measured int8 peak, optionally two source trees alternating.

    python perf/smallrow_bench.py qwen2.5-coder-1.5b smollm2-135m            # this tree
    python perf/smallrow_bench.py smollm2-135m --old HEAD --new worktree -r 9  # A B A B
    python perf/smallrow_bench.py qwen2.5-coder-1.5b --m 1 4 16 --threads 2 --json out.json

The products are the ones ``Transformer.forward_chunks`` makes for M rows of one layer,
through the kernel interface it calls (``Linear`` / ``linear_many`` with llama_rounding:
activations quantized per call, then the integer kernels): q/k/v in one launch, the
attention output, gate/up in one launch, down (one layer of each weight type it has).

    MACs = M * sum over the op's matrices of N * K      MAC/s = MACs / time
    fraction = median over repetitions of  MAC/s / int8 peak of the same threads
The peak (perf/int8_peak.py) is sampled again before each repetition, so a host whose clock
drifts during the run (the shared 2-vCPU guests do) moves both sides of each ratio together.

A matrix is used over and over, so its weights come from L2/L3 once warm (7.7 MiB for
Qwen-1.5B's gate): this is the kernel's compute ceiling, not a forward from DRAM
(perf/verify_cost.py measures that).  With --old the two trees run old, new, new, old,
...; per op and M the figure is the median of the per-pair time ratios new / old.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "perf"))

from ab_trees import prepare_trees, quartiles  # noqa: E402
from int8_peak import int8_peak  # noqa: E402

M_DEFAULT = [1, 2, 4, 8, 16, 32, 64]
OPS = {"qkv": ("attn_q", "attn_k", "attn_v"), "o": ("attn_output",), "gate_up": ("ffn_gate", "ffn_up"),
       "down": ("ffn_down",)}


def layer_ops(gguf) -> list[tuple[str, int, list]]:
    """[(label, layer, [tensor info])] for every op of OPS, once per weight type of its first
    matrix (Qwen's down alternates Q4_K / Q6_K between layers)."""
    out, seen = [], set()
    n_layer = 1 + max(int(n.split(".")[1]) for n in gguf.tensors if n.startswith("blk."))
    for layer in range(n_layer):
        for op, names in OPS.items():
            infos = [gguf.tensors[f"blk.{layer}.{n}.weight"] for n in names]
            key = (op, tuple(i.qtype.name for i in infos))
            if key not in seen:
                seen.add(key)
                out.append((f"{op} {infos[0].qtype.name}", layer, infos))
    return out


class Op:
    """One op of a layer bound to one tree's kernel interface: ``run()`` makes the product
    for ``x`` (set by ``rows``) and returns the seconds one call took (min over a burst)."""

    def __init__(self, kmod, infos):
        self.lins = [kmod.Linear(i) for i in infos]
        self.k = kmod
        for lin in self.lins:
            lin.prepare()
        self.macs_per_row = sum(lin.rows * lin.cols for lin in self.lins)

    def rows(self, x: np.ndarray) -> None:
        self.x = x  # [M, K] f32

    def call(self):
        if len(self.lins) == 1:
            return [self.lins[0](self.x, llama_rounding=True)]
        return self.k.linear_many(self.x, self.lins, llama_rounding=True)

    def run(self, burst: int) -> float:
        t0 = time.perf_counter()
        for _ in range(burst):
            self.call()
        return (time.perf_counter() - t0) / burst


def _burst(op: Op, M: int, peak: float) -> int:
    """Calls per sample: about 20 ms at half the peak, at least 3."""
    return max(3, int(0.02 * peak * 0.5 / (op.macs_per_row * M)))


def _peak_sample(isa: str, threads: int) -> float:
    """One short int8 peak sample (about 10 ms at 88 GMAC/s, an AVX2 core)."""
    return int8_peak(isa, threads, reps=1, n_iter=2_000_000)


def bench_model(model: str, trees: dict, ms: list[int], threads: int, reps: int, peak: float,
                isa: str) -> list[dict]:
    from llcinfer.model.catalog import resolve_model
    from llcinfer.model.gguf_file import GGUFFile

    gguf = GGUFFile(resolve_model(model))
    rng = np.random.default_rng(0)
    rows = []
    for label, layer, infos in layer_ops(gguf):
        ops = {name: Op(k, infos) for name, k in trees.items()}
        for name in trees:
            trees[name].set_threads(threads)
        for M in ms:
            x = rng.standard_normal((M, infos[0].shape[1])).astype(np.float32)
            for op in ops.values():
                op.rows(x)
                op.run(2)  # compile / warm
            if len(ops) == 2:
                a, b = (o.call() for o in ops.values())
                if not all(np.allclose(p, q, rtol=1e-4, atol=1e-3) for p, q in zip(a, b)):
                    sys.exit(f"error: the trees' {label} products differ at M={M}")
            burst = _burst(next(iter(ops.values())), M, peak)
            per = {name: [] for name in ops}
            peaks, ratios = [], []
            for r in range(reps):
                peaks.append(_peak_sample(isa, threads))
                for name in (list(ops) if r % 2 == 0 else list(ops)[::-1]):
                    per[name].append(ops[name].run(burst))
                if len(ops) == 2:
                    ratios.append(per["new"][-1] / per["old"][-1])
            row = {"model": model, "op": label, "layer": layer, "M": M, "threads": threads,
                   "macs": M * ops[next(iter(ops))].macs_per_row, "peak": round(float(np.median(peaks)))}
            for name, ts in per.items():
                row[f"{name}_us"] = round(1e6 * float(np.median(ts)), 2)
                row[f"{name}_fraction"] = round(float(np.median([row["macs"] / t / p for t, p in zip(ts, peaks)])), 4)
            if ratios:
                row["new_over_old"], row["q1"], row["q3"] = (round(v, 4) for v in quartiles(ratios))
            rows.append(row)
            _print_row(row, list(ops))
    return rows


def _print_row(row: dict, names: list[str]) -> None:
    cells = "".join(f"  {n} {row[f'{n}_us']:9.1f} us {100 * row[f'{n}_fraction']:5.1f} %" for n in names)
    ab = f"  new/old {row['new_over_old']:.3f} ({row['q1']:.3f}-{row['q3']:.3f})" if "new_over_old" in row else ""
    head = f"{row['model']:20s} {row['op']:14s} M={row['M']:3d} t={row['threads']} peak {row['peak'] / 1e9:5.1f}"
    print(f"{head}{cells}{ab}", flush=True)


class _Kernels:
    """A tree's kernel interface and its thread setting."""

    def __init__(self, package: str):
        k = importlib.import_module(f"{package}.kernels")
        self.Linear, self.linear_many, self.set_threads = k.Linear, k.linear_many, k.set_threads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="catalog names (smollm2-135m, qwen2.5-coder-1.5b, ...)")
    ap.add_argument("--m", type=int, nargs="+", default=M_DEFAULT, help="activation rows")
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--old", help="git revision or 'worktree': alternate it with --new")
    ap.add_argument("--new", default="worktree")
    ap.add_argument("-r", "--reps", type=int, default=7)
    ap.add_argument("--isa", default=None, help="the int8 peak's path (default: the one the kernels take)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.reps < 1 or min(args.m) < 1 or min(args.threads) < 1:
        ap.error("-r, --m and --threads take numbers from 1")
    if args.old:
        prepare_trees({"old": args.old, "new": args.new})
        trees = {name: _Kernels(f"ab_{name}") for name in ("old", "new")}
    else:
        trees = {"this": _Kernels("llcinfer")}
    from llcinfer.kernels.isa import current_isa
    from llcinfer.model.catalog import resolve_model

    for model in args.models:  # an unknown name fails before the peak is measured
        resolve_model(model)
    isa = args.isa or current_isa()
    out = {"isa": isa, "peaks": {}, "rows": []}
    for th in args.threads:
        peak = int8_peak(isa, th)
        out["peaks"][th] = round(peak)
        print(f"int8 peak {isa}, {th} thread(s): {peak / 1e9:.1f} GMAC/s", flush=True)
        for model in args.models:
            out["rows"] += bench_model(model, trees, args.m, th, args.reps, peak, isa)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


def _engine_errors() -> tuple[type, ...]:
    """LLCInferError of llcinfer and of the trees loaded as ab_old / ab_new (each its own class)."""
    mods = (sys.modules.get(f"{p}.errors") for p in ("llcinfer", "ab_old", "ab_new"))
    return tuple(m.LLCInferError for m in mods if m is not None)


if __name__ == "__main__":
    try:
        main()
    except subprocess.CalledProcessError as exc:  # git archive of an unknown revision, as ab_trees reports it
        sys.exit(f"error: {' '.join(exc.cmd[:5])}: {exc.stderr.decode(errors='replace').strip().splitlines()[-1]}")
    except Exception as exc:  # the engine's own errors (unknown model, bad GGUF) as one line
        if not isinstance(exc, _engine_errors()):
            raise
        sys.exit(f"error: {exc}")
