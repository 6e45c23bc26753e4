"""Causal GQA attention read through a block table (the paged KV pool), and the stores
that fill it.

The pool (llcinfer.kv.pool) is one array per storage type, seen as [block, elems]; a
block holds ``bs`` tokens of every layer.  Token t of a sequence lives in block
``table[t // bs]``, slot ``t % bs``.  ``kv_index`` gives the element (of the flat array)
of (block, layer, K or V, head, slot, d):

    f16 / f32, head-major: the blocks of one (layer, kv head) are adjacent, so attention
    over a sequence whose blocks were allocated in order reads one stream per head
    (measured 1 thread, SmolLM2 at 4k: 15-17 GB/s with whole blocks 360 KiB apart,
    21-22 GB/s head-major):
        data    # [layer, kv_head, block, 2 (K, V), bs * head_dim]
                #   K: [head_dim, token] (transposed: the scores of W keys are plain
                #      vector FMAs, paged_attention_simd.py);  V: [token, head_dim]
    int8, block-major (one block = one row of the array):
        data    # [block, layer, 2 (K, V), kv_head, token, head_dim]
        scales  # [block, layer, 2, kv_head, token, head_dim // group]  f32, at scale_off0

One task = (query row m, kv head, split of the key blocks).  The G = H / KVH query heads
of a group share every K/V row read, the softmax is online per block (one rescale per
block, not per key), and long contexts are split across the thread pool
(flash-decoding) and merged at the end.  How many parts a row takes depends on its own
key count only (``split_count``), so a row's result does not depend on the rows beside
it (batch invariance):

    s[g, t] = q[m, h0+g] . k[t] * scale;   out[m, h0+g] = sum_t softmax(s[g])[t] v[t]

``kind`` selects the storage type: dtypes.KV_F32, KV_F16 (bit patterns), KV_INT8 (x = q *
scale per ``group`` values).

Two implementations of a task, chosen by the ``tag`` argument (simd.make_tag; None is
the 'generic' ISA):

- ``_task_simd`` (paged_attention_simd.py; a tag, f32 / f16 storage, head_dim and bs
  multiples of the tag's lanes W): explicit vectors, K^T rows widened by vcvtph2ps and
  shared by the heads of the group, vector exp, the blocks ahead prefetched.
- ``_task_scalar`` (no tag, int8, other shapes): plain loops, f16 through a lookup table.
"""

import numpy as np
from numba import prange

from ..dtypes import KV_F16, KV_F32, KV_INT8
from .isa import current_isa
from ..jit import kernel, parallel_kernel
from .paged_attention_simd import _NEG, _task_simd
from .simd import make_tag, vlanes, vtag


@kernel
def kv_index(pool, blk, layer, kv, kvh, j, d, KVH, bs, D, kind):
    """Index in the flat pool data of (block, layer, kv 0 K / 1 V, kv head, slot j, dim d)."""
    if kind == KV_INT8:  # block-major
        return blk * pool.shape[1] + ((layer * 2 + kv) * KVH + kvh) * bs * D + j * D + d
    base = (((layer * KVH + kvh) * pool.shape[0] + blk) * 2 + kv) * bs * D  # head-major
    if kv == 0:
        return base + d * bs + j  # K^T [D, bs]
    return base + j * D + d


