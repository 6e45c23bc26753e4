"""Perplexity by llama-perplexity's method, and KL divergence against a base run.

The text's tokens (with the tokenizer's BOS) are cut into chunks of ``n_ctx``; each chunk
runs from an empty context with its first token replaced by BOS (when the model adds
one), and the second half of it is scored: the logits at positions n_ctx // 2 .. n_ctx - 2
against the next token.  PPL = exp(mean NLL), its uncertainty as llama.cpp's.  Against a
base (``kld_base``): per scored position

    KLD = sum_i p_base(i) * (log p_base(i) - log p(i))      over i with log p_base(i) > -16

and whether both put their largest probability on the same token ("same top").  Every
chunk is a request on the LLM's step loop (prompt scoring: its scored rows are computed,
never taken from cached blocks); the chunks run side by side as the scheduler admits them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..engine.sampling import SamplingParams
from ..errors import UsageError
from .kld_base import BaseLogits, BaseWriter, decode_rows, encode_rows, row_width, scored_per_chunk


@dataclass
class ChunkScores:
    """One chunk's scored positions: NLL, and against a base KLD and same-top flags."""

    nll: np.ndarray  # [scored] f64
    kld: np.ndarray | None = None  # [scored] f64
    same_top: np.ndarray | None = None  # [scored] bool
    nll_base: np.ndarray | None = None  # [scored] f64


@dataclass
class PerplexityResult:
    n_ctx: int
    chunks: list[ChunkScores] = field(default_factory=list)

    def _all(self, name: str) -> np.ndarray:
        return np.concatenate([getattr(c, name) for c in self.chunks])

    @staticmethod
    def _ppl(nll: np.ndarray) -> tuple[float, float]:
        mean = float(nll.mean())
        var = float((nll ** 2).mean()) - mean * mean
        err = math.sqrt(var / (len(nll) - 1)) if var > 0 and len(nll) > 1 else 0.0
        return math.exp(mean), err * math.exp(mean)

    @property
    def ppl(self) -> tuple[float, float]:
        """PPL and its uncertainty (llama-perplexity's "Final estimate")."""
        return self._ppl(self._all("nll"))

    @property
    def ppl_base(self) -> tuple[float, float]:
        return self._ppl(self._all("nll_base"))

    def running_ppl(self) -> list[float]:
        """PPL over the chunks so far, after each chunk (llama-perplexity's [i] values)."""
        out, total, count = [], 0.0, 0
        for c in self.chunks:
            total += float(c.nll.sum())
            count += len(c.nll)
            out.append(math.exp(total / count))
        return out

    @property
    def kld(self) -> tuple[float, float]:
        """Mean KL divergence from the base and its uncertainty."""
        k = self._all("kld")
        err = float(k.std(ddof=1) / math.sqrt(len(k))) if len(k) > 1 else 0.0
        return float(k.mean()), err

    @property
    def same_top(self) -> float:
        return float(self._all("same_top").mean())

    def kld_percentiles(self) -> dict[str, float]:
        k = self._all("kld")
        return {f"{p:g}": float(np.percentile(k, p)) for p in (50, 90, 99, 99.9)} | {"max": float(k.max())}


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    hi = logits.max(axis=1, keepdims=True)
    shifted = logits.astype(np.float64) - hi
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))  # [n, vocab] f64


def chunk_tokens(tokens: np.ndarray, n_ctx: int, n_chunks: int | None, bos: int | None) -> list[list[int]]:
    """The chunks to run: n_ctx tokens each, the first replaced by ``bos`` when given."""
    n = len(tokens) // n_ctx if n_chunks is None else min(n_chunks, len(tokens) // n_ctx)
    out = []
    for i in range(n):
        toks = [int(t) for t in tokens[i * n_ctx:(i + 1) * n_ctx]]
        if bos is not None:
            toks[0] = bos
        out.append(toks)
    return out


