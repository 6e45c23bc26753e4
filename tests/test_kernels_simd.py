"""The integer SIMD matmul paths (isa.py, simd.py, repack.py, vnni_matmul.py) against the
NumPy oracle: x rounded as act_quant does, times gguf's dequantized weights (float64).

Every ISA path this CPU can run is tested (a 512-bit machine runs avx512vnni, avxvnni
and avx2 alike); 'generic' is the float kernel of quant_matmul.py.
"""

import warnings
import zlib

import naive
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

from llcinfer.kernels import Linear, linear_many
from llcinfer.kernels import isa as isa_mod
from llcinfer.kernels.act_quant import ACT_Q8_0, ACT_Q8_K, quantize_activations, quantize_activations_int
from llcinfer.weights.repack import repack, unpack
from llcinfer.kernels.simd import lanes

from tiny_models import K_QUANTS, LEGACY_QUANTS, QUANT_TYPES, FakeTensor, fake_tensor, random_quant_bytes

SIMD_ISAS = [i for i in isa_mod.supported_isas() if i != "generic"]
ROWS = (1, 3, 17, 33, 129)
MS = (1, 2, 3, 17, 64)
COLS = {q: (32, 96, 4128) for q in LEGACY_QUANTS} | {q: (256, 768, 4352) for q in K_QUANTS}

pytestmark = pytest.mark.skipif(not SIMD_ISAS, reason="CPU without AVX2: only the generic path")


def _kind(qtype: str) -> int:
    return ACT_Q8_K if qtype in K_QUANTS else ACT_Q8_0


def _check(y, xr, w64, rel=2e-6):
    """Within float32 summation error of the rounded input's exact product."""
    naive.assert_matmul_close(y, xr, w64, rel)


