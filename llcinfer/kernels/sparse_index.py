"""The sparse-attention indexer's kernels: index keys appended beside the KV, and the
block scorer with its top-k.

Index keys (one per token, layer and KV head) are the post-RoPE key projected on a
per-(layer, KV head) basis of rank r, stored int8 (+ 128, as u8) with one f32 scale per
token and head:

    y = basis[h] @ k[h];   s = max|y| / 127;   q = round(y / s)        (half away from zero)
    idx  # [full layer, pool block, kv_head, r/4, token, 4] uint8 q + 128: the 4 ranks of a
         #   quad of one token are one 32-bit lane, a block's tokens the lanes of a vector
    isc  # [full layer, pool block, kv_head, token] f32

The scorer follows DSA's form over the query heads h (G of them per KV head):

    qt[h]   = scale * hbasis[h] @ q[h]                  the query head on its KV head's basis
    u[h]    = round(qt[h] / c[h]),  c[h] = max|qt[h]| / 127       (int8, as the keys)
    x[h, t] = c[h] isc[t, kvh(h)] (u[h] . idx[t, kvh(h)])      (exact int dot: vpdpbusd)
    I[t]    = sum_h w[h] phi(x[h, t])
        phi = relu:  max(x, 0)
        phi = exp:   exp(min(x - m[h], 60)),  m[h] = max of x[h, .] over the always-kept tokens
                     (as 2**(min(x log2e - m[h] log2e, 60 log2e)): simd_exp.vexp2)
    score(block) = max_t I[t] (agg max)  or  sum_t I[t] (agg sum)

and picks the K best candidate blocks (ties: the earlier) by a threshold from one
partition of the scores.  Candidates are the full blocks between the sink blocks (the
first) and the window blocks (the last, the partial one among them).  One vector of W
lanes holds W tokens of one block: per (block, KV head) 4 key loads serve all G query
heads (r/4 vpdpbusd each), phi runs on whole vectors; a row's candidates may be scored
in parts on several threads (score_part; sparse_rows.py runs rows of a chunk).  The u8 x s8 dot needs the key + 128: each quad's dot starts at -128 sum u[quad].
"""

import numpy as np

from ..jit import inline_kernel, kernel
from .simd import addr, vbcast4, vlanes, vload, vloadf, vsplat, vstore
from .simd_exp import vexp2
from .simd_math import vadd, vcvt, vdot_q8, vfma, vhmax, vhsum, vmaxf, vminf, vmul, vzero_f, vzero_i

PHI_RELU, PHI_EXP = 0, 1
AGG_MAX, AGG_SUM = 0, 1
EXP_CAP = np.float32(60.0)  # exp(x - m) of a token far above the kept tokens' max stays finite
LOG2E = np.float32(1.4426950408889634)  # exp(x) = 2**(x log2 e)
_NEG = np.float32(-3.0e38)
# (candidate block, query head) pairs per thread below which one thread scores alone: ~10 ns
# a pair on Zen 4, so 6144 pairs take ~60 us, about a parallel region's launch
PARALLEL_WORK = 6144
PAD_LANES = 16  # the index arrays' padding: a vector of up to 16 lanes read at the last token
# fields of the int64 config the selection kernels read (SparseConfig.kernel_conf);
# SP_REUSE, SP_REUSE_COS: sparse_reuse.py (rows back, query cosine x 1e6)
SP_MIN_CONTEXT, SP_SINK, SP_WINDOW, SP_K_BLOCKS, SP_PHI, SP_AGG, SP_REUSE, SP_REUSE_COS = range(8)
SP_FIELDS = 8
# fields of the per-layer counts the executor keeps of its sparse rows (SparseAttention.count_into)
COUNT_ROWS, COUNT_ATTENDED, COUNT_TOTAL, COUNT_SELECTIONS, COUNT_REUSED = range(5)
COUNT_FIELDS = 5


