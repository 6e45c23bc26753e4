"""Attention of a draft tree's rows (speculative verification) and the K/V move that
commits the accepted path.

A verification chunk of one sequence holds M tree nodes after its committed prefix of
``n_prefix`` tokens: node i (row i) has its K/V at slot n_prefix + i and its RoPE
position n_prefix + depth(i); node 0 is the root (the last committed token, depth 0) and
a node's ancestors come before it.  Row i attends to the whole prefix and to its own
ancestors (itself included) only:

    s[g, t] = q[i, h0+g] . k[t] * scale   for t < n_prefix, and t = n_prefix + a, a on i's path
    out[i, h0+g] = sum_t softmax(s[g])[t] v[t]

To give the very bits plain decoding would give for the same path, each row runs the
paged kernels' own tasks (``row_part``) over a *virtual* sequence: its prefix blocks, then
scratch blocks (``scratch``, one row's worth per tree row) into which the tail of the
prefix and the row's ancestors, in depth order, are copied first.  The row's keys are then
laid out exactly as in the sequence that decoded that path token by token, split and
summed in the same order.
"""

import numpy as np
from numba import prange

from ..jit import kernel, parallel_kernel
from .paged_attention import kv_index, merge_partials, row_part, split_count


@kernel
def _fill_virtual_tail(pool, table, layer, kvh, KVH, bs, D, kind, n_prefix, path, n_keys, row_table):
    """Copy virtual positions n_prefix // bs * bs .. n_keys - 1 of one row (prefix slots,
    then its ancestors ``path``  # [depth + 1] tree rows, root first) into the scratch
    blocks of ``row_table`` for one (layer, kv head)."""
    flat = pool.reshape(-1)
    for v in range(n_prefix // bs * bs, n_keys):
        src = v if v < n_prefix else n_prefix + path[v - n_prefix]
        sblk, sj = table[src // bs], src % bs
        dblk, dj = row_table[v // bs], v % bs
        for kv in range(2):
            for d in range(D):
                flat[kv_index(pool, dblk, layer, kv, kvh, dj, d, KVH, bs, D, kind)] = \
                    flat[kv_index(pool, sblk, layer, kv, kvh, sj, d, KVH, bs, D, kind)]


@parallel_kernel
def tree_attention(q, pool, pool_f32, lut, kind, table, layer, KVH, bs, n_prefix, paths, depth, row_tables, scale,
                   threads, out, tag=None):
    """q [M, H, D] f32 rotated (row i: tree node i); paths [M, max depth + 1] int64 (row i's
    ancestors by depth, root first, i last); depth [M] int64; row_tables [M, blocks] int32
    (the prefix's blocks, then the row's scratch blocks); table [blocks] int32 the
    sequence's; out [M, H, D] f32 (module doc).  f16 / f32 pools."""
    M, H, D = q.shape
    G = H // KVH
    for mk in prange(M * KVH):
        m = mk // KVH
        _fill_virtual_tail(pool, table, layer, mk % KVH, KVH, bs, D, kind, n_prefix, paths[m],
                           n_prefix + depth[m] + 1, row_tables[m])
    S = split_count(n_prefix + depth.max() + 1, bs, KVH, threads)  # the deepest row has the most keys
    n_tasks = M * KVH * S
    pmax = np.empty((n_tasks, G), np.float32)  # [task, G]
    psum = np.empty((n_tasks, G), np.float32)  # [task, G]
    pacc = np.empty((n_tasks, G, D), np.float32)  # [task, G, D]
    for task in prange(n_tasks):
        mk = task // S
        m = mk // KVH
        row_part(q, m, mk % KVH, task % S, S, pool, pool_f32, lut, kind, 1, 0, row_tables[m], layer, KVH, bs,
                 n_prefix + depth[m] + 1, scale, threads, pmax, psum, pacc, tag)
    for mk in range(M * KVH):
        merge_partials(pmax, psum, pacc, mk // KVH, mk % KVH, S, KVH, out)


@kernel
def move_kv_slots(pool, table, n_layer, KVH, bs, D, kind, src, dst):
    """K/V of every layer and kv head at position src[i] copied to position dst[i], in
    order (dst[i] <= src[i] and dst increasing: a later move never reads an overwritten
    slot).  f16 / f32 pools."""
    flat = pool.reshape(-1)
    for i in range(src.shape[0]):
        ps, pd = src[i], dst[i]
        if ps == pd:
            continue
        bsrc, jsrc = table[ps // bs], ps % bs
        bdst, jdst = table[pd // bs], pd % bs
        for layer in range(n_layer):
            for h in range(KVH):
                for kv in range(2):
                    for d in range(D):
                        flat[kv_index(pool, bdst, layer, kv, h, jdst, d, KVH, bs, D, kind)] = \
                            flat[kv_index(pool, bsrc, layer, kv, h, jsrc, d, KVH, bs, D, kind)]
