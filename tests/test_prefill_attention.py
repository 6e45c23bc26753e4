"""The blocked prefill attention (kernels/prefill_attention.py) against the NumPy oracle
``naive.attention`` at odd lengths, on every ISA path this CPU runs: M query rows after
n_past cached positions, blocks of 16 scattered through the pool (every spare slot NaN,
so a stray read shows), GQA ratios 1, 3 and 7, f16 and f32 storage, serial and on the
thread pool; then batch invariance (a row's bits do not depend on its tile, chunk or the
thread count) and the dispatch of PagedSequence.attention between prefill and decode rows.
"""

import naive
import numba
import numpy as np
import pytest

from llcinfer.kernels import isa as isa_mod
from llcinfer.kernels import paged_attention as pa
from llcinfer.kernels import prefill_attention as pf
from llcinfer.kernels.tables import F16_TO_F32
from llcinfer.kv import KVPool, PagedSequence

ISAS = isa_mod.supported_isas()  # best first, always ends with 'generic' (the decode kernels' path)
GQA = [(4, 4, 64), (9, 3, 64), (14, 2, 64)]  # (H, KVH, D): ratios 1, 3 (SmolLM2), 7 (Qwen2.5-0.5B)
ROWS = (1, 7, 17, 33, 100)
PAST = (0, 5, 31)
_NAN = {"f16": np.uint16(0x7E00), "f32": np.float32(np.nan)}


