"""Sparse decode attention on real text (CPython's stdlib sources, read from the other end
than the calibration reads them): selection quality per layer, and decode TPOT.

    python perf/sparse_bench.py quality -m smollm2-135m --depth 8000 [--probes 16]
    python perf/sparse_bench.py tpot -m smollm2-135m --depth 8000 [-n 24] [--top-k 1024]

quality: the context is filled densely (index keys written), then ``--probes`` rows at the
end run as one chunk and their query rows are kept.  For each probe row and layer, dense
attention probabilities p[h, t] come from the cached keys, and each scorer variant (phi,
block score, top-k, rank, layer policy) picks its blocks through the real kernel
(SparseAttention.select).  Reported, mean over rows (and heads for the mass):
  mass     sum of p over the attended tokens (sinks + chosen + window), head mean
  recall   the fraction of the |attended| tokens of largest head-mean p that were attended
  oracle   the mass of the best blocks (true block mass) and the best single tokens of the
           same count: what a perfect block scorer, and a token-granular one, would reach.

tpot: the context is filled once (dense attention, index keys written); then decode steps
alternate dense and sparse on the same sequence (both on the batched forward pass, one
token each) and the medians are compared.  2 threads by default.
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
from llcinfer.engine.sparse_setup import model_basis  # noqa: E402
from llcinfer.engine.transformer import Transformer  # noqa: E402
from llcinfer.kv import PagedSequence  # noqa: E402
from llcinfer.model import catalog  # noqa: E402
from llcinfer.model.gguf_file import GGUFFile  # noqa: E402
from llcinfer.model.tokenizer import Tokenizer  # noqa: E402
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
    v.phi, v.agg = {"relu": 0, "exp": 1}[v.config.phi], {"max": 0, "sum": 1}[v.config.agg]
    v.k_blocks = -(-v.config.top_k // sp.pool.block_size)
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
    bs = pool.block_size
    variants = [(r, phi, agg, k) for r in a.ranks for phi in ("exp", "relu") for agg in ("max", "sum")
                for k in a.top_k]
    views = {v: retuned(base[v[0]], phi=v[1], agg=v[2], top_k=v[3]) for v in variants}
    res = {v: np.zeros((c.n_layer, 4)) for v in variants}  # [layer, (mass, recall, block oracle, token oracle)]
    shared = {v: np.zeros(c.n_layer) for v in variants}  # mass with the previous layer's selection
    for li in range(c.n_layer):
        q, p0 = rec.q[li]
        keys = seq.keys(li)  # [n, KVH, D]
        G = c.n_head // c.n_kv_head
        for m in range(a.probes):
            n = p0 + m + 1
            kh = keys[:n][:, np.arange(c.n_head) // G]  # [n, H, D]
            s = np.einsum("hd,thd->ht", q[m], kh) * tm.scale
            p = np.exp(s - s.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)  # [H, n]
            pm = p.mean(0)  # [n] head-mean mass per token
            slot_of = {int(b): i for i, b in enumerate(seq.table[:seq.n_blocks])}
            for v, sp in views.items():
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
                res[v][li] += np.array([mass, recall, boracle, toracle]) / a.probes
                if li > 0:
                    prev = views[v].select(seq, li - 1, rec.q[li - 1][0][m], n, tm.scale)
                    ppos = np.concatenate([np.arange(slot_of[int(b)] * bs, min(n, slot_of[int(b)] * bs + bs))
                                           for b in prev])
                    shared[v][li] += pm[ppos].sum() / a.probes
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


def tpot(a) -> dict:
    tm, tok = load(a.model)
    c = tm.config
    toks = eval_tokens(tok, a.depth + a.n)
    pool, prefix = tm.new_pool(a.depth + a.n + 16, kv_type="f16")
    cfg = SparseConfig(top_k=a.top_k, rank=a.rank, window=a.window, dense_layers=a.dense_layers,
                       full_every=a.full_every, min_context=min(4096, a.depth))
    sp = SparseAttention(cfg, model_basis(tm, tok, a.rank), pool, c.n_head)
    dense_view = retuned(sp, min_context=NEVER)
    seq = PagedSequence(pool, a.depth + a.n + 16, prefix)
    tm.sparse = dense_view
    t0 = time.perf_counter()
    fill(tm, seq, toks[:a.depth])
    t_fill = time.perf_counter() - t0
    times = {"dense": [], "sparse": []}
    for i in range(a.n):
        kind = ("dense", "sparse")[i % 2]
        tm.sparse = dense_view if kind == "dense" else sp
        t = time.perf_counter()
        tm.forward_chunks([(seq, [toks[a.depth + i]])])
        times[kind].append(time.perf_counter() - t)
    tm.sparse = None
    med = {k: statistics.median(v[1:]) * 1e3 for k, v in times.items()}  # first of each: warm-up
    frac = sp.stats.keys_attended / max(1, sp.stats.keys_total)
    st = sp.kv_stats()
    print(f"{a.model} d{a.depth} threads {a.threads}: fill {t_fill:.1f} s; TPOT dense {med['dense']:.2f} ms, "
          f"sparse {med['sparse']:.2f} ms ({med['sparse'] / med['dense']:.2f}x); keys attended {frac:.3f}; "
          f"index {st['index_bytes_per_token']} B/token vs KV {st['kv_bytes_per_token']} B/token")
    return {"model": a.model, "depth": a.depth, "threads": a.threads, "config": dataclasses.asdict(cfg),
            "tpot_ms": med, "keys_fraction": frac, "fill_s": t_fill, **st}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("quality", "tpot"):
        p = sub.add_parser(name)
        p.add_argument("-m", "--model", required=True)
        p.add_argument("--depth", type=int, default=8000)
        p.add_argument("--threads", type=int, default=2)
        p.add_argument("--json")
    q = sub.choices["quality"]
    q.add_argument("--probes", type=int, default=16)
    q.add_argument("--ranks", type=int, nargs="+", default=[16])
    q.add_argument("--top-k", type=int, nargs="+", default=[512, 1024, 2048])
    t = sub.choices["tpot"]
    t.add_argument("-n", type=int, default=24, help="decode steps (half dense, half sparse)")
    t.add_argument("--top-k", type=int, default=1024)
    t.add_argument("--rank", type=int, default=16)
    t.add_argument("--window", type=int, default=256)
    t.add_argument("--dense-layers", type=int, default=2)
    t.add_argument("--full-every", type=int, default=1)
    a = ap.parse_args()
    jit.set_threads(a.threads)
    out = quality(a) if a.cmd == "quality" else tpot(a)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
