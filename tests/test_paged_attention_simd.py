"""The explicit-SIMD decode attention (paged_attention._task_simd) on every ISA path this
CPU runs, against a plain NumPy oracle over the f16-rounded (or f32) K/V.

Paths: the tags of simd.make_tag ('avx512vnni' 16 lanes, 'avxvnni' / 'avx2' 8 lanes) and
'generic' (tag None: the scalar loops).  Shapes are SmolLM2 (H=9, KVH=3), Qwen2.5-0.5B
(14, 2) and Qwen2.5-1.5B (12, 2, D=128) groups at odd context lengths, one and three
query rows, one and several key splits, serial and on the thread pool.
"""

import zlib

import naive
import numpy as np
import pytest

from llcinfer.kernels import isa as isa_mod
from llcinfer.kernels import paged_attention as pa
from llcinfer.jit import kernel
from llcinfer.kernels.simd import lanes, make_tag, vlanes, vloadf, vstore
from llcinfer.kernels.simd_exp import vexp
from llcinfer.kernels.simd_math import vhmax, vhsum, vmaxf
from llcinfer.kernels.tables import F16_TO_F32
from llcinfer.kv import KVPool, PagedSequence

ISAS = isa_mod.supported_isas()  # best first, always ends with 'generic'
SIMD_ISAS = [i for i in ISAS if i != "generic"]
CTX = (1, 3, 17, 33, 129, 4095)
GQA = [(9, 3, 64), (14, 2, 64), (12, 2, 128)]  # (H, KVH, D)


def _tag(isa):
    return None if isa == "generic" else make_tag(isa)


