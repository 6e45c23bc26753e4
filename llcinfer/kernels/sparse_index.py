"""The sparse-attention indexer's kernels: index keys appended beside the KV, and the
fused block scorer with its running top-k.

Index keys (one per token, layer and KV head) are the post-RoPE key projected on a
per-(layer, KV head) basis of rank r, stored int8 with one f32 scale per token and head:

    y = basis[h] @ k[h];   s = max|y| / 127;   q = round(y / s)        (half away from zero)
    idx  # [full layer, pool block, kv_head, rank, token] int8 (transposed, as K: a block's dots are vector FMAs)
    isc  # [full layer, pool block, kv_head, token] f32

The scorer follows DSA's form over the query heads h (G of them per KV head):

    x[h, t] = qt[h] . (idx[t, kvh(h)] * isc[t, kvh(h)])     qt: query heads projected, * scale
    I[t]    = sum_h w[h] * phi(x[h, t])
        phi = relu:  max(x, 0)
        phi = exp:   exp(x - m[h]),  m[h] = max of x[h, .] over the always-kept tokens,
                     as (1 + d / 256)^256, d = clip(x - m, -60, 60) (8 squarings, no libm call:
                     the loop over a block's tokens vectorizes; it ranks as exp does)
    score(block) = max_t I[t] (agg max)  or  sum_t I[t] (agg sum)

and keeps the K best candidate blocks in a min-heap while it reads them, so no [heads,
tokens] (nor [tokens]) score array is written.  Candidates are the full blocks between the
sink blocks (the first) and the window blocks (the last, the partial one among them).
"""

import numpy as np

from ..jit import inline_kernel, kernel

PHI_RELU, PHI_EXP = 0, 1
AGG_MAX, AGG_SUM = 0, 1
_EXP_CAP = np.float32(60.0)  # exp(x - m) of a token far above the kept tokens' max stays finite