@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("qtype", QUANT_TYPES)
@pytest.mark.parametrize("N", ROWS)
def test_simd_matmul_matches_oracle(isa, qtype, N):
    rng = np.random.default_rng(zlib.crc32(f"{isa}-{qtype}-{N}".encode()))
    for K in COLS[qtype]:
        t = fake_tensor(rng, qtype, N, K)
        w64 = naive.weight(t)
        lin = Linear(t, (N, K), isa=isa)
        assert lin.simd and lin.isa == isa
        for M in MS:
            x = (rng.standard_normal((M, K)) * rng.uniform(0.1, 3.0, (M, 1))).astype(np.float32)
            xr = quantize_activations(x, _kind(qtype)).astype(np.float64)
            _check(lin(x, llama_rounding=True), xr, w64)
        assert lin.prepare().shape[0] == -(-N // lanes(isa))


ODD_MS = (2, 3, 5, 6, 7, 9, 11, 17, 33)  # every mix of the 4-, 3-, 2- and 1-row tiles


@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_simd_matmul_row_tiles_agree(isa, qtype):
    """At row counts that mix the 4-, 3-, 2- and 1-row tiles: each product row is within the
    oracle's bound and equal bit for bit to that row's one-row product (every tile does the
    same operations per output in the same order)."""
    rng = np.random.default_rng(zlib.crc32(f"tiles-{isa}-{qtype}".encode()))
    N, K = 33, COLS[qtype][1]
    t = fake_tensor(rng, qtype, N, K)
    w64 = naive.weight(t)
    lin = Linear(t, (N, K), isa=isa)
    for M in ODD_MS:
        x = (rng.standard_normal((M, K)) * rng.uniform(0.1, 3.0, (M, 1))).astype(np.float32)
        y = lin(x, llama_rounding=True)
        _check(y, quantize_activations(x, _kind(qtype)).astype(np.float64), w64)
        one = np.concatenate([lin(x[m:m + 1], llama_rounding=True) for m in range(M)])
        np.testing.assert_array_equal(y, one)


@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("types", [("Q4_1", "Q4_1", "Q4_1"), ("Q5_0", "Q8_0", "Q4_K"), ("Q6_K", "Q4_0"),
                                   ("Q4_K", "Q6_K", "Q8_0")])
def test_simd_linear_many(isa, types):
    rng = np.random.default_rng(zlib.crc32(f"{isa}-{types}".encode()))
    K = 512
    ts = [fake_tensor(rng, q, n, K) for q, n in zip(types, (33, 17, 9))]
    lins = [Linear(t, t.shape, isa=isa) for t in ts]
    for M in (1, 3, 5, 6, 64):
        x = rng.standard_normal((M, K)).astype(np.float32)
        ys = linear_many(x, lins, llama_rounding=True)
        for y, t, q in zip(ys, ts, types):
            _check(y, quantize_activations(x, _kind(q)).astype(np.float64), naive.weight(t))


@pytest.mark.parametrize("qtype", QUANT_TYPES)
@pytest.mark.parametrize("W", (8, 16))
def test_repack_round_trip(qtype, W):
    rng = np.random.default_rng(zlib.crc32(f"rt-{qtype}-{W}".encode()))
    for N in (1, 17, 40):
        K = 512
        t = fake_tensor(rng, qtype, N, K)
        p = repack(t.data, int(t.qtype), K, W, chunk_rows=16)  # several chunks, a padded tail
        assert p.shape[0] == -(-N // W)
        back = unpack(p, int(t.qtype), N, K, W)
        ref = naive.weight(t).astype(np.float32)
        np.testing.assert_allclose(back, ref, rtol=1e-6, atol=0)


# the bytes of one GGML block that hold quantized values (the rest: f16 scales)
_QUANT_FIELDS = {"Q4_0": slice(2, None), "Q4_1": slice(4, None), "Q5_0": slice(2, None), "Q8_0": slice(2, None),
                 "Q4_K": slice(4, None), "Q6_K": slice(0, 208)}


@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("qtype", QUANT_TYPES)
@pytest.mark.parametrize("fill", [0xFF, 0x7F, 0x80])
def test_simd_matmul_extreme_values(isa, qtype, fill):
    """Every quantized field at an extreme byte and every activation at +-127: the largest
    partial sums the AVX2 path keeps in i16 lanes (vpmaddubsw results added before
    vpmaddwd) must not wrap."""
    N, K = 17, COLS[qtype][1]
    raw = random_quant_bytes(np.random.default_rng(fill), qtype, N, K)
    blocks = raw.reshape(N, K // (256 if qtype in K_QUANTS else 32), -1).copy()
    blocks[..., _QUANT_FIELDS[qtype]] = fill
    w = blocks.reshape(N, -1)
    w.setflags(write=False)
    t = FakeTensor(f"w_{qtype}", QT[qtype], (N, K), w)
    lin = Linear(t, (N, K), isa=isa)
    x = np.ones((5, K), np.float32) * np.array([1, -1, 3, -0.5, 2], np.float32)[:, None]
    xr = quantize_activations(x, _kind(qtype)).astype(np.float64)
    assert np.abs(xr).max() > 0
    _check(lin(x, llama_rounding=True), xr, naive.weight(t))


def test_block_bytes_agree_with_repack():
    from llcinfer.weights.repack import BLOCK_BYTES_PER_ROW
    from llcinfer.kernels.vnni_blocks import block_bytes

    for qt, nbytes in BLOCK_BYTES_PER_ROW.items():
        assert block_bytes(qt) == nbytes


@pytest.mark.parametrize("kind,B", [(ACT_Q8_0, 32), (ACT_Q8_K, 256)])
def test_int_activations_equal_float_rounding(kind, B):
    rng = np.random.default_rng(B)
    M, K = 7, 4096
    x = (rng.standard_normal((M, K)) * rng.uniform(1e-3, 30, (M, 1))).astype(np.float32)
    x[1, :B] = 0  # an all-zero block
    x[2, 5] = 1e4  # one large value
    q, d, s = quantize_activations_int(x, kind)
    vals = (q.reshape(M, -1, B).astype(np.float32) * d[:, :, None]).reshape(M, K)
    np.testing.assert_array_equal(vals, quantize_activations(x, kind))
    per = 32 if kind == ACT_Q8_0 else 16
    np.testing.assert_array_equal(s, q.reshape(M, -1, per).astype(np.int32).sum(-1))


def test_q8_k_scale_takes_the_sign_of_the_first_largest_value():
    """llama.cpp's scan keeps the first index of max|x|: with -a before +a the scale is
    -127 / -a (d > 0), with +a first -127 / a (d < 0)."""
    x = np.random.default_rng(3).standard_normal((2, 512)).astype(np.float32)
    x[0, 10], x[0, 20] = -50.0, 50.0
    x[0, 300], x[0, 400] = 50.0, -50.0
    x[1, 7] = -50.0  # one largest value only, negative; then one positive
    x[1, 270] = 50.0
    q, d, s = quantize_activations_int(x, ACT_Q8_K)
    assert d[0, 0] > 0 and d[0, 1] < 0 and d[1, 0] > 0 and d[1, 1] < 0
    assert q[0, 10] == -127 and q[0, 20] == 127 and q[0, 300] == -127 and q[0, 400] == 127


def test_env_var_forces_path(monkeypatch):
    for name in isa_mod.supported_isas():
        monkeypatch.setenv("LLCINFER_ISA", name)
        isa_mod.reset_isa()
        assert isa_mod.current_isa() == name
        t = fake_tensor(np.random.default_rng(0), "Q4_1", 5, 64)
        lin = Linear(t, (5, 64))
        assert lin.isa == name and lin.simd == (name != "generic")
    monkeypatch.setenv("LLCINFER_ISA", "sse9")
    isa_mod.reset_isa()
    with pytest.raises(ValueError, match="LLCINFER_ISA"):
        isa_mod.current_isa()
    monkeypatch.delenv("LLCINFER_ISA")
    isa_mod.reset_isa()
    assert isa_mod.current_isa() == isa_mod.supported_isas()[0]


def test_cpu_without_feature_falls_back(monkeypatch):
    assert isa_mod.supported_isas({"sse2"}) == ["generic"]
    assert isa_mod.supported_isas({"avx2", "fma", "f16c"}) == ["avx2", "generic"]
    assert isa_mod.supported_isas({"avx2", "fma", "f16c", "avx_vnni"}) == ["avxvnni", "avx2", "generic"]
    monkeypatch.setattr(isa_mod, "cpu_flags", lambda: {"avx2", "fma", "f16c"})
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        assert isa_mod.select_isa("avx512vnni") == "avx2"
    assert any("cannot run" in str(r.message) for r in rec)
    monkeypatch.setattr(isa_mod, "cpu_flags", lambda: {"sse2"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert isa_mod.select_isa("avx2") == "generic"


@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_generic_path_matches_simd(qtype):
    """A CPU without the features (forced 'generic') computes the same llama-rounded product."""
    rng = np.random.default_rng(zlib.crc32(qtype.encode()))
    K = 512
    t = fake_tensor(rng, qtype, 21, K)
    gen = Linear(t, (21, K), isa="generic")
    assert not gen.simd and gen.prepare() is None
    x = rng.standard_normal((3, K)).astype(np.float32)
    xr = quantize_activations(x, _kind(qtype)).astype(np.float64)
    y_gen = gen(x, llama_rounding=True)
    _check(y_gen, xr, naive.weight(t), rel=1e-5)
    for isa in SIMD_ISAS:
        y = Linear(t, (21, K), isa=isa)(x, llama_rounding=True)
        _check(y, xr, naive.weight(t))
        terms = np.abs(xr) @ np.abs(naive.weight(t)).T
        assert np.all(np.abs(y.astype(np.float64) - y_gen) <= 2e-5 * terms)
