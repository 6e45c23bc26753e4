"""The explicit-SIMD rope + KV append (rope_simd.rope_append_simd) on every SIMD path this
CPU runs, against a plain NumPy oracle and against the scalar fused.rope_append.

Shapes: SmolLM2 (G=3, D=64, NORM pairs), Qwen2.5-0.5B (G=7, D=64, NEOX, biases),
Qwen2.5-1.5B (G=6, D=128, NEOX) and small odd ones (G=1, D=32); rows at odd positions,
scattered pool blocks, several rows per call.
"""

import naive
import numpy as np
import pytest

from llcinfer.kernels import isa as isa_mod
from llcinfer.kernels.fused import rope_append, rope_table
from llcinfer.kernels.rope_simd import rope_append_simd, rope_simd_ok
from llcinfer.kernels.simd import lanes, make_tag

SIMD_ISAS = [i for i in isa_mod.supported_isas() if i != "generic"]
SHAPES = [(3, 3, 64, False, False), (7, 2, 64, True, True), (6, 2, 128, True, True), (1, 3, 32, False, True),
          (2, 1, 32, True, False)]  # (G, KVH, D, neox, has_bias)


def _oracle_rope(x, pos, inv_freq, neox):
    """x  # [D] f64 rotated at position pos, with the kernels' f32 cos / sin."""
    return naive.rope(x[None, None], [pos], inv_freq, neox, f32_angles=True)[0, 0]


