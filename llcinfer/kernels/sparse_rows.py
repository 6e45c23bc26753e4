"""Sparse attention of a run of consecutive query rows of one sequence (a prompt chunk, or
one decode row on the batched path): each row's block selection, then exact paged
attention of every row over its own gathered table, each a parallel region for the run.

    row m of the run sits at position n_past + m and has  n_m = n_past + m + 1  keys
    select  (full layers; sparse_index.py)
        scores_m            = score_part of row m over its candidate blocks, in P parts
        table_m, keys_m     = gather_selection(scores_m): [sinks, top-k, window] of its
                              table, or the table itself when the row does not select
        (reuse_steps > 0: a row close to the last row that scored takes its blocks
         instead, sparse_reuse.py; which rows do is decided first, in row order)
    attend
        out[m]              = softmax(q[m] K_m^T * scale) V_m  over the keys_m keys of
                              table_m (paged_attention.row_part, split as a single row)

A row's scores do not depend on how its candidates are split into parts, and its
attention splits as the decode executor's rows do (split_count of its own key count), so
a prompt row gives the bits the same row gives alone, in a chunk of any size.
"""

import numpy as np
from numba import prange

from ..dtypes import KV_INT8
from ..jit import parallel_kernel
from .paged_attention import merge_partials, row_part, split_count
from .simd import lanes_of
from .sparse_index import (PAD_LANES, PARALLEL_WORK, SP_FIELDS, SP_K_BLOCKS, SP_REUSE, SP_SINK, SP_WINDOW,
                           gather_selection, kept_blocks, row_selects, score_part)
from .sparse_reuse import A_CHOSE, A_KEYS, gather_reused, reuses


@parallel_kernel
def _select_rows(q, hbasis, scale, idx, isc, slot, table, n_past, bs, conf, w, parts, scores, sel, sel_keys, chosen,
                 anchor_of, tag):
    M = q.shape[0]
    anchor_of[:] = -1
    if conf[SP_REUSE] > 0:  # which rows take the selection of the last row before them that scored
        a = -1
        anchor = np.empty(2, np.int64)  # [A_KEYS, A_CHOSE] of row a
        for m in range(M):
            if a >= 0 and reuses(q[m], n_past + m + 1, anchor, q[a], bs, conf):
                anchor_of[m] = a
            else:
                a, n = m, n_past + m + 1
                anchor[A_KEYS], anchor[A_CHOSE] = n, conf[SP_K_BLOCKS] if row_selects(n, bs, conf) else -1
    for task in prange(M * parts):
        m = task // parts
        if anchor_of[m] < 0:
            score_part(q[m], hbasis, scale, idx, isc, slot, table, n_past + m + 1, bs, conf, w, task % parts, parts,
                       scores[m], tag)
    for m in prange(M):
        if anchor_of[m] < 0:
            sel_keys[m] = gather_selection(table, n_past + m + 1, bs, conf, scores[m], sel[m], chosen[m])
    for m in prange(M):
        a = anchor_of[m]
        if a >= 0:
            anchor = np.empty(2, np.int64)
            anchor[A_KEYS], anchor[A_CHOSE] = n_past + a + 1, conf[SP_K_BLOCKS]
            sel_keys[m] = gather_reused(table, n_past + m + 1, bs, conf, anchor, chosen[a], sel[m])


