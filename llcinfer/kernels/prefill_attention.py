"""Blocked causal prefill attention over the paged KV pool: many query rows at once.

What it computes (row m of q sits at position n_past + m; kv head j serves the query
heads j G .. j G + G - 1, G = H / KVH):

    out[m, h] = softmax(q[m, h] . K[t] * scale + mask[m, t]) @ V      over t < n_past + M
    mask[m, t] = 0 for t <= n_past + m, -inf after (causal)

The decode kernels (paged_attention.py) run one task per (query row, kv head), so M rows
read every K/V block M times.  Here one task is (kv head, tile of TQ query positions):
its R = TQ G query rows (the G heads of the group at each position) go over the key
blocks once, each 16-token block of K^T and V read through the block table and widened
to f32 once in registers for all R rows (``_qk_t`` / ``_pv`` of paged_attention_simd.py,
in groups of 8 and 4 rows).  The softmax is online per key block:

    s = qs[r] . K^T[:, block]        (qs = q scale)  ; keys past row r's position: _NEG
    mx' = max(mx, max s);  acc = acc exp(mx - mx') + exp(s - mx') V[block];  sum likewise
    out = acc / sum

A row's result depends on that row alone (batch invariance): the key blocks are the
sequence's own (position // bs), always visited in order from 0, the calls' register
shapes are fixed (row groups padded to 8 / 4), and the blocks past a row's position that
its tile-mates need add exact zeros (exp(_NEG - mx) = 0, corr = 1).  The same rows in
other tiles, chunks or thread counts give the same bits; they differ in rounding from the
decode kernel's (which splits a row's keys over threads).

Tasks are dealt to n_slots (up to 4 per thread) slots in zigzag order (task k of round i goes to
slot k or n_slots - 1 - k), so the causal triangle's growing tiles even out over threads
under numba's static split of the prange.

f16 / f32 storage on a SIMD path with bs and head_dim multiples of the lanes; int8
storage, the 'generic' ISA and other shapes run the decode kernels' path
(``paged_attention``), one task per row.
"""

import numpy as np
from numba import prange

from ..dtypes import KV_INT8
from ..jit import kernel, parallel_kernel
from .paged_attention import attention_tag, paged_attention
from .paged_attention_simd import _NEG, _pass_width, _pv, _qk_t, online_softmax_block
from .simd import addr, lanes_of, vlanes, vloadf, vtag
from .simd_math import vhsum

_SLOTS_PER_THREAD = 4


