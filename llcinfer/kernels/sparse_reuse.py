"""Reusing a full layer's block selection at later rows of the same sequence
(SparseConfig.reuse_steps): adjacent decode steps pick mostly the same blocks, so a row
whose query stays close to that of the row that last ran the scorer (its anchor, at most
R rows back) skips the scorer and takes the anchor's blocks:

    reuses   iff  the row selects, the anchor selected, 0 < n - n_a <= R  (keys: n, n_a)
                  and  mean_h cos(q[h], q_a[h]) >= c_min        (rotated query heads)
    table    = [sinks, the anchor's chosen blocks, the blocks that left the window since
                the anchor (all attended then), the row's window]     (position order)

So a reused table holds every block the anchor attended that is not a sink or window
block of the row, and the row's own sinks and window; the index keys it does not score
are those of the tokens written since the anchor, which are in its window.  The anchor
state of a row  (conf: SP_REUSE = R, SP_REUSE_COS = c_min x 1e6):
    anchor  # [2] int64  (keys of the anchor row, candidate blocks it chose; -1: none)
    chosen  # [>= its count] int32 the candidate indices it chose (ascending)
    q_a     # [H, D] f32 its query

The cosine is taken on the query itself, not on its projection on the index basis: the
projection reads the layer's basis, which the weights streamed since have evicted: with
it the decode step of SmolLM2 at 8K keys ran 7 % slower when no row reused.
"""

import numpy as np

from ..jit import kernel
from .sparse_index import SP_REUSE, SP_REUSE_COS, SP_SINK, SP_WINDOW, kept_blocks, row_selects

A_KEYS, A_CHOSE = 0, 1  # fields of an anchor


@kernel
def query_cos(q, q_a):
    """Mean over the heads of cos(q[h], q_a[h])  (q, q_a  # [H, D]; a zero head: 0)."""
    H, D = q.shape
    total = 0.0
    for h in range(H):
        dot, n1, n2 = 0.0, 0.0, 0.0
        for d in range(D):
            dot += q[h, d] * q_a[h, d]
            n1 += q[h, d] * q[h, d]
            n2 += q_a[h, d] * q_a[h, d]
        if n1 > 0 and n2 > 0:
            total += dot / np.sqrt(n1 * n2)
    return total / H


@kernel
def reuses(q, n_keys, anchor, q_a, bs, conf):
    """Whether the query row  q  # [H, D] with ``n_keys`` keys takes the blocks of its
    anchor (``anchor``, its query  q_a  # [H, D]): reuse is on, the row selects, the anchor
    selected and is 1 .. R rows back, and the queries are close enough."""
    if conf[SP_REUSE] <= 0 or anchor[A_CHOSE] < 0 or not row_selects(n_keys, bs, conf):
        return False
    back = n_keys - anchor[A_KEYS]
    return 0 < back <= conf[SP_REUSE] and query_cos(q, q_a) * 1e6 >= conf[SP_REUSE_COS]


@kernel
def gather_reused(table, n_keys, bs, conf, anchor, chosen, out):
    """The gathered table of a row that reuses (see the module doc) into ``out``; returns
    the keys it holds."""
    nb = (n_keys + bs - 1) // bs
    n_sink, n_win = kept_blocks(n_keys, bs, conf[SP_SINK], conf[SP_WINDOW])
    a_keys = anchor[A_KEYS]
    a_nb = (a_keys + bs - 1) // bs
    a_sink, a_win = kept_blocks(a_keys, bs, conf[SP_SINK], conf[SP_WINDOW])
    n = 0
    for i in range(n_sink):
        out[n] = table[i]
        n += 1
    for i in range(anchor[A_CHOSE]):
        out[n] = table[a_sink + chosen[i]]
        n += 1
    for b in range(max(a_nb - a_win, n_sink), nb):  # the anchor's window blocks (now candidates) and the row's
        out[n] = table[b]
        n += 1
    return (n - 1) * bs + n_keys - (nb - 1) * bs  # every gathered block is full but the last