class Case:
    """A pool holding ``n`` positions of 2 layers in scattered blocks, and what it holds."""

    def __init__(self, H, KVH, D, n, kv_type="f16", bs=16, seed=0, k_scale=1.0):
        self.H, self.KVH, self.D, self.bs, self.L = H, KVH, D, bs, 2
        rng = np.random.default_rng(seed)
        n_blocks = 2 * (-(-n // bs)) + 4
        self.pool = KVPool(self.L, KVH, D, bs, n_blocks, kv_type, budget_bytes=1 << 30)
        self.seq = PagedSequence(self.pool, n + bs, None, "sequence")
        filler = PagedSequence(self.pool, n + bs, None, "filler")  # interleave the blocks
        for p in range(0, n, bs):
            filler.n_tokens = min(n, p + bs)
            self.seq.n_tokens = min(n, p + bs)
        self.k = (rng.standard_normal((self.L, n, KVH, D)) * k_scale).astype(np.float32)
        self.v = rng.standard_normal((self.L, n, KVH, D)).astype(np.float32)
        for li in range(self.L):
            self.seq.store(li, 0, self.k[li], self.v[li])
        if kv_type == "f16":  # what the cache holds
            self.k = self.k.astype(np.float16).astype(np.float32)
            self.v = self.v.astype(np.float16).astype(np.float32)
        self.rng = rng
        self.filler = filler

    def args(self, layer):
        p = self.pool
        return (p.data, p.data_f32, F16_TO_F32, p.kind, p.group, p.scale_offset, self.seq.table[:self.seq.n_blocks],
                layer, self.KVH, self.bs)

    def query(self, M, scale=1.0):
        return (self.rng.standard_normal((M, self.H, self.D)) * scale).astype(np.float32)

    def check(self, out, q, layer, n_past, scale):
        ref = naive.attention(q, self.k[layer], self.v[layer], n_past, scale)
        assert out.dtype == np.float32 and np.all(np.isfinite(out))
        err = np.abs(out - ref).max()
        assert err <= 2e-5 * np.abs(self.v[layer]).max(), err


def _run(fn, case, layer, q, n_past, scale, splits, tag):
    out = np.full(q.shape, np.nan, np.float32)
    fn(q, *case.args(layer), n_past, scale, splits, out, tag)
    return out


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("H,KVH,D", GQA)
def test_f16_paths_match_oracle(isa, H, KVH, D):
    tag = _tag(isa)
    case = Case(H, KVH, D, max(CTX) + 3, seed=zlib.crc32(f"{isa}{H}{D}".encode()), k_scale=2.0)
    scale = np.float32(1 / np.sqrt(D))
    for n in CTX:
        for M in (1, 3):
            n_past = n - 1
            q = case.query(M, 2.0)
            layer = n % 2
            for splits in (1, 3):
                for fn in (pa.paged_attention_serial, pa.paged_attention_parallel):
                    case.check(_run(fn, case, layer, q, n_past, scale, splits, tag), q, layer, n_past, scale)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("D,bs", [(32, 4), (80, 8), (48, 32), (64, 16)])
def test_other_head_dims_and_block_sizes(isa, D, bs):
    """Head dims not 64/128 (row passes of 4, 2, 1 vectors, or the scalar fallback when D is
    not a multiple of the lanes), blocks shorter and longer than a vector, f16 and f32."""
    tag = _tag(isa)
    for kv_type in ("f16", "f32"):
        case = Case(6, 2, D, 200, kv_type, bs, seed=zlib.crc32(f"{isa}{D}{bs}{kv_type}".encode()))
        scale = np.float32(1 / np.sqrt(D))
        for n_past, M in ((0, 1), (16, 1), (40, 3), (197, 3)):
            q = case.query(M)
            for splits in (1, 2):
                out = _run(pa.paged_attention_serial, case, 1, q, n_past, scale, splits, tag)
                case.check(out, q, 1, n_past, scale)


@pytest.mark.parametrize("isa", SIMD_ISAS)
def test_simd_matches_scalar_and_large_scores(isa):
    """Scores of +-1000 (the max moves between blocks by far more than exp's range): the
    vector path agrees with the scalar loops and the oracle."""
    case = Case(4, 2, 64, 300, seed=5)
    q = case.query(2, 40.0)
    scale = np.float32(1.0)
    simd = _run(pa.paged_attention_serial, case, 0, q, 250, scale, 2, make_tag(isa))
    scalar = _run(pa.paged_attention_serial, case, 0, q, 250, scale, 2, None)
    case.check(simd, q, 0, 250, scale)
    np.testing.assert_allclose(simd, scalar, atol=2e-5 * np.abs(case.v).max())


@pytest.mark.parametrize("isa", ISAS)
def test_dispatcher_follows_llcinfer_isa(isa, monkeypatch):
    """``paged_attention`` (what the sequences call) takes the path LLCINFER_ISA forces."""
    monkeypatch.setenv("LLCINFER_ISA", isa)
    isa_mod.reset_isa()
    try:
        assert isa_mod.current_isa() == isa
        tag = pa.attention_tag()
        assert (tag is None) if isa == "generic" else (tag.dtype == make_tag(isa).dtype)
        case = Case(9, 3, 64, 1000, seed=11)
        scale = np.float32(0.125)
        for M, n_past, threads in ((1, 996, 1), (1, 996, 2), (3, 500, 2)):
            q = case.query(M)
            out = np.full(q.shape, np.nan, np.float32)
            case.seq.attention(1, q, n_past, scale, out) if threads == 1 else pa.paged_attention(
                q, *case.args(1), n_past, scale, out, threads=threads)
            case.check(out, q, 1, n_past, scale)
    finally:
        monkeypatch.delenv("LLCINFER_ISA")
        isa_mod.reset_isa()


@pytest.mark.parametrize("isa", ISAS)
def test_task_called_directly_with_a_tag(isa):
    """``_task`` with the tag as its last argument (an executor calling it from its own
    threads) gives the partial results the merge expects; without a tag: the scalar loops."""
    case = Case(14, 2, 64, 700, seed=3)
    q = case.query(1)
    scale = np.float32(0.125)
    S = 3
    G = 7
    n_tasks = case.KVH * S
    outs = []
    for tag in (_tag(isa), None):
        pmax = np.empty((n_tasks, G), np.float32)
        psum = np.empty((n_tasks, G), np.float32)
        pacc = np.empty((n_tasks, G, 64), np.float32)
        for t in range(n_tasks):
            if tag is None:
                pa._task(q, *case.args(0), 690, scale, S, t, pmax, psum, pacc)
            else:
                pa._task(q, *case.args(0), 690, scale, S, t, pmax, psum, pacc, tag)
        out = np.empty_like(q)
        for mk in range(case.KVH):
            pa.merge_partials(pmax, psum, pacc, 0, mk, S, case.KVH, out)
        case.check(out, q, 0, 690, scale)
        outs.append(out)
    np.testing.assert_allclose(outs[0], outs[1], atol=2e-5 * np.abs(case.v).max())


@kernel
def _vector_ops(x, out, tag):
    """out[0] = exp(x) lane-wise; out[1, 0] = max of x, out[1, 1] = sum of x; out[2] =
    max(x, out[2]) lane-wise (x is one vector of the tag's width)."""
    v = vloadf(x, 0, tag)
    vstore(out[0], 0, vexp(v))
    out[1, 0] = vhmax(v)
    out[1, 1] = vhsum(v)
    vstore(out[2], 0, vmaxf(v, vloadf(out[2], 0, tag)))
    return vlanes(tag)


@pytest.mark.parametrize("isa", SIMD_ISAS)
def test_vector_exp_and_reductions(isa):
    W = lanes(isa)
    rng = np.random.default_rng(1)
    xs = np.concatenate([np.linspace(-120, 88, 4000), rng.standard_normal(96) * 30, [-1e30, -87.3, 0.0, -1e-30]])
    xs = xs.astype(np.float32)
    for i in range(0, xs.size - W + 1, W):
        x = xs[i:i + W].copy()
        out = np.zeros((3, W), np.float32)
        out[2] = rng.standard_normal(W)
        other = out[2].copy()
        assert _vector_ops(x, out, make_tag(isa)) == W
        ref = np.exp(x.astype(np.float64))
        tiny = ref < np.exp(-87.33654)
        assert np.all(out[0][tiny] == 0)
        np.testing.assert_allclose(out[0][~tiny], ref[~tiny], rtol=3e-7)
        assert out[1, 0] == x.max()
        np.testing.assert_allclose(out[1, 1], x.astype(np.float64).sum(), rtol=1e-5, atol=1e-3)
        np.testing.assert_array_equal(out[2], np.maximum(x, other))


@pytest.mark.parametrize("width_isa", ["avx512vnni", "avx2"])
@pytest.mark.parametrize("H,KVH,D,bs", [(14, 2, 64, 16), (14, 2, 64, 32), (9, 3, 64, 32), (16, 2, 64, 64)])
def test_lane_logic_of_both_widths(width_isa, H, KVH, D, bs):
    """The 16-lane and the 8-lane task on any CPU (attention emits plain LLVM vectors: on a
    CPU without AVX-512 the 16-lane code is split into halves, its logic unchanged), in
    blocks of 1, 2 and 4 key vectors per pass: ``_qk_t``'s one- and two-vector loops with
    their masks, ``_pv``'s passes of 4 and 2 (16 lanes) or 3 and 2 (8 lanes) V vectors for
    groups of up to 4 heads."""
    case = Case(H, KVH, D, 301, "f16", bs, seed=zlib.crc32(f"{width_isa}{H}{bs}".encode()))
    scale = np.float32(1 / np.sqrt(D))
    for n_past, M in ((0, 1), (8, 1), (20, 1), (31, 1), (50, 2), (298, 3)):
        q = case.query(M)
        for splits in (1, 3):
            out = _run(pa.paged_attention_serial, case, 1, q, n_past, scale, splits, make_tag(width_isa))
            case.check(out, q, 1, n_past, scale)


@pytest.mark.parametrize("isa", [ISAS[0], "generic"])
@pytest.mark.parametrize("H,KVH,D", GQA)
def test_rows_of_one_sequence_in_one_task_give_each_rows_own_bits(isa, H, KVH, D):
    """``row_part`` over n_rows consecutive rows (one stream of K/V) writes, for each row,
    the bits that row gets alone, in every split, and what the merge makes of them
    matches the oracle."""
    case = Case(H, KVH, D, 300, seed=5)
    tag = _tag(isa)
    n_keys, R = 290, 7  # rows at 290 .. 296 keys: all in block 18
    q = case.query(R + 2)
    scale = np.float32(0.125)
    S = pa.split_count(n_keys, case.bs, KVH, 2)
    assert S > 1
    G = H // KVH
    n_slots = (2 + R) * KVH * S
    together = [np.full((n_slots, G), np.nan, np.float32), np.full((n_slots, G), np.nan, np.float32),
                np.full((n_slots, G, D), np.nan, np.float32)]  # pmax, psum, pacc
    alone = [a.copy() for a in together]
    for j in range(KVH):
        for s in range(S):
            pa.row_part(q, 1, j, s, S, *case.args(1), n_keys, scale, 2, *together, tag, R)
            for r in range(R):
                pa.row_part(q, 1 + r, j, s, S, *case.args(1), n_keys + r, scale, 2, *alone, tag)
    for a, b in zip(together, alone):
        assert np.array_equal(a, b, equal_nan=True)
    out = np.zeros_like(q)
    for r in range(R):
        for j in range(KVH):
            pa.merge_partials(*together, 1 + r, j, S, KVH, out)
        case.check(out[1 + r:2 + r], q[1 + r:2 + r], 1, n_keys - 1 + r, scale)
