"""The on-disk cache of repacked weights (kernels/repack_cache.py).

Tiny models are below the cache's size threshold, so every test lowers it
(``MIN_FILE_SIZE``) and points the cache at a temporary directory.
"""

import errno
import functools
import json
import os
import re
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from llcinfer.weights import file_pages
from llcinfer.model import gguf_file
from llcinfer.model.gguf_file import GGUFFile
from llcinfer.kernels import Linear
from llcinfer.kernels import isa as isa_mod
from llcinfer.weights import repack as rp
from llcinfer.weights import page_cache
from llcinfer.weights import repack_cache as rc
from llcinfer.kernels.simd import lanes
from llcinfer.engine.transformer import Transformer

from tiny_models import QUANT_TYPES, fake_tensor, isolated_runtime, write_tiny_model

SIMD_ISAS = [i for i in isa_mod.supported_isas() if i != "generic"]
# one path per lane count: the layout depends on W only
ISAS = list({lanes(i): i for i in reversed(SIMD_ISAS)}.values())

pytestmark = pytest.mark.skipif(not SIMD_ISAS, reason="CPU without AVX2: nothing is repacked")


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """The cache directory (empty), with the size threshold and free-space margin off."""
    d = tmp_path / "repack"
    monkeypatch.setenv("LLCINFER_REPACK_CACHE", str(d))
    monkeypatch.setattr(rc, "MIN_FILE_SIZE", 0)
    monkeypatch.setattr(rc, "MIN_FREE_BYTES", 0)
    rc.clear()
    with isolated_runtime(tmp_path / "home"):
        yield d
    rc.clear()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """models(qtype, **kw) -> a tiny model's path, written once per module."""
    root = tmp_path_factory.mktemp("tiny_models")

    @functools.cache
    def get(qtype="Q8_0", **kw):
        name = "-".join([qtype, *(f"{k}={v}" for k, v in sorted(kw.items()))])
        return write_tiny_model(root / f"{name}.gguf", qtype=qtype, **kw)

    return get


def packed_all(path, isa) -> dict[str, np.ndarray]:
    """name -> Linear(...).prepare() for every repacked matrix of the model, as the forward
    pass does (a fresh process: the open packs forgotten)."""
    rc.clear()
    f = GGUFFile(path)
    tied = "output.weight" not in f.tensors
    out = {}
    for n, t in f.tensors.items():
        if len(t.shape) == 2 and int(t.qtype) in rp.SUPPORTED and (n != "token_embd.weight" or tied):
            out[n] = Linear(t, isa=isa).prepare()
    rc.wait_loaded()  # the file is at rest (moved to 2 MiB pages) before a test damages it
    return out


def fresh(path, isa) -> dict[str, np.ndarray]:
    f = GGUFFile(path)
    W = lanes(isa)
    return {n: rp.repack(t.data, int(t.qtype), t.shape[1], W) for n, t in f.tensors.items()
            if len(t.shape) == 2 and int(t.qtype) in rp.SUPPORTED}


def assert_same(got, want):
    assert set(got) <= set(want) and got
    for n, a in got.items():
        assert a.dtype == np.uint8 and a.ndim == 2 and a.flags.c_contiguous and not a.flags.writeable
        assert a.tobytes() == want[n].tobytes() and a.shape == want[n].shape, n


def only_file(d):
    files = sorted(os.listdir(d))
    assert len(files) == 1 and files[0].endswith(".bin"), files
    return d / files[0]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_round_trip_equals_fresh_repack(models, cache, qtype, isa):
    path = models(qtype)
    want = fresh(path, isa)
    built = packed_all(path, isa)  # no file yet: built and written
    assert rc.STATS["built"] == 1 and rc.STATS["in_memory"] == 0
    assert_same(built, want)
    f = only_file(cache)
    assert f.name.endswith(f"-w{lanes(isa)}.bin")
    mapped = packed_all(path, isa)  # a second "process": mapped from the file
    assert rc.STATS == {**rc.STATS, "built": 0, "in_memory": 0, "mapped": len(mapped)}
    assert_same(mapped, want)
    for a in mapped.values():
        assert a.ctypes.data % rc.ALIGN == 0


