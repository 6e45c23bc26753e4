"""Memory-mapped GGUF files: checked metadata values, tensors as validated views.

Parsing is ``gguf.GGUFReader``'s; this module adds the checks a runtime needs before any
kernel touches the bytes and turns failures into one-line ``ModelFileError``s: file present
and a GGUF (magic), every header length inside the file (gguf_header.py), every metadata key
llcinfer reads of its type and range (metadata.py), every tensor in its place (tensor_layout.py).
"""

from __future__ import annotations

import hashlib
import math
import os
import pickle
from dataclasses import dataclass

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf import quants as gguf_quants
from gguf.constants import GGMLQuantizationType

from .. import paths
from ..errors import ModelFileError, UnsupportedModelError
from .gguf_header import check_header
from .metadata import Metadata
from .tensor_layout import Placed, check_layout

GGUF_MAGIC = b"GGUF"

# Tensor types the kernels implement (issue: foundation).  Everything else is refused by name.
SUPPORTED_TYPES = frozenset(
    GGMLQuantizationType[n]
    for n in ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K")
)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file.  ``data`` is a read-only view into the memory map.

    ``shape`` is in row-major order (rows, cols) as NumPy sees it, i.e. the reverse of
    GGUF's ``ne``; ``data`` is [rows, bytes_per_row] uint8 for quantized types and the
    natural dtype (float32/float16, uint16 for BF16) otherwise.
    """

    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray

    @property
    def n_bytes(self) -> int:
        return int(self.data.nbytes)


def _field_value(field):
    """Decode a ReaderField into str / int / float / bool / list."""
    types = field.types
    if not types:
        return None
    if types[0] == GGUFValueType.ARRAY:
        sub = types[-1]
        if sub == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if types[0] == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
    value = field.parts[field.data[0]].tolist()[0]
    if types[0] == GGUFValueType.BOOL:
        return bool(value)
    return value


def _field_types(field) -> tuple[GGUFValueType, ...]:
    """(T,) for a scalar, (ARRAY, element type) for an array, empty ones included (the
    reader lists no element type for those; it is the part after the value type)."""
    if field.types and field.types[0] == GGUFValueType.ARRAY:
        return GGUFValueType.ARRAY, GGUFValueType(int(field.parts[3][0]))
    return tuple(field.types[:1])


class _Reader(GGUFReader):
    """``gguf.GGUFReader`` without its tensor views: ``_build_tensors`` only keeps the
    tensor info fields, which tensor_layout.py checks before anything is mapped."""

    def _build_tensors(self, start_offs: int, fields) -> None:
        self.tensor_fields = fields


INDEX_VERSION = 3
INDEX_MIN_FILE_SIZE = 16 << 20  # bytes; smaller files are parsed every time


def _index_cache_path(path: str, st: os.stat_result) -> str | None:
    """Where the parsed header of this exact file (path, inode, size, mtime, ctime) is kept;
    any write to the file changes its ctime, even one that puts the size and mtime back."""
    ident = (f"{INDEX_VERSION}|{os.path.realpath(path)}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|"
             f"{st.st_ctime_ns}")
    key = hashlib.sha256(ident.encode()).hexdigest()
    return os.path.join(paths.gguf_index_dir(), key[:32] + ".pkl")


def _read_index(path: str) -> dict:
    """Parse the header with gguf.GGUFReader, once its lengths check out (gguf_header.py):
    metadata values and types, tensor records [(name, type, ne, offset in the data
    section)], the data section's offset in the file and the alignment."""
    check_header(path)
    try:
        reader = _Reader(path, "r")
    except Exception as exc:  # gguf raises ValueError/KeyError/... on corrupt files
        raise ModelFileError(f"truncated or corrupt GGUF file {path}: {_short(exc)}") from None
    try:
        values = {k: _field_value(f) for k, f in reader.fields.items()}
        types = {k: _field_types(f) for k, f in reader.fields.items()}
    except Exception as exc:
        raise ModelFileError(f"corrupt GGUF metadata in {path}: {_short(exc)}") from None
    tensors = []
    for f in reader.tensor_fields:  # data: name, dims, type, offset
        dims, qtype, offset = (f.parts[i] for i in f.data[1:4])
        tensors.append((f.name, int(qtype[0]), [int(x) for x in dims], int(offset[0])))
    return {"values": values, "types": types, "tensors": tensors, "data_start": int(reader.data_offset),
            "alignment": int(reader.alignment)}


