"""The model runner: one scheduled batch in, the logits of its sampling rows out.  It is
the one place that decides how rows run.

Two kinds of row group today, each in one call per step:
  decode rows   one generated token of a sequence (``Chunk.start >= n_prompt``): one
                executor step for all of them (executor/), when the model and the KV
                storage allow it;
  chunks        prompt tokens (prefill, chunked prefill, the recomputation of a resumed
                request) and the decode rows the executor cannot take: one batched
                forward pass (transformer.py) over every chunk's rows.
A token is always computed by the same kind of group whatever else is in the batch, and
both kinds compute a row from that row's inputs only, so a request's greedy output does
not depend on what runs beside it.  A verification chunk (a sequence's draft tree,
engine/speculation.py) whose tree is a chain runs on the executor too, its rows causal
(DecodeExecutor.step_rows); a branching tree runs on the batched pass, each row with its
tree mask.
"""

from __future__ import annotations

import numpy as np

from .. import settings
from ..executor import DecodeExecutor, Domains, unsupported_reason
from ..dtypes import KV_INT8
from ..kv import PagedSequence
from .scheduler import Batch
from .transformer import Transformer


class ModelRunner:
    """Runs batches of ``model`` whose sequences live in one KV pool.  ``domains``: the cores
    the executor's workers use (the plan's, engine/placement.py); None runs every row on
    the batched forward pass."""

    def __init__(self, model: Transformer, kv_kind: int, domains: Domains | None):
        self.model = model
        self.executor: DecodeExecutor | None = None
        self.executor_note = self._why_not_executor(kv_kind, domains)  # None: decode rows run on it
        if self.executor_note is None:
            self.executor = DecodeExecutor(model, domains)

    def _why_not_executor(self, kv_kind: int, domains: Domains | None) -> str | None:
        if domains is None:
            return "no executor domains given"
        if not settings.executor_enabled():
            return "disabled by LLCINFER_EXECUTOR=0"
        if kv_kind == KV_INT8:
            return "int8 KV cache runs on the batched path"
        return unsupported_reason(self.model)

    def run(self, batch: Batch) -> list[np.ndarray | None]:
        """Logits  # [vocab] f32 for every chunk that samples (None for the others; a
        verification chunk's  # [rows, vocab], one per tree row), in the order of
        ``batch.chunks``; a chunk with prompt rows to score gets their logits in
        ``Chunk.scored_logits``.  Decode rows are views of the executor's buffer: read
        them before the next run."""
        out: list[np.ndarray | None] = [None] * len(batch.chunks)
        decode, rest = [], []
        for i, c in enumerate(batch.chunks):
            if self.executor is not None and c.start >= c.request.n_prompt and (
                    len(c.tokens) == 1 if c.tree is None else c.tree.is_chain):
                decode.append(i)
            else:
                rest.append(i)
        if any(c.start >= c.request.n_prompt for c in batch.chunks):
            self.model.settle_weights()  # past a first token: the weights may move to 2 MiB pages
        if rest:
            chunks = [batch.chunks[i] for i in rest]
            rows, sample_at = _logit_rows(chunks)
            trees = [None if c.tree is None else c.tree.chunk_parents() for c in chunks]
            logits = self.model.forward_chunks([(c.request.seq, c.tokens) for c in chunks], rows,
                                               trees if any(t is not None for t in trees) else None)
            for c, i, at in zip(chunks, rest, sample_at):
                if c.tree is not None:
                    out[i] = logits[at + 1 - len(c.tokens):at + 1]  # [n + 1, vocab] every tree row
                elif c.samples:
                    out[i] = logits[at]
                if c.score_rows is not None:
                    lo, hi = c.score_rows
                    c.scored_logits = logits[lo:hi]
        if decode:
            chunks = [batch.chunks[i] for i in decode]
            seqs = [c.request.seq for c in chunks]
            if all(c.tree is None for c in chunks):
                logits = self.executor.step(seqs, [c.tokens[0] for c in chunks], copy=False)
                for row, i in enumerate(decode):
                    out[i] = logits[row]
            else:
                logits = self.executor.step_rows(seqs, [c.tokens for c in chunks], [c.tree is None for c in chunks],
                                                 copy=False)
                r0 = 0
                for c, i in zip(chunks, decode):
                    r1 = r0 + len(c.tokens)
                    out[i] = logits[r1 - 1] if c.tree is None else logits[r0:r1]  # a chain: [n + 1, vocab]
                    r0 = r1
        return out

    def decode(self, seqs: list[PagedSequence], tokens: list[int]) -> np.ndarray:
        """One token for each sequence, as the step loop's decode rows run; logits  # [M, vocab]
        (benchmarks and tests)."""
        self.model.settle_weights()
        return self.decode_rows(seqs, tokens)

    def decode_rows(self, seqs: list[PagedSequence], tokens: list[int]) -> np.ndarray:
        """``decode`` without letting the weights settle (start-up measurements)."""
        if self.executor is not None:
            return self.executor.step(seqs, tokens)
        return self.model.forward_chunks([(s, [t]) for s, t in zip(seqs, tokens)])

    def warm_up(self, new_sequence) -> None:
        """Compile (or load from numba's cache) every kernel both row groups use, so the
        first request's timings measure the model, not the JIT."""
        seq = new_sequence("warm-up")
        try:
            self.model.forward_chunks([(seq, [0, 0])])
            self.decode_rows([seq], [0])  # not decode(): the weights stay where they are until a first token
        finally:
            seq.free()

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()
            self.executor = None


def _logit_rows(chunks) -> tuple[np.ndarray | None, list[int]]:
    """The rows of one batched pass whose logits are needed: each chunk's last row (the
    sampling row, when it samples) and the prompt rows a scoring request asks for.  Returns
    the row indices  # [R] (None when no chunk scores: the last rows only) and, per chunk,
    the index of its last row among them; sets each scoring chunk's ``score_rows``.  A
    verification chunk needs all its rows."""
    if all(c.request.score_from is None and c.tree is None for c in chunks):
        return None, list(range(len(chunks)))
    rows: list[int] = []
    last_at = []
    r0 = 0
    for c in chunks:
        n = len(c.tokens)
        if c.tree is not None:  # a verification chunk: every row
            rows.extend(range(r0, r0 + n))
            last_at.append(len(rows) - 1)
            r0 += n
            continue
        first, end = c.score_first, min(c.start + n, c.request.n_prompt)  # scored: positions first .. end - 1
        if first is not None:
            lo = len(rows)
            rows.extend(range(r0 + first - c.start, r0 + end - c.start))
            c.score_rows = (lo, len(rows))
        if first is None or end < c.start + n:
            rows.append(r0 + n - 1)
        last_at.append(len(rows) - 1)
        r0 += n
    return np.asarray(rows, np.int64), last_at
