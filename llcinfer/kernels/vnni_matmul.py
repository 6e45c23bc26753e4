"""Integer dot-product matmul on repacked weights (vpdpbusd; see simd.py, repack.py).

    y[m, n] = sum_blocks  dw[n, b] * dx[m, b] * sum_k w_int[n, k] * q[m, k]   (+ min terms)

Activations come as int8 ``q`` [M, K] with per-block scales ``xd`` and block sums ``xs``
(act_quant.quantize_activations_int): exactly the values llama.cpp feeds its own dot
products, so results differ from the float path with llama_rounding only by float
summation order.

A group of W weight rows (16 with zmm, 8 with ymm) is one vector of accumulators: lane r
holds row r, so nothing is reduced horizontally.  Per 4 values of k: one vector load gives
every row 4 weight bytes (u8 operand), the 4 activation bytes are broadcast (s8 operand),
and vpdpbusd adds the 4 products into each row's i32 lane.  Signed weights are made
unsigned by a bias that the block sum of the activations takes back out:
    Q4_0: (nib - 8)    Q5_0: (q5 - 16)    Q8_0: (q + 128) - 128    Q6_K: (q6 - 32)
(the bias times the block sum initialises the block's i32 accumulator; Q6_K adds -32
scale x block sum, two sub-blocks per vpdpwssd, into its sub-blocks' accumulator).
Q4_1 adds its mins times the block sums in float, Q4_K in integer (vpdpwssd again: Q8_K
block sums are int16, two to an i32 lane).  AVX2 has no vpdpbusd: vpmaddubsw +
vpmaddwd do its work (simd_math._dot_ir; the K-quants' sub-block scales ride in that
vpmaddwd, simd_math.vdot_u6_scaled), and Q8_0 there is dotted as signed bytes
(llama.cpp's sign trick), its bias term unused.

Small batches: rows of x are taken 4 at a time, each weight block is loaded and decoded
once and fed to the 4 rows' accumulators; a remainder of 3 takes the 4-row loop without
its fourth row, of 2 or 1 a tile of its own (M = 3: one pass, M = 7: 4 + 3).  A group's
weights stay in L1/L2 while every row of x passes over them.  The one-row loops (decode)
and the 32-value types' 2-row loop prefetch the weight stream a little ahead
(``vnni_blocks.W_AHEAD``, ``vnni_kquant.K_AHEAD`` bytes; groups are contiguous, so past a
group lies the next); the 4-row loops and the K-quants' 2-row loop, in the first pass over
a group, prefetch the next group, block by block: a tile of a verification step computes
long enough per group for the whole next group to arrive from DRAM.  The loops over one group, per weight type, are
in vnni_blocks.py, vnni_kquant.py (Q4_K) and vnni_q6k.py; this module holds the drivers.
"""

from numba import prange

from ..jit import inline_kernel, kernel, parallel_kernel
from ..weights.repack import Q4_0, Q4_1, Q4_K, Q5_0, Q6_K, Q8_0
from .simd import addr, stf, vlane, vlanes, vstore, vtag
from .vnni_blocks import run32_1, run32_2, run32_4
from .vnni_kquant import runk4_1, runk4_2, runk4_4
from .vnni_q6k import runk6_1, runk6_2, runk6_4


# ------------------------------------------------------------------------- drivers
@kernel
def _put(ya, ny, m, n0, nv, acc, tag):
    """y[m, n0:n0+nv] = the first nv lanes of acc;  y  # [M, ny] f32 at address ya."""
    if nv == vlanes(tag):
        vstore(ya, 4 * (m * ny + n0), acc)
    else:
        for i in range(nv):
            stf(ya, m * ny + n0 + i, vlane(acc, i))


@inline_kernel
def _rows(qt, wa, g, xa, xda, xsa, M, K, ya, ny, tag):
    """group_rows for one weight type: inlined where qt is a constant, so that the block
    loops below carry no branch on the type (with them, and 16 ymm registers on AVX2, the
    decoded weight vectors were spilled to the stack in every block)."""
    W = vlanes(tag)
    n0 = g * W
    nv = min(W, ny - n0)
    m = 0
    while m + 4 <= M:
        if qt == Q4_K:
            a0, a1, a2, a3 = runk4_4(wa, xa, xda, xsa, K, m, 4, tag)
        elif qt == Q6_K:
            a0, a1, a2, a3 = runk6_4(wa, xa, xda, xsa, K, m, 4, tag)
        else:
            a0, a1, a2, a3 = run32_4(qt, wa, xa, xda, xsa, K, m, 4, tag)
        _put(ya, ny, m, n0, nv, a0, tag)
        _put(ya, ny, m + 1, n0, nv, a1, tag)
        _put(ya, ny, m + 2, n0, nv, a2, tag)
        _put(ya, ny, m + 3, n0, nv, a3, tag)
        m += 4
    if m + 3 == M:
        if qt == Q4_K:
            a0, a1, a2, _ = runk4_4(wa, xa, xda, xsa, K, m, 3, tag)
        elif qt == Q6_K:
            a0, a1, a2, _ = runk6_4(wa, xa, xda, xsa, K, m, 3, tag)
        else:
            a0, a1, a2, _ = run32_4(qt, wa, xa, xda, xsa, K, m, 3, tag)
        _put(ya, ny, m, n0, nv, a0, tag)
        _put(ya, ny, m + 1, n0, nv, a1, tag)
        _put(ya, ny, m + 2, n0, nv, a2, tag)
        m += 3
    if m + 2 == M:
        if qt == Q4_K:
            a0, a1 = runk4_2(wa, xa, xda, xsa, K, m, tag)
        elif qt == Q6_K:
            a0, a1 = runk6_2(wa, xa, xda, xsa, K, m, tag)
        else:
            a0, a1 = run32_2(qt, wa, xa, xda, xsa, K, m, tag)
        _put(ya, ny, m, n0, nv, a0, tag)
        _put(ya, ny, m + 1, n0, nv, a1, tag)
        m += 2
    if m < M:
        if qt == Q4_K:
            a0 = runk4_1(wa, xa, xda, xsa, K, m, tag)
        elif qt == Q6_K:
            a0 = runk6_1(wa, xa, xda, xsa, K, m, tag)
        else:
            a0 = run32_1(qt, wa, xa, xda, xsa, K, m, tag)
        _put(ya, ny, m, n0, nv, a0, tag)


