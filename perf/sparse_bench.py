"""Sparse decode attention on real text (CPython's stdlib sources, read from the other end
than the calibration reads them): selection quality per layer, and decode TPOT.

    python perf/sparse_bench.py quality -m smollm2-135m --depth 8000 [--probes 16]
    python perf/sparse_bench.py tpot -m smollm2-135m --depth 8000 [-n 24] [--top-k 1024] [--top-k-per 16]
    python perf/sparse_bench.py tpot -m qwen2.5-coder-0.5b --depth 32768 --pool-ctx 32832 \
        --state /tmp/qwen.npz --fill-budget 480        (repeat until filled)
    python perf/sparse_bench.py tpot -m smollm2-135m --depth 8000 -n 120 --reuse-steps 4
    python perf/sparse_bench.py ppl -m smollm2-135m -c 8192 --variant dense reuse_steps=0 reuse_steps=4
    python perf/sparse_bench.py ppl -m smollm2-135m -c 8192 --chunks 4 --dense-layers 2 --variant min_context=2560

quality: the context is filled densely (index keys written), then ``--probes`` rows at the
end run as one chunk and their query rows are kept.  For each probe row and layer, dense
attention probabilities p[h, t] come from the cached keys, and each scorer variant (phi,
block score, top-k, rank, layer policy) picks its blocks through the real kernel
(SparseAttention.select).  Reported, mean over rows (and heads for the mass):
  mass     sum of p over the attended tokens (sinks + chosen + window), head mean
  recall   the fraction of the |attended| tokens of largest head-mean p that were attended
  oracle   the mass of the best blocks (true block mass) and the best single tokens of the
           same count: what a perfect block scorer, and a token-granular one, would reach.

tpot: the context is filled once (dense attention, index keys written), over several runs
if --fill-budget stops it (--state keeps the pool); then decode steps alternate dense and
sparse on the same sequence (A B A B, --block tokens each, on the decode executor as LLM
runs them: a dense executor and a sparse one sharing the workers; with --reuse-steps a
third, reusing selections across steps, in blocks of at least 2 (R + 1) steps so that its
scoring steps count at their share) and the medians of the blocks' mean step times are
compared (the dense steps write no index keys: their tokens stay in the window), and
printed beside the planner's prediction for that depth (planner/sparse_policy.py: the
plan LLM runs at n_ctx = depth, this machine's calibration); then --probes rows report
the mass and recall of the selection at the run's top_k.  2 threads by default.

ppl: perplexity of the same LLM under several sparse configurations, set in place
(--dense-layers: fixed for the run, one LLM built with it).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llcinfer import jit  # noqa: E402
from llcinfer.engine.placement import plan_for_model  # noqa: E402
from llcinfer.engine.sparse_setup import model_basis, planned_sparse, with_chosen_layers  # noqa: E402
from llcinfer.engine.transformer import Transformer  # noqa: E402
from llcinfer.executor import DecodeExecutor, default_domains  # noqa: E402
from llcinfer.weights.repack_cache import wait_loaded  # noqa: E402
from llcinfer.errors import LLCInferError  # noqa: E402
from llcinfer.kv import PagedSequence  # noqa: E402
from llcinfer.model import catalog  # noqa: E402
from llcinfer.model.gguf_file import GGUFFile  # noqa: E402
from llcinfer.model.tokenizer import Tokenizer  # noqa: E402
from llcinfer.planner import Calibration, cache_key, detect_machine  # noqa: E402
from llcinfer.kernels.sparse_index import COUNT_REUSED, COUNT_SELECTIONS  # noqa: E402
from llcinfer.sparse import SparseAttention, SparseConfig, stdlib_text  # noqa: E402

NEVER = 1 << 40  # min_context that keeps every row dense


def load(name: str):
    g = GGUFFile(catalog.resolve_model(name, progress=False))
    return Transformer(g), Tokenizer.from_metadata(g.metadata)


def eval_tokens(tok: Tokenizer, n: int) -> list[int]:
    return tok.encode(stdlib_text(8 * n, reverse=True))[:n]


def retuned(sp: SparseAttention, **changes) -> SparseAttention:
    """A view of ``sp`` (same basis and index cache) with another config."""
    v = copy.copy(sp)
    v.config = dataclasses.replace(sp.config, **changes)
    v.conf = v.config.kernel_conf(sp.pool.block_size)
    return v


class Recorder:
    """model.sparse during the fill: writes the index keys of every SparseAttention given,
    attends densely, and keeps the query rows of the last chunk."""

    def __init__(self, sps):
        self.sps, self.q, self.recording = sps, {}, False

    def store_index(self, *a):
        for sp in self.sps:
            sp.store_index(*a)

    def attend(self, seq, layer, q, n_past, scale, out, selected):
        seq.attention(layer, q, n_past, scale, out)
        if self.recording:
            self.q[layer] = (q.copy(), n_past)


def fill(tm, seq, tokens, chunk=512):
    for i in range(0, len(tokens), chunk):
        tm.forward_chunks([(seq, tokens[i:i + chunk])])


def evaluate(tm, seq, rec, views: dict, probes: int):
    """Mass, recall and the oracles  # [layer, 4] of each view's selection for the last
    ``probes`` query rows ``rec`` kept, and the mass of the previous layer's selection
    # [layer] (module doc)."""
    c, bs = tm.config, seq.pool.block_size
    res = {v: np.zeros((c.n_layer, 4)) for v in views}  # [layer, (mass, recall, block oracle, token oracle)]
    shared = {v: np.zeros(c.n_layer) for v in views}  # mass with the previous layer's selection
    G = c.n_head // c.n_kv_head
    slot_of = {int(b): i for i, b in enumerate(seq.table[:seq.n_blocks])}
    for li in range(c.n_layer):
        q, p0 = rec.q[li]
        keys = seq.keys(li)  # [n, KVH, D]
        for m in range(probes):
            n = p0 + m + 1
            s = np.einsum("hgd,thd->hgt", q[m].reshape(c.n_kv_head, G, -1), keys[:n]).reshape(c.n_head, n) * tm.scale
            p = np.exp(s - s.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)  # [H, n]
            pm = p.mean(0)  # [n] head-mean mass per token
            for v, sp in views.items():
                if not sp.index.has_index(li):  # a dense (or shared) layer: nothing of its own to score
                    continue
                picked = np.array([slot_of[int(b)] for b in sp.select(seq, li, q[m], n, tm.scale)])
                pos = np.concatenate([np.arange(b * bs, min(n, b * bs + bs)) for b in picked])
                mass = pm[pos].sum()
                recall = np.isin(np.argpartition(-pm, len(pos) - 1)[:len(pos)], pos).mean()
                blk_mass = np.add.reduceat(pm, np.arange(0, n, bs))
                n_sink, n_win = sp.kept_blocks(n)
                cand = blk_mass[n_sink:len(blk_mass) - n_win]
                keep = blk_mass[:n_sink].sum() + blk_mass[len(blk_mass) - n_win:].sum()
                kk = len(picked) - n_sink - n_win
                boracle = keep + np.sort(cand)[::-1][:kk].sum()
                ctok = pm[n_sink * bs:(len(blk_mass) - n_win) * bs]
                toracle = keep + np.sort(ctok)[::-1][:kk * bs].sum()
                res[v][li] += np.array([mass, recall, boracle, toracle]) / probes
                if li > 0 and sp.index.has_index(li - 1):
                    prev = sp.select(seq, li - 1, rec.q[li - 1][0][m], n, tm.scale)
                    ppos = np.concatenate([np.arange(slot_of[int(b)] * bs, min(n, slot_of[int(b)] * bs + bs))
                                           for b in prev])
                    shared[v][li] += pm[ppos].sum() / probes
    return res, shared


