"""Every count and length in a GGUF header, checked against the file before ``gguf`` parses it.

``gguf.GGUFReader`` reads through NumPy slices, which come back short instead of failing past
the end of the file, and builds one Python object per array element.  A corrupt array length
therefore makes it loop once per remaining element of the file (a SmolLM2 file whose
``tokenizer.ggml.token_type`` length gained 2^40 ran for over a minute, gigabytes deep, before
it was stopped), and a corrupt count reads garbage.  ``check_header`` walks the same layout
with ``struct`` first:

    [magic][u32 version][u64 tensor count][u64 kv count]
    kv count x  [string key][u32 value type][value]
    tensor count x  [string name][u32 n_dims][u64 x n_dims][u32 ggml type][u64 offset]

(a string is [u64 length][bytes]; an array [u32 element type][u64 count][elements]) and
refuses, naming the entry and its byte offset, a version other than 2 or 3, a big-endian
file, an unknown value type, a string or array that runs past the end of the file, or a
tensor with more than ``MAX_DIMS`` dimensions.  Arrays of fixed-size elements are skipped
in O(1); only string arrays are walked element by element, and each element takes at least
8 bytes of the file, so the walk ends within a pass over the header.
"""

from __future__ import annotations

import mmap
import struct

from gguf import GGUFValueType as VT

from ..errors import ModelFileError, UnsupportedModelError

MAX_DIMS = 4  # GGML_MAX_DIMS
VERSIONS = (2, 3)  # what gguf.GGUFReader reads
_FIXED = {VT.UINT8: 1, VT.INT8: 1, VT.BOOL: 1, VT.UINT16: 2, VT.INT16: 2, VT.UINT32: 4, VT.INT32: 4,
          VT.FLOAT32: 4, VT.UINT64: 8, VT.INT64: 8, VT.FLOAT64: 8}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_MIN_KV = 8 + 4 + 1  # an empty key, a type and a one-byte value
_MIN_TENSOR_INFO = 8 + 4 + 4 + 8  # an empty name, no dimension, type and offset


class _Corrupt(Exception):
    """A length or count that does not fit in the file (message: what and where)."""


class _Walker:
    """A read position in the file's bytes; every read checks that it stays inside."""

    def __init__(self, buf):
        self.buf, self.size, self.pos = buf, len(buf), 0

    def _need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise _Corrupt(f"{what} at byte {self.pos} needs {n} bytes, the file has {self.size - self.pos} left")

    def u32(self, what: str) -> int:
        self._need(4, what)
        self.pos += 4
        return _U32.unpack_from(self.buf, self.pos - 4)[0]

    def u64(self, what: str) -> int:
        self._need(8, what)
        self.pos += 8
        return _U64.unpack_from(self.buf, self.pos - 8)[0]

    def skip(self, n: int, what: str) -> None:
        self._need(n, what)
        self.pos += n

    def string(self, what: str) -> None:
        self.skip(self.u64(f"{what} length"), what)

    def value_type(self, what: str) -> VT:
        at, code = self.pos, self.u32(what)
        try:
            return VT(code)
        except ValueError:
            raise _Corrupt(f"{what} at byte {at}: unknown GGUF value type {code}") from None

    def value(self, vtype: VT, what: str) -> None:
        if vtype in _FIXED:
            self.skip(_FIXED[vtype], what)
        elif vtype == VT.STRING:
            self.string(what)
        else:  # ARRAY
            etype = self.value_type(f"{what} element type")
            at, count = self.pos, self.u64(f"{what} length")
            least = _FIXED.get(etype, 8 if etype == VT.STRING else 12)  # 12: an empty nested array
            if count > (self.size - self.pos) // least:
                raise _Corrupt(f"{what} at byte {at}: {count} elements of {etype.name} need at least "
                               f"{count * least} bytes, the file has {self.size - self.pos} left")
            if etype in _FIXED:
                self.skip(count * least, what)
            else:
                for _ in range(count):
                    self.value(etype, what)


def check_header(path: str) -> None:
    """Raise ``ModelFileError`` (``UnsupportedModelError`` for a big-endian file) unless every
    count and length of the GGUF header at ``path`` fits in the file."""
    with open(path, "rb") as fh:
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                _walk(_Walker(buf))
            except _Corrupt as exc:
                raise ModelFileError(f"truncated or corrupt GGUF file {path}: {exc}") from None


def _walk(w: _Walker) -> None:
    w.skip(4, "magic")
    version = w.u32("version")
    if version not in VERSIONS:
        if version & 0xFFFF == 0 and (version >> 16) in VERSIONS:
            raise UnsupportedModelError("big-endian GGUF files are not supported")
        raise _Corrupt(f"GGUF version {version} (supported: {', '.join(map(str, VERSIONS))})")
    n_tensors, n_kv = w.u64("tensor count"), w.u64("metadata count")
    if n_kv > (w.size - w.pos) // _MIN_KV or n_tensors > (w.size - w.pos) // _MIN_TENSOR_INFO:
        raise _Corrupt(f"{n_kv} metadata entries and {n_tensors} tensors cannot fit in {w.size} bytes")
    for i in range(n_kv):
        what = f"metadata entry {i}"
        w.string(f"{what} key")
        w.value(w.value_type(f"{what} type"), what)
    for i in range(n_tensors):
        what = f"tensor info {i}"
        w.string(f"{what} name")
        at, n_dims = w.pos, w.u32(f"{what} dimension count")
        if n_dims > MAX_DIMS:
            raise _Corrupt(f"{what} at byte {at}: {n_dims} dimensions (at most {MAX_DIMS})")
        w.skip(8 * n_dims + 4 + 8, f"{what} dimensions, type and offset")