@kernel
def store_index_rows(k, basis, pos, seq, tables, bs, slot, idx, isc):
    """Index keys of every row into full-layer ``slot``.

    k  # [M, KVH*D] f32 rotated keys;  basis  # [KVH, r, D] f32 (this layer's);
    pos, seq  # [M] position and sequence of each row;  tables  # [n_seq, blocks] int32."""
    M = k.shape[0]
    KVH, r, D = basis.shape
    y = np.empty(r, np.float32)  # [r] the projected key of one (row, head)
    for m in range(M):
        p = pos[m]
        blk = tables[seq[m], p // bs]
        j = p % bs
        for h in range(KVH):
            amax = np.float32(0.0)
            for i in range(r):
                acc = np.float32(0.0)
                for d in range(D):
                    acc += basis[h, i, d] * k[m, h * D + d]
                y[i] = acc
                amax = max(amax, abs(acc))
            s = amax / np.float32(127.0)
            inv = np.float32(1.0) / s if s > 0 else np.float32(0.0)
            isc[slot, blk, h, j] = s
            for i in range(r):
                v = y[i] * inv
                iv = np.int64(v + np.float32(0.5)) if v >= 0 else -np.int64(np.float32(0.5) - v)
                idx[slot, blk, h, i, j] = min(127, max(-127, iv))


@inline_kernel
def _head_dot(qt, idx, isc, slot, blk, h, j, hh):
    """x[hh, token j of blk] = qt[hh] . dequantized index key of head h."""
    acc = np.float32(0.0)
    for i in range(qt.shape[1]):
        acc += qt[hh, i] * np.float32(idx[slot, blk, h, i, j])
    return acc * isc[slot, blk, h, j]


@kernel
def _kept_head_max(qt, idx, isc, slot, table, n_keys, bs, G, n_sink, n_win, hmax):
    """hmax  # [H] = max of x[h, t] over the sink and window blocks' tokens."""
    KVH = idx.shape[2]
    nb = (n_keys + bs - 1) // bs
    hmax[:] = np.float32(-3.0e38)
    for b in range(nb):
        if n_sink <= b < nb - n_win:
            continue
        blk = table[b]
        for j in range(min(bs, n_keys - b * bs)):
            for h in range(KVH):
                for g in range(G):
                    hh = h * G + g
                    hmax[hh] = max(hmax[hh], _head_dot(qt, idx, isc, slot, blk, h, j, hh))


@inline_kernel
def _heap_push(heap_s, heap_b, n, score, b):
    """Offer (score, b) to the min-heap heap_s[:n] of capacity heap_s.size; returns new n."""
    cap = heap_s.shape[0]
    if n < cap:
        i = n
        n += 1
        while i > 0:  # sift up
            parent = (i - 1) // 2
            if heap_s[parent] <= score:
                break
            heap_s[i] = heap_s[parent]
            heap_b[i] = heap_b[parent]
            i = parent
        heap_s[i] = score
        heap_b[i] = b
        return n
    if score <= heap_s[0]:
        return n
    i = 0
    while True:  # sift down from the root
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and heap_s[c + 1] < heap_s[c]:
            c += 1
        if heap_s[c] >= score:
            break
        heap_s[i] = heap_s[c]
        heap_b[i] = heap_b[c]
        i = c
    heap_s[i] = score
    heap_b[i] = b
    return n


@inline_kernel
def _phi_exp(d):
    """exp(d) as (1 + d / 256)^256 for d clipped to [-60, 60]."""
    y = np.float32(1.0) + min(max(d, -_EXP_CAP), _EXP_CAP) * np.float32(1.0 / 256.0)
    for _ in range(8):
        y = y * y
    return y


@kernel
def score_blocks(qt, idx, isc, slot, table, bs, G, phi, agg, w, hmax, b0, b1, heap_s, heap_b):
    """Candidate blocks b0 .. b1-1 (full) scored into the min-heap heap_s, heap_b  # [K];
    returns how many it holds.  hmax  # [H]: the per-head max (phi exp)."""
    KVH = idx.shape[2]
    H, r = qt.shape
    x = np.empty((H, bs), np.float32)  # [H, token] dots of one block
    deq = np.empty(bs, np.float32)  # [token] one rank row of a head's index keys
    tok = np.empty(bs, np.float32)  # [token] I[t]
    n = 0
    for b in range(b0, b1):
        blk = table[b]
        x[:, :] = 0.0
        for h in range(KVH):
            for i in range(r):
                for j in range(bs):
                    deq[j] = np.float32(idx[slot, blk, h, i, j])
                for g in range(G):
                    c = qt[h * G + g, i]
                    for j in range(bs):
                        x[h * G + g, j] += c * deq[j]
        tok[:] = 0.0
        for hh in range(H):
            sc = isc[slot, blk, hh // G]  # [token] scales
            wh = w[hh]
            if phi == PHI_EXP:
                m = hmax[hh]
                for j in range(bs):
                    tok[j] += wh * _phi_exp(x[hh, j] * sc[j] - m)
            else:
                for j in range(bs):
                    tok[j] += wh * max(x[hh, j] * sc[j], np.float32(0.0))
        best = tok[0]
        for j in range(1, bs):
            best = best + tok[j] if agg == AGG_SUM else max(best, tok[j])
        n = _heap_push(heap_s, heap_b, n, best, b)
    return n


@kernel
def score_topk(qt, idx, isc, slot, table, n_keys, bs, G, phi, agg, w, n_sink, n_win, hmax, heap_s, heap_b):
    """The best heap_s.size candidate blocks of one query row; returns how many were kept.

    qt  # [H, r] f32 projected query heads (times the attention scale);  table  # [blocks]
    int32 the sequence's pool blocks;  keys 0 .. n_keys-1;  w  # [H] head weights;
    hmax  # [H] scratch;  heap_s  # [K] f32, heap_b  # [K] int32 (sequence block slots, not
    sorted).  Candidates: blocks n_sink .. nb - n_win - 1 (all full)."""
    nb = (n_keys + bs - 1) // bs
    if phi == PHI_EXP:
        _kept_head_max(qt, idx, isc, slot, table, n_keys, bs, G, n_sink, n_win, hmax)
    return score_blocks(qt, idx, isc, slot, table, bs, G, phi, agg, w, hmax, n_sink, nb - n_win, heap_s, heap_b)