@kernel
def store_index_rows(k, basis, pos, seq, tables, bs, slot, idx, isc):
    """Index keys of every row into full-layer ``slot``.

    k  # [M, KVH*D] f32 rotated keys;  basis  # [KVH, r, D] f32 (this layer's);
    pos, seq  # [M] slot and sequence of each row;  tables  # [n_seq, blocks] int32."""
    y = np.empty(basis.shape[1], np.float32)  # [r] the projected key of one (row, head)
    for m in range(k.shape[0]):
        p = pos[m]
        for h in range(basis.shape[0]):
            store_index_key(k[m], h, basis, tables[seq[m], p // bs], p % bs, slot, idx, isc, y)


@kernel
def store_index_key(k_row, h, basis, blk, j, slot, idx, isc, y):
    """The index key of KV head h of one token (k_row  # [KVH*D] f32 rotated) into token j
    of pool block ``blk``, full-layer ``slot``;  y  # [r] f32 scratch."""
    r, D = basis.shape[1], basis.shape[2]
    amax = np.float32(0.0)
    for i in range(r):
        acc = np.float32(0.0)
        for d in range(D):
            acc += basis[h, i, d] * k_row[h * D + d]
        y[i] = acc
        amax = max(amax, abs(acc))
    s = amax / np.float32(127.0)
    inv = np.float32(1.0) / s if s > 0 else np.float32(0.0)
    isc[slot, blk, h, j] = s
    for i in range(r):
        v = y[i] * inv
        iv = np.int64(v + np.float32(0.5)) if v >= 0 else -np.int64(np.float32(0.5) - v)
        idx[slot, blk, h, i // 4, j, i % 4] = np.uint8(min(127, max(-127, iv)) + 128)


@inline_kernel
def _head_dots(ia, kb, R4, bs, qa, qb, qcorr, hh, tag):
    """[W] int32: u[hh] . key of tokens j0 .. j0+W-1 (kb: byte offset of their quad 0 in
    idx, qb: of u[hh] in qw).  Quad by quad: vdot_q8 on AVX2 returns the quad's dot alone
    (no accumulator), on VNNI acc + dot(key + 128, u), acc = qcorr[hh, c] its correction."""
    acc = vzero_i(tag)
    for c in range(R4):
        acc = vadd(acc, vdot_q8(vsplat(qcorr[hh, c], tag), (vload(ia, kb + c * bs * 4, tag),),
                                (vbcast4(qa, qb + 4 * c, tag),), tag))
    return acc


@kernel
def _kept_max(idx, isc, qw, qsc, qcorr, slot, table, n_keys, bs, G, n_sink, n_win, hmax, tag):
    """hmax  # [H] = max of x[h, t] over the sink and window blocks' tokens (t < n_keys)."""
    NB, KVH, R4 = idx.shape[1], idx.shape[2], idx.shape[3]
    W = vlanes(tag)
    ia, sa, qa = addr(idx), addr(isc), addr(qw)
    lanes = np.empty(W, np.float32)  # [W] one vector, for a partial one's valid lanes
    la = addr(lanes)
    nb = (n_keys + bs - 1) // bs
    hmax[:] = _NEG
    for b in range(nb):
        if n_sink <= b < nb - n_win:
            continue
        n_tok = min(bs, n_keys - b * bs)
        for j0 in range(0, n_tok, W):
            valid = min(W, n_tok - j0)
            for h in range(KVH):
                hb = (slot * NB + table[b]) * KVH + h  # (slot, block, head) row
                iv = vloadf(sa, 4 * (hb * bs + j0), tag)  # [W] token scales
                for g in range(G):
                    hh = h * G + g
                    acc = _head_dots(ia, (hb * R4 * bs + j0) * 4, R4, bs, qa, hh * R4 * 4, qcorr, hh, tag)
                    x = vmul(vmul(vcvt(acc), iv), vsplat(qsc[hh], tag))
                    if valid == W:
                        m = vhmax(x)
                    else:
                        vstore(la, 0, x)
                        m = lanes[0]
                        for j in range(1, valid):
                            m = max(m, lanes[j])
                    hmax[hh] = max(hmax[hh], m)


@inline_kernel
def _phi_add(tok, acc, iv, c, m, w, phi, cap, zero, tag):
    """tok + w phi(x), x = acc iv c the head's logits of W tokens (phi exp: exp(min(x - m, 60))
    as 2**(min(t c log2e - m log2e, 60 log2e)); cap is 60 log2e)."""
    t = vmul(vcvt(acc), iv)
    if phi == PHI_EXP:
        e = vexp2(vminf(vfma(t, vsplat(c * LOG2E, tag), vsplat(-m * LOG2E, tag)), cap))
    else:
        e = vmaxf(vmul(t, vsplat(c, tag)), zero)
    return vfma(vsplat(w, tag), e, tok)


@kernel
def _score_range(idx, isc, qw, qsc, qcorr, w, hmax, slot, table, bs, G, phi, agg, b0, b1, scores, tag):
    """scores[b - b0] for the full candidate blocks b0 .. b1-1 (sequence block slots).
    At rank 16 a block's 4 key quads are loaded once per KV head for its G query heads,
    each head's dot one vdot_q8 over the 4 quads started at its whole correction (on AVX2
    the keys' sign-trick half, xor and abs, is then G-invariant and hoisted); other ranks
    dot quad by quad (_head_dots)."""
    NB, KVH, R4 = idx.shape[1], idx.shape[2], idx.shape[3]
    W = vlanes(tag)
    ia, sa, qa = addr(idx), addr(isc), addr(qw)
    lanes = np.empty(W, np.float32)  # [W] one vector, for a partial one's valid lanes (bs % W)
    la = addr(lanes)
    cap, zero = vsplat(EXP_CAP * LOG2E, tag), vzero_f(tag)
    for b in range(b0, b1):
        total = np.float32(0.0) if agg == AGG_SUM else _NEG
        for j0 in range(0, bs, W):
            tok = vzero_f(tag)  # [W] I[t] of tokens j0 ..
            for h in range(KVH):
                hb = (slot * NB + table[b]) * KVH + h
                iv = vloadf(sa, 4 * (hb * bs + j0), tag)
                kb = (hb * R4 * bs + j0) * 4  # byte offset of the tokens' quad 0
                if R4 == 4:
                    keys = (vload(ia, kb, tag), vload(ia, kb + 4 * bs, tag), vload(ia, kb + 8 * bs, tag),
                            vload(ia, kb + 12 * bs, tag))
                    for g in range(G):
                        hh = h * G + g
                        qb = 16 * hh
                        corr = qcorr[hh, 0] + qcorr[hh, 1] + qcorr[hh, 2] + qcorr[hh, 3]
                        acc = vdot_q8(vsplat(corr, tag), keys, (vbcast4(qa, qb, tag), vbcast4(qa, qb + 4, tag),
                                                                vbcast4(qa, qb + 8, tag), vbcast4(qa, qb + 12, tag)),
                                      tag)
                        tok = _phi_add(tok, acc, iv, qsc[hh], hmax[hh], w[hh], phi, cap, zero, tag)
                else:
                    for g in range(G):
                        hh = h * G + g
                        acc = _head_dots(ia, kb, R4, bs, qa, hh * R4 * 4, qcorr, hh, tag)
                        tok = _phi_add(tok, acc, iv, qsc[hh], hmax[hh], w[hh], phi, cap, zero, tag)
            valid = min(W, bs - j0)
            if valid == W:
                part = vhsum(tok) if agg == AGG_SUM else vhmax(tok)
            else:
                vstore(la, 0, tok)
                part = lanes[0]
                for j in range(1, valid):
                    part = part + lanes[j] if agg == AGG_SUM else max(part, lanes[j])
            total = total + part if agg == AGG_SUM else max(total, part)
        scores[b - b0] = total


@kernel
def top_blocks(scores, k, out):
    """out[:k] = indices of the k largest scores  # [n] (ties: the lower index), ascending;
    returns how many (min(k, n)).  One partition gives the k-th largest as a threshold."""
    n = scores.size
    if k >= n:
        for i in range(n):
            out[i] = i
        return n
    thr = np.partition(scores, n - k)[n - k]
    ties = k
    for i in range(n):
        if scores[i] > thr:
            ties -= 1
    c = 0
    for i in range(n):
        s = scores[i]
        if s > thr or (s == thr and ties > 0):
            if s == thr:
                ties -= 1
            out[c] = i
            c += 1
    return c


@kernel
def quantize_query(q, hbasis, scale, qw, qsc, qcorr):
    """u = qw  # [H, r] int8, c = qsc  # [H] and qcorr  # [H, r/4] int32 (-128 sum of
    each quad of u[h]) of the query row  q  # [H, D] on  hbasis  # [H, r, D], times scale."""
    H, r, D = hbasis.shape
    qt = np.empty(r, np.float32)  # [r] one query head on its basis
    for hh in range(H):
        amax = np.float32(0.0)
        for i in range(r):
            acc = np.float32(0.0)
            for d in range(D):
                acc += hbasis[hh, i, d] * q[hh, d]
            qt[i] = acc * scale
            amax = max(amax, abs(qt[i]))
        c = amax / np.float32(127.0)
        inv = np.float32(1.0) / c if c > 0 else np.float32(0.0)
        qsc[hh] = c
        for i in range(r // 4):
            qcorr[hh, i] = 0
        for i in range(r):
            v = qt[i] * inv
            iv = min(127, max(-127, np.int64(v + np.float32(0.5)) if v >= 0 else -np.int64(np.float32(0.5) - v)))
            qw[hh, i] = iv
            qcorr[hh, i // 4] -= 128 * iv


@kernel
def _query_and_kept_max(q, hbasis, scale, idx, isc, slot, table, n_keys, bs, phi, n_sink, n_win, qw, qsc, qcorr,
                        hmax, tag):
    """The quantized query (qw, qsc, qcorr) and, for phi exp, the kept tokens' max (hmax)."""
    quantize_query(q, hbasis, scale, qw, qsc, qcorr)
    if phi == PHI_EXP:
        _kept_max(idx, isc, qw, qsc, qcorr, slot, table, n_keys, bs, hbasis.shape[0] // idx.shape[2], n_sink, n_win,
                  hmax, tag)


@kernel
def _gather_top(scores, table, nb, n_sink, n_win, k_blocks, out, chosen):
    """out = [sink blocks, the k_blocks best candidates (position order), window blocks]
    of ``table``, chosen  # [>= k_blocks] int32 the candidate indices picked (ascending);
    returns the length of out."""
    n_cand = nb - n_sink - n_win
    n_ch = top_blocks(scores[:n_cand], k_blocks, chosen)
    for i in range(n_sink):
        out[i] = table[i]
    for i in range(n_ch):
        out[n_sink + i] = table[n_sink + chosen[i]]
    for i in range(n_win):
        out[n_sink + n_ch + i] = table[nb - n_win + i]
    return n_sink + n_ch + n_win


@kernel
def kept_blocks(n_keys, bs, sink, window):
    """(sink blocks, window blocks) a row with ``n_keys`` keys always attends."""
    nb = (n_keys + bs - 1) // bs
    n_sink = min((sink + bs - 1) // bs, nb)
    return n_sink, min(nb - n_sink, nb - max(0, n_keys - window) // bs)


@kernel
def row_selects(n_keys, bs, conf):
    """Whether a row with ``n_keys`` keys runs the scorer: at least conf[SP_MIN_CONTEXT]
    keys and more candidate blocks than the top-k (else it attends every key)."""
    nb = (n_keys + bs - 1) // bs
    n_sink, n_win = kept_blocks(n_keys, bs, conf[SP_SINK], conf[SP_WINDOW])
    return n_keys >= conf[SP_MIN_CONTEXT] and nb - n_sink - n_win > conf[SP_K_BLOCKS]


@kernel
def score_part(q, hbasis, scale, idx, isc, slot, table, n_keys, bs, conf, w, part, n_parts, scores, tag):
    """Part ``part`` of ``n_parts`` of one query row's block scores, on the calling thread:
    scores[c] for its share of the candidates c (select_blocks' scorer; each part
    quantizes the query and takes the kept tokens' max itself).  Nothing for a row that
    does not select (row_selects).

    q  # [H, D] f32 rotated;  conf  # [SP_FIELDS] int64 (SP_*);  scores  # [>= candidates]
    f32;  the rest as select_blocks, ``slot`` the layer's full-layer slot."""
    if not row_selects(n_keys, bs, conf):
        return
    nb = (n_keys + bs - 1) // bs
    n_sink, n_win = kept_blocks(n_keys, bs, conf[SP_SINK], conf[SP_WINDOW])
    n_cand = nb - n_sink - n_win
    H, r = hbasis.shape[0], hbasis.shape[1]
    qw = np.empty((H, r), np.int8)  # [H, r] u[h]
    qsc = np.empty(H, np.float32)  # [H] c[h]
    qcorr = np.empty((H, r // 4), np.int32)  # [H, r/4] -128 sum of each quad of u[h]
    hmax = np.empty(H, np.float32)  # [H] m[h] (phi exp)
    phi, agg = conf[SP_PHI], conf[SP_AGG]
    _query_and_kept_max(q, hbasis, scale, idx, isc, slot, table, n_keys, bs, phi, n_sink, n_win, qw, qsc, qcorr,
                        hmax, tag)
    b0, b1 = n_sink + n_cand * part // n_parts, n_sink + n_cand * (part + 1) // n_parts
    _score_range(idx, isc, qw, qsc, qcorr, w, hmax, slot, table, bs, H // idx.shape[2], phi, agg, b0, b1,
                 scores[b0 - n_sink:b1 - n_sink], tag)


@kernel
def gather_selection(table, n_keys, bs, conf, scores, out, chosen):
    """After every score_part of a row: its gathered block table into ``out`` (its own
    table when it does not select) and the candidate indices it picked into ``chosen``
    (conf[SP_K_BLOCKS] of them); returns the keys the gathered table holds."""
    nb = (n_keys + bs - 1) // bs
    if not row_selects(n_keys, bs, conf):
        for i in range(nb):
            out[i] = table[i]
        return n_keys
    n_sink, n_win = kept_blocks(n_keys, bs, conf[SP_SINK], conf[SP_WINDOW])
    n = _gather_top(scores, table, nb, n_sink, n_win, conf[SP_K_BLOCKS], out, chosen)
    return (n - 1) * bs + n_keys - (nb - 1) * bs  # every gathered block is full but the last
