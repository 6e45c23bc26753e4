"""Every kernel against a NumPy oracle (float64), at odd sizes.

Oracles (tests/naive.py): ``gguf.quants.dequantize`` followed by a float64 matmul for the
weight formats; independent NumPy formulas for rms_norm, RoPE and SwiGLU.  Kernels run with
fastmath (reassociated float32 sums), so comparisons use tolerances scaled to the size of
the terms summed, not bit equality.
"""

import zlib

import naive
import numpy as np
import pytest

from llcinfer.errors import ModelFileError
from llcinfer.kernels import Linear, linear_many, rms_norm, swiglu
from llcinfer.kernels.act_quant import quantize_activations
from llcinfer.kernels.fused import rope_rows, rope_table
from llcinfer.kernels import isa as isa_mod
from llcinfer.kernels.simd import make_tag

from tiny_models import ALL_TYPES, FLOAT_TYPES, K_QUANTS, LEGACY_QUANTS, QUANT_TYPES, fake_tensor

ROWS = (1, 3, 17, 33, 129)
MS = (1, 3, 17)
COLS = {q: (32, 96, 160) for q in LEGACY_QUANTS + FLOAT_TYPES} | {q: (256, 512) for q in K_QUANTS}


# ---------------------------------------------------------------------------- matmul
def _matmul_cases():
    for q in ALL_TYPES:
        for K in COLS[q]:
            for N in ROWS:
                yield pytest.param(q, N, K, id=f"{q}-N{N}-K{K}")


@pytest.mark.parametrize("qtype,N,K", list(_matmul_cases()))
def test_linear_matches_dequantized_matmul(qtype, N, K):
    rng = np.random.default_rng(zlib.crc32(f"{qtype}-{N}-{K}".encode()))
    t = fake_tensor(rng, qtype, N, K)
    w64 = naive.weight(t)
    assert np.all(np.isfinite(w64))
    lin = Linear(t, (N, K))
    assert (lin.rows, lin.cols, lin.nbytes) == (N, K, t.data.nbytes)
    for M in MS:
        x = rng.standard_normal((M, K)).astype(np.float32)
        naive.assert_matmul_close(lin(x), x, w64)
    # caller-provided output buffer, and a non-contiguous activation view
    x = rng.standard_normal((5, K + 7)).astype(np.float32)[:, 3:K + 3]
    out = np.full((5, N), np.nan, np.float32)
    y = lin(x, out=out)
    assert y is out
    naive.assert_matmul_close(out, np.ascontiguousarray(x), w64)


@pytest.mark.parametrize("qtype", ALL_TYPES)
def test_get_rows_matches_dequantize(qtype):
    rng = np.random.default_rng(7)
    K = COLS[qtype][-1]
    t = fake_tensor(rng, qtype, 37, K)
    w64 = naive.weight(t)
    lin = Linear(t)
    for ids in ([0], [36], [5, 5, 0, 36, 17], np.arange(37)[::-1], np.array([3, 1], np.int32)):
        rows = lin.get_rows(ids)
        assert rows.shape == (len(ids), K) and rows.dtype == np.float32
        np.testing.assert_array_equal(rows.astype(np.float64), w64[np.asarray(ids)])
    np.testing.assert_allclose(lin.dequantize(), w64, rtol=0, atol=0)


@pytest.mark.parametrize("qtype", ALL_TYPES)
def test_get_rows_empty_ids(qtype):
    rng = np.random.default_rng(8)
    K = COLS[qtype][0]
    lin = Linear(fake_tensor(rng, qtype, 5, K))
    rows = lin.get_rows(np.zeros(0, np.int64))
    assert rows.shape == (0, K) and rows.dtype == np.float32


