"""Memory-mapped GGUF files: metadata as plain Python values, tensors as validated views.

Parsing is ``gguf.GGUFReader``'s; this module adds the checks a runtime needs before any
kernel touches the bytes (file present, magic, every tensor inside the file, sizes that
agree with the tensor type) and turns failures into one-line ``ModelFileError``s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from .errors import ModelFileError, UnsupportedModelError

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
        try:
            self._reader = GGUFReader(self.path, "r")
        except Exception as exc:  # gguf raises ValueError/IndexError/... on short or corrupt files
            raise ModelFileError(f"truncated or corrupt GGUF file {self.path}: {_short(exc)}") from None
        try:
            self.metadata = {k: _field_value(f) for k, f in self._reader.fields.items()}
        except Exception as exc:
            raise ModelFileError(f"corrupt GGUF metadata in {self.path}: {_short(exc)}") from None
        self.tensors: dict[str, TensorInfo] = {}
        for t in self._reader.tensors:
            self.tensors[t.name] = self._validated(t)

    def _validated(self, t) -> TensorInfo:
        qtype = GGMLQuantizationType(int(t.tensor_type))
        if qtype not in GGML_QUANT_SIZES:
            raise UnsupportedModelError(f"tensor {t.name}: unknown tensor type {int(t.tensor_type)}")
        block, type_size = GGML_QUANT_SIZES[qtype]
        ne = [int(x) for x in t.shape]  # GGUF order: ne[0] is the contiguous dimension
        if any(x <= 0 for x in ne):
            raise ModelFileError(f"tensor {t.name}: invalid shape {ne}")
        if ne[0] % block:
            raise ModelFileError(f"tensor {t.name}: row length {ne[0]} is not a multiple of {qtype.name} block {block}")
        n_elems = int(np.prod(ne))
        expect = n_elems // block * type_size
        end = int(t.data_offset) + expect
        if int(t.n_bytes) != expect or end > self.file_size or t.data.nbytes != expect:
            raise ModelFileError(
                f"truncated or corrupt GGUF file {self.path}: tensor {t.name} needs bytes up to {end}, "
                f"file has {self.file_size}"
            )
        shape = tuple(reversed(ne))
        return TensorInfo(t.name, qtype, shape, t.data)

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def require(self, key: str):
        if key not in self.metadata:
            raise ModelFileError(f"GGUF metadata key missing: {key} ({self.path})")
        return self.metadata[key]

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