@kernel
def _tile(q, pool, table, layer, KVH, bs, n_past, scale, m0, m1, kvh, qs, sbuf, acc, corr, rmax, rsv, out, vt):
    """Attention of query positions m0 .. m1-1 (all G heads of kv head ``kvh``) into out.

    Buffers (the slot's, rows r = (m - m0) G + g, padded to whole groups of 8 / 4):
    qs [Rp, D] scaled queries, sbuf [Rp, SW] one block's scores then probabilities,
    acc [Rp, D], corr [Rp] this block's rescale, rmax [Rp] running max, rsv [Rp, W]
    running sums per lane."""
    M, H, D = q.shape
    G = H // KVH
    W = vlanes(vt)
    gq = 8 if W == 16 else 4  # rows per _qk_t call (QK_HEADS[W]): 1 accumulator chain each
    h0 = kvh * G
    R = (m1 - m0) * G
    Rp = (R + gq - 1) // gq * gq
    SW = sbuf.shape[1]
    nv = D // W  # vectors per row
    for r in range(Rp):
        m = m0 + r // G
        for d in range(D):
            qs[r, d] = q[m, h0 + r % G, d] * scale if r < R else np.float32(0.0)
            acc[r, d] = 0.0
        rmax[r] = _NEG
        corr[r] = 1.0
        for i in range(W):
            rsv[r, i] = 0.0
    esz = pool.itemsize
    kv_b = bs * D * esz  # bytes of one (layer, K or V, head) in a block: K^T [D, bs], V [bs, D]
    blk_b = 2 * kv_b  # head-major pool (kv_index): consecutive blocks of one (layer, head)
    kv0 = addr(pool) + (layer * KVH + kvh) * pool.shape[0] * blk_b
    qa, sa, aa, ca, rsa = addr(qs), addr(sbuf), addr(acc), addr(corr), addr(rsv)
    t_last = n_past + m1  # keys 0 .. t_last-1 exist; row m sees those < n_past + m + 1
    nb = (t_last + bs - 1) // bs
    for b in range(nb):
        kb = kv0 + np.int64(table[b]) * blk_b
        k_lo = b * bs
        n_valid = min(bs, t_last - k_lo)
        nxt = kv0 + np.int64(table[b + 1]) * blk_b if b + 1 < nb else 0
        for gi in range(Rp // gq):
            pf = 0  # the next block, spread over the first two calls: K^T, then V
            if nxt != 0 and gi < 2:
                pf = nxt + gi * kv_b
            for ch in range(0, n_valid, 2 * W):  # nkv from the block's shape alone (fixed chains)
                _qk_t(qa + gi * gq * D * 4, kb + ch * esz, bs * esz, n_valid - ch, D, sa + (gi * gq * SW + ch) * 4,
                      SW, gq, 2 if bs - ch > W else 1, pf if ch == 0 else 0, vt, pool)
        if k_lo + n_valid > n_past + m0 + 1:  # the causal diagonal crosses this block
            for r in range(R):
                te = n_past + m0 + r // G + 1 - k_lo  # keys of this block row r sees
                for j in range(max(te, 0), n_valid):
                    sbuf[r, j] = _NEG
        for r in range(Rp):
            rmax[r], corr[r] = online_softmax_block(sa + r * SW * 4, rsa + r * W * 4, rmax[r], n_valid, vt)
        vb = kb + kv_b  # V rows follow the block's K^T
        for r0 in range(0, Rp, 4):  # 4 rows per pass: each V vector widened once for them
            c0 = 0
            while c0 < nv:
                nc = _pass_width(nv - c0, 4 if W == 16 else 3)
                _pv(aa + (r0 * D + c0 * W) * 4, sa + r0 * SW * 4, SW, ca + r0 * 4, vb + c0 * W * esz, D, n_valid,
                    nc, 4, 0, vt, pool)
                c0 += nc
    for r in range(R):
        inv = np.float32(1.0) / vhsum(vloadf(rsa, r * W * 4, vt))
        m = m0 + r // G
        for d in range(D):
            out[m, h0 + r % G, d] = acc[r, d] * inv


@kernel
def _slot(q, pool, table, layer, KVH, bs, n_past, scale, tq, slot, n_slots, out, vt):
    """The tasks (query tile, kv head) of one slot, dealt in zigzag order; the slot's
    buffers are allocated once for all of them."""
    M, H, D = q.shape
    W = vlanes(vt)
    Rp = (tq * (H // KVH) + 7) // 8 * 8
    qs = np.empty((Rp, D), np.float32)  # [row, D] scaled queries of the tile
    sbuf = np.empty((Rp, (bs + W - 1) // W * W), np.float32)  # [row, key] one block's scores / probabilities
    acc = np.empty((Rp, D), np.float32)  # [row, D] running weighted sum of values
    corr = np.empty(Rp, np.float32)  # [row] rescale of acc for the current block
    rmax = np.empty(Rp, np.float32)  # [row] running max
    rsv = np.empty((Rp, W), np.float32)  # [row, lane] running sums of probabilities
    n_tasks = (M + tq - 1) // tq * KVH  # task k: tile k // KVH, kv head k % KVH
    i = 0
    while True:
        k = i * n_slots + (slot if i % 2 == 0 else n_slots - 1 - slot)
        if k >= n_tasks:
            break
        m0 = (k // KVH) * tq
        _tile(q, pool, table, layer, KVH, bs, n_past, scale, m0, min(M, m0 + tq), k % KVH, qs, sbuf, acc, corr, rmax,
              rsv, out, vt)
        i += 1


@parallel_kernel
def prefill_attention_parallel(q, pool, table, layer, KVH, bs, n_past, scale, tq, n_slots, out, tag):
    """q [M, H, D] f32 rotated, row m at position n_past + m; table [blocks] int32 (the
    sequence's); out [M, H, D] f32; tq query positions per tile; tag: simd.make_tag."""
    for slot in prange(n_slots):
        _slot(q, pool, table, layer, KVH, bs, n_past, scale, tq, np.int64(slot), n_slots, out, vtag(tag))


@kernel
def prefill_attention_serial(q, pool, table, layer, KVH, bs, n_past, scale, tq, n_slots, out, tag):
    """Same as prefill_attention_parallel (the same bits) on the calling thread."""
    for slot in range(n_slots):
        _slot(q, pool, table, layer, KVH, bs, n_past, scale, tq, np.int64(slot), n_slots, out, vtag(tag))


def tile_positions(G: int) -> int:
    """Query positions per tile for G heads per kv head: about 48 rows (scaled queries,
    accumulators and scores of the tile stay near L1), a multiple of 8 positions."""
    return max(8, 48 // max(1, G) // 8 * 8)


def prefill_supported(kind: int, D: int, bs: int, isa: str | None = None) -> bool:
    """True when ``prefill_attention`` runs the blocked kernel (else the decode kernels)."""
    tag = attention_tag(isa)
    return kind != KV_INT8 and tag is not None and D % lanes_of(tag) == 0 and bs % lanes_of(tag) == 0


def prefill_attention(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past, scale, out,
                      threads: int = 1, isa: str | None = None, tq: int | None = None):
    """out  # [M, H, D] = causal attention of q  # [M, H, D] (rows at n_past ..) over the
    sequence's positions 0 .. n_past + M - 1; the arguments as ``paged_attention``'s.
    Unsupported storage / ISA / shapes: ``paged_attention``."""
    M, H, D = q.shape
    if not prefill_supported(kind, D, bs, isa):
        paged_attention(q, pool, pool_f32, lut, kind, group, scale_off0, table, layer, KVH, bs, n_past, scale, out,
                        threads=threads, isa=isa)
        return
    tq = tile_positions(H // KVH) if tq is None else int(tq)
    threads = max(1, threads)
    n_tasks = -(-M // tq) * KVH
    n_slots = threads * min(_SLOTS_PER_THREAD, -(-n_tasks // threads))  # a whole number of slots per thread
    fn = prefill_attention_serial if threads == 1 else prefill_attention_parallel
    fn(q, pool, table, layer, KVH, bs, n_past, np.float32(scale), tq, n_slots, out, attention_tag(isa))