@pytest.mark.parametrize("types", [
    ("Q4_0", "Q8_0"),
    ("Q6_K", "Q4_K"),
    ("Q4_1", "Q5_0", "Q8_0"),
    ("Q4_K", "Q6_K", "Q4_0"),
    ("Q8_0", "Q8_0", "Q8_0"),
], ids="-".join)
def test_linear_many_equals_separate_calls(types):
    rng = np.random.default_rng(11)
    K = 512 if any(q in K_QUANTS for q in types) else 160
    Ns = (33, 3, 17)[:len(types)]
    lins = [Linear(fake_tensor(rng, q, n, K)) for q, n in zip(types, Ns)]
    for M in MS:
        x = rng.standard_normal((M, K)).astype(np.float32)
        outs = linear_many(x, lins)
        assert len(outs) == len(lins)
        for y, lin in zip(outs, lins):
            assert y.shape == (M, lin.rows)
            np.testing.assert_allclose(y, lin(x), rtol=1e-6, atol=1e-5)
            naive.assert_matmul_close(y, x, naive.weight(lin.info))


@pytest.mark.parametrize("types", [("F32", "Q8_0"), ("Q4_0",), ("Q4_0", "Q4_0", "Q4_0", "Q4_0"), ("F16", "BF16")],
                         ids="-".join)
def test_linear_many_fallback_paths(types):
    """One weight, four weights, or any float weight (calls of their own): each product
    against the dequantized oracle, with and without llama.cpp's input rounding."""
    rng = np.random.default_rng(12)
    lins = [Linear(fake_tensor(rng, q, 9, 96)) for q in types]
    x = rng.standard_normal((3, 96)).astype(np.float32)
    for y, lin in zip(linear_many(x, lins), lins):
        naive.assert_matmul_close(y, x, naive.weight(lin.info))
    for y, lin in zip(linear_many(x, lins, llama_rounding=True), lins):
        naive.assert_matmul_close(y, quantize_activations(x, lin.act_kind), naive.weight(lin.info))


# ---------------------------------------------------------------------------- input checks
@pytest.mark.parametrize("qtype", ["Q4_0", "Q6_K", "F32", "F16", "BF16"])
def test_linear_rejects_bad_activations(qtype):
    rng = np.random.default_rng(3)
    K = 256
    lin = Linear(fake_tensor(rng, qtype, 5, K))
    bad = [
        np.zeros((2, K + 1), np.float32),  # wrong K
        np.zeros((2, K - 32), np.float32),
        np.zeros((K,), np.float32),  # 1-D
        np.zeros((1, 2, K), np.float32),  # 3-D
        np.zeros((2, K), np.float64),  # wrong dtype
        np.zeros((2, K), np.float16),
        np.zeros((2, K), np.int32),
    ]
    for x in bad:
        out = np.full((x.shape[0] if x.ndim else 1, 5), 7.0, np.float32)
        with pytest.raises(ValueError, match=lin.name):
            lin(x, out=out)
        assert np.all(out == 7.0)  # nothing written: the check comes before the kernel
    other = Linear(fake_tensor(rng, "Q4_0", 4, K))
    with pytest.raises(ValueError):
        linear_many(np.zeros((2, K + 32), np.float32), [lin, other])
    with pytest.raises(ValueError):
        linear_many(np.zeros((2, K), np.float64), [lin, other])


def test_linear_many_rejects_mismatched_weights():
    rng = np.random.default_rng(4)
    a = Linear(fake_tensor(rng, "Q8_0", 4, 64))
    b = Linear(fake_tensor(rng, "Q8_0", 4, 96))  # different K
    with pytest.raises(ValueError, match=b.name):
        linear_many(np.zeros((1, 64), np.float32), [a, b])


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "F32", "F16", "BF16"])
def test_get_rows_rejects_out_of_range_ids(qtype):
    rng = np.random.default_rng(5)
    lin = Linear(fake_tensor(rng, qtype, 6, COLS[qtype][0]))
    for ids in ([6], [-1], [0, 1, 6], [2**40], [-2**40]):
        with pytest.raises(ValueError, match="out of range"):
            lin.get_rows(np.asarray(ids))


