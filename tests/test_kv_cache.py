"""The paged KV cache (llcinfer.kv): block-table arithmetic, stable addresses, commit and
release, rollback, prefix sharing with copy-on-write, exhaustion, and the paged
attention kernel for f32 / f16 / int8 storage against the NumPy oracle."""

import numpy as np
import psutil
import pytest
import naive
from tiny_models import isolated_runtime, write_tiny_model

from llcinfer.errors import OutOfMemoryError, UsageError
from llcinfer.model.gguf_file import GGUFFile
from llcinfer.kernels.paged_attention import paged_attention, paged_attention_parallel, paged_attention_serial
from llcinfer.kernels.tables import F16_TO_F32
from llcinfer.kv import KVPool, PagedSequence, PrefixCache
from llcinfer.engine.reference import ReferenceModel
from llcinfer.engine.transformer import Transformer

SEQ = [3, 200, 17, 262, 45, 45, 99, 1, 150, 7, 271, 64, 33, 128, 0, 255, 80, 12, 9, 77, 31, 5, 240, 66, 101]


def make_seq(L=2, KVH=2, D=32, bs=4, n_blocks=32, kv_type="f16", budget=1 << 30, prefix=False, n_ctx=None):
    pool = KVPool(L, KVH, D, bs, n_blocks, kv_type, budget)
    pc = PrefixCache(bs) if prefix else None
    if pc is not None:
        pool.on_evict = pc.forget
    return pool, pc, PagedSequence(pool, n_ctx or n_blocks * bs, pc)


