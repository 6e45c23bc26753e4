"""Sparse attention: the index-key store and the fused scorer against the NumPy oracles
(naive.py), sparse attention equal to dense when the selection covers the context and to
the oracle on the blocks it picks, and the index cache consistent through fork,
truncate, copy-on-write and prefix sharing."""

import numpy as np
import pytest

import naive
from tiny_models import isolated_runtime, write_tiny_model
from llcinfer.engine.sparse_setup import calibrate_basis
from llcinfer.engine.transformer import Transformer
from llcinfer.jit import kernel
from llcinfer.kernels.isa import supported_isas
from llcinfer.kernels.simd import make_tag, vlanes, vloadf, vstore
from llcinfer.kernels.simd_exp import vexp2
from llcinfer.kernels.sparse_index import kept_blocks, store_index_rows, top_blocks
from llcinfer.kernels.sparse_rows import select_rows
from llcinfer.kv import KVPool, PagedSequence
from llcinfer.model.gguf_file import GGUFFile
from llcinfer.sparse import SparseAttention, SparseConfig, fit_basis, rotate_to


def random_basis(rng, L, KVH, r, D):
    """[L, KVH, r, D] orthonormal rows."""
    out = np.empty((L, KVH, r, D), np.float32)
    for li in range(L):
        for h in range(KVH):
            out[li, h] = np.linalg.qr(rng.standard_normal((D, r)))[0].T
    return out


def scattered_table(rng, n_blocks, nb):
    return rng.permutation(n_blocks)[:nb].astype(np.int32)  # [nb] pool blocks in no order


@kernel
def _exp2_lanes(x, out, tag):
    """out = 2**x lane-wise, one vector of the tag's width at a time (x.size a multiple)."""
    W = vlanes(tag)
    for i in range(0, x.size, W):
        vstore(out[i:], 0, vexp2(vloadf(x[i:], 0, tag)))


@pytest.mark.parametrize("isa", [i for i in supported_isas() if i != "generic"])
def test_scorer_exp2_matches_numpy(isa):
    """The scorer's 2**y (simd_exp.vexp2) within 3e-6 of float64 over its range (integers
    included), clamped to 2**-125 and 2**127 outside it."""
    y = np.concatenate([np.linspace(-125, 127, 40000), np.arange(-125, 128), [-1e30, -200, 200, 1e30]])
    y = np.concatenate([y, np.zeros(-y.size % 16)]).astype(np.float32)
    out = np.empty_like(y)
    _exp2_lanes(y, out, make_tag(isa))
    ref = np.exp2(np.clip(y.astype(np.float64), -125, 127))
    np.testing.assert_allclose(out, ref, rtol=3e-6)


