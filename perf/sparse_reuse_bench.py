"""Decode TPOT of sparse attention's selection reuse across steps (SparseConfig.reuse_steps,
kernels/sparse_reuse.py) against dense rows and sparse rows that always score, near a
depth of real text.

    python perf/sparse_reuse_bench.py -m smollm2-135m --depth 8000 --pool-ctx 10000 --state /tmp/smol.npz
    python perf/sparse_reuse_bench.py -m qwen2.5-coder-0.5b --depth 32768 --pool-ctx 32832 --state /tmp/qwen32k.npz

The context is filled as ``sparse_bench.py tpot`` fills it (resumable with --state: the
same file serves both scripts).  Then one sparse decode executor runs blocks of --block
steps, its selection rule changed in place between blocks (the kernels read the rule from
one array): dense rows (min_context out of reach; index keys still written), sparse rows
that always score, and reuse at each --cos, in turn (A B C D A B C D ...), over the last
--span positions before the depth, the sequence truncated back before each of --passes
passes.  A block's mean step time counts its scoring steps at their share; medians over
blocks, the first of each kind dropped.  Also the selections scored and reused per kind.
With --indexers N, one more kind: reuse at the first --cos with only N sparse layers
owning an indexer (chosen on calibration loss as ``LLM(sparse_indexers=N)`` chooses them,
cached), on a second executor whose index cache starts as a copy of the first one's
(the positions decoded here stay in the window, so neither scores the other's keys).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sparse_bench as sb  # noqa: E402

from llcinfer import jit  # noqa: E402
from llcinfer.engine.sparse_setup import model_basis, with_chosen_layers  # noqa: E402
from llcinfer.executor import DecodeExecutor, default_domains  # noqa: E402
from llcinfer.kernels.sparse_index import COUNT_REUSED, COUNT_SELECTIONS  # noqa: E402
from llcinfer.kv import PagedSequence  # noqa: E402
from llcinfer.sparse import SparseAttention, SparseConfig  # noqa: E402
from llcinfer.weights.repack_cache import wait_loaded  # noqa: E402


def run(a) -> dict:
    tm, tok = sb.load(a.model)
    toks = sb.eval_tokens(tok, a.depth + 8)
    n_ctx = max(a.pool_ctx, a.depth + 24)
    pool, prefix = tm.new_pool(n_ctx, kv_type="f16", prefix_sharing=False)
    cfg = SparseConfig(min_context=min(4096, a.depth - a.span)).for_context(a.depth)
    sp = SparseAttention(cfg, model_basis(tm, tok, cfg.rank), pool, tm.config.n_head)
    seq = PagedSequence(pool, n_ctx, prefix)
    state = Path(a.state) if a.state else None
    if state and state.exists():
        sb.load_state(state, pool, seq, sp, toks)
    tm.sparse = sb.retuned(sp, min_context=sb.NEVER)  # the fill: dense, index keys written
    while seq.n_tokens < a.depth:
        tm.forward_chunks([(seq, toks[seq.n_tokens:min(a.depth, seq.n_tokens + 512)])])
    if state and not state.exists():
        sb.save_state(state, pool, seq, sp, toks[:seq.n_tokens])
    kinds = {"dense": dataclasses.replace(cfg, min_context=sb.NEVER), "sparse": dataclasses.replace(cfg, reuse_steps=0)}
    kinds.update({f"reuse {c}": dataclasses.replace(cfg, reuse_steps=a.steps_back, reuse_cos=c) for c in a.cos})
    fewer = None  # (kind, its SparseAttention) with --indexers
    if a.indexers:
        asked = SparseConfig(min_context=cfg.min_context, indexers=a.indexers, reuse_steps=a.steps_back,
                             reuse_cos=a.cos[0])
        sp_few = SparseAttention(with_chosen_layers(tm, tok, asked, print).for_context(a.depth), sp.basis, pool,
                                 tm.config.n_head)
        for li in sp_few.index.full_layers:
            sp_few.index.idx[sp_few.index.slot_of[li]] = sp.index.idx[sp.index.slot_of[li]]
            sp_few.index.isc[sp_few.index.slot_of[li]] = sp.index.isc[sp.index.slot_of[li]]
        fewer = (f"reuse {a.cos[0]}, {a.indexers} indexers", sp_few)
        kinds[fewer[0]] = sp_few.config
    wait_loaded()
    tm.sparse = sp
    ex = DecodeExecutor(tm, default_domains(a.threads))
    executors = {k: ex for k in kinds}
    if fewer:
        tm.sparse = fewer[1]
        executors[fewer[0]] = DecodeExecutor(tm, default_domains(a.threads), workers=ex.workers)
    blocks = {k: [] for k in kinds}  # per kind: mean step seconds of each block
    counts = {k: np.zeros(2, np.int64) for k in kinds}  # per kind: selections scored, reused
    start = a.depth - a.span
    for _ in range(a.passes):
        seq.truncate(start)
        for b in range(a.span // a.block):
            kind = list(kinds)[b % len(kinds)]
            run_ex = executors[kind]
            tm.sparse = run_ex.sparse
            if run_ex is ex:
                sp.config = kinds[kind]
                sp.conf[:] = sp.config.kernel_conf(pool.block_size)
            c0 = run_ex.sparse_counts[..., [COUNT_SELECTIONS, COUNT_REUSED]].sum(axis=(0, 1))
            t = time.perf_counter()
            for _ in range(a.block):
                run_ex.step([seq], [toks[seq.n_tokens]])
            blocks[kind].append((time.perf_counter() - t) / a.block)
            counts[kind] += run_ex.sparse_counts[..., [COUNT_SELECTIONS, COUNT_REUSED]].sum(axis=(0, 1)) - c0
    for e in set(executors.values()) - {ex}:
        e.close()
    ex.close()
    med = {k: statistics.median(v[1:]) * 1e3 for k, v in blocks.items()}
    out = {"model": a.model, "depth": a.depth, "span": a.span, "threads": a.threads, "steps_back": a.steps_back,
           "tpot_ms": med, "blocks_ms": {k: [x * 1e3 for x in v] for k, v in blocks.items()},
           "scored_reused": {k: v.tolist() for k, v in counts.items()}}
    for k in kinds:
        scored, reused = counts[k]
        print(f"{a.model} d{start}..{a.depth} {k:>10}: {med[k]:.2f} ms  {med[k] / med['dense']:.3f}x of dense  "
              f"{med[k] / med['sparse']:.3f}x of sparse  selections scored {scored}, reused {reused}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--depth", type=sb._count(1024), default=8000)
    ap.add_argument("--pool-ctx", type=sb._count(0), default=0, help="pool size in tokens (that of the --state)")
    ap.add_argument("--state", help="npz of the filled context (sparse_bench.py tpot's): resumed, or saved")
    ap.add_argument("--span", type=sb._count(1), default=240, help="positions before the depth each pass decodes")
    ap.add_argument("--block", type=sb._count(1), default=10, help="consecutive steps of one kind")
    ap.add_argument("--passes", type=sb._count(1), default=3)
    ap.add_argument("--steps-back", type=sb._count(1), default=4, help="reuse_steps of the reuse kinds")
    ap.add_argument("--cos", type=float, nargs="+", default=[0.9, 0.8], help="reuse_cos of each reuse kind")
    ap.add_argument("--indexers", type=sb._count(1), default=None,
                    help="also reuse at the first --cos with this many sparse layers owning an indexer")
    ap.add_argument("--threads", type=sb._count(1), default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.span >= a.depth:
        raise SystemExit("--span must be less than --depth")
    jit.set_threads(a.threads)
    out = run(a)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