def test_each_lane_count_has_its_file(models, cache):
    if len(ISAS) < 2:
        pytest.skip("one lane count on this CPU")
    for isa in ISAS:
        packed_all(models("Q4_0"), isa)
    assert len(os.listdir(cache)) == 2


def _truncate(p):
    with open(p, "r+b") as fh:
        fh.truncate(os.path.getsize(p) - 100)


def _flip_header_byte(p):
    with open(p, "r+b") as fh:
        fh.seek(40)
        b = fh.read(1)
        fh.seek(40)
        fh.write(bytes([b[0] ^ 0x20]))


def _garbage(p):
    with open(p, "wb") as fh:
        fh.write(os.urandom(5000))


def _empty(p):
    open(p, "wb").close()


def _append(p):
    with open(p, "ab") as fh:
        fh.write(b"\0" * 64)


def _bad_offset(p):
    """A header that checks out (crc recomputed) with a tensor off its 64-byte boundary."""
    with open(p, "rb") as fh:
        magic, n, _ = rc.PREFIX.unpack(fh.read(rc.PREFIX.size))
        head = json.loads(fh.read(n))
        rest = fh.read()
    head["tensors"][0]["offset"] += 1  # not on a 64-byte boundary
    body = json.dumps(head, separators=(",", ":")).encode()
    assert len(body) <= n
    body = body.ljust(n)
    with open(p, "wb") as fh:
        fh.write(rc.PREFIX.pack(magic, n, zlib.crc32(body)) + body + rest)


@pytest.mark.parametrize("damage", [_truncate, _flip_header_byte, _garbage, _empty, _append, _bad_offset])
def test_damaged_file_is_rebuilt(models, cache, damage):
    path, isa = models("Q4_K"), ISAS[0]
    want = fresh(path, isa)
    packed_all(path, isa)
    f = only_file(cache)
    damage(f)
    got = packed_all(path, isa)
    assert rc.STATS["built"] == 1
    assert_same(got, want)
    assert only_file(cache) == f  # replaced in place, nothing left behind
    packed_all(path, isa)
    assert rc.STATS["built"] == 0


def test_version_bump_invalidates(models, cache, monkeypatch):
    path, isa = models("Q5_0"), ISAS[0]
    packed_all(path, isa)
    monkeypatch.setattr(rp, "FORMAT_VERSION", rp.FORMAT_VERSION + 1)
    packed_all(path, isa)
    assert rc.STATS["built"] == 1
    with open(only_file(cache), "rb") as fh:
        assert rc.parse_header(fh, os.path.getsize(only_file(cache)))["format"] == rp.FORMAT_VERSION
    packed_all(path, isa)
    assert rc.STATS["built"] == 0


def test_changed_model_file_is_rebuilt(tmp_path, cache):
    path, isa = write_tiny_model(tmp_path / "m.gguf", qtype="Q8_0", seed=1), ISAS[0]
    packed_all(path, isa)
    write_tiny_model(path, qtype="Q8_0", seed=2)  # same path, new weights
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    got = packed_all(path, isa)
    assert rc.STATS["built"] == 1
    assert_same(got, fresh(path, isa))
    only_file(cache)