def quality(a) -> dict:
    tm, tok = load(a.model)
    c = tm.config
    toks = eval_tokens(tok, a.depth)
    pool, prefix = tm.new_pool(a.depth + 64, kv_type="f16")
    seq = PagedSequence(pool, a.depth + 64, prefix)
    base = {r: SparseAttention(SparseConfig(rank=r, min_context=0, dense_layers=0), model_basis(tm, tok, r), pool,
                               c.n_head) for r in a.ranks}
    rec = Recorder(list(base.values()))
    tm.sparse = rec
    t0 = time.perf_counter()
    fill(tm, seq, toks[:-a.probes])
    rec.recording = True
    tm.forward_chunks([(seq, toks[-a.probes:])])
    tm.sparse = None
    print(f"filled {seq.n_tokens} tokens in {time.perf_counter() - t0:.1f} s")
    variants = [(r, phi, agg, k) for r in a.ranks for phi in ("exp", "relu") for agg in ("max", "sum")
                for k in a.top_k]
    views = {v: retuned(base[v[0]], phi=v[1], agg=v[2], top_k=v[3]) for v in variants}
    res, shared = evaluate(tm, seq, rec, views, a.probes)
    out = {"model": a.model, "depth": seq.n_tokens, "probes": a.probes, "variants": []}
    print(f"{'rank':>4} {'phi':>4} {'agg':>3} {'top_k':>5} | mass  recall | oracle blk tok | shared-prev mass"
          f"   (layers {2}..{c.n_layer - 1})")
    for v in variants:
        r = res[v][2:].mean(0)
        sh = shared[v][3:].mean()
        print(f"{v[0]:>4} {v[1]:>4} {v[2]:>3} {v[3]:>5} | {r[0]:.3f} {r[1]:.3f}  | {r[2]:.3f} {r[3]:.3f}      | {sh:.3f}")
        out["variants"].append({"rank": v[0], "phi": v[1], "agg": v[2], "top_k": v[3],
                                "per_layer": res[v].tolist(), "shared_prev_mass": shared[v].tolist()})
    best = max(variants, key=lambda v: res[v][2:, 0].mean())
    print(f"per layer, {best}: mass / recall")
    print("  " + " ".join(f"{li}:{res[best][li, 0]:.2f}/{res[best][li, 1]:.2f}" for li in range(c.n_layer)))
    return out


