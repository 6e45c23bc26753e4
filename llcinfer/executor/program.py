"""Build the static per-worker operator lists of a decode step (plan before compute).

Given the model's shapes, the rows of the step (M), the workers of each domain, the
micro-batches and the attention splits, ``build_program`` returns the operator table and
each worker's order; the counters are numbered here, once per (M, splits) shape.

Worker order (a software pipeline over micro-batches u, layers l):
    weight domain:     QKV(0,u) for every u;  then per l, per u:  WO GATE_UP DOWN (l,u), QKV(l+1,u)
                       and LM_HEAD(u) at the end
    attention domain:  ROPE [SELECT TOPK] ATTN [MERGE] (l,u)  in layer order

With one shared domain every worker runs both lists merged in dependency order, so a
worker that finds no projection tile left moves on to the heads that are ready.

Sparse attention (Shapes.sparse, the layer kinds of sparse/attention.py): a "full" layer's
ROPE also writes the rows' index keys; its SELECT scores each row's candidate blocks
in P parts (a tile per row and part, P the attention domain's workers, after every
head's ROPE), its TOPK (a tile per row, after the row's P parts) writes the row's
gathered block table, and its ATTN tiles wait for their row's TOPK.  The ATTN of a
"full" or "shared" layer reads the rows' gathered tables (F_SEL), a shared layer the
last full layer's, which no TOPK overwrites before this ATTN is done (the next full
layer's QKV waits for this layer's DOWN).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model.architectures.base import ModelConfig
from .tiles import (ATTN, DOWN, F_CLAIM, F_DONE, F_KIND, F_KMASK, F_LANES, F_LAYER, F_MAT0, F_MAT1, F_MAT2, F_NPART,
                    F_NTILES, F_PBASE, F_TARGET, F_TILE, F_TTARGET, F_TWAIT, F_WAIT, GATE_UP, LM_HEAD, MERGE, N_FIELDS,
                    QKV, ROPE, SELECT, TOPK, WO)

EXTRA_FIELDS = 3  # F_M0, F_M1: the micro-batch's rows [m0, m1); F_SEL (ATTN): which block table
F_M0, F_M1, F_SEL = N_FIELDS, N_FIELDS + 1, N_FIELDS + 2
SEL_OWN, SEL_WAIT, SEL_SHARED = 0, 1, 2  # F_SEL: the row's own table; its selection (wait for it); the last one


@dataclass(frozen=True)
class Shapes:
    """What the program needs to know of the model: its config, the vector lanes, the ids
    of the packed matrices and the activation kinds their inputs are quantized to."""

    config: ModelConfig
    lanes: int
    mat_ids: tuple  # per layer (wq, wk, wv, wo, w_gate, w_up, w_down), then (lm_head,) at the end
    kmask: tuple  # per layer (qkv, wo, gate_up, down) activation-kind masks, then lm_head's
    head_rows: int  # logits the LM head computes: the first head_rows token ids
    sparse: tuple = ()  # per layer "dense" | "full" | "shared" (sparse attention), or () for none


@dataclass
class Program:
    ops: np.ndarray  # [n_ops, N_FIELDS + EXTRA_FIELDS] int64
    order: np.ndarray  # [workers, max_ops] int64, -1 padded
    n_counters: int
    n_splits: int
    micro_batches: list  # [(m0, m1)]
    waits_per_step: int  # dependency hand-offs (operator and tile waits) per step


@dataclass(frozen=True)
class Tiles:
    """Rows per tile for the weight operators (multiples of the lanes)."""

    wo: int = 64
    gate_up: int = 64
    down: int = 64
    lm_head: int = 2048


def _round_tile(rows: int, lanes: int) -> int:
    return max(lanes, (rows // lanes) * lanes)


def build_program(s: Shapes, M: int, weight_workers: list[int], attn_workers: list[int], n_splits: int = 1,
                  micro_batches: int = 1, tiles: Tiles = Tiles()) -> Program:
    """The operator table and orders; ``attn_workers`` empty means one shared domain."""
    c = s.config
    if c.head_dim % s.lanes:
        raise ValueError(f"head_dim {c.head_dim} is not a multiple of {s.lanes} lanes")
    L, KVH = c.n_layer, c.n_kv_head
    G = c.n_head // KVH
    U = max(1, min(micro_batches, M))
    bounds = [(u * M // U, (u + 1) * M // U) for u in range(U)]
    n_counters = [1]  # counter 0: abort

    def counters(n: int) -> int:
        first = n_counters[0]
        n_counters[0] += n
        return first

    rows: list[list[int]] = []

    # the workers that run an operator: (first worker id, count)
    for ws in (weight_workers, attn_workers):
        if ws and sorted(ws) != list(range(min(ws), min(ws) + len(ws))):
            raise ValueError(f"a domain's worker ids must be consecutive, got {sorted(ws)}")
    weight_part = (min(weight_workers), len(weight_workers))
    attn_part = (min(attn_workers), len(attn_workers)) if attn_workers else weight_part

    def op(kind, layer, n_tiles, tile, wait=-1, target=0, done=-1, twait=-1, ttarget=0, mats=(-1, -1, -1), kmask=0,
           mb=(0, 0), sel=0) -> int:
        r = [0] * (N_FIELDS + EXTRA_FIELDS)
        base, n_part = attn_part if kind in (ROPE, SELECT, TOPK, ATTN, MERGE) else weight_part
        r[F_KIND], r[F_LAYER], r[F_NTILES], r[F_TILE] = kind, layer, n_tiles, tile
        # a claim counter per region of the tiles (step_kernel.next_tile)
        r[F_WAIT], r[F_TARGET], r[F_CLAIM], r[F_DONE] = wait, target, counters(n_part), done
        r[F_PBASE], r[F_NPART] = base, n_part
        r[F_TWAIT], r[F_TTARGET] = twait, ttarget
        r[F_MAT0], r[F_MAT1], r[F_MAT2] = mats
        r[F_KMASK], r[F_LANES] = kmask, s.lanes
        r[F_M0], r[F_M1], r[F_SEL] = mb[0], mb[1], sel
        rows.append(r)
        return len(rows) - 1

    t_wo, t_gu = _round_tile(tiles.wo, s.lanes), _round_tile(tiles.gate_up, s.lanes)
    t_dn, t_lm = _round_tile(tiles.down, s.lanes), _round_tile(tiles.lm_head, s.lanes)
    n_wo, n_gu = -(-c.d_model // t_wo), -(-c.d_ff // t_gu)
    n_dn, n_lm = -(-c.d_model // t_dn), -(-s.head_rows // t_lm)
    waits = 0
    qkv_ops, attn_ops, tail_ops, lm_ops = {}, {}, {}, {}
    down_done = {}
    for u, (m0, m1) in enumerate(bounds):
        Mu = m1 - m0
        for layer in range(L):
            wq, wk, wv, wo, wg, wu, wd = s.mat_ids[layer]
            km_qkv, km_wo, km_gu, km_dn = s.kmask[layer]
            head_ready, rope_done = counters(KVH), counters(KVH)
            parts_done, attn_done = counters(1), counters(1)
            wo_done, gu_done, dn_done = counters(1), counters(1), counters(1)
            prev = down_done.get((layer - 1, u), (-1, 0))
            qkv_ops[layer, u] = [op(QKV, layer, KVH * (G + 2), s.lanes, prev[0], prev[1], head_ready,
                                    mats=(wq, wk, wv), kmask=km_qkv, mb=(m0, m1))]
            kind = s.sparse[layer] if s.sparse else "dense"
            a = [op(ROPE, layer, KVH, 1, done=rope_done, twait=head_ready, ttarget=G + 2, mb=(m0, m1))]
            attn_wait, sel = rope_done, {"dense": SEL_OWN, "shared": SEL_SHARED}.get(kind, SEL_WAIT)
            if kind == "full":  # score parts after every head's ROPE, a row's top-k after its parts
                P, parts_ready, attn_wait = attn_part[1], counters(Mu), counters(Mu)
                a.append(op(SELECT, layer, Mu * P, P, done=parts_ready, twait=rope_done, ttarget=1, mb=(m0, m1)))
                a.append(op(TOPK, layer, Mu, 1, done=attn_wait, twait=parts_ready, ttarget=P, mb=(m0, m1)))
                waits += Mu * P * KVH + Mu
            a.append(op(ATTN, layer, Mu * KVH * n_splits, n_splits, done=attn_done if n_splits == 1 else parts_done,
                        twait=attn_wait, ttarget=1, mb=(m0, m1), sel=sel))
            if n_splits > 1:
                a.append(op(MERGE, layer, Mu * KVH, n_splits, parts_done, Mu * KVH * n_splits, attn_done, mb=(m0, m1)))
            attn_ops[layer, u] = a
            tail_ops[layer, u] = [
                op(WO, layer, n_wo, t_wo, attn_done, Mu * KVH, wo_done, mats=(wo, -1, -1), kmask=km_wo, mb=(m0, m1)),
                op(GATE_UP, layer, n_gu, t_gu, wo_done, n_wo, gu_done, mats=(wg, wu, -1), kmask=km_gu, mb=(m0, m1)),
                op(DOWN, layer, n_dn, t_dn, gu_done, n_gu, dn_done, mats=(wd, -1, -1), kmask=km_dn, mb=(m0, m1)),
            ]
            down_done[layer, u] = (dn_done, n_dn)
            waits += 1 + 2 * KVH + Mu * KVH * n_splits + (1 if n_splits > 1 else 0) + 3
        lm_ops[u] = [op(LM_HEAD, L, n_lm, t_lm, down_done[L - 1, u][0], n_dn, counters(1),
                        mats=(s.mat_ids[L][0], -1, -1), kmask=s.kmask[L], mb=(m0, m1))]
        waits += 1
    # weight-domain order: the pipeline of the module docstring
    w_order = [o for u in range(U) for o in qkv_ops[0, u]]
    for layer in range(L):
        for u in range(U):
            w_order += tail_ops[layer, u]
            if layer + 1 < L:
                w_order += qkv_ops[layer + 1, u]
    for u in range(U):
        w_order += lm_ops[u]
    a_order = [o for layer in range(L) for u in range(U) for o in attn_ops[layer, u]]
    if attn_workers:
        orders = {w: w_order for w in weight_workers} | {w: a_order for w in attn_workers}
    else:  # shared: attention right after the projections it needs
        shared = []
        for o in w_order:
            shared.append(o)
            if rows[o][F_KIND] == QKV:
                shared += attn_ops[rows[o][F_LAYER], next(u for u, b in enumerate(bounds) if b[0] == rows[o][F_M0])]
        orders = {w: shared for w in weight_workers}
    n_workers = len(orders)
    if sorted(orders) != list(range(n_workers)):
        raise ValueError(f"worker ids must be 0..{n_workers - 1}, got {sorted(orders)}")
    width = max(len(v) for v in orders.values()) + 1
    order = np.full((n_workers, width), -1, np.int64)
    for w, lst in orders.items():
        order[w, :len(lst)] = lst
    return Program(np.asarray(rows, np.int64), order, n_counters[0], n_splits, bounds, waits)