def test_model_rewritten_with_its_size_and_mtime_is_rebuilt(tmp_path, cache, monkeypatch):
    """A GGUF rewritten in place with its size and mtime put back (as a mutated copy may be):
    neither its cached header index nor the repacked weights of the old bytes are used."""
    monkeypatch.setattr(gguf_file, "INDEX_MIN_FILE_SIZE", 0)  # the tiny file's header is cached too
    path, isa = write_tiny_model(tmp_path / "m.gguf", qtype="Q8_0", seed=1), ISAS[0]
    assert GGUFFile(path).metadata.value("llama.rope.freq_base") == 10000.0
    packed_all(path, isa)
    st = os.stat(path)
    time.sleep(0.05)  # past the file system's timestamp granularity
    write_tiny_model(path, qtype="Q8_0", seed=2, extra_metadata={"llama.rope.freq_base": 20000.0})
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(path).st_size, os.stat(path).st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert GGUFFile(path).metadata.value("llama.rope.freq_base") == 20000.0
    got = packed_all(path, isa)
    assert rc.STATS["built"] == 1
    assert_same(got, fresh(path, isa))


def test_disabled_by_env(models, cache, monkeypatch):
    monkeypatch.setenv("LLCINFER_REPACK_CACHE", "0")
    path, isa = models("Q6_K"), ISAS[0]
    got = packed_all(path, isa)
    assert_same(got, fresh(path, isa))
    assert rc.STATS["in_memory"] == len(got) and rc.STATS["built"] == 0
    assert not cache.exists()


def test_small_models_are_not_cached(models, cache, monkeypatch):
    monkeypatch.setattr(rc, "MIN_FILE_SIZE", rc.INDEX_MIN_FILE_SIZE)
    packed_all(models("Q4_1"), ISAS[0])
    assert rc.STATS["in_memory"] > 0 and not cache.exists()


def test_arrays_not_from_a_file_repack_in_memory(cache):
    t = fake_tensor(np.random.default_rng(0), "Q4_0", 33, 64)
    a = Linear(t, isa=ISAS[0]).prepare()
    assert not a.flags.writeable
    assert a.tobytes() == rp.repack(t.data, int(t.qtype), 64, lanes(ISAS[0])).tobytes()
    assert rc.STATS["in_memory"] == 1 and not cache.exists()


def test_no_space_falls_back_silently(models, cache, monkeypatch, recwarn):
    path, isa = models("Q4_0"), ISAS[0]
    want = fresh(path, isa)
    monkeypatch.setattr(rc, "_free_bytes", lambda d: 0)
    got = packed_all(path, isa)
    assert_same(got, want)
    assert rc.STATS["in_memory"] == len(got)
    assert os.listdir(cache) == []
    assert not recwarn.list


def test_write_error_leaves_nothing_behind(models, cache, monkeypatch, recwarn):
    path, isa = models("Q8_0"), ISAS[0]
    want = fresh(path, isa)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rc.os, "fsync", full)
    got = packed_all(path, isa)
    assert_same(got, want)
    assert rc.STATS["built"] == 0 and rc.STATS["in_memory"] == len(got)
    assert os.listdir(cache) == []  # the temporary file is removed
    assert not recwarn.list