def test_linear_rejects_wrong_shape_and_non_matrix():
    rng = np.random.default_rng(6)
    t = fake_tensor(rng, "Q4_0", 8, 64, name="blk.0.attn_q.weight")
    with pytest.raises(ModelFileError, match="blk.0.attn_q.weight"):
        Linear(t, (9, 64))
    with pytest.raises(ModelFileError, match="blk.0.attn_q.weight"):
        Linear(t, (8, 96))
    vec = type(t)("v", t.qtype, (64,), t.data[0])
    with pytest.raises(ModelFileError, match="matrix"):
        Linear(vec)


# ---------------------------------------------------------------------------- rms_norm
@pytest.mark.parametrize("M,K", [(1, 1), (1, 64), (3, 17), (17, 257), (5, 896)])
def test_rms_norm(M, K):
    rng = np.random.default_rng(M * 1000 + K)
    x = (rng.standard_normal((M, K)) * rng.uniform(0.01, 100, (M, 1))).astype(np.float32)
    w = rng.uniform(0.5, 1.5, K).astype(np.float32)
    eps = 1e-5
    ref = naive.rms_norm(x, w, eps)
    y = np.full_like(x, np.nan)
    rms_norm(x, w, eps, y)
    np.testing.assert_allclose(y, ref, rtol=2e-5, atol=1e-6 * np.abs(ref).max())
    x2 = x.copy()
    rms_norm(x2, w, eps, x2)  # in place
    np.testing.assert_allclose(x2, ref, rtol=2e-5, atol=1e-6 * np.abs(ref).max())


def test_rms_norm_zero_row_is_finite():
    x = np.zeros((2, 32), np.float32)
    x[1] = 3.0
    y = np.empty_like(x)
    rms_norm(x, np.ones(32, np.float32), 1e-6, y)
    assert np.all(y[0] == 0.0)
    np.testing.assert_allclose(y[1], 1.0, rtol=1e-5)