def select_rows(q, hbasis, scale, idx, isc, slot, table, n_past, bs, conf, w, threads, scores, sel, sel_keys,
                tag) -> int:
    """Each row's gathered block table into ``sel`` and its key count into ``sel_keys``;
    returns how many rows reused the selection of an earlier row (sparse_reuse.py).

    q  # [M, H, D] f32 rotated, row m at position n_past + m;  hbasis  # [H, r, D] f32
    each head's KV head basis (this layer's);  idx, isc  the index cache (sparse_index.py;
    read past their end by up to one vector: IndexCache pads them), ``slot`` the layer's;
    table  # [>= nb of the last row] int32 the sequence's pool blocks;  conf  # [SP_FIELDS]
    int64;  w  # [H] head weights;  scores  # [M, >= candidates of the last row] f32 (out);
    sel  # [M, >= nb of the last row] int32 (out);  sel_keys  # [M] int64 (out)."""
    M, H, D = q.shape
    r = hbasis.shape[1]
    n_keys = n_past + M  # the last row's
    nb = -(-n_keys // bs)
    if conf.size != SP_FIELDS:
        raise ValueError(f"select_rows: conf has {conf.size} fields, not {SP_FIELDS}")
    n_sink, n_win = kept_blocks(n_keys, bs, conf[SP_SINK], conf[SP_WINDOW])
    n_cand = nb - n_sink - n_win
    if (hbasis.shape != (H, r, D) or idx.dtype != np.uint8 or idx.shape[3:] != (r // 4, bs, 4) or r % 4
            or H % idx.shape[2] or isc.shape[1:] != idx.shape[1:3] + (bs,) or not 0 <= slot < idx.shape[0]
            or n_past < 0 or table.size < nb or scores.shape[0] < M
            or scores.shape[1] < max(n_cand, 1) or sel.shape[0] < M or sel.shape[1] < nb or sel_keys.size < M
            or w.size != H or lanes_of(tag) > PAD_LANES):
        raise ValueError(f"select_rows: arguments do not fit (see its doc): q {q.shape}, hbasis {hbasis.shape}, "
                         f"idx {idx.shape} {idx.dtype}, isc {isc.shape}, slot {slot}, conf {conf.size}, table "
                         f"{table.size}, n_past {n_past}, bs {bs}, scores {scores.shape}, sel {sel.shape}, "
                         f"sel_keys {sel_keys.size}, w {w.size}")
    if nb and (table[:nb].max() >= idx.shape[1] or table[:nb].min() < 0):
        raise ValueError("select_rows: a block id outside the index cache")
    parts = 1 if M >= threads else max(1, min(-(-threads // M), n_cand * H // PARALLEL_WORK))
    chosen = np.empty((M, nb), np.int32)  # [M, nb] candidate indices each scoring row picked
    anchor_of = np.empty(M, np.int64)  # [M] the row whose selection row m reuses, -1: its own
    _select_rows(q, hbasis, np.float32(scale), idx, isc, slot, table, n_past, bs, conf, w, parts, scores, sel,
                 sel_keys, chosen, anchor_of, tag)
    return int(np.count_nonzero(anchor_of >= 0))


@parallel_kernel
def _attend_rows(q, pool, pool_f32, lut, kind, group, scale_off0, sel, sel_keys, layer, KVH, bs, scale, threads, S,
                 out, tag):
    M, H, D = q.shape
    n_tasks = M * KVH * S
    pmax = np.empty((n_tasks, H // KVH), np.float32)  # [task, G]
    psum = np.empty((n_tasks, H // KVH), np.float32)  # [task, G]
    pacc = np.empty((n_tasks, H // KVH, D), np.float32)  # [task, G, D]
    for task in prange(n_tasks):
        mk = task // S
        m = mk // KVH
        row_part(q, m, mk % KVH, task % S, S, pool, pool_f32, lut, kind, group, scale_off0, sel[m], layer, KVH, bs,
                 sel_keys[m], scale, threads, pmax, psum, pacc, tag)
    for mk in prange(M * KVH):
        merge_partials(pmax, psum, pacc, mk // KVH, mk % KVH, S, KVH, out)


def attend_rows(q, pool, pool_f32, lut, kind, group, scale_off0, sel, sel_keys, layer, KVH, bs, scale, threads,
                out, tag) -> None:
    """out[m] = attention of  q[m]  # [H, D] over the first sel_keys[m] keys of the pool
    blocks  sel[m]  (select_rows' outputs; every block but the last full);  out  # [M, H,
    D] f32.  ``threads`` sets each row's splits; the tag is ignored for an int8 pool."""
    M = q.shape[0]
    if sel.shape[0] < M or sel_keys.size < M or out.shape != q.shape or (M and sel_keys[:M].min() < 1):
        raise ValueError(f"attend_rows: q {q.shape}, sel {sel.shape}, sel_keys {sel_keys.size}, out {out.shape}")
    S = split_count(int(sel_keys[:M].max()), bs, KVH, threads) if M else 1  # grows with the keys
    _attend_rows(q, pool, pool_f32, lut, kind, group, scale_off0, sel, sel_keys, layer, KVH, bs, np.float32(scale),
                 threads, S, out, None if kind == KV_INT8 else tag)