class _ChunkScorer:
    """The consumer of one chunk's scored logits (called on the engine thread, once per prompt
    chunk of the request, again for rows a preemption recomputes)."""

    def __init__(self, chunk: list[int], n_ctx: int, base: tuple[np.ndarray, np.ndarray] | None):
        self.first = n_ctx // 2
        n = scored_per_chunk(n_ctx)
        self.targets = np.asarray(chunk[self.first + 1:], np.int64)  # [scored] the token each position predicts
        self.base = base
        self.nll = np.full(n, np.nan)
        self.kld = np.full(n, np.nan) if base is not None else None
        self.same = np.zeros(n, bool) if base is not None else None
        self.kept: np.ndarray | None = None  # [scored, row_width] uint16, the base-file rows when saved

    def keep_rows(self, vocab: int) -> None:
        self.kept = np.zeros((len(self.nll), row_width(vocab)), np.uint16)

    def __call__(self, pos0: int, rows: np.ndarray) -> None:
        lo = pos0 - self.first  # index of rows[0] among the scored positions
        n = min(len(rows), len(self.nll) - lo)  # the chunk's last position predicts nothing
        if n <= 0:
            return
        rows = rows[:n]
        idx = np.arange(lo, lo + n)
        logp = _log_softmax(rows)
        self.nll[idx] = -logp[np.arange(n), self.targets[idx]]
        if self.kept is not None:
            self.kept[idx] = encode_rows(rows)
        if self.base is not None:
            head, q = self.base
            base = decode_rows(head[idx], q[idx]).astype(np.float64)  # [n, vocab] log p_base
            p_base = np.where(base > -16, np.exp(base), 0.0)
            self.kld[idx] = (p_base * (base - logp)).sum(axis=1)
            self.same[idx] = rows.argmax(axis=1) == base.argmax(axis=1)

    def scores(self, base_nll: np.ndarray | None) -> ChunkScores:
        if np.isnan(self.nll).any():
            raise RuntimeError("a scored position got no logits")  # pragma: no cover - the engine's contract
        return ChunkScores(self.nll, self.kld, self.same, base_nll)


def check_inputs(n_tokens: int, n_ctx: int, vocab: int, base: BaseLogits | None = None) -> None:
    """``UsageError`` when ``n_tokens`` tokens (the base's, with a base) cannot be scored in
    chunks of ``n_ctx`` by a model of ``vocab`` tokens; needs no model built."""
    if base is not None and base.n_vocab != vocab:
        raise UsageError(f"{base.path} holds a vocabulary of {base.n_vocab} tokens, the model has {vocab}")
    if n_ctx < 4:
        raise UsageError(f"-c must be at least 4 (got {n_ctx})")
    if base is None and n_tokens < 2 * n_ctx:
        raise UsageError(f"the text is {n_tokens} tokens; -c {n_ctx} needs at least {2 * n_ctx}")


def perplexity(llm, tokens, n_ctx: int, n_chunks: int | None = None, base: BaseLogits | None = None,
               save: str | None = None, on_chunk: Callable[[int, PerplexityResult], None] | None = None
               ) -> PerplexityResult:
    """Score ``tokens`` (the text's, BOS included as the tokenizer adds it) in chunks of
    ``n_ctx`` on ``llm`` (its context must hold n_ctx).  With ``base``, its tokens are used
    and each position is compared with it; ``save`` writes a base file of this run.
    ``on_chunk(i, result)`` runs as chunks finish, in order."""
    vocab = llm.config.vocab_size
    if base is not None:
        n_ctx, tokens = base.n_ctx, base.tokens
    check_inputs(len(tokens), n_ctx, vocab, base)
    if n_ctx > llm.n_ctx:
        raise UsageError(f"-c {n_ctx} is larger than the model's context {llm.n_ctx}")
    tokens = np.asarray(tokens, np.int64)
    bos = llm.tokenizer.bos_id if llm.tokenizer.add_bos else None
    chunks = chunk_tokens(tokens, n_ctx, n_chunks, bos)
    writer = BaseWriter(save, n_ctx, vocab, tokens[:len(chunks) * n_ctx]) if save else None
    scorers = [_ChunkScorer(c, n_ctx, None if base is None else base.chunk(i)) for i, c in enumerate(chunks)]
    if writer is not None:
        for s in scorers:
            s.keep_rows(vocab)  # a chunk's rows, until it is written
    first = n_ctx // 2
    window = llm.engine.scheduler.max_seqs  # chunks in flight: they run side by side
    handles = []
    result = PerplexityResult(n_ctx)
    try:
        for i, s in enumerate(scorers):
            while len(handles) < min(len(chunks), i + window):
                j = len(handles)
                handles.append(llm.engine.submit(chunks[j], SamplingParams(max_tokens=0), score_from=first,
                                                 on_logits=scorers[j]))
            done = handles[i].result()
            if done.error is not None:
                raise done.error
            base_nll = None
            if base is not None:
                head, q = base.chunk(i)
                base_nll = -decode_rows(head, q[np.arange(len(s.targets)), s.targets][:, None])[:, 0]
            result.chunks.append(s.scores(None if base_nll is None else base_nll.astype(np.float64)))
            if writer is not None:
                writer.write_rows(s.kept)
                s.kept = None
            if on_chunk is not None:
                on_chunk(i, result)
    finally:
        for h in handles:
            if not h.done:
                h.cancel()
        if writer is not None:
            writer.close()
    return result