def _load_index(path: str) -> dict:
    """The header index, from the on-disk cache when this file was parsed before.

    GGUFReader builds one NumPy object per vocabulary string and takes seconds on a
    150k-token vocabulary; the cached index loads in tens of milliseconds.  Small files
    parse quickly and are not cached (tests write many throwaway models).  The index is
    what was parsed; GGUFFile checks it every time.
    """
    st = os.stat(path)
    if st.st_size < INDEX_MIN_FILE_SIZE:
        return _read_index(path)
    cache = _index_cache_path(path, st)
    try:
        with open(cache, "rb") as fh:
            return pickle.load(fh)
    except Exception:
        pass
    index = _read_index(path)
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        tmp = f"{cache}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            pickle.dump(index, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, cache)
    except OSError:
        pass  # a read-only home only costs the next load some time
    return index


class GGUFFile:
    """An opened GGUF model file (memory-mapped, never copied)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise ModelFileError(f"model file not found: {self.path}")
        if os.path.isdir(self.path):
            raise ModelFileError(f"model path is a directory, not a GGUF file: {self.path}")
        self.file_size = os.path.getsize(self.path)
        with open(self.path, "rb") as fh:
            magic = fh.read(4)
        if magic != GGUF_MAGIC:
            raise ModelFileError(f"not a GGUF file (bad magic {magic!r}): {self.path}")
        index = _load_index(self.path)
        self.metadata = Metadata(index["values"], index["types"], self.path)
        placed = check_layout(index["tensors"], index["data_start"], index["alignment"], self.file_size, self.path)
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r")  # [file_size] bytes
        self.tensors: dict[str, TensorInfo] = {t.name: self._view(t) for t in placed}

    def _view(self, t: Placed) -> TensorInfo:
        shape = tuple(reversed(t.ne))  # NumPy order
        raw = self._map[t.offset:t.end]
        if t.qtype == GGMLQuantizationType.F32:
            data = raw.view(np.float32).reshape(shape)
        elif t.qtype == GGMLQuantizationType.F16:
            data = raw.view(np.float16).reshape(shape)
        else:  # block types (BF16 too): [..., bytes per row]
            data = raw.reshape(*shape[:-1], t.n_bytes // math.prod(shape[:-1]))
        return TensorInfo(t.name, t.qtype, shape, data)

    def require(self, key: str):
        return self.metadata.require(key)

    def tensor(self, name: str, required: bool = True) -> TensorInfo | None:
        t = self.tensors.get(name)
        if t is None and required:
            raise ModelFileError(f"tensor missing from GGUF: {name} ({self.path})")
        if t is not None and t.qtype not in SUPPORTED_TYPES:
            raise UnsupportedModelError(
                f"tensor {name}: tensor type {t.qtype.name} is not supported "
                f"(supported: {', '.join(sorted(q.name for q in SUPPORTED_TYPES))})"
            )
        return t


def _short(exc: Exception) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0] if msg else ''}"[:200]


def dequantize_tensor(info) -> np.ndarray:
    """Any supported GGUF tensor as float32 in NumPy order, using ``gguf``'s dequantizers."""
    if info.qtype == GGMLQuantizationType.F32:
        return np.asarray(info.data, dtype=np.float32).reshape(info.shape).copy()
    return np.asarray(gguf_quants.dequantize(info.data, info.qtype), dtype=np.float32).reshape(info.shape)
