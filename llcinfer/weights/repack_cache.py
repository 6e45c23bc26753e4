"""Repacked weights (repack.py) cached on disk, so that a second process maps them instead of
repacking every matrix again (0.7 s for SmolLM2-135M, 4.6 s for Qwen2.5-Coder-0.5B, 10.5 s
for the 1.5B at every start).

One file per (GGUF file, lanes W) holds every matrix the model repacks:

    $LLCINFER_HOME/repack/<gguf stem>-<sha256(realpath)[:16]>-w<W>.bin

    [magic "LLCREPAK"][u32 header length][u32 crc32 of the header][header: JSON]
    [zero padding to 64 bytes][tensor 0 (64-byte aligned)][padding][tensor 1] ...

The header names the file it was made from (real path, inode, size, mtime and ctime in
ns, as the GGUF header index of gguf_file.py: any write to the GGUF changes its ctime, even
one that puts its size and mtime back, so a changed file never maps another's weights), W,
repack.FORMAT_VERSION, this container's version, the file's total size, and per tensor
its name, GGML type, [N, K], packed shape and offset.
A file whose header does not check out (magic, crc, versions, source identity, size on
disk, offsets) is rebuilt, never trusted; the name depends only on the GGUF path and W,
so a rebuild (new model version, new layout) replaces the stale file instead of leaving
it behind.

The first ``packed()`` of a model with no valid file repacks every matrix of the model
at once (``_candidates``: what the forward pass repacks) and writes the file atomically
(a temporary file, fsync, os.replace); later calls and processes open it and return
views: C-contiguous uint8 [groups, bytes] starting on 64-byte boundaries.  The file is
mapped at once; from the first decode step on, a background thread moves it onto 2 MiB
pages at the same address (llcinfer/file_pages.py; the weights stream about 5-10 % faster
from those than from the page cache's 4 KiB pages), so the first token neither waits for
that copy nor shares the CPUs with it; ``wait_loaded()`` starts it and waits (a benchmark
does, to measure the steady state).  With ``LLCINFER_HUGEPAGES=0`` the mapping stays.
Either way the pages not in the page cache are read in on a background thread at once
(``prefetch_missing``).  Files smaller than
``MIN_FILE_SIZE`` (test models) are repacked in memory.

``LLCINFER_REPACK_CACHE``: ``0`` turns the cache off; a path puts it in that directory
instead.  When the cache cannot be written (no space: ``MIN_FREE_BYTES`` must stay free
after the write; a read-only directory; any OSError) the weights are repacked in memory
for the rest of the process, silently, as without a cache.

Every array returned is read-only, cached or not, so the kernels always see the same
numba type (a writable and a read-only array would be two compiled specializations).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
import zlib

import numpy as np

from . import file_pages, hugepages
from .. import paths, settings
from ..errors import ModelFileError
from ..model.gguf_file import INDEX_MIN_FILE_SIZE
from . import repack as _rp
from .page_cache import prefetch_missing
from .repack_file import ALIGN, CONTAINER_VERSION, MAGIC, PREFIX, align_up, entry_ok, parse_header, settle_header

MIN_FILE_SIZE = INDEX_MIN_FILE_SIZE  # smaller GGUFs repack in milliseconds: not cached
MIN_FREE_BYTES = 1 << 30  # leave at least this much free on the cache's disk

_lock = threading.Lock()
# (file, GGUF identity, W, layout version) -> the open pack; None: not writable, in memory
_packs: dict[tuple, "_Pack | None"] = {}
_loading: list["_Pack"] = []  # packs whose map has yet to move onto 2 MiB pages
STATS = {"mapped": 0, "built": 0, "in_memory": 0, "promoted": 0, "build_seconds": 0.0, "map_seconds": 0.0}


def cache_dir() -> str | None:
    """The cache directory, or None when ``LLCINFER_REPACK_CACHE=0``."""
    where = settings.repack_cache()
    if where == "off":
        return None
    return where or str(paths.repack_dir())


def clear() -> None:
    """Forget the open packs (the arrays already handed out stay valid) and the counters."""
    wait_loaded()
    with _lock:
        _packs.clear()
        STATS.update(mapped=0, built=0, in_memory=0, promoted=0, build_seconds=0.0, map_seconds=0.0)


def packed(w: np.ndarray, name: str, qtype: int, K: int, W: int) -> np.ndarray:
    """``repack(w, qtype, K, W)``, read-only; from the disk cache when ``w`` is a tensor
    ``name`` of a GGUF file's memory map (``GGUFFile``) and the cache is on.  A cached
    array is readable at once (``wait_loaded``: its pages may still be moving)."""
    pack = _pack_for(w, W)
    if pack is not None:
        a = pack.get(name, qtype, w.shape[0], K)
        if a is None:  # a matrix the file lacks: rebuild with it added
            pack = _rebuild(pack, extra=name)
            a = None if pack is None else pack.get(name, qtype, w.shape[0], K)
        if a is not None:
            STATS["mapped"] += 1
            return a
    STATS["in_memory"] += 1
    return _readonly(_rp.repack(w, qtype, K, W))


def wait_loaded(block: bool = True) -> bool:
    """Move every opened cache file onto 2 MiB pages (a thread per file, started by the
    first call) and wait for that; True when none is still moving (``block=False`` only
    starts them and looks: one list test once all are done).  The arrays are readable
    before (they map the file meanwhile): the decode step calls this without blocking, so
    the first token does not wait and does not share the CPUs with the copy's page faults;
    a benchmark blocks, to measure the steady state.  Raises ModelFileError when a file
    could not be read."""
    for pack in list(_loading):
        pack.start_moving()
    while _loading:
        pack = _loading[0]
        if not block and not pack.loaded.is_set():
            return False
        pack.wait()
        with _lock:
            if _loading and _loading[0] is pack:
                _loading.pop(0)
    return True


# ------------------------------------------------------------------------------ lookup
def _source(w: np.ndarray) -> tuple[str, os.stat_result] | None:
    """(path, stat) of the GGUF file ``w`` maps, when it is a big enough one."""
    path = getattr(w, "filename", None)  # np.memmap views keep their file's name
    if not isinstance(path, str):
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (path, st) if st.st_size >= MIN_FILE_SIZE else None


def _identity(path: str, st: os.stat_result) -> dict:
    return {"path": os.path.realpath(path), "inode": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns}


def _slot(directory: str, ident: dict, W: int) -> str:
    stem = os.path.splitext(os.path.basename(ident["path"]))[0]
    key = hashlib.sha256(ident["path"].encode()).hexdigest()[:16]
    return os.path.join(directory, f"{stem}-{key}-w{W}.bin")


def _pack_for(w: np.ndarray, W: int) -> "_Pack | None":
    directory = cache_dir()
    src = None if directory is None else _source(w)
    if src is None:
        return None
    path, st = src
    ident = _identity(path, st)
    slot = _slot(directory, ident, W)
    key = (slot, tuple(ident.values()), W, _rp.FORMAT_VERSION)
    with _lock:
        if key in _packs:
            return _packs[key]
        t0 = time.perf_counter()
        pack = _Pack.open(slot, ident, W)
        STATS["map_seconds"] += time.perf_counter() - t0
        if pack is None:
            pack = _build(slot, ident, W, path, names=())
        _packs[key] = pack
        return pack


def _rebuild(old: "_Pack", extra: str) -> "_Pack | None":
    """A new file with the matrices of ``old`` (copied) and ``extra`` (repacked), once per
    name; None when that cannot be done (the caller repacks ``extra`` in memory)."""
    with _lock:
        if extra in old.refused:
            return None
        old.refused.add(extra)
        pack = _build(old.slot, old.ident, old.W, old.ident["path"], names=(*old.entries, extra), old=old)
        if pack is not None:
            for k, v in _packs.items():
                if v is old:
                    _packs[k] = pack
        return pack


# ---------------------------------------------------------------------------- the file
class _Pack:
    """An open cache file: the header's entries and a read-only map of the data."""

    def __init__(self, slot: str, ident: dict, W: int, entries: dict, data: np.ndarray):
        self.slot, self.ident, self.W = slot, ident, W
        self.entries = entries  # name -> header entry
        self.data = data  # [file size] uint8 (the kernels see read-only views)
        self.refused: set[str] = set()  # names a rebuild could not add
        self.loaded = threading.Event()  # set once data is on 2 MiB pages (or stays the map)
        self.load_error: str | None = None
        self.loaded.set()
        self._move_fd: int | None = None  # the open file, until a thread moves data
        self._move_lock = threading.Lock()  # one thread takes the file

    def wait(self) -> None:
        self.start_moving()
        self.loaded.wait()
        if self.load_error:
            raise ModelFileError(f"cannot read the repacked weights {self.slot}: {self.load_error}")

    def _promote_later(self, fd: int) -> None:
        """Queue ``data`` (a map of the open file ``fd``) to move onto 2 MiB pages; the move
        starts in ``start_moving``."""
        self.loaded.clear()
        self._move_fd = fd
        _loading.append(self)

    def start_moving(self) -> None:
        """Start the queued move on a thread, which closes the file (file_pages.py)."""
        with self._move_lock:
            fd, self._move_fd = self._move_fd, None
        if fd is not None:
            threading.Thread(target=self._promote, args=(fd,), name="llcinfer-move-weights", daemon=True).start()

    def _promote(self, fd: int) -> None:
        try:
            STATS["promoted"] += file_pages.promote(self.data, fd)
        except OSError as e:
            self.load_error = str(e)
        finally:
            os.close(fd)
            self.loaded.set()

    @classmethod
    def open(cls, slot: str, ident: dict, W: int) -> "_Pack | None":
        """The file at ``slot`` if it is complete and made from ``ident`` with this
        layout version and W; None when missing, stale, truncated or corrupt."""
        huge = hugepages.enabled() and file_pages.supported()  # a bad setting is the user's error
        fd = None
        try:
            with open(slot, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                head = parse_header(fh, size)
                if (head is None or head.get("container") != CONTAINER_VERSION
                        or head.get("format") != _rp.FORMAT_VERSION or head.get("lanes") != W
                        or head.get("source") != ident or head.get("file_size") != size):
                    return None
                entries = {e["name"]: e for e in head["tensors"]}
                if not all(entry_ok(e, W, head["data_start"], size) for e in entries.values()):
                    return None
                data = file_pages.map_file(fh.fileno(), size)
                if huge:  # promoted from this very file (a rebuild may replace the path)
                    fd = os.dup(fh.fileno())
        except Exception:  # unreadable, or a header of the wrong shape: rebuild
            if fd is not None:
                os.close(fd)
            return None
        pack = cls(slot, ident, W, entries, data)
        prefetch_missing(pack.slot, pack.data)  # the first forward pass reads the map
        if huge:
            pack._promote_later(fd)
        return pack

    def get(self, name: str, qtype: int, N: int, K: int) -> np.ndarray | None:
        """The packed matrix ``name`` (a view of the map), or None when absent or recorded
        with another type or shape."""
        e = self.entries.get(name)
        if e is None or (e["qtype"], e["rows"], e["cols"]) != (qtype, N, K):
            return None
        G, B = e["shape"]
        a = self.data[e["offset"]:e["offset"] + G * B].reshape(G, B)
        assert a.flags.c_contiguous and a.ctypes.data % ALIGN == 0
        return _readonly(a)


# --------------------------------------------------------------------------- building
def _candidates(path: str, names) -> dict:
    """The matrices of the GGUF at ``path`` the forward pass repacks, as TensorInfos: every
    2-D tensor of a repacked type except the token embedding when the model has its own
    output matrix (the embedding is then only a row lookup), plus ``names``."""
    from ..model.gguf_file import GGUFFile

    g = GGUFFile(path)
    out = {n: t for n, t in g.tensors.items()
           if len(t.shape) == 2 and int(t.qtype) in _rp.SUPPORTED
           and not (n == "token_embd.weight" and "output.weight" in g.tensors)}
    for n in names:
        t = g.tensors.get(n)
        if t is not None and len(t.shape) == 2 and int(t.qtype) in _rp.SUPPORTED:
            out[n] = t
    return out


def _build(slot: str, ident: dict, W: int, path: str, names, old: _Pack | None = None) -> _Pack | None:
    """Repack the model's matrices into a new file at ``slot``; the open pack, or None when
    the file cannot be written (the caller repacks in memory)."""
    t0 = time.perf_counter()
    try:
        tensors = _candidates(path, names)
    except Exception:  # an unreadable GGUF: the caller's own view still repacks
        return None
    if any(n not in tensors for n in names):
        return None  # not a matrix of this file that repacks
    entries, rel = [], 0  # rel: offset from the start of the data
    for n, t in tensors.items():
        q, (N, K) = int(t.qtype), t.shape
        shape = _rp.packed_shape(q, N, K, W)
        entries.append({"name": n, "qtype": q, "rows": N, "cols": K, "shape": list(shape), "offset": rel})
        rel = align_up(rel + shape[0] * shape[1])
    head = {"container": CONTAINER_VERSION, "format": _rp.FORMAT_VERSION, "lanes": W, "source": ident,
            "file_size": 0, "tensors": entries}
    body = settle_header(head, rel)
    directory = os.path.dirname(slot)
    tmp = f"{slot}.{os.getpid()}.tmp"
    try:
        os.makedirs(directory, exist_ok=True)
        if _free_bytes(directory) < head["file_size"] + MIN_FREE_BYTES:
            return None
        with open(tmp, "wb") as fh:
            fh.write(PREFIX.pack(MAGIC, len(body), zlib.crc32(body)) + body)
            for e in entries:
                fh.write(bytes(e["offset"] - fh.tell()))
                fh.write(_packed_bytes(tensors[e["name"]], e, W, old))
            fh.write(bytes(head["file_size"] - fh.tell()))
            fh.flush()
            os.fsync(fh.fileno())  # a crash must not leave a valid header over missing data
        os.replace(tmp, slot)
    except OSError:  # no space, read-only directory, ...: no cache this time
        _unlink(tmp)
        return None
    except BaseException:
        _unlink(tmp)
        raise
    pack = _Pack.open(slot, ident, W)
    STATS["built"] += pack is not None
    STATS["build_seconds"] += time.perf_counter() - t0
    return pack


def _packed_bytes(t, e: dict, W: int, old: _Pack | None) -> np.ndarray:
    """The packed matrix of entry ``e``: copied from ``old`` when it has it, else repacked."""
    a = None if old is None else old.get(e["name"], e["qtype"], e["rows"], e["cols"])
    return a if a is not None else _rp.repack(t.data, e["qtype"], e["cols"], W)


def _free_bytes(directory: str) -> int:
    return shutil.disk_usage(directory).free


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a
