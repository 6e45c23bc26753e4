"""Sparse attention on the decode executor: the same selection, index keys and logits as
the batched path's sparse attention, dense bits when the selection covers the context,
a chain of rows in one step equal to its tokens one step at a time, and the reuse of a
selection across decode steps equal to its reuse across the rows of a prompt chunk."""

import numpy as np
import pytest

from tiny_models import isolated_runtime, write_tiny_model
from llcinfer.engine.sparse_setup import calibrate_basis
from llcinfer.engine.transformer import Transformer
from llcinfer.executor import DecodeExecutor, Domains
from llcinfer.kv import PagedSequence
from llcinfer.model.gguf_file import GGUFFile
from llcinfer.sparse import SparseAttention, SparseConfig

PROMPT = [int(t) for t in np.random.default_rng(11).integers(0, 250, 150)]  # 10 blocks of 16
# sparse from 100 keys on: sink block, 2 chosen blocks, window blocks (the first layer dense)
# (a decode row on the batched path scores alone: without reuse, as the executor's rows)
CONFIG = SparseConfig(top_k=32, sink=4, window=20, min_context=100, dense_layers=1, full_every=2, rank=8,
                      reuse_steps=0)
DOMAINS = [Domains(weight=(None,)), Domains(weight=(None, None)), Domains(weight=(None,), attention=(None,))]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    with isolated_runtime(tmp_path_factory.mktemp("llcinfer_home")):
        path = write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf", arch="qwen2", qtype="Q8_0",
                                n_layer=4, d_model=128, n_head=4, n_kv_head=2, d_ff=96)
        basis = calibrate_basis(Transformer(GGUFFile(path)), PROMPT[:64], CONFIG.rank)
        yield path, basis


def sparse_model(path, basis, config=CONFIG, n_ctx=192):
    """A model with sparse attention on a fresh pool, and a sequence holding PROMPT."""
    m = Transformer(GGUFFile(path))
    pool, prefix = m.new_pool(n_ctx, 2, prefix_sharing=False)
    if config is not None:
        m.sparse = SparseAttention(config, basis, pool, m.config.n_head)
    seq = PagedSequence(pool, n_ctx, None, "s")
    m.forward(PROMPT, seq)
    return m, seq