@kernel
def _load_rows(flat, flat_f32, off, n, kind, lut, scale_off, group, dst):
    """dst[:n] = f32 of flat[off : off + n] (n = rows * D, rows contiguous; int8: times the
    scales flat_f32[scale_off ...], one per group)."""
    if kind == KV_F16:
        for i in range(n):
            dst[i] = lut[np.int64(flat[off + i])]
    elif kind == KV_F32:
        for i in range(n):
            dst[i] = np.float32(flat[off + i])
    else:
        for g in range(n // group):
            sc = flat_f32[scale_off + g]
            for i in range(g * group, (g + 1) * group):
                dst[i] = np.float32(flat[off + i]) * sc


@kernel
def _task_scalar(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past, scale,
                 n_splits, task, pmax, psum, pacc):
    """``_task`` in plain loops (f16 through the lookup table): every kind, every shape."""
    M, H, D = q.shape
    G = H // KVH
    s_idx = task % n_splits
    mk = task // n_splits
    m = mk // KVH
    kvh = mk % KVH
    h0 = kvh * G
    t_end = n_past + m + 1  # keys 0 .. t_end-1 are visible to row m
    nb = (t_end + bs - 1) // bs
    b0 = s_idx * nb // n_splits
    b1 = (s_idx + 1) * nb // n_splits
    kbuf = np.empty(bs * D, np.float32)  # [token, D] one block's K (then V) rows in f32
    sbuf = np.empty((G, bs), np.float32)  # [G, token] scores, then probabilities
    rmax = np.full(G, _NEG, np.float32)
    rsum = np.zeros(G, np.float32)
    acc = np.zeros((G, D), np.float32)  # [G, D] running weighted sum of values
    gs = D // group
    flat, flat_f32 = pool.reshape(-1), pool_f32.reshape(-1)
    for b in range(b0, b1):
        blk = table[b]
        n_valid = min(bs, t_end - b * bs)
        rk = ((layer * 2 + 0) * KVH + kvh) * bs  # int8: first K row of this (layer, head) in the block
        rv = ((layer * 2 + 1) * KVH + kvh) * bs
        s0 = blk * pool_f32.shape[1] + scale_off0  # int8: the block's scales
        if kind == KV_INT8:
            _load_rows(flat, flat_f32, kv_index(pool, blk, layer, 0, kvh, 0, 0, KVH, bs, D, kind), n_valid * D,
                       kind, lut, s0 + rk * gs, group, kbuf)
        else:  # K^T [D, bs] -> kbuf [token, D]
            k0 = kv_index(pool, blk, layer, 0, kvh, 0, 0, KVH, bs, D, kind)
            for d in range(D):
                for j in range(n_valid):
                    x = flat[k0 + d * bs + j]
                    kbuf[j * D + d] = lut[np.int64(x)] if kind == KV_F16 else np.float32(x)
        for g in range(G):
            for j in range(n_valid):
                s = np.float32(0.0)
                for d in range(D):
                    s += q[m, h0 + g, d] * kbuf[j * D + d]
                sbuf[g, j] = s * scale
        for g in range(G):
            bm = sbuf[g, 0]
            for j in range(1, n_valid):
                bm = max(bm, sbuf[g, j])
            new = max(rmax[g], bm)
            corr = np.float32(np.exp(rmax[g] - new))
            tot = np.float32(0.0)
            for j in range(n_valid):
                p = np.float32(np.exp(sbuf[g, j] - new))
                sbuf[g, j] = p
                tot += p
            rsum[g] = rsum[g] * corr + tot
            rmax[g] = new
            for d in range(D):
                acc[g, d] *= corr
        _load_rows(flat, flat_f32, kv_index(pool, blk, layer, 1, kvh, 0, 0, KVH, bs, D, kind), n_valid * D, kind,
                   lut, s0 + rv * gs, group, kbuf)
        for j in range(n_valid):
            for g in range(G):
                p = sbuf[g, j]
                for d in range(D):
                    acc[g, d] += p * kbuf[j * D + d]
    for g in range(G):
        pmax[task, g] = rmax[g]
        psum[task, g] = rsum[g]
        for d in range(D):
            pacc[task, g, d] = acc[g, d]


@kernel
def _task(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past, scale,
          n_splits, task, pmax, psum, pacc, tag=None, n_rows=1, row_step=0):
    """Partial attention of one (m, kv head, split): pmax/psum [G], pacc [G, D] of this task;
    with n_rows > 1, the same for rows m .. m + n_rows - 1 (row m + r one position further
    each, results in slot task + r row_step; rows with the same key-block count).

    ``tag`` (simd.make_tag; optional): the explicit-SIMD path of that width for f32 / f16
    storage when D and bs are multiples of its lanes, every row over one stream of K/V;
    None (the 'generic' ISA), int8 storage or another D: the scalar loops, row by row."""
    if tag is None:
        _rows_scalar(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past, scale,
                     n_splits, task, pmax, psum, pacc, n_rows, row_step)
    elif kind != KV_INT8 and q.shape[2] % vlanes(tag) == 0 and bs % vlanes(tag) == 0:
        _task_simd(q, pool, table, layer, KVH, bs, n_past, scale, n_splits, task, pmax, psum, pacc, vtag(tag),
                   n_rows, row_step)
    else:
        _rows_scalar(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past, scale,
                     n_splits, task, pmax, psum, pacc, n_rows, row_step)


@kernel
def _rows_scalar(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past, scale,
                 n_splits, task, pmax, psum, pacc, n_rows, row_step):
    """``_task_scalar`` for each of n_rows rows in turn (see ``_task``)."""
    for r in range(n_rows):
        _task_scalar(q[r:], pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past + r, scale,
                     n_splits, task, pmax[r * row_step:], psum[r * row_step:], pacc[r * row_step:])


@kernel
def merge_partials(pmax, psum, pacc, m, j, S, KVH, out):
    """out[m, the heads of group j] = its S partial results combined (flash-decoding merge):

        mx = max_s pmax[s];  w_s = exp(pmax[s] - mx);  out = sum_s w_s pacc[s] / sum_s w_s psum[s]

    Empty parts (``empty_partial``) add exactly nothing, so a row merged over more splits
    than it has gives the same bits."""
    G = pmax.shape[1]
    D = out.shape[2]
    t0 = (m * KVH + j) * S
    for g in range(G):
        mx = pmax[t0, g]
        for s in range(1, S):
            mx = max(mx, pmax[t0 + s, g])
        den = np.float32(0.0)
        h = j * G + g
        for d in range(D):
            out[m, h, d] = 0.0
        for s in range(S):
            w = np.float32(np.exp(pmax[t0 + s, g] - mx))
            den += w * psum[t0 + s, g]
            for d in range(D):
                out[m, h, d] += w * pacc[t0 + s, g, d]
        inv = np.float32(1.0) / den
        for d in range(D):
            out[m, h, d] *= inv


@kernel
def empty_partial(pmax, psum, pacc, task):
    """The partial result of a split with no keys: weight exp(_NEG - mx) = 0 in the merge."""
    for g in range(pmax.shape[1]):
        pmax[task, g] = _NEG
        psum[task, g] = 0.0
        for d in range(pacc.shape[2]):
            pacc[task, g, d] = 0.0


_BLOCKS_PER_SPLIT = 4  # at least this many key blocks per split


@kernel
def split_count(n_keys, bs, KVH, threads):
    """Key-block splits of one query row's attention, from that row's key count alone (so
    a row gives the same bits whatever rows run beside it): enough parts for the kv heads
    of one row to fill ``threads`` evenly, at least _BLOCKS_PER_SPLIT blocks each."""
    if threads <= 1 or KVH >= 2 * threads:
        return 1
    a, b = KVH, threads  # gcd
    while b:
        a, b = b, a % b
    step = threads // a
    want = (4 * threads + KVH - 1) // KVH
    want = (want + step - 1) // step * step
    return max(1, min(want, ((n_keys + bs - 1) // bs) // _BLOCKS_PER_SPLIT))


@kernel
def row_part(q, m, j, s, S, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_keys, scale,
             threads, pmax, psum, pacc, tag, n_rows=1):
    """Part s of query row m's attention over its ``n_keys`` keys for kv group j, into slot
    (m KVH + j) S + s of the partials.  The row takes split_count(n_keys, ...) <= S parts;
    the slots past them get empty parts (merge_partials adds nothing for them).

    n_rows > 1: the same for rows m .. m + n_rows - 1 of one sequence at consecutive
    positions (n_keys + r keys) in as many key blocks as row m, over one stream of K/V;
    each row's bits are those it gets alone."""
    sm = split_count(n_keys, bs, KVH, threads)
    slot = (m * KVH + j) * S + s
    step = KVH * S  # slots from one row to the next
    if s >= sm:
        for r in range(n_rows):
            empty_partial(pmax, psum, pacc, slot + r * step)
        return
    base = slot - (j * sm + s)  # _task writes its task j sm + s at base + j sm + s
    _task(q[m:m + n_rows], pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_keys - 1, scale,
          sm, j * sm + s, pmax[base:], psum[base:], pacc[base:], tag, n_rows, step)


@parallel_kernel
def paged_attention_parallel(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past,
                             scale, threads, out, tag=None):
    """q [M, H, D] f32 rotated, row m at position n_past + m; table [blocks] int32; out
    [M, H, D] f32 (see module doc).  Each row is split as split_count(its keys, ...,
    ``threads``) says; tag: the SIMD path (``_task``), None for the scalar loops."""
    M, H, D = q.shape
    S = split_count(n_past + M, bs, KVH, threads)  # the last row has the most keys
    n_tasks = M * KVH * S
    pmax = np.empty((n_tasks, H // KVH), np.float32)  # [task, G]
    psum = np.empty((n_tasks, H // KVH), np.float32)  # [task, G]
    pacc = np.empty((n_tasks, H // KVH, D), np.float32)  # [task, G, D]
    for task in prange(n_tasks):
        mk = task // S
        row_part(q, mk // KVH, mk % KVH, task % S, S, pool, pool_f32, lut, kind, group, scale_off0, table, layer,
                 KVH, bs, n_past + mk // KVH + 1, scale, threads, pmax, psum, pacc, tag)
    for mk in range(M * KVH):
        merge_partials(pmax, psum, pacc, mk // KVH, mk % KVH, S, KVH, out)


@kernel
def paged_attention_serial(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past,
                           scale, threads, out, tag=None):
    """Same as paged_attention_parallel (the same bits) on the calling thread."""
    M, H, D = q.shape
    S = split_count(n_past + M, bs, KVH, threads)
    n_tasks = M * KVH * S
    pmax = np.empty((n_tasks, H // KVH), np.float32)
    psum = np.empty((n_tasks, H // KVH), np.float32)
    pacc = np.empty((n_tasks, H // KVH, D), np.float32)
    for task in range(n_tasks):
        mk = task // S
        row_part(q, mk // KVH, mk % KVH, task % S, S, pool, pool_f32, lut, kind, group, scale_off0, table, layer,
                 KVH, bs, n_past + mk // KVH + 1, scale, threads, pmax, psum, pacc, tag)
    for mk in range(M * KVH):
        merge_partials(pmax, psum, pacc, mk // KVH, mk % KVH, S, KVH, out)


_SERIAL_WORK = 1 << 17  # multiply-adds below which a pool launch costs more than it saves


_TAGS: dict[str, np.ndarray | None] = {}


def attention_tag(isa: str | None = None) -> np.ndarray | None:
    """The ``tag`` argument of the kernels for an ISA path (None: ``isa.current_isa()``);
    None for 'generic' (the scalar loops)."""
    name = current_isa() if isa is None else isa
    if name not in _TAGS:
        _TAGS[name] = None if name == "generic" else make_tag(name)
    return _TAGS[name]


def paged_attention(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past, scale, out,
                    threads: int = 1, isa: str | None = None):
    """Dispatch: serial for small work, else over the thread pool (the same bits either
    way: rows are split for ``threads`` in both); ``isa`` picks the path (None: the
    process's, ``isa.current_isa()``)."""
    M, H, D = q.shape
    tag = attention_tag(isa) if kind != KV_INT8 else None  # int8: the scalar loops either way
    work = M * H * D * (n_past + M) * 2
    fn = paged_attention_serial if work < _SERIAL_WORK or threads <= 1 else paged_attention_parallel
    fn(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past, scale, threads, out, tag)


@kernel
def store_rows(pool, table, layer, kv, bs, pos0, src):
    """pool[...] <- src  # [M, KVH, D] (uint16 f16 bits or f32, the pool's dtype), positions pos0.."""
    M, KVH, D = src.shape
    flat = pool.reshape(-1)
    for m in range(M):
        p = pos0 + m
        blk = table[p // bs]
        j = p % bs
        for h in range(KVH):
            for d in range(D):
                flat[kv_index(pool, blk, layer, kv, h, j, d, KVH, bs, D, 0)] = src[m, h, d]


@kernel
def store_rows_int8(pool, pool_f32, scale_off0, group, table, layer, kv, bs, pos0, src):
    """Quantize src  # [M, KVH, D] f32 to int8 with one f32 scale per ``group`` values
    (llama.cpp's q8_0 rule: d = max|x| / 127, q = round(x / d))."""
    M, KVH, D = src.shape
    gs = D // group
    for m in range(M):
        p = pos0 + m
        blk = table[p // bs]
        j = p % bs
        for h in range(KVH):
            r = ((layer * 2 + kv) * KVH + h) * bs + j
            for g in range(gs):
                amax = np.float32(0.0)
                for d in range(g * group, (g + 1) * group):
                    amax = max(amax, abs(src[m, h, d]))
                dsc = amax / np.float32(127.0)
                inv = np.float32(1.0) / dsc if dsc > 0 else np.float32(0.0)
                pool_f32[blk, scale_off0 + r * gs + g] = dsc
                for d in range(g * group, (g + 1) * group):
                    v = src[m, h, d] * inv
                    iv = np.int64(v + np.float32(0.5)) if v >= 0 else -np.int64(np.float32(0.5) - v)
                    pool[blk, r * D + d] = min(127, max(-127, iv))