# ---------------------------------------------------------------------------- rope
def _rope(x, positions, inv_freq, neox):
    """x  # [M, H, D] rotated in place by the kernels' rope (fused.rope_rows: the H heads as
    the query heads of one KV group, no bias, no rounding)."""
    M, H, D = x.shape
    cs = np.empty((M, D // 2, 2), np.float32)  # [M, D/2, 2]
    rope_table(positions, inv_freq, cs)
    q = x.reshape(M, H * D)
    k, v = np.zeros((M, D), np.float32), np.zeros((M, D), np.float32)
    none = np.zeros(H * D, np.float32)
    rope_rows(q, k, v, none, none[:D], none[:D], False, 0, H, D, cs, neox, False)


@pytest.mark.parametrize("neox", [False, True], ids=["normal", "neox"])
@pytest.mark.parametrize("M,H,D,positions", [
    (1, 1, 2, [0]),
    (1, 3, 64, [129]),
    (3, 2, 16, [7, 8, 9]),
    (17, 4, 64, list(range(33, 50))),
    (4, 3, 128, [4095, 0, 1000, 2]),
])
def test_rope_rows(neox, M, H, D, positions):
    rng = np.random.default_rng(D + M)
    x = rng.standard_normal((M, H, D)).astype(np.float32)
    pos = np.asarray(positions, np.int64)
    base = 10000.0
    inv_freq = base ** (-2.0 * np.arange(D // 2, dtype=np.float64) / D)
    ref = naive.rope(x, pos, inv_freq, neox)
    y = x.copy()
    _rope(y, pos, inv_freq, neox)
    np.testing.assert_allclose(y, ref, rtol=0, atol=2e-6 * np.abs(x).max())
    # a rotation keeps each pair's norm
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)


def test_rope_position_zero_is_identity_and_modes_differ():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 2, 8)).astype(np.float32)
    inv = 10000.0 ** (-2.0 * np.arange(4) / 8)
    y = x.copy()
    _rope(y, np.zeros(2, np.int64), inv, False)
    np.testing.assert_array_equal(y, x)
    a, b = x.copy(), x.copy()
    _rope(a, np.array([3, 4], np.int64), inv, False)
    _rope(b, np.array([3, 4], np.int64), inv, True)
    assert not np.allclose(a, b)


# ---------------------------------------------------------------------------- swiglu
_SWIGLU_PATHS = ["generic"] + [i for i in isa_mod.supported_isas() if i != "generic"]


def _swiglu_tag(isa):
    return None if isa == "generic" else make_tag(isa)


@pytest.mark.parametrize("isa", _SWIGLU_PATHS)
@pytest.mark.parametrize("M,F", [(1, 1), (3, 17), (17, 513), (2, 33), (1, 129)])
def test_swiglu(M, F, isa):
    rng = np.random.default_rng(F)
    gate = (rng.standard_normal((M, F)) * 4).astype(np.float32)
    up = rng.standard_normal((M, F)).astype(np.float32)
    ref = naive.swiglu(gate, up)
    y = np.empty_like(gate)
    swiglu(gate, up, y, _swiglu_tag(isa))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    g2 = gate.copy()
    swiglu(g2, up, g2, _swiglu_tag(isa))  # in place (the model's usage)
    np.testing.assert_allclose(g2, ref, rtol=1e-5, atol=1e-6)
    if M > 1 and F > 4:  # column slices of wider rows (the executor's tiles)
        wide_g, wide_u = np.zeros((M, F + 7), np.float32), np.zeros((M, F + 7), np.float32)
        wide_g[:, 3:3 + F], wide_u[:, 3:3 + F] = gate, up
        out = np.zeros((M, F + 7), np.float32)
        swiglu(wide_g[:, 3:3 + F], wide_u[:, 3:3 + F], out[:, 3:3 + F], _swiglu_tag(isa))
        np.testing.assert_allclose(out[:, 3:3 + F], ref, rtol=1e-5, atol=1e-6)
        assert not out[:, :3].any() and not out[:, 3 + F:].any()


@pytest.mark.parametrize("isa", _SWIGLU_PATHS)
def test_swiglu_extreme_gates(isa):
    gate = np.array([[-1000.0, -100.0, -88.0, -20.0, 0.0, 20.0, 88.0, 100.0, 1000.0] * 2], np.float32)
    up = np.full_like(gate, 2.0)
    y = np.empty_like(gate)
    swiglu(gate, up, y, _swiglu_tag(isa))
    g = gate.astype(np.float64)
    with np.errstate(over="ignore"):
        ref = g / (1.0 + np.exp(-g)) * 2.0
    assert np.all(np.isfinite(y)), y
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- llama.cpp input rounding
@pytest.mark.parametrize("kind", ["Q8_0", "Q8_K", "F16", "BF16", "F32"])
def test_quantize_activations(kind):
    from llcinfer.kernels import act_quant as aq

    rng = np.random.default_rng(21)
    M, K = 33, 512
    x = (rng.standard_normal((M, K)) * rng.uniform(1e-3, 50, (M, 1))).astype(np.float32)
    x[0, :256] = 0.0  # an all-zero block
    x[1, 5] = -1e4  # a dominant negative value (Q8_K's signed scale)
    x[2, 10], x[2, 20] = -7e3, 7e3  # +max|x| and -max|x| in one block: the first one's sign
    x[3, 300], x[3, 400] = 7e3, -7e3
    y = aq.quantize_activations(x, getattr(aq, "ACT_" + kind))
    assert y.shape == x.shape and y.dtype == np.float32 and np.all(np.isfinite(y))
    if kind in ("Q8_0", "Q8_K"):
        ref, step = (naive.q8_0_round if kind == "Q8_0" else naive.q8_k_round)(x)
        assert np.all(y[0, :256] == 0.0)
        step = np.repeat(step[..., 0], 32 if kind == "Q8_0" else 256, axis=1)  # [M, K] quantization step
        off = np.abs(y - ref) > 1e-4 * step  # float32 product q * d: <= 127 x 2^-24 steps off
        # float32 vs float64 division can put a value on the other side of a .5 boundary
        assert off.mean() < 1e-3 and np.all(np.abs(y - ref)[off] <= 1.01 * step[off])
        assert np.all(np.abs(y - x) <= 0.57 * step + 1e-30)  # half a step + 127 x f16 rounding of d
    elif kind == "F16":
        np.testing.assert_array_equal(y, x.astype(np.float16).astype(np.float32))
    elif kind == "BF16":
        x64 = x.astype(np.float64)
        lo = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32).astype(np.float64)
        ulp = np.abs(lo) * 2.0 ** -7
        assert np.all(y.view(np.uint32) & 0xFFFF == 0)
        assert np.all(np.abs(y - x64) <= 0.5 * ulp * 1.0001 + 1e-30)
    else:
        np.testing.assert_array_equal(y, x)


