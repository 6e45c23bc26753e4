"""The repacked-weights file's container format (repack_cache.py has the whole layout):

    [magic "LLCREPAK"][u32 header length][u32 crc32 of the header][header: JSON]
    [zero padding to 64 bytes][tensor 0 (64-byte aligned)][padding][tensor 1] ...

reading and checking a header, checking an entry against the layout ``repack.py``
produces, and settling a new header's offsets.
"""

from __future__ import annotations

import json
import struct
import zlib

from . import repack as _rp

CONTAINER_VERSION = 1
MAGIC = b"LLCREPAK"
PREFIX = struct.Struct("<8sII")  # magic, header length, crc32(header)
ALIGN = 64  # every tensor starts on a cache line (the kernels' vector loads)
MAX_HEADER = 64 << 20


def parse_header(fh, size: int) -> dict | None:
    raw = fh.read(PREFIX.size)
    if len(raw) != PREFIX.size:
        return None
    magic, n, crc = PREFIX.unpack(raw)
    if magic != MAGIC or n > min(size, MAX_HEADER):
        return None
    body = fh.read(n)
    if len(body) != n or zlib.crc32(body) != crc:
        return None
    head = json.loads(body)
    head["data_start"] = align_up(PREFIX.size + n)
    return head


def entry_ok(e: dict, W: int, data_start: int, size: int) -> bool:
    G, B = e["shape"]
    return (e["qtype"] in _rp.SUPPORTED and [G, B] == list(_rp.packed_shape(e["qtype"], e["rows"], e["cols"], W))
            and e["offset"] % ALIGN == 0 and data_start <= e["offset"] and e["offset"] + G * B <= size)


def align_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def settle_header(head: dict, data_bytes: int) -> bytes:
    """The header's bytes, with absolute offsets and file size: the data starts after the
    header, whose length depends on those numbers, so repeat until the start stays put."""
    start, rel = align_up(PREFIX.size), [e["offset"] for e in head["tensors"]]
    while True:
        for e, r in zip(head["tensors"], rel):
            e["offset"] = start + r
        head["file_size"] = start + data_bytes
        body = json.dumps(head, separators=(",", ":")).encode()
        if align_up(PREFIX.size + len(body)) == start:
            return body
        start = align_up(PREFIX.size + len(body))  # only grows, so this ends