@kernel
def group_rows(qt, wa, g, xa, xda, xsa, M, K, ya, ny, tag):
    """y[:, g W : g W + W] = x @ W[group g].T, everything by address: the packed group at
    wa; the int8 activations [M, K] at xa, their block scales at xda and sums at xsa;
    y  # [M, ny] f32 at ya; tag a VTag.  Array arguments would be reference counted at
    every call (an atomic add on the array's counter, at entry and at exit); the decode step
    with address-only tile calls and per-worker tile regions took 0.90x the time per token
    of the array form (SmolLM2, 2 threads, d0; the regions alone: 0.96x).  One branch on
    the type per call, then that type's own loops (_rows with a constant type)."""
    if qt == Q4_K:
        _rows(Q4_K, wa, g, xa, xda, xsa, M, K, ya, ny, tag)
    elif qt == Q6_K:
        _rows(Q6_K, wa, g, xa, xda, xsa, M, K, ya, ny, tag)
    elif qt == Q4_0:
        _rows(Q4_0, wa, g, xa, xda, xsa, M, K, ya, ny, tag)
    elif qt == Q4_1:
        _rows(Q4_1, wa, g, xa, xda, xsa, M, K, ya, ny, tag)
    elif qt == Q5_0:
        _rows(Q5_0, wa, g, xa, xda, xsa, M, K, ya, ny, tag)
    else:
        _rows(Q8_0, wa, g, xa, xda, xsa, M, K, ya, ny, tag)


@parallel_kernel
def vnni_matmul(xq, xd, xs, w, qt, y, tag):
    """y  # [M, N] f32 = x @ W.T

    xq  # [M, K] int8, xd  # [M, K/B] f32 block scales, xs  # [M, ...] int32 block sums
    w   # [ceil(N/W), bytes] uint8 repacked (repack.py) with W = vlanes(tag)
    The pool's threads get addresses (group_rows), not slices of the shared arrays.
    """
    M, K = xq.shape
    xa, xda, xsa, ya, wa = addr(xq), addr(xd), addr(xs), addr(y), addr(w)
    vt = vtag(tag)
    for g in prange(w.shape[0]):
        group_rows(qt, wa + g * w.strides[0], g, xa, xda, xsa, M, K, ya, y.shape[1], vt)


@parallel_kernel
def vnni_matmul3(xq0, xd0, xs0, w0, q0, y0, xq1, xd1, xs1, w1, q1, y1, xq2, xd2, xs2, w2, q2, y2, tag):
    """Up to three products of one layer input in one pool launch (as quant_matmul3); an
    absent third has w2 with 0 groups."""
    G0, G1, G2 = w0.shape[0], w1.shape[0], w2.shape[0]
    M, K0 = xq0.shape
    K1, K2 = xq1.shape[1], xq2.shape[1]
    x0, d0, s0, a0, o0 = addr(xq0), addr(xd0), addr(xs0), addr(w0), addr(y0)
    x1, d1, s1, a1, o1 = addr(xq1), addr(xd1), addr(xs1), addr(w1), addr(y1)
    x2, d2, s2, a2, o2 = addr(xq2), addr(xd2), addr(xs2), addr(w2), addr(y2)
    st0, st1, st2 = w0.strides[0], w1.strides[0], w2.strides[0]
    n0, n1, n2 = y0.shape[1], y1.shape[1], y2.shape[1]
    vt = vtag(tag)
    for g in prange(G0 + G1 + G2):
        if g < G0:
            group_rows(q0, a0 + g * st0, g, x0, d0, s0, M, K0, o0, n0, vt)
        elif g < G0 + G1:
            h = g - G0
            group_rows(q1, a1 + h * st1, h, x1, d1, s1, M, K1, o1, n1, vt)
        else:
            h = g - G0 - G1
            group_rows(q2, a2 + h * st2, h, x2, d2, s2, M, K2, o2, n2, vt)


@parallel_kernel
def vnni_matmul_table(mats, acts, M, y, tag, n_chunks):
    """Many independent products in one pool launch, each worker taking its 1/n_chunks of
    every matrix's row groups in turn (no barrier between matrices): the weight stream of
    a decode step without its dependencies (engine/calibrate.py times it).

    mats  # [n, 5] int64: packed weight address, row groups, bytes per group, qtype, act row
    acts  # [a, 4] int64: int8 activations address, block scales address, block sums address, K
    y     # [M, >= lanes * max groups] f32 scratch output
    """
    vt = vtag(tag)
    ya, ny = addr(y), y.shape[1]
    for c in prange(n_chunks):
        for m in range(mats.shape[0]):
            G = mats[m, 1]
            a = mats[m, 4]
            for g in range(c * G // n_chunks, (c + 1) * G // n_chunks):
                group_rows(mats[m, 3], mats[m, 0] + g * mats[m, 2], g, acts[a, 0], acts[a, 1], acts[a, 2], M,
                           acts[a, 3], ya, ny, vt)
