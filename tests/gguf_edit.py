"""Byte-level edits of a GGUF file, for the bad-file tests and the fuzz suite.

Not a test module.  ``GGUFMap(data)`` records where each part of a GGUF file lies (parsed
once with ``gguf.GGUFReader``); its methods return edited copies of the bytes:

* ``with_value(key, vtype, value, sub_type)``: a metadata value replaced by one of any type
  (an empty array, a UINT64 where UINT32 is usual, ...), which ``gguf.GGUFWriter`` refuses
  to write; ``without(key)`` drops a key;
* ``with_tensor(name, offset=..., ne=..., type_code=...)``: a tensor info changed in place;
* ``splice(start, end, raw)``: any header bytes replaced.

An edit that changes the header's length pads it again to the alignment, so the data
section keeps its bytes and every tensor offset (relative to it) still means what it did.
"""

from __future__ import annotations

import math
import struct
import tempfile
from dataclasses import dataclass

from gguf import GGUFReader, GGUFValueType as VT
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

_PACK = {VT.UINT8: "B", VT.INT8: "b", VT.UINT16: "H", VT.INT16: "h", VT.UINT32: "I", VT.INT32: "i",
         VT.FLOAT32: "f", VT.UINT64: "Q", VT.INT64: "q", VT.FLOAT64: "d", VT.BOOL: "?"}


def encode_string(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def encode_value(vtype: VT, value, sub_type: VT | None = None) -> bytes:
    """[u32 type][value] as GGUF stores a metadata value (arrays may be empty)."""
    return struct.pack("<I", vtype) + _payload(vtype, value, sub_type)


def _payload(vtype: VT, value, sub_type: VT | None) -> bytes:
    if vtype == VT.STRING:
        return encode_string(value)
    if vtype == VT.ARRAY:
        return struct.pack("<IQ", sub_type, len(value)) + b"".join(_payload(sub_type, v, None) for v in value)
    return struct.pack("<" + _PACK[vtype], value)


@dataclass(frozen=True)
class Span:
    start: int
    end: int


class GGUFMap:
    """Where the header fields, metadata entries and tensor infos of ``data`` lie."""

    def __init__(self, data: bytes):
        self.data = bytes(data)
        with tempfile.NamedTemporaryFile(suffix=".gguf") as fh:
            fh.write(self.data)
            fh.flush()
            r = GGUFReader(fh.name)
            self.alignment = int(r.alignment)
            self.data_start = int(r.data_offset)
            fields = [f for k, f in r.fields.items() if not k.startswith("GGUF.")]
            self.kv = {f.name: Span(f.offset, f.offset + sum(int(p.nbytes) for p in f.parts)) for f in fields}
            self.kv_types = {f.name: list(f.types) for f in fields}
            self.values = {f.name: f.contents() for f in fields}
            self.tensors = {t.name: Span(t.field.offset, t.field.offset + sum(int(p.nbytes) for p in t.field.parts))
                            for t in r.tensors}
            self.tensor_ne = {t.name: [int(x) for x in t.shape] for t in r.tensors}
            self.tensor_offset = {t.name: int(t.data_offset) - self.data_start for t in r.tensors}
            self.tensor_type = {t.name: int(t.tensor_type) for t in r.tensors}
        self.kv_start = min(s.start for s in self.kv.values())
        self.infos_start = min(s.start for s in self.tensors.values())
        self.infos_end = max(s.end for s in self.tensors.values())

    def n_bytes(self, name: str) -> int:
        """The data bytes of tensor ``name`` (its shape and type, unpadded)."""
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(self.tensor_type[name])]
        return math.prod(self.tensor_ne[name]) // block * type_size

    # ------------------------------------------------------------------ edits
    def splice(self, start: int, end: int, raw: bytes, kv_delta: int = 0) -> bytes:
        """Header bytes [start, end) replaced by ``raw`` (before the end of the tensor
        infos), the header padded to the alignment again, the kv count moved by ``kv_delta``."""
        assert 0 <= start <= end <= self.infos_end
        header = self.data[:start] + raw + self.data[end:self.infos_end]
        header += bytes(-len(header) % self.alignment)
        if kv_delta:
            (n,) = struct.unpack_from("<Q", header, 16)
            header = header[:16] + struct.pack("<Q", n + kv_delta) + header[24:]
        return header + self.data[self.data_start:]

    def with_value(self, key: str, vtype: VT, value, sub_type: VT | None = None) -> bytes:
        """``key`` set to ``value`` of GGUF type ``vtype`` (added when the file lacks it)."""
        raw = encode_string(key) + encode_value(vtype, value, sub_type)
        if key in self.kv:
            return self.splice(self.kv[key].start, self.kv[key].end, raw)
        return self.splice(self.infos_start, self.infos_start, raw, kv_delta=1)

    def without(self, key: str) -> bytes:
        return self.splice(self.kv[key].start, self.kv[key].end, b"", kv_delta=-1)

    def with_tensor(self, name: str, offset: int | None = None, ne: list[int] | None = None,
                    type_code: int | None = None, new_name: str | bytes | None = None) -> bytes:
        """Tensor info ``name`` with another data offset (relative to the data section),
        shape (GGUF order), type code or name."""
        ne = self.tensor_ne[name] if ne is None else ne
        raw = (encode_string(name if new_name is None else new_name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
               + struct.pack("<IQ", self.tensor_type[name] if type_code is None else type_code,
                             self.tensor_offset[name] if offset is None else offset))
        span = self.tensors[name]
        return self.splice(span.start, span.end, raw)