def test_read_only_directory_falls_back(models, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("LLCINFER_REPACK_CACHE", str(blocker / "repack"))
    path, isa = models("Q4_K"), ISAS[0]
    assert_same(packed_all(path, isa), fresh(path, isa))


def test_matrix_missing_from_the_file_is_added(models, cache):
    """An untied model's embedding is not in the file (only a row lookup); a caller that
    repacks it anyway gets it added, the other matrices copied over (from the open pack's
    map, whose move to 2 MiB pages has not started: no wait on it)."""
    path, isa = models("Q8_0", tied=False), ISAS[0]
    packed_all(path, isa)
    rc.clear()  # a new process: the pack the next call opens is queued to move, not moving
    f = GGUFFile(path)
    emb = Linear(f.tensor("token_embd.weight"), isa=isa).prepare()
    assert rc.STATS["built"] == 1
    assert_same({"token_embd.weight": emb}, fresh(path, isa))
    rc.clear()
    assert_same({"token_embd.weight": Linear(GGUFFile(path).tensor("token_embd.weight"), isa=isa).prepare()},
                fresh(path, isa))
    assert rc.STATS["built"] == 0 and rc.STATS["mapped"] == 1


@pytest.mark.parametrize("qtype", ["Q4_1", "Q6_K"])
def test_model_output_identical_with_and_without_cache(models, cache, monkeypatch, qtype):
    path = models(qtype, arch="qwen2")
    ids = [3, 200, 17, 262, 45, 45, 99, 1]

    def logits():
        rc.clear()
        tm = Transformer(GGUFFile(path))
        return tm.forward(ids, tm.new_cache(16), all_logits=True)

    built = logits()
    assert rc.STATS["built"] == 1
    mapped = logits()
    assert rc.STATS["mapped"] > 0 and rc.STATS["built"] == rc.STATS["in_memory"] == 0
    monkeypatch.setenv("LLCINFER_REPACK_CACHE", "0")
    plain = logits()
    assert rc.STATS["in_memory"] > 0
    np.testing.assert_array_equal(built, plain)
    np.testing.assert_array_equal(mapped, plain)


def test_page_runs():
    f = np.array([1, 1, 0, 1, 0, 0, 1], bool)
    assert page_cache.page_runs(f, 4096, 7 * 4096 - 100) == [(0, 8192), (12288, 16384), (24576, 7 * 4096 - 100)]
    assert page_cache.page_runs(np.zeros(3, bool), 4096, 3 * 4096) == []


def test_evicted_file_is_read_back(models, cache, monkeypatch):
    """A mapped file (LLCINFER_HUGEPAGES=0) that left the page cache is read back by the
    prefetch thread."""
    monkeypatch.setenv("LLCINFER_HUGEPAGES", "0")
    path, isa = models("Q8_0"), ISAS[0]
    packed_all(path, isa)
    f = only_file(cache)
    fd = os.open(f, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    rc.clear()
    pack = rc._Pack.open(str(f), rc._identity(str(path), os.stat(path)), lanes(isa))
    missing = page_cache.missing_ranges(pack.data)
    if not missing:
        pytest.skip("this file system keeps the file in memory")
    assert all(0 <= a < b <= pack.data.size for a, b in missing)
    page_cache.read_ranges(str(f), missing)
    assert page_cache.missing_ranges(pack.data) == []


def _mapped_file(address: int) -> str | None:
    """The file mapped at ``address`` ('' for anonymous memory), from /proc/self/smaps."""
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", Path("/proc/self/smaps").read_text()):
        head = block.split("\n")[0].split(None, 5)
        lo, hi = (int(v, 16) for v in head[0].split("-"))
        if lo <= address < hi:
            return head[5].strip() if len(head) > 5 else ""
    return None


def test_mapped_at_once_then_moved_to_huge_pages(models, cache, monkeypatch):
    """A cached file is readable at once (its map) while a thread moves it onto 2 MiB pages
    at the same address; with LLCINFER_HUGEPAGES=0 the map stays; all equal a fresh repack."""
    path, isa = models("Q4_K"), ISAS[0]
    want = fresh(path, isa)
    packed_all(path, isa)  # build the file
    rc.clear()
    f = GGUFFile(path)
    early = {n: Linear(f.tensor(n), isa=isa).prepare() for n in want}
    assert_same(early, want)  # whether or not the move has happened yet
    addresses = {n: a.ctypes.data for n, a in early.items()}
    assert rc.wait_loaded() and not rc._loading
    assert_same(early, want)
    assert {n: a.ctypes.data for n, a in early.items()} == addresses
    pack = next(p for p in rc._packs.values() if p is not None)
    assert pack.data.ctypes.data % file_pages.HUGE_PAGE == 0
    assert rc.STATS["promoted"] == file_pages.supported()
    assert _mapped_file(pack.data.ctypes.data) == ("" if file_pages.supported() else pack.slot)
    monkeypatch.setenv("LLCINFER_HUGEPAGES", "0")
    assert_same(packed_all(path, isa), want)
    assert rc.STATS["mapped"] > 0 and rc.STATS["built"] == 0


def test_engine_moves_the_weights_after_the_first_token(models, cache):
    """Loading and the first token run on the file's map; the engine's first decode step
    starts the move (a thread), and later steps see it finish; output unchanged."""
    from llcinfer.engine.loop import Engine
    from llcinfer.engine.sampling import SamplingParams
    from llcinfer.model.tokenizer import Tokenizer

    path = models("Q4_K")
    packed_all(path, ISAS[0])  # build the file
    rc.clear()
    gguf = GGUFFile(path)
    model = Transformer(gguf)
    eng = Engine(model, Tokenizer.from_metadata(gguf.metadata), n_ctx=64, step_tokens=8)
    eng.runner.warm_up(eng.new_sequence)
    queued = [p for p in rc._loading if p._move_fd is not None]
    assert len(queued) == int(file_pages.supported())  # opened, not moving
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    first = eng.generate([[1, 5, 9]], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))[0].token_ids
    assert all(p._move_fd is not None for p in queued)  # the first token did not start it
    ids = eng.generate([[1, 5, 9]], params)[0].token_ids
    assert all(p._move_fd is None for p in queued)  # a decode step did
    assert rc.wait_loaded() and ids[:1] == first
    assert eng.generate([[1, 5, 9]], params)[0].token_ids == ids


def test_move_reads_consistent_bytes_while_kernels_read(tmp_path):
    """file_pages: a reader of the view during the move sees the file's bytes throughout."""
    size = 3 * file_pages.HUGE_PAGE + 12345
    data = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
    f = tmp_path / "blob.bin"
    f.write_bytes(data.tobytes())
    with open(f, "rb") as fh:
        view = file_pages.map_file(fh.fileno(), size)
        assert view.ctypes.data % file_pages.HUGE_PAGE == 0 and not view.flags.writeable
        np.testing.assert_array_equal(view, data)
        assert _mapped_file(view.ctypes.data) == str(f)
        sums, stop = [], threading.Event()

        def reader():
            while not stop.is_set():
                sums.append(int(view[::997].sum()))

        t = threading.Thread(target=reader)
        t.start()
        try:
            moved = file_pages.promote(view, fh.fileno())
        finally:
            stop.set()
            t.join()
    assert moved is file_pages.supported()
    assert _mapped_file(view.ctypes.data) == ("" if moved else str(f))  # same address, anonymous now
    assert set(sums) <= {int(data[::997].sum())}
    np.testing.assert_array_equal(view, data)
    with open(f, "r+b") as fh:  # a file cut short is an OSError, and the map is left alone
        fh.truncate(size // 2)
        view2 = file_pages.map_file(fh.fileno(), size // 2)
        with pytest.raises(OSError, match="file ends"):
            file_pages.promote(file_pages.map_file(fh.fileno(), size), fh.fileno())
        np.testing.assert_array_equal(view2, data[:size // 2])


def test_file_cut_while_loading_is_a_clear_error(models, cache):
    path, isa = models("Q8_0"), ISAS[0]
    packed_all(path, isa)
    rc.wait_loaded()
    pack = next(p for p in rc._packs.values() if p is not None)
    with open(pack.slot, "r+b") as fh:  # the file shrinks after the header was checked
        fh.truncate(os.path.getsize(pack.slot) // 2)
    pack.loaded.clear()
    pack._promote(os.open(pack.slot, os.O_RDONLY))
    with pytest.raises(rc.ModelFileError, match="cannot read the repacked weights"):
        pack.wait()


def test_hugepages_setting_is_validated(monkeypatch):
    from llcinfer.weights import hugepages
    from llcinfer.errors import UsageError

    for value, on in (("1", True), ("on", True), ("0", False), ("off", False)):
        monkeypatch.setenv("LLCINFER_HUGEPAGES", value)
        assert hugepages.enabled() is on
    monkeypatch.setenv("LLCINFER_HUGEPAGES", "bogus")
    with pytest.raises(UsageError, match="LLCINFER_HUGEPAGES"):
        hugepages.enabled()
