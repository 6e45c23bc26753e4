"""Small-row matmul efficiency inside the executor's step: a drafted chain of T rows
verified after a prefix, the weights streaming from DRAM and the activations quantized
in the step, as a verification runs.  Per operator kind, int8 multiply-adds per second
of one worker's working time, against one core's int8 peak measured in the same run.

    python perf/verify_efficiency.py smollm2-135m
    python perf/verify_efficiency.py qwen2.5-coder-1.5b --rows 1 4 8 16 --depth 512

    MACs(op) = T * the op's N * K summed over the layers (lm_head once)
    GMAC/s(op) = MACs(op) / workers / mean worker time working on the op's tiles
    % = matmul MACs / workers / matmul working time / peak(1 thread)

The times are the executor's own cycle counts (``start_profile``, as perf/step_profile.py
reads them), so waits for inputs are left out and the counting itself is in.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "perf"))

from int8_peak import int8_peak  # noqa: E402
from step_profile import KINDS, tsc_hz  # noqa: E402


def op_macs(c) -> dict[str, int]:
    """Multiply-adds per row of each weight operator kind, all layers."""
    L, D, hd = c.n_layer, c.d_model, c.head_dim
    return {"qkv": L * D * (c.n_head + 2 * c.n_kv_head) * hd, "wo": L * c.n_head * hd * D,
            "gate_up": L * 2 * D * c.d_ff, "down": L * c.d_ff * D, "lm_head": c.vocab_size * D}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--depth", type=int, default=64, help="prefix tokens before the chain")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    if min(args.rows) < 1 or args.depth < 1 or args.reps < 1:
        ap.error("--rows, --depth and --reps take positive numbers")
    from llcinfer.api import LLM
    from llcinfer.executor.tiles import F_KIND
    from llcinfer.kernels.isa import current_isa
    from llcinfer.weights.repack_cache import wait_loaded

    llm = LLM(args.model, threads=args.threads, n_ctx=args.depth + max(args.rows) + 64, progress=False)
    wait_loaded()
    llm.generate("hello", max_tokens=8)
    ex = llm.engine.runner.executor
    if ex is None:
        sys.exit("error: this model runs without the executor here")
    macs = op_macs(llm.model.config)
    peak = int8_peak(current_isa(), 1)
    seq = llm.engine.new_sequence("prefix")
    llm.model.forward_chunks([(seq, list(range(1, args.depth + 1)))])
    hz = tsc_hz()
    print(f"{args.model}, {args.threads} threads, after {args.depth} tokens; int8 peak of one core "
          f"{peak / 1e9:.0f} GMAC/s ({current_isa()})")
    for T in args.rows:
        n0 = seq.n_tokens
        for _ in range(3):
            ex.step_rows([seq], [[1] * T], [False])
            seq.truncate(n0)
        ex.start_profile()
        t0 = time.perf_counter()
        for _ in range(args.reps):
            ex.step_rows([seq], [[1] * T], [False])
            seq.truncate(n0)
        step_s = (time.perf_counter() - t0) / args.reps
        work: dict[str, float] = {}
        workers = 1
        for prog, prof in ex.profile.values():
            workers = prog.order.shape[0]
            for o in range(prog.ops.shape[0]):
                k = KINDS[int(prog.ops[o, F_KIND])]
                work[k] = work.get(k, 0.0) + float(np.mean(prof[:, o, 1])) / hz / args.reps
        ex.profile = None
        mm_s = sum(work[k] for k in macs)
        rate = sum(macs.values()) * T / workers / mm_s
        per_op = ", ".join(f"{k} {macs[k] * T / workers / work[k] / 1e9:.0f}" for k in macs)
        print(f"T={T:3d}: step {step_s * 1e3:7.2f} ms, matmuls {mm_s * 1e3:7.2f} ms per worker, "
              f"{rate / 1e9:4.0f} GMAC/s = {rate / peak * 100:3.0f} % of one core's peak; GMAC/s {per_op}", flush=True)
    llm.close()


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # the engine's own errors (unknown model, bad GGUF) as one line
        if type(exc).__module__.split(".")[0] != "llcinfer":
            raise
        sys.exit(f"error: {exc}")
