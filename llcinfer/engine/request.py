"""A request in the step loop: its tokens, its sampler and text post-processing, its
state and timings; and the handle a caller holds while it runs.

A request's tokens are its prompt followed by what it generated so far.  ``n_computed``
of them have K/V in its sequence; the scheduler gives it the rest in chunks (prefill, a
resumed request's recomputation) or one at a time (decode).  A chunk that reaches the
last token yields logits, from which the loop samples the next token.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Iterator

import numpy as np

from ..kv import PagedSequence
from ..model.tokenizer import StreamDecoder
from .sampling import Sampler, SamplingParams, StopMatcher

_WAIT_S = 0.05  # a waiting thread re-checks whether it should run the steps itself


class State(Enum):
    WAITING = "waiting"  # queued, or preempted and waiting to be recomputed
    RUNNING = "running"  # holds a sequence in the KV pool
    FINISHED = "finished"


@dataclass
class GenerationStats:
    """Timings of one request (tokenization excluded)."""

    n_prompt: int = 0  # prompt tokens submitted
    n_prompt_evaluated: int = 0  # of those, run through the model (the rest came from shared blocks)
    n_generated: int = 0
    n_preempted: int = 0  # times its KV was dropped and later recomputed
    queue_seconds: float = 0.0  # submitted -> first scheduled
    prompt_seconds: float = 0.0  # first scheduled -> first token
    generation_seconds: float = 0.0  # first token -> last token
    stop_reason: str = ""  # "eos", "stop", "length", "context", "cancelled", "error"
    spec_verified: int = 0  # draft tokens verified (speculative decoding)
    spec_accepted: int = 0  # of those, accepted

    @property
    def ttft_s(self) -> float:
        """Time to first token: queueing and prompt evaluation."""
        return self.queue_seconds + self.prompt_seconds

    @property
    def prompt_tps(self) -> float:
        return self.n_prompt_evaluated / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def generation_tps(self) -> float:
        """Generated tokens per second, counting the decode steps after the first token."""
        steps = self.n_generated - 1
        return steps / self.generation_seconds if steps > 0 and self.generation_seconds > 0 else 0.0

    @property
    def tpot_ms(self) -> float:
        tps = self.generation_tps
        return 1000.0 / tps if tps > 0 else 0.0

    def summary(self) -> str:
        spec = (f" | drafts: {self.spec_accepted}/{self.spec_verified} accepted" if self.spec_verified else "")
        return (
            f"prompt: {self.n_prompt_evaluated} tokens, {self.prompt_tps:.1f} tok/s | "
            f"generation: {self.n_generated} tokens, {self.generation_tps:.1f} tok/s, "
            f"TPOT {self.tpot_ms:.2f} ms{spec} | stop: {self.stop_reason}"
        )


@dataclass
class Completion:
    """The outcome of one request.  ``logprobs`` (one per generated token) and
    ``top_logprobs`` (per token, the most likely (token, log-probability) pairs) are
    filled when the request asked for them (``SamplingParams.logprobs``)."""

    text: str
    token_ids: list[int]
    stop_reason: str
    error: Exception | None = None
    stats: GenerationStats = field(default_factory=GenerationStats)
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None

    @property
    def mean_logprob(self) -> float | None:
        """Mean log-probability of the generated tokens (None without logprobs or tokens)."""
        if not self.logprobs:
            return None
        return sum(self.logprobs) / len(self.logprobs)


class Request:
    """One prompt being completed.  Created by the engine (``Engine.submit``); the step loop
    is the only writer of its state."""

    def __init__(self, rid: int, prompt: list[int], params: SamplingParams, vocab_size: int,
                 decoder: StreamDecoder, eog_ids, want_logits: bool = False, score_from: int | None = None,
                 on_logits: Callable[[int, np.ndarray], None] | None = None):
        self.id = rid
        self.params = params
        self.sampler = Sampler(params, vocab_size)
        self.eog = frozenset(() if params.ignore_eos else eog_ids)
        self.tokens: list[int] = list(prompt)  # prompt, then every generated token
        self.n_prompt = len(prompt)
        self.want_logits = want_logits  # keep the logits after the prompt (LLM.logits)
        self.logits: np.ndarray | None = None  # [vocab] f32, the last sampled-from logits when asked
        # prompt scoring (perplexity): the logits at prompt positions >= score_from go to
        # on_logits(first position, rows  # [n, vocab] f32) on the engine thread, chunk by chunk
        # (again after a preemption: the recomputed rows are handed over once more)
        self.score_from, self.on_logits = score_from, on_logits
        # per generated token, when params.logprobs is set: its log-probability and the top N
        self.logprobs: list[float] | None = None if params.logprobs is None else []
        self.top_logprobs: list[list[tuple[int, float]]] | None = None if params.logprobs is None else []
        self.seq: PagedSequence | None = None
        self.n_computed = 0  # tokens whose K/V the sequence holds
        self.state = State.WAITING
        self.stop_reason = ""
        self.error: Exception | None = None
        self.cancel_requested = False
        self.stats = GenerationStats(n_prompt=len(prompt))
        self.arrival = time.perf_counter()
        self._first_scheduled: float | None = None
        self._first_token: float | None = None
        self.evaluated_once = False  # prompt tokens counted in stats (not again after a preemption)
        self._decoder = decoder
        self._stopper = StopMatcher(params.stop)
        self._text: list[str] = []
        self.pieces: queue.SimpleQueue = queue.SimpleQueue()  # text pieces, then None at the end
        self.finished = threading.Event()
        # samples of the same prompt (LLM.submit_n): they start from this request's prompt
        # blocks and its logits after the prompt, once it has them (the loop forks them)
        self.followers: list[Request] = []

    # ------------------------------------------------------------------ views
    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.n_prompt:]

    @property
    def n_pending(self) -> int:
        """Tokens still to run through the model before the next token can be sampled."""
        return len(self.tokens) - self.n_computed

    @property
    def text(self) -> str:
        return "".join(self._text)

    def completion(self) -> Completion:
        return Completion(self.text, self.output_ids, self.stop_reason, self.error, self.stats,
                          self.logprobs, self.top_logprobs)

    # ------------------------------------------------------------------ the loop's updates
    def mark_scheduled(self, now: float) -> None:
        if self._first_scheduled is None:
            self._first_scheduled = now
            self.stats.queue_seconds = now - self.arrival

    def append(self, token: int, now: float, logprob: tuple[float, list] | None = None) -> bool:
        """Record a sampled token (with its log-probability and top alternatives when asked)
        and emit its text; True when a stop string completed."""
        if self._first_token is None:
            self._first_token = now
            self.stats.prompt_seconds = now - (self._first_scheduled or self.arrival)
        else:
            self.stats.generation_seconds = now - self._first_token
        if logprob is not None:
            self.logprobs.append(logprob[0])
            self.top_logprobs.append(logprob[1])
        self.tokens.append(token)
        self.stats.n_generated += 1
        text, stopped = self._stopper.push(self._decoder.push(token))
        self._emit(text)
        return stopped

    def finish(self, reason: str, error: Exception | None = None) -> None:
        """End the request: flush held-back text (not after a stop string), release its
        sequence, wake whoever waits on it."""
        if self.state is State.FINISHED:
            return
        if reason not in ("cancelled", "error"):
            text, stopped = self._stopper.push(self._decoder.flush())
            self._emit(text if stopped else text + self._stopper.flush())
            if stopped:
                reason = "stop"
        self.stop_reason = self.stats.stop_reason = reason
        self.error = error
        if self.seq is not None:
            self.seq.free()
            self.seq = None
        self.n_computed = 0
        self.state = State.FINISHED
        self.pieces.put(None)
        self.finished.set()

    def _emit(self, text: str) -> None:
        if text:
            self._text.append(text)
            self.pieces.put(text)


class RequestHandle:
    """What ``LLM.submit`` returns.  Iterating it yields the text as it is produced;
    ``result()`` waits for the whole completion; ``cancel()`` ends the request and frees
    its KV blocks.  Any thread may hold one; when no engine thread runs, iterating or
    waiting drives the step loop from the calling thread."""

    def __init__(self, engine, request: Request):
        self._engine = engine
        self.request = request

    def __iter__(self) -> Iterator[str]:
        req = self.request
        try:
            while True:
                piece = self._next_piece()
                if piece is None:
                    break
                yield piece
        finally:
            if not req.finished.is_set():  # the consumer stopped early (break, close, Ctrl-C)
                self.cancel()
        if req.error is not None:
            raise req.error

    def _next_piece(self) -> str | None:
        pieces = self.request.pieces
        while True:
            try:
                return pieces.get_nowait()
            except queue.Empty:
                pass
            if not self._engine.step_if_idle():  # another thread runs the steps: wait for it
                try:
                    return pieces.get(timeout=_WAIT_S)
                except queue.Empty:
                    pass

    def result(self) -> Completion:
        """Wait until the request ends; its completion (``error`` set if it failed)."""
        req = self.request
        while not req.finished.is_set():
            if not self._engine.step_if_idle():
                req.finished.wait(_WAIT_S)
        return req.completion()

    def cancel(self) -> None:
        self._engine.cancel(self.request)

    @property
    def done(self) -> bool:
        return self.request.finished.is_set()

    @property
    def stats(self) -> GenerationStats:
        return self.request.stats