# ---------------------------------------------------------------------------- pool, block table
def test_block_geometry_and_table_arithmetic():
    pool, _, seq = make_seq(L=2, KVH=2, D=32, bs=4, kv_type="f32")
    import mmap

    assert pool.block_bytes % mmap.PAGESIZE == 0 and pool.block_bytes >= 2 * 2 * 2 * 4 * 32 * 4
    for n, nb in ((0, 0), (1, 1), (4, 1), (5, 2), (13, 4)):
        seq.n_tokens = n
        assert seq.n_blocks == nb and pool.n_committed == nb
    seq.truncate(0)
    rng = np.random.default_rng(0)
    k = rng.standard_normal((11, 2, 32)).astype(np.float32)  # [M, KVH, D]
    v = rng.standard_normal((11, 2, 32)).astype(np.float32)
    seq.store(1, 0, k, v)
    seq.n_tokens = 11
    # position p lives in block table[p // bs], slot p % bs; f32 / f16 pools are head-major
    # [layer, kv_head, block, K/V, ...]: K transposed [D, token], V as [token, D]
    flat = pool.data.reshape(-1)
    for p in range(11):
        blk, j = seq.table[p // 4], p % 4
        for h in range(2):
            base_k = ((1 * 2 + h) * pool.n_blocks + blk) * 2 * 4 * 32
            np.testing.assert_array_equal(flat[base_k + j:base_k + 4 * 32:4], k[p, h])
            off_v = base_k + 4 * 32 + j * 32
            np.testing.assert_array_equal(flat[off_v:off_v + 32], v[p, h])


def test_addresses_fixed_while_sequences_grow():
    pool, _, a = make_seq(bs=4, n_blocks=256)
    b = PagedSequence(pool, 1024, None, "sequence 1")
    base = pool.base_address
    a.n_tokens = 10
    addr = a.block_addresses()
    first = pool.data.ctypes.data
    for n in range(20, 400, 37):  # both grow, interleaved
        a.n_tokens = n
        b.n_tokens = n // 2
        assert a.block_addresses()[:len(addr)] == addr
    assert pool.base_address == base == first == pool.data.ctypes.data
    assert all(base <= x < base + pool.reserved_bytes for x in a.block_addresses() + b.block_addresses())
    assert set(a.table[:a.n_blocks]).isdisjoint(b.table[:b.n_blocks])


def test_commit_and_release_follow_the_tokens():
    """Pages are committed on first write and returned to the OS when a sequence ends."""
    L, KVH, D, bs = 4, 4, 64, 64
    pool, _, seq = make_seq(L, KVH, D, bs, n_blocks=4096, kv_type="f32")  # reserves 4096 blocks
    assert pool.reserved_bytes >= 1 << 30
    from llcinfer.weights.repack_cache import wait_loaded

    wait_loaded()  # an earlier test's weights moving onto 2 MiB pages would grow the RSS meanwhile
    proc = psutil.Process()
    r0 = proc.memory_info().rss
    n = 96 * bs  # ~ 48 MiB of K/V
    x = np.ones((n, KVH, D), np.float32)
    for li in range(L):
        seq.store(li, 0, x, x)
    seq.n_tokens = n
    r1 = proc.memory_info().rss
    assert pool.committed_bytes == 96 * pool.block_bytes
    assert r1 - r0 > 0.8 * pool.committed_bytes  # committed, and only that: not the reservation
    assert r1 - r0 < pool.reserved_bytes / 4
    seq.free()
    assert pool.n_committed == 0 and pool.n_released == 96
    assert proc.memory_info().rss - r0 < 0.2 * 96 * pool.block_bytes


def test_rollback_drops_tokens_and_whole_blocks():
    pool, _, seq = make_seq(bs=4)
    seq.prepare(list(range(10)))
    seq.finish(list(range(10)))
    assert seq.n_tokens == 10 and seq.n_blocks == 3
    seq.truncate(7)
    assert seq.n_tokens == 7 and seq.n_blocks == 2 and seq.tokens == list(range(7)) and pool.n_committed == 2
    seq.truncate(100)  # never grows
    assert seq.n_tokens == 7
    seq.truncate(0)
    assert seq.n_blocks == 0 and pool.n_committed == 0


def test_committed_path_holds_the_dropped_block_for_the_next_rows():
    """A verification's rows past the accepted path free a block; the sequence keeps it
    for its next rows instead of handing its pages back, and lets go of it when freed."""
    pool, _, seq = make_seq(bs=4)
    seq.prepare(list(range(7)))
    seq.finish(list(range(7)))
    seq.prepare([1, 2, 3, 4])  # a root and 3 draft rows: positions 7..10, a third block
    seq.finish([1, 2, 3, 4], index=False)
    dropped = int(seq.table[2])
    seq.commit_path(7, [])  # nothing accepted: the root at position 7 stays, block 2 is dropped
    assert seq.n_tokens == 8 and seq.n_blocks == 2 and pool.n_committed == 3 and pool.refcount[dropped] == 1
    seq.prepare([5])
    seq.finish([5])
    seq.prepare([6])  # position 9: the held block, no new one
    assert seq.n_blocks == 3 and int(seq.table[2]) == dropped and pool.n_committed == 3
    seq.truncate(8)  # a plain rollback gives blocks back
    assert pool.n_committed == 2
    seq.prepare([1, 2, 3])
    seq.finish([1, 2, 3], index=False)
    seq.commit_path(8, [0])
    seq.free()
    assert seq.n_blocks == 0 and pool.n_committed == 0 and pool.refcount.sum() == 0


def test_exhaustion_error_names_the_sequence_and_others_continue():
    pool, _, a = make_seq(bs=4, n_blocks=64, budget=0)
    pool.budget_blocks = 3  # a budget of three blocks
    b = PagedSequence(pool, 256, None, "sequence 7")
    a.n_tokens = 8  # 2 blocks
    b.n_tokens = 4  # 1 block: the budget is used up
    with pytest.raises(OutOfMemoryError, match="sequence 7.*budget"):
        b.prepare([1])
    with pytest.raises(OutOfMemoryError):
        b.prepare(list(range(9)))  # several blocks: all or nothing
    assert b.n_tokens == 4 and b.n_blocks == 1 and pool.n_committed == 3
    a.truncate(3)  # a frees a block
    b.n_tokens = 5
    assert pool.n_committed == 3


def test_pool_rejects_bad_arguments():
    with pytest.raises(UsageError):
        KVPool(2, 2, 32, 4, 8, "q4")
    with pytest.raises(UsageError):
        KVPool(2, 2, 32, 0, 8)


# ---------------------------------------------------------------------------- attention kernel
KERNELS = {"serial": paged_attention_serial, "parallel": paged_attention_parallel}


@pytest.mark.parametrize("kv_type", ["f32", "f16", "int8"])
@pytest.mark.parametrize("D,bs,group", [(32, 4, 1), (64, 16, 3), (16, 8, 2)])
def test_paged_attention_matches_oracle(kv_type, D, bs, group):
    L, KVH = 2, 2
    H = KVH * group
    scale = np.float32(1 / np.sqrt(D))
    rng = np.random.default_rng(D + bs)
    n_max = 80
    pool, _, seq = make_seq(L, KVH, D, bs, n_blocks=64, kv_type=kv_type)
    # scatter the sequence's blocks through the pool: the kernel must follow the table
    other = PagedSequence(pool, 1024, None, "filler")
    k = (rng.standard_normal((L, n_max, KVH, D)) * 2).astype(np.float32)
    v = rng.standard_normal((L, n_max, KVH, D)).astype(np.float32)
    for p in range(0, n_max, bs):
        other.n_tokens = other.n_tokens + 3
        seq.n_tokens = min(n_max, p + bs)
    for li in range(L):
        seq.store(li, 0, k[li], v[li])
    if kv_type == "f16":
        k, v = k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32)
    elif kv_type == "int8":
        k, v = naive.int8_kv_round(k, pool.group), naive.int8_kv_round(v, pool.group)
    for M, n_past in ((1, 0), (1, 37), (3, 40), (17, n_max - 17), (1, n_max - 1)):
        q = (rng.standard_normal((M, H, D)) * 2).astype(np.float32)
        for li in range(L):
            ref = naive.attention(q, k[li], v[li], n_past, scale)
            tol = 2e-5 * np.abs(v[li]).max()
            runs = [(fn, s) for fn in KERNELS.values() for s in (1, 2, 3)]
            for fn, splits in runs:
                out = np.full((M, H, D), np.nan, np.float32)
                fn(q, pool.data, pool.data_f32, F16_TO_F32, pool.kind, pool.group, pool.scale_offset,
                   seq.table[:seq.n_blocks], li, KVH, bs, n_past, scale, splits, out)
                assert np.abs(out - ref).max() <= tol, (fn, splits, M, n_past)
            out = np.full((M, H, D), np.nan, np.float32)
            seq.attention(li, q, n_past, scale, out)  # the dispatcher
            assert np.abs(out - ref).max() <= tol