@pytest.mark.parametrize("n", [1, 37, 203])
def test_store_index_rows_matches_oracle(n):
    rng = np.random.default_rng(n)
    KVH, D, r, bs = 3, 64, 16, 16
    basis = random_basis(rng, 1, KVH, r, D)[0]
    k = (rng.standard_normal((n, KVH * D)) * 2).astype(np.float32)
    table = scattered_table(rng, 40, -(-n // bs))
    idx = np.full((2, 40, KVH, r // 4, bs, 4), 99, np.uint8)  # [slot, block, kv_head, rank/4, token, 4]; 99: unwritten
    isc = np.full((2, 40, KVH, bs), np.nan, np.float32)
    store_index_rows(k, basis, np.arange(n), np.zeros(n, np.int64), table[None], bs, 1, idx, isc)
    want_q, want_s = naive.index_keys(k.reshape(n, KVH, D), basis)
    pos = np.arange(n)
    got_q = idx[1, table[pos // bs], :, :, pos % bs].reshape(n, KVH, r).astype(int) - 128  # [n, KVH, r]
    got_s = isc[1, table[pos // bs], :, pos % bs]
    np.testing.assert_allclose(got_s, want_s, rtol=1e-5)
    assert np.abs(got_q - want_q).max() <= 1  # fastmath sums: a value on a .5 boundary
    assert (got_q == want_q).mean() > 0.99
    assert (idx[0] == 99).all() and np.isnan(isc[0]).all()  # the other slot untouched


def index_arrays(rng, n_keys, KVH, r, bs, spare):
    """Random index entries of n_keys tokens in blocks scattered over a pool of nb + spare
    blocks (the others full of junk), padded as IndexCache pads them."""
    nb = -(-n_keys // bs)
    table = scattered_table(rng, nb + spare, nb)
    q = rng.integers(-127, 128, (n_keys, KVH, r))  # [n, KVH, r]
    s = rng.uniform(0.001, 0.02, (n_keys, KVH)).astype(np.float32)  # [n, KVH]
    shape = (1, nb + spare, KVH, r // 4, bs, 4)
    idx = rng.integers(0, 256, int(np.prod(shape)) + 64).astype(np.uint8)[:int(np.prod(shape))].reshape(shape)
    isc = rng.uniform(0, 9, int(np.prod(shape[:3])) * bs + 16).astype(np.float32)[:-16].reshape(shape[:3] + (bs,))
    pos = np.arange(n_keys)
    idx[0, table[pos // bs], :, :, pos % bs] = (q + 128).reshape(n_keys, KVH, r // 4, 4)
    isc[0, table[pos // bs], :, pos % bs] = s
    return table, q, s, idx, isc


@pytest.mark.parametrize("phi", [0, 1])
@pytest.mark.parametrize("agg", [0, 1])
@pytest.mark.parametrize("n_keys, k_blocks, bs, isa, M", [
    (333, 5, 16, "avx512vnni", 1), (1001, 17, 16, "avx512vnni", 3), (97, 1, 16, "avx512vnni", 1),
    (1001, 17, 16, "avx2", 5), (203, 9, 4, "avx512vnni", 7)])
def test_select_rows_matches_oracle(phi, agg, n_keys, k_blocks, bs, isa, M):
    """Each of M consecutive rows (the last with n_keys keys): scores of every candidate
    block against the oracle (fastmath sums, Cephes exp: rtol 1e-4), the k best picked
    (ties either way), the table [sinks, chosen, window] and the keys it holds."""
    from llcinfer.kernels.isa import supported_isas
    if isa not in supported_isas():
        pytest.skip(f"{isa} not on this CPU")
    rng = np.random.default_rng(n_keys + 7 * phi + 3 * agg + M)
    KVH, G, r = 2, 3, 16
    H = KVH * G
    table, q, s, idx, isc = index_arrays(rng, n_keys, KVH, r, bs, 9)
    qt = rng.standard_normal((M, H, r)).astype(np.float32)
    hbasis = np.broadcast_to(np.eye(r, dtype=np.float32), (H, r, r)).copy()  # [H, r, D = r]: qt bit for bit
    w = rng.uniform(0.5, 1.5, H).astype(np.float32)
    nb = len(table)
    window = n_keys - (nb - 2) * bs  # the last row keeps 2 window blocks
    conf = np.array([1, bs, window, k_blocks, phi, agg, 0, 0], np.int64)  # SP_*: min_context, sink (1 block), ...
    scores, sel = np.full((M, nb), np.nan, np.float32), np.full((M, nb), -1, np.int32)
    keys = np.zeros(M, np.int64)
    n_past = n_keys - M
    select_rows(qt, hbasis, 1.0, idx, isc, 0, table, n_past, bs, conf, w, 2, scores, sel, keys, make_tag(isa))
    slot_of = {int(b): i for i, b in enumerate(table)}
    for m in range(M):
        n = n_past + m + 1
        nb_m = -(-n // bs)
        n_sink, n_win = kept_blocks(n, bs, bs, window)
        want = naive.block_scores(qt[m], q[:n], s[:n], G, phi, agg, w, n_sink, n_win, bs)  # [candidates]
        if want.size <= k_blocks:  # nothing to drop: the row's own table
            assert keys[m] == n and (sel[m, :nb_m] == table[:nb_m]).all()
            continue
        np.testing.assert_allclose(scores[m, :want.size], want, rtol=1e-4)
        got = np.array([slot_of[int(b)] for b in sel[m, n_sink:n_sink + k_blocks]]) - n_sink
        assert (np.diff(got) > 0).all() and got.min() >= 0 and got.max() < want.size  # ascending, distinct
        np.testing.assert_allclose(np.sort(want[got]), np.sort(want)[-k_blocks:], rtol=1e-4)  # the k best
        assert (sel[m, :n_sink] == table[:n_sink]).all()
        assert (sel[m, n_sink + k_blocks:n_sink + k_blocks + n_win] == table[nb_m - n_win:nb_m]).all()
        assert keys[m] == (n_sink + k_blocks + n_win - 1) * bs + n - (nb_m - 1) * bs


@pytest.mark.parametrize("reuse, cos_min", [(3, -1.0), (2, 0.8), (40, 0.95)])
def test_select_rows_reuse_matches_oracle(reuse, cos_min):
    """With reuse_steps R: row m takes the blocks of the last row a before it that scored
    when m - a <= R and the mean cosine of their query heads >= cos_min:
    [sinks, a's chosen blocks, every block from a's window on] (sparse_reuse.py)."""
    rng = np.random.default_rng(reuse)
    KVH, G, r, bs, M, n_keys = 2, 3, 16, 16, 24, 1200
    H = KVH * G
    table, q, s, idx, isc = index_arrays(rng, n_keys, KVH, r, bs, 5)
    base = rng.standard_normal((H, r))
    qt = (base + rng.uniform(0, 0.9, (M, 1, 1)) * rng.standard_normal((M, H, r))).astype(np.float32)  # [M, H, r]
    hbasis = np.broadcast_to(np.eye(r, dtype=np.float32), (H, r, r)).copy()  # [H, r, D = r]
    w = np.ones(H, np.float32)
    conf = SparseConfig(top_k=5 * bs, sink=bs, window=3 * bs, min_context=1, reuse_steps=reuse,
                        reuse_cos=cos_min).kernel_conf(bs)
    nb = len(table)
    scores, sel = np.zeros((M, nb), np.float32), np.full((M, nb), -1, np.int32)
    keys = np.zeros(M, np.int64)
    n_past = n_keys - M
    reused = select_rows(qt, hbasis, 1.0, idx, isc, 0, table, n_past, bs, conf, w, 2, scores, sel, keys,
                         make_tag("avx2"))
    cos = lambda x, y: np.mean(np.sum(x * y, 1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1))  # noqa: E731
    a, want_reused = 0, 0
    for m in range(M):
        n = n_past + m + 1
        nb_m = -(-n // bs)
        n_sink, n_win = kept_blocks(n, bs, bs, 3 * bs)
        if m and m - a <= reuse and cos(qt[m].astype(np.float64), qt[a].astype(np.float64)) >= cos_min:
            want_reused += 1
            a_nb = -(-(n_past + a + 1) // bs)
            a_win = kept_blocks(n_past + a + 1, bs, bs, 3 * bs)[1]
            want = np.concatenate([table[:n_sink], sel[a, n_sink:n_sink + 5], table[a_nb - a_win:nb_m]])
        else:
            a = m
            fresh = np.full((1, nb), -1, np.int32)
            k1 = np.zeros(1, np.int64)
            select_rows(qt[m:m + 1], hbasis, 1.0, idx, isc, 0, table, n - 1, bs, conf, w, 2, scores[:1], fresh, k1,
                        make_tag("avx2"))  # the row alone scores
            want = fresh[0, :n_sink + 5 + n_win]
        assert np.array_equal(sel[m, :len(want)], want), m
        assert keys[m] == (len(want) - 1) * bs + n - (nb_m - 1) * bs
    assert reused == want_reused and (0 < reused < M - 1 if cos_min > 0 else reused > 0)


def test_top_blocks_ties_and_short_input():
    out = np.empty(8, np.int32)
    assert top_blocks(np.array([3, 1, 3, 2, 3], np.float32), 2, out) == 2 and list(out[:2]) == [0, 2]
    assert top_blocks(np.array([1, 5, 2], np.float32), 2, out) == 2 and list(out[:2]) == [1, 2]
    assert top_blocks(np.array([1, 5], np.float32), 4, out) == 2 and list(out[:2]) == [0, 1]


# ---------------------------------------------------------------------------- attention on a pool
def filled_sequence(rng, n_keys, KVH=2, D=32, bs=4, L=2):
    pool = KVPool(L, KVH, D, bs, 3 * (-(-n_keys // bs)) + 4, "f32")
    dummy = PagedSequence(pool, n_keys + 8, name="interleaved")
    seq = PagedSequence(pool, n_keys + 8)
    for _ in range(-(-n_keys // bs)):  # blocks of the two sequences interleave: scattered tables
        dummy.n_tokens = dummy.n_tokens + bs
        seq.n_tokens = seq.n_tokens + bs
    seq.truncate(n_keys)
    k = rng.standard_normal((L, n_keys, KVH, D)).astype(np.float32)
    v = rng.standard_normal((L, n_keys, KVH, D)).astype(np.float32)
    for li in range(L):
        seq.store(li, 0, k[li], v[li])
    return pool, seq, k, v


@pytest.mark.parametrize("n_keys", [61, 150])
def test_sparse_attention_on_its_selection_matches_oracle(n_keys):
    rng = np.random.default_rng(n_keys)
    L, KVH, D, bs, H = 2, 2, 32, 4, 6
    pool, seq, k, v = filled_sequence(rng, n_keys, KVH, D, bs, L)
    cfg = SparseConfig(top_k=12, sink=4, window=8, min_context=1, dense_layers=0, rank=8)
    sp = SparseAttention(cfg, random_basis(rng, L, KVH, 8, D), pool, H)
    tables = seq.table[None, :seq.n_blocks]
    for li in range(L):
        sp.store_index(li, k[li].reshape(n_keys, -1), np.arange(n_keys), np.zeros(n_keys, np.int64), tables)
    q = rng.standard_normal((1, H, D)).astype(np.float32)
    out = np.full((1, H, D), np.nan, np.float32)
    sp.attend(seq, 1, q, n_keys - 1, 0.2, out, {})
    picked = sp.select(seq, 1, q[0], n_keys, 0.2)  # pool blocks
    slot_of = {int(b): i for i, b in enumerate(seq.table[:seq.n_blocks])}
    pos = np.concatenate([np.arange(slot_of[int(b)] * bs, min(n_keys, slot_of[int(b)] * bs + bs)) for b in picked])
    assert len(pos) < n_keys and 0 in pos and n_keys - 1 in pos  # sparse, sinks and window kept
    assert len(picked) == 1 + 3 + 3  # sink block, top 12 / 4 = 3 blocks, window: positions n-8 .. n-1
    want = naive.attention(q[0][None], k[1][pos], v[1][pos], len(pos) - 1, 0.2)[0]
    np.testing.assert_allclose(out[0], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n_keys, M, full_every", [(150, 9, 1), (203, 17, 2)])
def test_sparse_chunk_rows_equal_rows_alone(n_keys, M, full_every):
    """A prompt chunk's rows give the bits each row gives alone (as a decode row), on full
    and shared layers, min_context in the middle of the chunk: rows before it dense."""
    rng = np.random.default_rng(n_keys)
    L, KVH, D, bs, H = 3, 2, 32, 4, 6
    pool, seq, k, v = filled_sequence(rng, n_keys, KVH, D, bs, L)
    n_past = n_keys - M
    cfg = SparseConfig(top_k=12, sink=4, window=8, min_context=n_past + 4, dense_layers=0, full_every=full_every,
                       rank=8, reuse_steps=0)  # a row alone has no earlier row to reuse
    sp = SparseAttention(cfg, random_basis(rng, L, KVH, 8, D), pool, H)
    tables = seq.table[None, :seq.n_blocks]
    for li in range(L):
        sp.store_index(li, k[li].reshape(n_keys, -1), np.arange(n_keys), np.zeros(n_keys, np.int64), tables)
    q = rng.standard_normal((L, M, H, D)).astype(np.float32)
    chunk, alone = np.full((2, L, M, H, D), np.nan, np.float32)
    selected, selected_alone = {}, [{} for _ in range(M)]
    for li in range(L):
        sp.attend(seq, li, q[li], n_past, 0.2, chunk[li], selected)
        for m in range(M):
            sp.attend(seq, li, q[li, m:m + 1], n_past + m, 0.2, alone[li, m:m + 1], selected_alone[m])
    assert np.array_equal(chunk, alone)
    assert sp.stats.selections == 2 * (M - 3) * len(range(0, L, full_every))  # rows from min_context select
    assert sp.stats.keys_attended < sp.stats.keys_total


# ---------------------------------------------------------------------------- model level
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    with isolated_runtime(tmp_path_factory.mktemp("llcinfer_home")):
        path = write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf", arch="qwen2", qtype="Q8_0",
                                n_layer=3, d_model=128, n_head=4, n_kv_head=2, d_ff=96)
        yield path, Transformer(GGUFFile(path), llama_rounding=False)


SEQ = [int(t) for t in np.random.default_rng(5).integers(0, 250, 71)]


def test_calibrated_basis_is_orthonormal_and_captures_keys(tiny):
    _, tm = tiny
    basis = calibrate_basis(tm, SEQ, rank=4)
    assert basis.shape == (3, 2, 4, 32)
    np.testing.assert_allclose(np.einsum("lhrd,lhsd->lhrs", basis, basis), np.broadcast_to(np.eye(4), (3, 2, 4, 4)),
                               atol=1e-5)
    k = np.random.default_rng(0).standard_normal((50, 2, 32)).astype(np.float32)
    back = rotate_to(rotate_to(k, np.arange(50), np.arange(50) + 999, tm.inv_freq, tm.config.rope_neox),
                     np.arange(50) + 999, np.arange(50), tm.inv_freq, tm.config.rope_neox)
    np.testing.assert_allclose(back, k, atol=1e-4)
    full = fit_basis([k], 32)[0]  # rank D: a rotation, keys kept whole
    np.testing.assert_allclose(np.einsum("nhd,hrd,hre->nhe", k, full, full), k, atol=1e-4)


def test_sparse_equals_dense_when_top_k_covers_the_context(tiny):
    _, tm = tiny
    ids = SEQ[:50]
    pool, prefix = tm.new_pool(80, kv_type="f32", block_size=4)
    dense = tm.forward(ids, PagedSequence(pool, 80, prefix), all_logits=True)
    pool2, prefix2 = tm.new_pool(80, kv_type="f32", block_size=4)
    cfg = SparseConfig(top_k=4096, sink=4, window=4, min_context=1, dense_layers=1, rank=8)
    tm.sparse = sp = SparseAttention(cfg, calibrate_basis(tm, SEQ, 8), pool2, tm.config.n_head)
    try:
        got = tm.forward(ids, PagedSequence(pool2, 80, prefix2), all_logits=True)
    finally:
        tm.sparse = None
    np.testing.assert_allclose(got, dense, rtol=1e-5, atol=1e-5 * np.abs(dense).max())
    assert sp.stats.rows == 2 * 50 and sp.stats.keys_attended == sp.stats.keys_total


def index_of(sp, seq):
    """The index entries of seq's positions  # [full layer, n, KVH, r], [full layer, n, KVH]."""
    pos = np.arange(seq.n_tokens)
    blk, j = seq.table[pos // sp.pool.block_size], pos % sp.pool.block_size
    got = [sp.index.entries(slot, blk, j) for slot in range(len(sp.index.full_layers))]
    return np.stack([g[0] for g in got]), np.stack([g[1] for g in got])


def assert_index_consistent(sp, seq):
    """Every position's index entry is the index key of the K the sequence holds there."""
    got_q, got_s = index_of(sp, seq)
    for slot, li in enumerate(sp.index.full_layers):
        want_q, want_s = naive.index_keys(seq.keys(li), sp.basis[li])
        np.testing.assert_allclose(got_s[slot], want_s, rtol=1e-5)
        assert np.abs(got_q[slot].astype(int) - want_q).max() <= 1


def test_index_cache_follows_fork_truncate_cow_and_prefix_sharing(tiny):
    _, tm = tiny
    pool, prefix = tm.new_pool(96, n_seq=3, kv_type="f32", block_size=4)
    cfg = SparseConfig(top_k=8, sink=4, window=4, min_context=20, dense_layers=1, full_every=2, rank=8)
    tm.sparse = sp = SparseAttention(cfg, calibrate_basis(tm, SEQ, 8), pool, tm.config.n_head)
    try:
        assert sp.kinds == ["dense", "full", "shared"] and sp.index.full_layers == [1]
        a = PagedSequence(pool, 96, prefix, "a")
        tm.forward(SEQ[:30], a)  # 7.5 blocks: a shared partial tail after the fork
        b = a.fork("b")
        tm.forward(SEQ[40:45], b)  # copy-on-write of the tail block
        tm.forward(SEQ[50:53], a)
        assert_index_consistent(sp, a)
        assert_index_consistent(sp, b)
        a.truncate(22)
        tm.forward(SEQ[60:70], a)
        assert_index_consistent(sp, a)
        c = PagedSequence(pool, 96, prefix, "c")
        assert c.adopt_prefix(SEQ[:30]) == 28  # a's full blocks, registered before a diverged
        tm.forward(SEQ[28:33], c)
        assert_index_consistent(sp, c)
        assert sp.stats.rows > 0 and sp.stats.keys_attended < sp.stats.keys_total  # some rows ran sparse
    finally:
        tm.sparse = None


def test_llm_sparse_surface(tiny):
    """LLM(sparse=True): the basis is calibrated once and cached, decode rows stay on the
    executor, kv_stats reports the index cache; below the threshold output equals dense."""
    from llcinfer import LLM
    from llcinfer.errors import UsageError

    path, _ = tiny
    with pytest.raises(UsageError):
        LLM(str(path), threads=1, sparse_top_k=64)  # needs sparse=True
    with pytest.raises(UsageError):
        LLM(str(path), threads=1, sparse=True, sparse_top_k=0)
    dense = LLM(str(path), threads=1, n_ctx=128).generate("hello the world", max_tokens=6, temperature=0)
    llm = LLM(str(path), threads=1, n_ctx=128, sparse=True, sparse_top_k=64)
    assert llm.executor_note is None and llm.engine.runner.executor.sparse is llm.engine.sparse
    assert llm.engine.sparse.config.top_k == 64 and llm.engine.sparse.kinds == ["dense", "full", "full"]
    out = llm.generate("hello the world", max_tokens=6, temperature=0)
    assert out == dense  # every row under the 4096-key threshold: dense
    st = llm.kv_stats()
    assert st["index_full_layers"] == 2 and st["index_bytes_per_token"] == 2 * 2 * (16 + 4)
    assert st["index_bytes_per_token_all_layers"] == 3 * 2 * 20 and st["kv_bytes_per_token"] > 0
    assert st["sparse_rows"] == 0 and st["sparse_keys_fraction"] is None and st["sparse_reused"] == 0
    assert llm.engine.sparse.config.top_k == 64  # a top-k given stays as given