class Case:
    """``n`` positions of 2 layers in a pool whose blocks are scattered (another sequence's
    between them, then the order shuffled), every other slot NaN."""

    def __init__(self, H, KVH, D, n, kv_type="f16", bs=16, seed=0):
        self.H, self.KVH, self.D, self.bs, self.L = H, KVH, D, bs, 2
        rng = np.random.default_rng(seed)
        nb = -(-n // bs)
        self.pool = KVPool(self.L, KVH, D, bs, 2 * nb + 4, kv_type, budget_bytes=1 << 30)
        self.pool.data[:] = _NAN[kv_type]
        self.seq = PagedSequence(self.pool, n + bs, None, "sequence")
        self.filler = PagedSequence(self.pool, n + bs, None, "filler")
        for p in range(0, n, bs):
            self.filler.n_tokens = min(n, p + bs)
            self.seq.n_tokens = min(n, p + bs)
        self.seq.table[:nb] = rng.permutation(self.seq.table[:nb])  # not in pool order
        self.k = rng.standard_normal((self.L, n, KVH, D)).astype(np.float32)
        self.v = rng.standard_normal((self.L, n, KVH, D)).astype(np.float32)
        for li in range(self.L):
            self.seq.store(li, 0, self.k[li], self.v[li])
        if kv_type == "f16":  # what the cache holds
            self.k = self.k.astype(np.float16).astype(np.float32)
            self.v = self.v.astype(np.float16).astype(np.float32)
        self.rng = rng

    def args(self, layer):
        p = self.pool
        return (p.data, p.data_f32, F16_TO_F32, p.kind, p.group, p.scale_offset, self.seq.table[:self.seq.n_blocks],
                layer, self.KVH, self.bs)

    def query(self, M):
        return self.rng.standard_normal((M, self.H, self.D)).astype(np.float32)

    def run(self, q, layer, n_past, scale, **kw):
        out = np.full(q.shape, np.nan, np.float32)
        pf.prefill_attention(q, *self.args(layer), n_past, np.float32(scale), out, **kw)
        return out

    def check(self, out, q, layer, n_past, scale):
        ref = naive.attention(q, self.k[layer], self.v[layer], n_past, scale)
        assert out.dtype == np.float32 and np.all(np.isfinite(out))
        err = np.abs(out - ref).max()
        assert err <= 2e-5 * np.abs(self.v[layer]).max(), (q.shape, n_past, err)


@pytest.mark.parametrize("kv_type", ["f16", "f32"])
@pytest.mark.parametrize("H,KVH,D", GQA)
@pytest.mark.parametrize("isa", ISAS)
def test_matches_oracle(isa, H, KVH, D, kv_type):
    case = Case(H, KVH, D, max(ROWS) + max(PAST), kv_type, seed=H)
    for M in ROWS:
        for n_past in PAST:
            q = case.query(M)
            for threads in (1, 2):
                case.check(case.run(q, 1, n_past, 0.125, threads=threads, isa=isa), q, 1, n_past, 0.125)


def test_large_scores_and_small_tiles():
    """Scores far from 0 (the running max rescales often) and tiles of 8 positions."""
    case = Case(9, 3, 64, 80, seed=3)
    q = case.query(45) * 6
    case.check(case.run(q, 0, 35, 0.125, threads=2, tq=8), q, 0, 35, 0.125)


def test_int8_storage_takes_the_decode_path():
    case = Case(9, 3, 64, 40, "f16", seed=4)
    pool = KVPool(2, 3, 64, 16, 8, "int8", budget_bytes=1 << 28)
    seq = PagedSequence(pool, 48, None)
    seq.n_tokens = 40
    seq.store(0, 0, case.k[0], case.v[0])
    k, v = seq.read(0, 0, 40)
    assert not pf.prefill_supported(pool.kind, 64, 16)
    q = case.query(12)
    out = np.empty_like(q)
    seq.attention(0, q, 28, 0.125, out)
    ref = naive.attention(q, k, v, 28, 0.125)
    assert np.abs(out - ref).max() <= 2e-5 * np.abs(v).max()


@pytest.mark.parametrize("isa", [i for i in ISAS if i != "generic"])
@pytest.mark.parametrize("H,KVH,D", GQA[1:])
def test_rows_are_batch_invariant(isa, H, KVH, D):
    """The rows of one 100-row call equal, bit for bit, the same rows in uneven chunks (other
    tiles, other n_past), one by one, with other tile sizes and thread counts."""
    case = Case(H, KVH, D, 131, seed=5)
    q = case.query(100)
    whole = case.run(q, 1, 31, 0.125, threads=2, isa=isa)
    for cuts, tq, threads in (((0, 1, 38, 39, 100), 8, 1), ((0, 17, 50, 100), 24, 2), (tuple(range(101)), 16, 2)):
        parts = [case.run(q[a:b], 1, 31 + a, 0.125, threads=threads, isa=isa, tq=tq) for a, b in zip(cuts, cuts[1:])]
        np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_sequence_dispatch_by_prefill_until():
    """PagedSequence.attention: rows below ``prefill_until`` on the prefill kernel, the rest
    on the decode kernels; without it, calls of M > 1 rows on the prefill kernel."""
    case = Case(9, 3, 64, 60, seed=6)
    q = case.query(20)
    args = case.args(1)
    threads = numba.get_num_threads()
    pre = np.empty_like(q)
    dec = np.empty_like(q)
    pf.prefill_attention(q, *args, 40, np.float32(0.125), pre, threads=threads)
    pa.paged_attention(q, *args, 40, np.float32(0.125), dec, threads=threads)
    assert not np.array_equal(pre, dec)  # the two round differently: the test can tell them apart
    got = np.empty_like(q)
    case.seq.attention(1, q, 40, 0.125, got)
    np.testing.assert_array_equal(got, pre)
    case.seq.attention(1, q[:1], 40, 0.125, got[:1])
    np.testing.assert_array_equal(got[:1], dec[:1])
    case.seq.prefill_until = 48
    case.seq.attention(1, q, 40, 0.125, got)
    np.testing.assert_array_equal(got[:8], pre[:8])
    for m in range(8, 20):  # decode rows: each as if alone
        one = np.empty_like(q[:1])
        pa.paged_attention(q[m:m + 1], *args, 40 + m, np.float32(0.125), one, threads=threads)
        np.testing.assert_array_equal(got[m], one[0])
    assert case.seq.fork("f").prefill_until == 48
