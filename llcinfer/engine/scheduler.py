"""The scheduler: which tokens of which requests run in the next step.

Two queues.  ``running`` requests hold a sequence in the KV pool, oldest first;
``waiting`` requests wait for one (new, or preempted and to be recomputed), in order.
Each step gets at most ``max_step_tokens`` tokens:

1. every running request, oldest first, gets its pending tokens: one when decoding, a
   chunk of its prompt while prefilling (chunked prefill: a long prompt takes several
   steps, and the others decode in each of them);
2. with tokens left, waiting requests are admitted in order while fewer than
   ``max_seqs`` run and the pool has free blocks for their first chunk (a request first
   adopts the indexed blocks of its longest known prefix).  A request with followers (n
   samples of one prompt) counts as all of them: the loop forks them off its sequence
   once its prompt is done.

A new request also looks at the sequence of the last request that finished, kept while
the pool has room: a prompt that extends it (the next turn of a chat, the same prompt
again) starts from their common prefix, partial blocks included, as llama.cpp reuses a
slot.  The blocks a chunk writes are committed here, before the step runs.  When the pool cannot
give a running request its block, the newest running request is preempted: its
sequence is freed (its full blocks stay indexed, so a resumed request often finds them
again) and it goes back to the front of the waiting queue, to be recomputed from its
tokens.  A request fails with ``OutOfMemoryError`` only when it cannot fit even alone.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import OutOfMemoryError
from ..kv import KVPool, PagedSequence
from ..speculative import DraftTree
from .request import Request, State


@dataclass
class Chunk:
    """Tokens of one request to run this step, at positions start .. start + len - 1 (a
    verification chunk: its draft tree after position start, engine/speculation.py).
    ``score_rows`` / ``scored_logits``: set by the runner for a chunk whose prompt rows are
    scored (its rows' place among the pass's logit rows, then their logits
    # [n, vocab] for positions score_first .. start + len - 1)."""

    request: Request
    start: int
    tokens: list[int]
    score_rows: tuple[int, int] | None = None
    scored_logits: np.ndarray | None = None
    tree: DraftTree | None = None  # a verification chunk: tokens = [last token] + the tree's nodes

    @property
    def score_first(self) -> int | None:
        """The first position of this chunk whose logits its request scores (None: none)."""
        s = self.request.score_from
        if s is None or self.start + len(self.tokens) <= s or self.start >= self.request.n_prompt:
            return None
        return max(self.start, s)

    @property
    def samples(self) -> bool:
        """The chunk reaches the request's last token: its logits give the next token."""
        return self.start + len(self.tokens) == len(self.request.tokens)


@dataclass
class Batch:
    chunks: list[Chunk] = field(default_factory=list)
    failed: list[tuple[Request, Exception]] = field(default_factory=list)  # could never fit

    @property
    def n_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks)