def test_paged_attention_large_scores_do_not_overflow():
    pool, _, seq = make_seq(1, 1, 32, 4, kv_type="f32")
    rng = np.random.default_rng(2)
    k = (rng.standard_normal((43, 1, 32)) * 30).astype(np.float32)
    v = rng.standard_normal((43, 1, 32)).astype(np.float32)
    seq.store(0, 0, k, v)
    seq.n_tokens = 43
    q = (rng.standard_normal((3, 2, 32)) * 30).astype(np.float32)
    out = np.empty_like(q)
    paged_attention(q, pool.data, pool.data_f32, F16_TO_F32, 0, pool.group, pool.scale_offset,
                    seq.table[:seq.n_blocks], 0, 1, 4, 40, np.float32(1 / np.sqrt(32)), out, threads=2)
    np.testing.assert_allclose(out, naive.attention(q, k, v, 40, np.float32(1 / np.sqrt(32))), atol=1e-4)


def test_int8_store_matches_q8_0_rule():
    pool, _, seq = make_seq(1, 2, 64, 4, kv_type="int8")
    x = np.random.default_rng(1).standard_normal((5, 2, 64)).astype(np.float32)
    x[2, 1] = 0.0  # an all-zero group: scale 0, values 0
    seq.store(0, 0, x, x)
    seq.n_tokens = 5
    want = naive.int8_kv_round(x, 32)
    gs = 64 // 32
    for p in range(5):
        blk, j = seq.table[p // 4], p % 4
        for h in range(2):
            r = (0 * 2 + 0) * 2 * 4 + h * 4 + j
            q = pool.data[blk, r * 64:(r + 1) * 64].astype(np.float32)
            d = np.repeat(pool.data_f32[blk, pool.scale_offset + r * gs:pool.scale_offset + (r + 1) * gs], 32)
            np.testing.assert_allclose(q * d, want[p, h], rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------- model level
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    with isolated_runtime(tmp_path_factory.mktemp("llcinfer_home")):
        path = write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf", arch="llama", qtype="Q8_0",
                                d_model=128, n_head=4, n_kv_head=2, d_ff=96)
        yield path, Transformer(GGUFFile(path), llama_rounding=False)


def fresh_logits(tm, ids, kv_type="f32"):
    return tm.forward(ids, tm.new_cache(64, kv_type=kv_type, block_size=4), all_logits=True)


@pytest.mark.parametrize("kv_type", ["f32", "f16", "int8"])
def test_paged_forward_matches_reference(tiny, kv_type):
    path, tm = tiny
    ref = ReferenceModel(GGUFFile(path), llama_rounding=False).logits(SEQ)
    got = fresh_logits(tm, SEQ, kv_type)
    scale = np.abs(ref).max()
    tol = {"f32": 2e-5, "f16": 2e-2, "int8": 5e-2}[kv_type]
    assert np.abs(got - ref).max() <= tol * scale


def test_prefix_sharing_copy_on_write_diverging_sequences(tiny):
    """B adopts A's prefix (a partial shared block), both go on with different tokens:
    each sees only its own tokens, exactly as if it had run alone."""
    path, tm = tiny
    pool, prefix = tm.new_pool(64, n_seq=3, kv_type="f32", block_size=4)
    a = PagedSequence(pool, 64, prefix, "sequence a")
    shared, tail_a, tail_b = SEQ[:10], SEQ[10:16], SEQ[16:23]
    tm.forward(shared + tail_a, a)
    assert prefix.stats.registered == 4  # 16 tokens = 4 full blocks indexed
    b = PagedSequence(pool, 64, prefix, "sequence b")
    # B matches A's first 12 tokens (3 full blocks) but adopts 10 (say a prompt of 11), the
    # last block only partly, then writes position 10 on: copy-on-write of that block
    n = b.adopt_prefix(SEQ[:12], max_tokens=10)
    assert n == 10 and b.n_blocks == 3 and prefix.stats.hit_tokens == 10
    assert list(b.table[:3]) == list(a.table[:3])  # the same physical blocks
    assert all(pool.refcount[blk] == 2 for blk in a.table[:3])
    got_b = tm.forward(SEQ[10:11] + tail_b, b, all_logits=True)
    assert prefix.stats.cow_copies == 1 and b.table[2] != a.table[2]  # the partial block was copied
    assert list(b.table[:2]) == list(a.table[:2])
    want_b = fresh_logits(tm, SEQ[:11] + tail_b)[10:]
    np.testing.assert_allclose(got_b, want_b, rtol=0, atol=1e-5 * np.abs(want_b).max())
    # A continues unaffected by B's writes
    more = [5, 6, 7]
    got_a = tm.forward(more, a, all_logits=True)
    want_a = fresh_logits(tm, shared + tail_a + more)[16:]
    np.testing.assert_allclose(got_a, want_a, rtol=0, atol=1e-5 * np.abs(want_a).max())
    # fork: a copy that shares every block, then diverges
    c = a.fork("sequence c")
    got_c = tm.forward([9, 9], c, all_logits=True)
    want_c = fresh_logits(tm, shared + tail_a + more + [9, 9])[-2:]
    np.testing.assert_allclose(got_c, want_c, rtol=0, atol=1e-5 * np.abs(want_c).max())
    got_a2 = tm.forward([4], a)
    np.testing.assert_allclose(got_a2, fresh_logits(tm, shared + tail_a + more + [4])[-1], rtol=0,
                               atol=1e-5 * np.abs(got_a2).max())
    # ending sequences: indexed blocks stay cached, the rest go back; then drop the cache
    for s in (a, b, c):
        s.free()
    assert pool.n_committed == len(pool._cached) > 0
    pool.drop_cached()
    assert pool.n_committed == 0 and prefix.match(shared + tail_a)[0] == []


def test_llm_kv_type_and_chat_turn_reuse(tiny):
    from llcinfer import LLM

    path, _ = tiny
    with pytest.raises(UsageError):
        LLM(str(path), threads=1, kv_type="q4")
    llm = LLM(str(path), threads=1, n_ctx=128, kv_type="int8", n_batch=4)
    assert llm.engine.pool.kv_type == "int8"
    llm.generate("hello the world", max_tokens=3, temperature=0)
    common = "hello the world, in here " * 8  # > 2 blocks of 16 tokens
    out = llm.generate_batch([common + "the", common + "in"], max_tokens=3, temperature=0)
    assert len(out) == 2 and all(o.error is None for o in out)
    assert llm.kv_stats()["prefix_hit_tokens"] > 0


@pytest.mark.parametrize("kv_type", ["f32", "f16", "int8"])
def test_read_returns_what_was_stored(kv_type):
    pool, _, seq = make_seq(2, 2, 32, 4, kv_type=kv_type)
    x = np.random.default_rng(3).standard_normal((9, 2, 32)).astype(np.float32)
    seq.store(1, 0, x, -x)
    seq.n_tokens = 9
    k, v = seq.read(1, 2, 9)
    want = {"f32": x, "f16": x.astype(np.float16).astype(np.float32), "int8": naive.int8_kv_round(x, 32)}[kv_type][2:]
    np.testing.assert_allclose(k, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(v, -want, rtol=1e-6, atol=1e-7)