def test_half_value_and_rounding_match_numpy():
    """_half_value (half bits -> f32 without a table) on all 65536 patterns, and
    _half_value(_half_bits(x)) = f32(f16(x)) at every scale (subnormals, overflow to inf)."""
    from numba import njit

    from llcinfer.kernels.act_quant import _half_bits, _half_value

    @njit
    def decode_all(out):
        for h in range(65536):
            out[h] = _half_value(np.uint16(h))

    @njit
    def round_all(x, out):
        scratch = np.empty(1, np.float32)
        for i in range(x.size):
            scratch[0] = x[i]
            out[i] = _half_value(_half_bits(scratch.view(np.uint32)[0]))

    got = np.empty(65536, np.float32)
    decode_all(got)
    ref = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), ref[~nan].view(np.uint32))  # -0.0 included
    assert np.isnan(got[nan]).all()
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.standard_normal(20_000).astype(np.float32) * np.float32(s)
                        for s in (1e-8, 1e-6, 3e-5, 1e-2, 1.0, 300.0, 6e4, 1e5)]
                       + [np.array([0.0, -0.0, 65504, 65519, 65520, -65520, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26],
                                   np.float32)])
    got = np.empty_like(x)
    round_all(x, got)
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("types", [("Q4_0", "Q4_K", "Q8_0"), ("Q6_K", "Q5_0"), ("Q4_1", "Q4_1", "Q6_K")],
                         ids="-".join)
def test_linear_many_llama_rounding_equals_separate_calls(types):
    """One pool launch, inputs rounded once per activation kind (Q8_0 vs Q8_K): same as
    separate calls, and as the exact product of the rounded input."""
    from llcinfer.kernels import act_quant as aq

    rng = np.random.default_rng(22)
    K = 512
    lins = [Linear(fake_tensor(rng, q, n, K)) for q, n in zip(types, (17, 33, 3))]
    for M in MS:
        x = rng.standard_normal((M, K)).astype(np.float32)
        outs = linear_many(x, lins, llama_rounding=True)
        for y, lin in zip(outs, lins):
            np.testing.assert_allclose(y, lin(x, llama_rounding=True), rtol=1e-6, atol=1e-5)
            xr = aq.quantize_activations(x, lin.act_kind)
            naive.assert_matmul_close(y, xr, naive.weight(lin.info))
            assert not np.array_equal(xr, x)


# ------------------------------------------------------------------------ get_rows (decode)
@pytest.mark.parametrize("qtype", QUANT_TYPES)
@pytest.mark.parametrize("rows", [1, 3, 17])
def test_quant_get_rows_odd_sizes(qtype, rows):
    """The numba row dequantizer (kernels/dequant.py) against gguf's, every row of odd-sized
    matrices, ids repeated and out of order."""
    from llcinfer.kernels.dequant import quant_get_rows
    from llcinfer.kernels.tables import F16_TO_F32

    rng = np.random.default_rng(rows)
    for K in COLS[qtype]:
        t = fake_tensor(rng, qtype, rows, K)
        ids = np.concatenate([np.arange(rows)[::-1], [0, rows - 1]]).astype(np.int64)
        out = np.full((ids.size, K), np.nan, np.float32)
        quant_get_rows(t.data, ids, int(t.qtype), F16_TO_F32, out)
        np.testing.assert_array_equal(out.astype(np.float64), naive.weight(t)[ids])