def save_state(path: Path, pool, seq, sp, tokens) -> None:
    """The whole pool buffer, the index cache and the filled tokens (a fill over several runs)."""
    np.savez(path, pool=np.frombuffer(pool._map, np.uint8), idx=sp.index.idx, isc=sp.index.isc,
             table=seq.table[:seq.n_blocks], tokens=np.asarray(tokens, np.int64),
             full=np.asarray(sp.index.full_layers, np.int64))


def load_state(path: Path, pool, seq, sp, tokens) -> int:
    """Restore save_state into a fresh pool of the same size; returns the tokens restored
    (the common prefix of the saved tokens and ``tokens``)."""
    st = np.load(path)
    n = int(np.argmin(np.append(st["tokens"] == np.asarray(tokens[:len(st["tokens"])]), False)))
    seq.n_tokens = len(st["tokens"])
    if st["pool"].size != pool.reserved_bytes or not np.array_equal(seq.table[:seq.n_blocks], st["table"]):
        raise SystemExit(f"{path}: saved for another pool (use the same --pool-ctx)")
    saved_full = st["full"].tolist() if "full" in st else None
    if saved_full is None and st["idx"].shape != sp.index.idx.shape:
        raise SystemExit(f"{path}: saved for another layer policy (--dense-layers, --full-every, --rank)")
    slots = list(range(len(sp.index.full_layers))) if saved_full is None else [
        saved_full.index(li) if li in saved_full else -1 for li in sp.index.full_layers]
    if -1 in slots or st["idx"].shape[1:] != sp.index.idx.shape[1:]:
        raise SystemExit(f"{path}: its index keys do not cover this run's full layers (saved: {saved_full})")
    np.frombuffer(pool._map, np.uint8)[:] = st["pool"]
    sp.index.idx[...] = st["idx"][slots]
    sp.index.isc[...] = st["isc"][slots]
    seq.tokens[:] = [int(t) for t in st["tokens"]]
    seq.truncate(n)
    return n