def _case(G, KVH, D, neox, has_bias, M, seed):
    rng = np.random.default_rng(seed)
    H, L, bs, n_blocks = G * KVH, 3, 16, 40
    q = rng.standard_normal((M, H * D)).astype(np.float32) * 3  # [M, H*D]
    q[0, :5] = [1e-6, -3e-7, 6.1e-5, 7e4, -2.9e-8]  # f16 subnormals, overflow, underflow
    k = rng.standard_normal((M, KVH * D)).astype(np.float32)  # [M, KVH*D]
    v = rng.standard_normal((M, KVH * D)).astype(np.float32)
    bq = rng.standard_normal((L, H * D)).astype(np.float32) * has_bias  # [L, H*D]
    bk = rng.standard_normal((L, KVH * D)).astype(np.float32) * has_bias  # [L, KVH*D]
    bv = rng.standard_normal((L, KVH * D)).astype(np.float32) * has_bias
    pos = np.array([5, 17, 33, 129, 1000][:M], np.int64)
    seq = np.array([0, 1, 0, 1, 0][:M], np.int64)
    tables = rng.permutation(n_blocks).astype(np.int32).reshape(2, -1)  # [n_seq, blocks] scattered
    inv_freq = 10000.0 ** (-np.arange(0, D, 2, dtype=np.float64) / D)
    cs = np.zeros((M, D // 2, 2), np.float32)  # [M, D/2, 2]
    rope_table(pos, inv_freq, cs)
    pool = np.zeros((n_blocks, 2 * L * KVH * bs * D), np.uint16)  # [block, elems] head-major f16
    return dict(q=q, k=k, v=v, bq=bq, bk=bk, bv=bv, pos=pos, seq=seq, tables=tables, cs=cs, pool=pool,
                inv_freq=inv_freq, L=L, bs=bs)


@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("G,KVH,D,neox,has_bias", SHAPES)
@pytest.mark.parametrize("M", [1, 3])
def test_rope_append_simd_matches_oracle_and_scalar(isa, G, KVH, D, neox, has_bias, M):
    if not rope_simd_ok(D, lanes(isa)):
        pytest.skip(f"D={D} is not a multiple of 2W on {isa}")
    a = _case(G, KVH, D, neox, has_bias, M, seed=G * 100 + D + M)
    b = {n: np.copy(x) for n, x in a.items()}
    q0, k0 = a["q"].copy(), a["k"].copy()  # [M, H*D], [M, KVH*D] before the call
    layer = 1
    for kvh in range(KVH):
        rope_append_simd(a["q"], a["k"], a["v"], a["bq"], a["bk"], a["bv"], has_bias, kvh, G, D, a["pos"], a["seq"],
                         a["cs"], neox, True, a["pool"], a["tables"], layer, KVH, a["bs"], make_tag(isa))
        rope_append(b["q"], b["k"], b["v"], b["bq"][layer], b["bk"][layer], b["bv"][layer], has_bias, kvh, G, D,
                    b["pos"], b["seq"], b["cs"], neox, True, b["pool"], 1, b["tables"], layer, KVH, a["bs"])
    H, bs = G * KVH, a["bs"]
    for m in range(M):
        qin = (q0[m] + a["bq"][layer]).astype(np.float64)
        kin = (k0[m] + a["bk"][layer]).astype(np.float64)
        for h in range(H):
            want = _oracle_rope(qin[h * D:(h + 1) * D], a["pos"][m], a["inv_freq"], neox)
            with np.errstate(over="ignore"):  # the 7e4 overflows f16 to inf, as in the kernels
                want = want.astype(np.float32).astype(np.float16).astype(np.float64)  # q is rounded to f16
            got = a["q"][m, h * D:(h + 1) * D].astype(np.float64)
            # equal, or one f16 ulp apart where the f32 value sits at a rounding boundary
            np.testing.assert_allclose(got, want, rtol=2 ** -10, atol=2 ** -24)
        for j in range(KVH):
            want = _oracle_rope(kin[j * D:(j + 1) * D], a["pos"][m], a["inv_freq"], neox)
            np.testing.assert_allclose(a["k"][m, j * D:(j + 1) * D], want, rtol=1e-5, atol=1e-6)
    # against the scalar form: f32 within an ulp or two, stored f16 within one f16 ulp
    np.testing.assert_allclose(a["q"], b["q"], rtol=2 ** -10, atol=1e-7)
    np.testing.assert_allclose(a["k"], b["k"], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(a["v"], b["v"])
    diff = np.abs(a["pool"].astype(np.int32) - b["pool"].astype(np.int32))
    assert diff.max() <= 1 and (diff != 0).mean() < 0.01
    assert np.count_nonzero(a["pool"]) >= M * KVH * 2 * D * 0.9  # k and v of every row landed
    # v landed exactly (no rope on v): its f16 bits are numpy's rounding of the f32 values
    for m in range(M):
        blk, slot = a["tables"][a["seq"][m], a["pos"][m] // bs], a["pos"][m] % bs
        for j in range(KVH):
            base = (((layer * KVH + j) * a["pool"].shape[0] + blk) * 2 + 1) * bs * D + slot * D
            got = a["pool"].reshape(-1)[base:base + D]
            np.testing.assert_array_equal(got, a["v"][m, j * D:(j + 1) * D].astype(np.float16).view(np.uint16))
            kt = (((layer * KVH + j) * a["pool"].shape[0] + blk) * 2) * bs * D + slot
            got_k = a["pool"].reshape(-1)[kt:kt + D * bs:bs]
            np.testing.assert_array_equal(got_k, a["k"][m, j * D:(j + 1) * D].astype(np.float16).view(np.uint16))


@pytest.mark.parametrize("isa", SIMD_ISAS)
def test_q_rounding_is_numpys_f16_rounding(isa):
    """The q written back equals numpy's float32 -> float16 -> float32 on every value kind
    (ties, subnormals, overflow to inf) — the rounding llama.cpp applies to Q."""
    G, KVH, D = 1, 1, 32
    a = _case(G, KVH, D, False, False, 1, seed=7)
    rng = np.random.default_rng(1)
    vals = np.concatenate([rng.standard_normal(8) * 1e-5, [2049.0, 2051.0, 65519.0, 65520.0, -1e-8, 3e-8],
                           rng.standard_normal(18) * 100]).astype(np.float32)  # [32]
    a["cs"][:] = 0.0
    a["cs"][:, :, 0] = 1.0  # cos 1, sin 0: the rotation is the identity
    a["q"][0, :] = vals
    rope_append_simd(a["q"], a["k"], a["v"], a["bq"], a["bk"], a["bv"], False, 0, G, D, a["pos"], a["seq"], a["cs"],
                     False, True, a["pool"], a["tables"], 0, KVH, a["bs"], make_tag(isa))
    with np.errstate(over="ignore"):
        want = vals.astype(np.float16).astype(np.float32)  # 65520 -> inf
    np.testing.assert_array_equal(a["q"][0], want)
