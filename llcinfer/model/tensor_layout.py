"""Where each tensor's bytes lie in a GGUF file, checked before any of them is mapped.

``check_layout`` takes the tensor infos as parsed (name, GGML type code, ``ne``, offset
from the start of the data section) and refuses, naming the tensor:

* a name of 64 bytes or more (ggml's limit), a duplicate name, an unknown type code
  (``UnsupportedModelError``), a shape with no dimension or a dimension of 0, a row length
  that is not a whole number of blocks;
* an offset that is not a multiple of the alignment (``general.alignment``, and the
  element size of float tensors, whose data NumPy and the kernels read as f32 / f16);
* a tensor that runs past the end of the file;
* tensors out of place: in offset order, the first starts the data section and each next
  one starts where the previous one ends, rounded up to the alignment, which is the layout
  ggml writes and reads.  A tensor starting earlier overlaps its predecessor; a larger gap
  (or tail after the last tensor) means a shape, type or offset does not match the data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ..errors import ModelFileError, UnsupportedModelError
from .metadata import show

MAX_NAME = 64  # GGML_MAX_NAME, with the terminating zero

# float tensors are viewed as arrays of their elements: their offsets must suit the element
ELEMENT_ALIGN = {GGMLQuantizationType.F32: 4, GGMLQuantizationType.F16: 2, GGMLQuantizationType.BF16: 2,
                 GGMLQuantizationType.F64: 8}


@dataclass(frozen=True)
class Placed:
    """A tensor whose bytes were checked: ``offset`` is from the start of the file."""

    name: str
    qtype: GGMLQuantizationType
    ne: tuple[int, ...]  # GGUF order: ne[0] is the contiguous dimension
    offset: int
    n_bytes: int

    @property
    def end(self) -> int:
        return self.offset + self.n_bytes


_MISMATCH = "a tensor count, shape, type or offset does not match the data"


def _align_up(n: int, a: int) -> int:
    return -(-n // a) * a


def _placed(name: str, type_code: int, ne, rel_offset: int, data_start: int, alignment: int) -> Placed:
    try:
        qtype = GGMLQuantizationType(type_code)
        block, type_size = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise UnsupportedModelError(f"tensor {name}: unknown tensor type {type_code}") from None
    ne = tuple(int(x) for x in ne)
    if not ne or any(x <= 0 for x in ne):
        raise ModelFileError(f"tensor {name}: invalid shape {list(ne)}")
    if ne[0] % block:
        raise ModelFileError(f"tensor {name}: row length {ne[0]} is not a multiple of {qtype.name} block {block}")
    need = max(alignment, ELEMENT_ALIGN.get(qtype, 1))
    if rel_offset % need:
        raise ModelFileError(f"tensor {name}: data offset {rel_offset} is not a multiple of {need} "
                             f"(general.alignment {alignment}, {qtype.name} data)")
    return Placed(name, qtype, ne, data_start + rel_offset, math.prod(ne) // block * type_size)


def check_layout(records, data_start: int, alignment: int, file_size: int, path: str) -> list[Placed]:
    """The tensors of ``records`` [(name, type code, ne, offset in the data section)], in
    file order, once their layout checks out; ``data_start`` is the data section's offset
    in the file, ``alignment`` the file's (a power of two, as gguf checked)."""
    placed, seen = [], {}
    for i, (name, type_code, ne, rel_offset) in enumerate(records):
        if len(name.encode()) >= MAX_NAME:
            raise ModelFileError(f"tensor {show(name)}: name of {len(name.encode())} bytes (GGML allows {MAX_NAME - 1})")
        if name in seen:
            raise ModelFileError(f"tensor {name}: duplicate name (tensor infos {seen[name]} and {i})")
        seen[name] = i
        t = _placed(name, type_code, ne, rel_offset, data_start, alignment)
        if t.end > file_size:
            raise ModelFileError(f"truncated or corrupt GGUF file {path}: tensor {name} needs bytes up to "
                                 f"{t.end}, file has {file_size}")
        placed.append(t)
    at, before = data_start, None  # where the next tensor must start; the tensor that ends there
    for t in sorted(placed, key=lambda p: p.offset):
        if t.offset < at:
            raise ModelFileError(f"tensor {t.name} (bytes {t.offset}-{t.end}) overlaps tensor {before.name} "
                                 f"(bytes {before.offset}-{before.end})")
        if t.offset > at:
            where = (f"{t.offset - before.end} bytes after tensor {before.name} ends (padding: under {alignment})"
                     if before else f"{t.offset - at} bytes into the data section (the first tensor starts it)")
            raise ModelFileError(f"tensor {t.name} starts {where}: {_MISMATCH}")
        at, before = _align_up(t.end, alignment), t
    if before is not None and file_size > at:
        raise ModelFileError(f"{file_size - at} bytes follow the last tensor, {before.name} ({list(before.ne)} "
                             f"{before.qtype.name}, {before.n_bytes} bytes): {_MISMATCH}")
    return placed