def index_entries(sp, seq):
    pos = np.arange(seq.n_tokens)
    blk, j = seq.table[pos // sp.pool.block_size], pos % sp.pool.block_size
    return [sp.index.entries(slot, blk, j) for slot in range(len(sp.index.full_layers))]


@pytest.mark.parametrize("dom", range(len(DOMAINS)))
def test_executor_sparse_equals_batched_sparse(tiny, dom):
    path, basis = tiny
    ref, ref_seq = sparse_model(path, basis)
    fast, fast_seq = sparse_model(path, basis)
    ex = DecodeExecutor(fast, DOMAINS[dom])
    assert fast.sparse.kinds == ["dense", "full", "shared", "full"]
    tok = 7
    for _ in range(6):
        want = ref.forward([tok], ref_seq)
        got = ex.step([fast_seq], [tok])[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        tok = int(np.argmax(want))
    for (wq, ws), (gq, gs) in zip(index_entries(ref.sparse, ref_seq), index_entries(fast.sparse, fast_seq)):
        np.testing.assert_allclose(gs, ws, rtol=1e-5)
        assert np.abs(gq - wq).max() <= 1  # a rounding tie may fall the other way
    want_t, got_t = ref.sparse.stats, fast.sparse.totals()
    assert got_t.rows == want_t.rows and got_t.keys_total == want_t.keys_total
    assert got_t.keys_attended == want_t.keys_attended < got_t.keys_total
    assert got_t.selections == want_t.selections > 0
    st = fast.sparse.kv_stats()
    assert 0 < st["sparse_keys_fraction"] < 1 and st["sparse_rows"] == want_t.rows
    ex.close()


def test_executor_sparse_covering_selection_is_dense(tiny):
    """top_k over the whole context: the gathered tables are the sequence's own, the logits
    the dense executor's bit for bit."""
    path, basis = tiny
    cover = SparseConfig(top_k=4096, sink=4, window=20, min_context=100, dense_layers=1, full_every=2, rank=8)
    dense, dense_seq = sparse_model(path, basis, None)
    sp, sp_seq = sparse_model(path, basis, cover)
    ex_d, ex_s = DecodeExecutor(dense, DOMAINS[1]), DecodeExecutor(sp, DOMAINS[1])
    for tok in (3, 9, 27, 81):
        assert np.array_equal(ex_s.step([sp_seq], [tok]), ex_d.step([dense_seq], [tok]))
    t = sp.sparse.totals()
    assert t.rows > 0 and t.keys_attended == t.keys_total and t.selections == 0
    ex_d.close()
    ex_s.close()


def test_executor_sparse_chain_equals_token_by_token(tiny):
    """Rows of one sequence in one step select and attend as decoding them one by one does
    (each row's index key is written before the selection of the rows after it)."""
    path, basis = tiny
    m, seq = sparse_model(path, basis)
    ex = DecodeExecutor(m, DOMAINS[1])
    chain = [11, 4, 250, 3, 9]
    want = np.stack([ex.step([seq], [t])[0] for t in chain])
    want_index = index_entries(m.sparse, seq)
    seq.truncate(len(PROMPT))
    got = ex.step_rows([seq], [chain])
    assert np.array_equal(got, want)
    for (wq, ws), (gq, gs) in zip(want_index, index_entries(m.sparse, seq)):
        assert np.array_equal(gq, wq) and np.array_equal(gs, ws)
    m.sparse = None
    with pytest.raises(ValueError, match="sparse attention changed"):
        ex.step([seq], [1])
    ex.close()


@pytest.mark.parametrize("reuse_cos", [-1.0, 0.2])  # 0.2: the tiny model's queries reuse some steps
def test_executor_reuse_across_steps_equals_reuse_across_chunk_rows(tiny, reuse_cos):
    """Decode steps that reuse the selection of the step that last scored (at most 2 back,
    query cosine >= reuse_cos) give the logits of the same tokens run as one chunk, where
    a row reuses the selection of the last row before it that scored; a row that moves to
    another sequence forgets its anchor."""
    from dataclasses import replace

    path, basis = tiny
    config = replace(CONFIG, reuse_steps=2, reuse_cos=reuse_cos)
    ref, ref_seq = sparse_model(path, basis, config)
    fast, fast_seq = sparse_model(path, basis, config)
    ex = DecodeExecutor(fast, DOMAINS[1])
    t0 = fast.sparse.totals()  # the prompt's rows (50 of them sparse) reused already
    assert t0.reused > t0.selections > 0 if reuse_cos < 0 else t0.selections > 0
    chain = [7, 91, 4, 250, 3, 9, 44]
    want = ref.forward(chain, ref_seq, all_logits=True)
    got = np.stack([ex.step([fast_seq], [t])[0] for t in chain])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    t, r = fast.sparse.totals(), ref.sparse.stats
    assert (t.selections, t.reused) == (r.selections, r.reused)
    assert t.selections + t.reused - t0.selections - t0.reused == 2 * len(chain)  # two full layers
    if reuse_cos < 0:
        assert t.reused - t0.reused == 2 * 4  # steps 2, 3, 5, 6 reuse; 1, 4, 7 score
    else:
        assert t.reused > t0.reused and t.selections - t0.selections > 2  # the cosine gate both ways
    other, ref_other = fast_seq.fork("other"), ref_seq.fork("other")  # at the position row 0 expects next
    want = ref.forward([5], ref_other)
    np.testing.assert_allclose(ex.step([other], [5])[0], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert (fast.sparse.totals().selections, fast.sparse.totals().reused) == (t.selections + 2, t.reused)
    ex.close()
