"""The base-logits file of llama.cpp's ``llama-perplexity --kl-divergence-base FILE``, read and
written byte for byte as it does, so either engine's dense run can be the base of the other.

    "_logits_"                      8 bytes
    n_ctx, n_vocab, n_chunk         int32 each
    tokens                          int32 [n_chunk * n_ctx], the text's tokens (no BOS put in)
    per chunk, per scored position  uint16 [2 * ((n_vocab + 1) // 2) + 4]

A position's row holds two float32 (scale, min_log_prob) in its first four uint16, then
one uint16 q per vocabulary entry: log p = scale * q + min_log_prob, where the logits are
clipped from below at max - 16 (q = 0 there) and the range to max is cut into 65535 steps.
The scored positions of a chunk are n_ctx // 2 .. n_ctx - 2 (each predicts the next token).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..errors import UsageError

MAGIC = b"_logits_"
_HEADER = len(MAGIC) + 3 * 4


def row_width(n_vocab: int) -> int:
    """uint16 per scored position."""
    return 2 * ((n_vocab + 1) // 2) + 4


def scored_per_chunk(n_ctx: int) -> int:
    return n_ctx - 1 - n_ctx // 2


@dataclass
class BaseLogits:
    """An open base file: its shape and tokens; ``chunk(i)`` maps chunk i's rows."""

    path: str
    n_ctx: int
    n_vocab: int
    n_chunk: int
    tokens: np.ndarray  # [n_chunk * n_ctx] int32
    _rows: np.ndarray  # [n_chunk, scored_per_chunk, row_width] uint16 (memory-mapped)

    def chunk(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Chunk i's (scale, min_log_prob)  # [n, 2] f32 and q  # [n, n_vocab] uint16."""
        rows = self._rows[i]
        head = np.ascontiguousarray(rows[:, :4]).view(np.float32)
        return head, rows[:, 4:4 + self.n_vocab]


def read_base(path: str | os.PathLike) -> BaseLogits:
    """Open a base file, checking its header against its size (one-line errors)."""
    path = str(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(_HEADER)
    except OSError as e:
        raise UsageError(f"cannot read the base logits {path}: {e.strerror or e}") from None
    if len(head) < _HEADER or head[:8] != MAGIC:
        raise UsageError(f"{path} is not a llama-perplexity base logits file (no '_logits_' header)")
    n_ctx, n_vocab, n_chunk = (int(x) for x in np.frombuffer(head, np.int32, 3, 8))
    if n_ctx < 4 or n_vocab < 2 or n_chunk < 1:
        raise UsageError(f"{path}: implausible header (n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk})")
    n_scored, width = scored_per_chunk(n_ctx), row_width(n_vocab)
    want = _HEADER + 4 * n_chunk * n_ctx + 2 * n_chunk * n_scored * width
    if size < want:
        raise UsageError(f"{path}: truncated: {size} bytes, its header (n_ctx {n_ctx}, n_vocab {n_vocab}, "
                         f"{n_chunk} chunks) needs {want}")
    tokens = np.fromfile(path, np.int32, n_chunk * n_ctx, offset=_HEADER)
    rows = np.memmap(path, np.uint16, "r", _HEADER + 4 * n_chunk * n_ctx, (n_chunk, n_scored, width))
    return BaseLogits(path, n_ctx, n_vocab, n_chunk, tokens, rows)


def encode_rows(logits: np.ndarray) -> np.ndarray:
    """llama.cpp's rows for logits  # [n, vocab] f32 -> # [n, row_width] uint16."""
    logits = np.asarray(logits, np.float32)
    n, vocab = logits.shape
    hi = logits.max(axis=1, keepdims=True)  # [n, 1]
    lo = np.maximum(logits.min(axis=1, keepdims=True), hi - 16)
    log_sum = np.log(np.exp(logits - hi, dtype=np.float64).sum(axis=1, keepdims=True)).astype(np.float32)
    min_log_prob = (lo - hi - log_sum).astype(np.float32)
    scale = ((hi - lo) / np.float32(65535)).astype(np.float32)
    out = np.zeros((n, row_width(vocab)), np.uint16)
    out[:, :4] = np.concatenate([scale, min_log_prob], axis=1).view(np.uint16)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where((logits > lo) & (scale > 0), np.rint((logits - lo) * (1 / scale)), 0)
    out[:, 4:4 + vocab] = q.astype(np.uint16)
    return out


def decode_rows(head: np.ndarray, q: np.ndarray) -> np.ndarray:
    """log p  # [n, vocab] f32 of rows (``BaseLogits.chunk``'s two arrays)."""
    return head[:, :1] * q.astype(np.float32) + head[:, 1:2]


class BaseWriter:
    """Writes a base file as llama-perplexity does: the header and tokens first, then each
    chunk's rows in chunk order (``write_chunk``)."""

    def __init__(self, path: str | os.PathLike, n_ctx: int, n_vocab: int, tokens: np.ndarray):
        n_chunk = len(tokens) // n_ctx
        try:
            self._f = open(path, "wb")
        except OSError as e:
            raise UsageError(f"cannot write the base logits {path}: {e.strerror or e}") from None
        self._f.write(MAGIC)
        np.array([n_ctx, n_vocab, n_chunk], np.int32).tofile(self._f)
        np.asarray(tokens[:n_chunk * n_ctx], np.int32).tofile(self._f)

    def write_rows(self, rows: np.ndarray) -> None:
        """A chunk's encoded rows  # [scored_per_chunk, row_width] uint16 (``encode_rows``)."""
        np.ascontiguousarray(rows, np.uint16).tofile(self._f)

    def close(self) -> None:
        self._f.close()