def tpot(a) -> dict:
    """Fill (resumable: --state, --fill-budget), then A B A B decode steps dense / sparse,
    then --probes query rows for the mass and recall of the configuration's selection."""
    tm, tok = load(a.model)
    c = tm.config
    toks = eval_tokens(tok, a.depth + a.n + a.probes)
    n_ctx = max(a.pool_ctx, a.depth + a.n + a.probes + 16)
    pool, prefix = tm.new_pool(n_ctx, kv_type="f16", prefix_sharing=False)
    asked = SparseConfig(top_k=a.top_k, top_k_per=a.top_k_per, rank=a.rank, window=a.window,
                         dense_layers=a.dense_layers, full_every=a.full_every, min_context=min(4096, a.depth),
                         **({"indexers": a.indexers} if a.indexers else {}))
    cfg = with_chosen_layers(tm, tok, asked, print).for_context(a.depth)  # top-k as LLM(n_ctx=depth) plans it
    sp = SparseAttention(cfg, model_basis(tm, tok, a.rank), pool, c.n_head)
    dense_view = retuned(sp, min_context=NEVER)
    seq = PagedSequence(pool, n_ctx, prefix)
    state = Path(a.state) if a.state else None
    start = load_state(state, pool, seq, sp, toks) if state and state.exists() else 0
    tm.sparse = dense_view
    t0 = time.perf_counter()
    while seq.n_tokens < a.depth and time.perf_counter() - t0 < a.fill_budget:
        tm.forward_chunks([(seq, toks[seq.n_tokens:min(a.depth, seq.n_tokens + 512)])])
    t_fill = time.perf_counter() - t0
    print(f"filled {start} .. {seq.n_tokens} of {a.depth} in {t_fill:.1f} s "
          f"({(seq.n_tokens - start) / max(t_fill, 1e-9):.0f} tokens/s)", flush=True)
    if state and t_fill > 1:
        save_state(state, pool, seq, sp, toks[:seq.n_tokens])
    if seq.n_tokens < a.depth:
        raise SystemExit(f"fill not done: run again with --state {state}" if state else "fill not done")
    views = {"dense": None, "sparse": sp}
    if a.reuse_steps:  # a third kind: the same selection rule, reusing across steps
        views["reuse"] = retuned(sp, reuse_steps=a.reuse_steps, reuse_cos=a.reuse_cos)
    block = max(a.block, 2 * (a.reuse_steps + 1)) if a.reuse_steps else a.block  # consecutive steps of a kind
    blocks = {k: [] for k in views}  # per kind: mean step time of each block
    tm.sparse = None
    wait_loaded()  # the steady state: weights on 2 MiB pages
    ex = {"dense": DecodeExecutor(tm, default_domains(a.threads))}
    for k in views:
        if k != "dense":
            tm.sparse = views[k]
            ex[k] = DecodeExecutor(tm, default_domains(a.threads), workers=ex["dense"].workers)
    fill_stats = sp.totals()
    kinds = list(views)
    for b in range(a.n // block):
        kind = kinds[b % len(kinds)]
        tm.sparse = views[kind]
        t = time.perf_counter()
        for i in range(b * block, (b + 1) * block):
            ex[kind].step([seq], [toks[a.depth + i]])
        blocks[kind].append((time.perf_counter() - t) / block)
    reused = int(ex["reuse"].sparse_counts[..., COUNT_REUSED].sum()) if "reuse" in ex else 0
    scored_reuse = int(ex["reuse"].sparse_counts[..., COUNT_SELECTIONS].sum()) if "reuse" in ex else 0
    for e in ex.values():
        e.close()
    tm.sparse = sp
    med = {k: statistics.median(v[1:]) * 1e3 for k, v in blocks.items()}  # first block of each: warm-up
    if "reuse" in med:
        print(f"reuse (up to {a.reuse_steps} steps back, cosine >= {a.reuse_cos}): {med['reuse']:.2f} ms "
              f"({med['reuse'] / med['sparse']:.3f}x of sparse); {reused} of {reused + scored_reuse} full-layer "
              f"selections reused", flush=True)
    run = sp.totals()
    frac = (run.keys_attended - fill_stats.keys_attended) / max(1, run.keys_total - fill_stats.keys_total)
    st = sp.kv_stats()
    print(f"{a.model} d{a.depth} threads {a.threads}: TPOT dense {med['dense']:.2f} ms, "
          f"sparse {med['sparse']:.2f} ms ({med['sparse'] / med['dense']:.2f}x); keys attended {frac:.3f}; "
          f"index {st['index_bytes_per_token']} B/token vs KV {st['kv_bytes_per_token']} B/token", flush=True)
    out = {"model": a.model, "depth": a.depth, "threads": a.threads, "config": dataclasses.asdict(cfg),
           "block": block, "reuse": {"steps": a.reuse_steps, "cos": a.reuse_cos, "reused": reused,
                                     "scored": scored_reuse},
           "tpot_ms": med, "tpot_ms_all": blocks, "keys_fraction": frac, "fill_s_this_run": t_fill, **st,
           "predicted": predicted(tm, a, cfg)}
    pr = out["predicted"]
    print(f"planner ({pr['plan']}, selection costs {pr['rates']}): dense {pr['dense_ms']:.2f} ms, sparse "
          f"{pr['sparse_ms']:.2f} ms ({pr['sparse_ms'] / pr['dense_ms']:.2f}x); pays from {pr['min_context']} keys",
          flush=True)
    if a.probes:
        rec = Recorder([sp])
        tm.sparse, rec.recording = rec, True
        tm.forward_chunks([(seq, toks[a.depth + a.n:a.depth + a.n + a.probes])])
        tm.sparse = None
        res, shared = evaluate(tm, seq, rec, {"cfg": sp}, a.probes)
        r = res["cfg"][a.dense_layers:].mean(0)
        out["quality"] = {"probes": a.probes, "mass": r[0], "recall": r[1], "block_oracle_mass": r[2],
                          "token_oracle_mass": r[3], "per_layer": res["cfg"].tolist(),
                          "shared_prev_mass": shared["cfg"].tolist()}
        print(f"sparse layers, {a.probes} probes at top_k {a.top_k}: mass {r[0]:.3f}, recall {r[1]:.3f} "
              f"(block oracle {r[2]:.3f}, token oracle {r[3]:.3f})")
    tm.sparse = None
    return out


def ppl(a) -> dict:
    """Perplexity of ``--chunks`` chunks of ``-c`` tokens (llama-perplexity's method,
    bench/perplexity.py) under each ``--variant`` of the sparse configuration, on one
    ``LLM(sparse=True)`` (so min_context is its planner's) and the same text; a variant
    is "dense" or SparseConfig fields "name=value,..." set in place between runs, the
    prefix cache emptied (else a chunk's unscored half would come from the last run's KV).
    ``--dense-layers`` is fixed when the LLM is built (its layers' kinds and index cache)."""
    from unittest import mock

    from llcinfer.api import LLM
    from llcinfer.bench.perplexity import perplexity

    fields = {f.name for f in dataclasses.fields(SparseConfig)}
    parsed = [(v, [] if v == "dense" else [kv.split("=", 1) for kv in v.split(",")]) for v in a.variant]
    for variant, pairs in parsed:
        if any(len(kv) != 2 or kv[0] not in fields for kv in pairs):
            raise SystemExit(f"--variant {variant!r}: expected 'dense' or name=value,... of {sorted(fields)}")
    given = SparseConfig.from_options

    def with_dense_layers(*args, **kwargs):  # LLM's configuration with --dense-layers
        return dataclasses.replace(given(*args, **kwargs), dense_layers=a.dense_layers)

    with mock.patch.object(SparseConfig, "from_options", with_dense_layers):
        llm = LLM(a.model, threads=a.threads, n_ctx=a.ctx, n_seq=2, progress=False, sparse=True)
    tokens = llm.tokenize(stdlib_text(560000, reverse=True))  # the text of `llcinfer perplexity -f stdlib.txt`
    sp = llm.model.sparse
    base, bs, out = sp.config, sp.pool.block_size, {"model": a.model, "ctx": a.ctx, "chunks": a.chunks, "runs": []}
    print(f"{a.model} -c {a.ctx}, {a.chunks} chunks, {base.dense_layers} dense layers, rows sparse from "
          f"{base.min_context} keys", flush=True)
    for variant, pairs in parsed:
        try:
            changes = {"min_context": NEVER} if variant == "dense" else {k: type(getattr(base, k))(v) for k, v in pairs}
        except ValueError as e:
            raise SystemExit(f"--variant {variant!r}: {e}") from None
        sp.config = dataclasses.replace(base, **changes)
        sp.conf[:] = sp.config.kernel_conf(bs)  # in place: the arrays the kernels were given
        llm.engine.pool.drop_cached()  # no prefix of the chunk from the last variant's KV
        before = sp.totals()
        t0 = time.perf_counter()
        res = perplexity(llm, tokens, a.ctx, a.chunks)
        dt, after = time.perf_counter() - t0, sp.totals()
        (p, err), sel, reused = res.ppl, after.selections - before.selections, after.reused - before.reused
        print(f"{variant:>32}: PPL {p:.4f} +/- {err:.4f}  {dt:.1f} s  scorer runs {sel}, reused {reused}", flush=True)
        out["runs"].append({"variant": variant, "ppl": p, "err": err, "s": dt, "selections": sel, "reused": reused})
    llm.close()
    return out


def predicted(tm, a, cfg: SparseConfig) -> dict:
    """The planner's dense and sparse TPOT at this depth (the plan LLM would run for one
    sequence at n_ctx = depth, this machine's calibration) and its break-even context."""
    machine = detect_machine(probe=False)
    plan, _ = plan_for_model(tm, a.depth, 1, a.threads, machine, Calibration.load(cache_key(machine)))
    _, policy = planned_sparse(tm, plan, a.depth, 1, cfg, True, print)
    return {"plan": plan.label, "rates": policy.rates, "dense_ms": policy.dense_s * 1e3,
            "sparse_ms": policy.sparse_s * 1e3,
            "min_context": policy.min_context}


def _count(least: int):
    """An argparse type: an integer of at least ``least``."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = None
        if n is None or n < least:
            raise argparse.ArgumentTypeError(f"expected an integer >= {least} (got {text!r})")
        return n
    return parse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("quality", "tpot"):
        p = sub.add_parser(name)
        p.add_argument("-m", "--model", required=True)
        p.add_argument("--depth", type=_count(1), default=8000)
        p.add_argument("--threads", type=_count(1), default=2)
        p.add_argument("--json")
    q = sub.choices["quality"]
    q.add_argument("--probes", type=_count(1), default=16)
    q.add_argument("--ranks", type=_count(1), nargs="+", default=[16])
    q.add_argument("--top-k", type=_count(1), nargs="+", default=[512, 1024, 2048])
    t = sub.choices["tpot"]
    t.add_argument("-n", type=_count(1), default=24, help="decode steps (in blocks: dense, sparse[, reuse])")
    t.add_argument("--block", type=_count(1), default=1, help="consecutive steps of one kind (A B A B blocks)")
    t.add_argument("--reuse-steps", type=_count(0), default=0, help="also time selection reuse up to N steps back")
    t.add_argument("--reuse-cos", type=float, default=0.9, help="its query cosine gate")
    t.add_argument("--top-k", type=_count(1), default=1024)
    t.add_argument("--top-k-per", type=_count(0), default=16, help="top-k raised to depth / N (0: fixed)")
    t.add_argument("--rank", type=_count(1), default=16)
    t.add_argument("--window", type=_count(1), default=256)
    t.add_argument("--dense-layers", type=_count(0), default=SparseConfig.dense_layers)
    t.add_argument("--full-every", type=_count(1), default=1)
    t.add_argument("--indexers", type=_count(1), default=None,
                   help="sparse layers that own an indexer, chosen on calibration (default: the library's)")
    t.add_argument("--probes", type=_count(0), default=8, help="query rows for mass / recall after the timing (0: none)")
    t.add_argument("--pool-ctx", type=_count(0), default=0, help="pool size in tokens (a --state reused across depths)")
    t.add_argument("--state", help="npz of the filled context: resumed, saved after each fill run")
    t.add_argument("--fill-budget", type=float, default=1e9, help="seconds of filling in this run")
    v = sub.add_parser("ppl")
    v.add_argument("-m", "--model", required=True)
    v.add_argument("-c", "--ctx", type=_count(4), default=8192)
    v.add_argument("--chunks", type=_count(1), default=1)
    v.add_argument("--dense-layers", type=_count(0), default=SparseConfig.dense_layers,
                   help="first layers that stay dense (fixed for the run's LLM)")
    v.add_argument("--threads", type=_count(1), default=2)
    v.add_argument("--variant", nargs="+", default=["dense", "reuse_steps=0", "reuse_steps=4,reuse_cos=0.9"])
    v.add_argument("--json")
    a = ap.parse_args()
    jit.set_threads(a.threads)
    out = {"quality": quality, "tpot": tpot, "ppl": ppl}[a.cmd](a)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    try:
        main()
    except LLCInferError as e:
        raise SystemExit(f"error: {e}") from None