class Scheduler:
    """Args: the pool the sequences live in; ``new_sequence()`` makes an empty one; at most
    ``max_seqs`` running requests and ``max_step_tokens`` tokens per step; ``n_ctx`` tokens
    per sequence."""

    def __init__(self, pool: KVPool, new_sequence: Callable[[str], PagedSequence], n_ctx: int, max_seqs: int,
                 max_step_tokens: int):
        self.pool = pool
        self.new_sequence = new_sequence
        self.n_ctx = int(n_ctx)
        self.max_seqs = max(1, int(max_seqs))
        self.max_step_tokens = max(1, int(max_step_tokens))
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.retained: PagedSequence | None = None  # the last finished request's sequence (see module doc)
        self.n_preemptions = 0
        self.n_reused_tokens = 0  # prompt tokens taken from the retained sequence

    # ------------------------------------------------------------------ queues
    def add(self, req: Request) -> None:
        self.waiting.append(req)

    @property
    def n_concurrent(self) -> int:
        """Requests that decode together once the waiting ones are admitted: the running
        and the waiting, at most ``max_seqs``."""
        return min(self.max_seqs, len(self.running) + len(self.waiting))

    def remove(self, req: Request) -> None:
        """Take a request out of the queues (finished or cancelled); its sequence is the
        caller's to free."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)

    def retain(self, seq: PagedSequence) -> None:
        """Keep a finished request's sequence for the next prompt (the previous one is freed)."""
        self.release_retained()
        self.retained = seq

    def release_retained(self) -> bool:
        """Free the retained sequence; False when there was none."""
        if self.retained is None:
            return False
        self.retained.free()
        self.retained = None
        return True

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # ------------------------------------------------------------------ the step
    def schedule(self) -> Batch:
        batch = Batch()
        budget = self.max_step_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.n_pending, budget)
            if self._commit(req, n, batch):
                batch.chunks.append(Chunk(req, req.n_computed, req.tokens[req.n_computed:req.n_computed + n]))
                budget -= n
                i += 1
            # else req itself was preempted or failed: running[i] is now the next one
        while self.waiting and budget > 0:
            req = self.waiting[0]
            if self.running and len(self.running) + 1 + len(req.followers) > self.max_seqs:
                break
            if self._never_fits(req, batch):
                continue
            n = self._admit(req, budget)
            if n == 0:
                break  # not enough free blocks: wait for running requests to finish
            self.waiting.popleft()
            self.running.append(req)
            batch.chunks.append(Chunk(req, req.n_computed, req.tokens[req.n_computed:req.n_computed + n]))
            budget -= n
        return batch

    def _commit(self, req: Request, n: int, batch: Batch) -> bool:
        """Commit the blocks for req's next n tokens, preempting newer requests if the pool
        is full.  False when req itself was preempted or failed."""
        chunk = req.tokens[req.n_computed:req.n_computed + n]
        while True:
            try:
                req.seq.prepare(chunk)
                return True
            except OutOfMemoryError as e:
                if self.release_retained():
                    continue
                victim = self.running[-1]
                if victim is req and len(self.running) == 1:
                    self.running.remove(req)
                    batch.failed.append((req, e))  # alone and still too big: it never fits
                    return False
                self._preempt(victim)
                if victim is req:
                    return False

    def activate(self, req: Request) -> None:
        """A follower forked off its leader's sequence runs from now on."""
        req.state = State.RUNNING
        req.evaluated_once = True
        self.running.append(req)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        req.seq.free()
        req.seq = None
        req.n_computed = 0
        req.state = State.WAITING
        req.stats.n_preempted += 1
        self.n_preemptions += 1
        self.waiting.appendleft(req)

    def _never_fits(self, req: Request, batch: Batch) -> bool:
        """A request whose tokens need more blocks than the pool may ever commit fails now."""
        need = -(-(len(req.tokens) + 1) // self.pool.block_size)
        cap = self.pool.capacity_blocks
        if need <= cap:
            return False
        self.waiting.popleft()
        batch.failed.append((req, OutOfMemoryError(
            f"KV pool too small: {len(req.tokens)} tokens of a sequence need {need} blocks, the budget "
            f"{self.pool.budget_bytes / 2**20:.1f} MiB holds {cap}")))
        return True

    def _admit(self, req: Request, budget: int) -> int:
        """Give a waiting request a sequence (with its longest indexed prefix) and commit its
        first chunk; returns the chunk's length, 0 when the pool has no room for it yet."""
        seq = self.new_sequence(f"request {req.id}")
        limit = len(req.tokens) - 1  # at least one token runs: its logits give the next
        if req.score_from is not None:
            limit = min(limit, req.score_from)  # scored positions are computed, never adopted
        shared = seq.adopt_prefix(req.tokens, limit)
        kept = self.retained
        if kept is not None:
            common = _common_prefix(kept.tokens, req.tokens, limit)
            if common > shared:
                seq.free()
                seq = kept.fork(f"request {req.id}")
                seq.truncate(common)
                self.n_reused_tokens += common - shared
                shared = common
        n = min(len(req.tokens) - shared, budget)
        need = -(-(shared + n) // seq.block_size) - seq.n_blocks + 1  # + 1: a copy-on-write tail
        if need > self.pool.available_blocks and self.release_retained():
            pass  # its blocks go back to the pool (those this sequence shares stay)
        if need > self.pool.available_blocks and self.running:
            seq.free()
            return 0
        while True:
            try:
                seq.prepare(req.tokens[shared:shared + n])
                break
            except OutOfMemoryError:
                if self.release_retained():
                    continue
                seq.free()
                if self.running:
                    return 0
                raise  # pragma: no cover - _never_fits and an empty pool make this unreachable
        seq.prefill_until = req.n_prompt  # prompt rows on the prefill kernel, in any chunk (PagedSequence.attention)
        req.seq, req.n_computed, req.state = seq, shared, State.RUNNING
        if not req.evaluated_once:
            req.stats.n_prompt_evaluated = req.n_prompt - min(shared, req.n_prompt)
            req.evaluated_once = True
        return n


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n, stop = 0, min(len(a), len(b), limit)
    while n < stop and a[n] == b[n]:
        n += 1
    return n
