"""The step loop: every request, from any thread, runs here.

    step():  batch = scheduler.schedule()       # which tokens of which requests
             logits = runner.run(batch)         # one pass for all of them
             post_process(batch, logits)        # sample, detokenize, stop checks

One ``Engine`` owns one paged KV pool that its requests share (prefix blocks included).
``submit`` may be called from any thread; steps run either on the engine's own thread
(``start()``) or, when none runs, on whichever thread waits for a request (a blocking
``LLM.generate`` steps the loop itself, with no hand-off between threads per token).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque

import numpy as np

from ..errors import UsageError, check_prompt_fits
from ..kv import DEFAULT_BLOCK_SIZE, PagedSequence
from ..model.tokenizer import Tokenizer
from ..sparse import SparseConfig
from .sparse_setup import enable_sparse
from .request import Completion, Request, RequestHandle, State
from .runner import ModelRunner
from .sampling import SamplingParams, token_logprobs
from .scheduler import Batch, Scheduler
from .speculation import Speculator
from .transformer import Transformer

DEFAULT_STEP_TOKENS = 128  # tokens per step: decode rows plus prompt chunks


class Engine:
    """Args: ``n_seq`` requests run at once (the plan's concurrency) on a pool with room for
    that many contexts of ``n_ctx`` tokens; ``step_tokens`` tokens per step; ``kv_type``
    "f16" | "int8" | "f32" (None: the model's default); ``kv_budget_bytes`` caps the
    committed KV memory (None: available RAM less the model and a margin); ``domains``
    the executor's cores (None: every row on the batched forward pass); ``speculator``
    drafts and verifies token trees for decoding requests (engine/speculation.py);
    ``sparse``: sparse attention for long contexts (engine/sparse_setup.py; the executor
    runs it too).  The two do not combine (api.py refuses it)."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, n_ctx: int, step_tokens: int = DEFAULT_STEP_TOKENS,
                 kv_type: str | None = None, n_seq: int = 1, block_size: int = DEFAULT_BLOCK_SIZE,
                 kv_budget_bytes: int | None = None, prefix_sharing: bool = True, domains=None,
                 speculator: Speculator | None = None, sparse: SparseConfig | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.n_ctx = int(n_ctx)
        self.pool, self.prefix = model.new_pool(self.n_ctx, n_seq, kv_type, block_size, kv_budget_bytes,
                                                prefix_sharing)
        # sparse attention (above its context threshold) on this pool, or dense; before the runner
        self.sparse = enable_sparse(model, tokenizer, self.pool, sparse) if sparse is not None else None
        if sparse is None:
            model.sparse = None
        self.runner = ModelRunner(model, self.pool.kind, domains)
        self.scheduler = Scheduler(self.pool, self.new_sequence, self.n_ctx, n_seq, step_tokens)
        self.speculator = speculator
        self.n_steps = 0
        self._ids = itertools.count()
        self._inbox: deque = deque()  # ("add", request) | ("cancel", request) from any thread
        self._step_lock = threading.Lock()  # held by the thread running a step
        self._wake = threading.Condition()  # the engine thread sleeps on it when idle
        self._thread: threading.Thread | None = None
        self._stopping = False

    def new_sequence(self, name: str = "sequence") -> PagedSequence:
        """An empty sequence on the shared pool (free it with ``seq.free()``)."""
        return PagedSequence(self.pool, self.n_ctx, self.prefix, name)

    # ------------------------------------------------------------------ requests
    def submit(self, prompt: list[int], params: SamplingParams, want_logits: bool = False,
               score_from: int | None = None, on_logits=None, _queue: bool = True) -> RequestHandle:
        """Queue a request for ``prompt`` (token ids); returns its handle.  Thread-safe.
        With ``score_from`` and ``on_logits``, the logits at prompt positions >= score_from
        are computed (never taken from cached blocks) and handed to ``on_logits(first
        position, rows # [n, vocab])`` on the engine thread as the prompt's chunks run."""
        params = params.validate()
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise UsageError("empty prompt: nothing to condition on")
        vocab = self.model.config.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise UsageError(f"token ids must be in [0, {vocab})")
        check_prompt_fits(len(prompt), self.n_ctx)
        if (score_from is None) != (on_logits is None) or (on_logits is not None and not callable(on_logits)):
            raise UsageError("scoring a prompt needs both score_from and a callable on_logits")
        if score_from is not None and not 0 <= score_from < len(prompt):
            raise UsageError(f"score_from must be in [0, {len(prompt)}) (got {score_from})")
        req = Request(next(self._ids), prompt, params, vocab, self.tokenizer.stream_decoder(),
                      self.tokenizer.eog_ids, want_logits, score_from, on_logits)
        if _queue:
            self._post(("add", req))
        return RequestHandle(self, req)

    def submit_n(self, prompt: list[int], params: list[SamplingParams]) -> list[RequestHandle]:
        """One request per ``params`` for the same prompt, computed once: the others fork its
        blocks and sample their first token from its logits.  Thread-safe."""
        if not params:
            raise UsageError("submit_n needs at least one set of sampling parameters")
        handles = [self.submit(prompt, p, _queue=False) for p in params]
        leader = handles[0].request
        leader.followers = [h.request for h in handles[1:]]
        self._post(("add", leader))
        return handles

    def cancel(self, req: Request) -> None:
        """End ``req`` and free its blocks: now when no step is running, else right after it."""
        req.cancel_requested = True
        self._post(("cancel", req))
        if self._step_lock.acquire(blocking=False):
            try:
                self._take_inbox()
            finally:
                self._step_lock.release()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Complete every prompt (continuous batching: a finished request's place is taken by
        the next at once); completions in the order of ``prompts``."""
        handles = [self.submit(p, params) for p in prompts]
        return [h.result() for h in handles]

    def _post(self, item) -> None:
        self._inbox.append(item)
        with self._wake:
            self._wake.notify()

    def _take_inbox(self) -> None:
        while self._inbox:
            what, req = self._inbox.popleft()
            if what == "add" and not req.cancel_requested:
                self.scheduler.add(req)
            elif what == "cancel" and req.state is not State.FINISHED:
                self._finish(req, "cancelled")

    # ------------------------------------------------------------------ the step
    def step(self) -> bool:
        """Run one step; False when there was nothing to do.  The caller holds no lock: use
        ``step_if_idle`` from threads that may race."""
        self._take_inbox()
        batch = self.scheduler.schedule()
        for req, err in batch.failed:
            self._finish(req, "error", err)
        if not batch.chunks:
            return bool(batch.failed)
        t_start = time.perf_counter()
        if self.speculator is not None:
            self.speculator.extend(batch, self.n_ctx, self.scheduler.max_step_tokens, self.scheduler.n_concurrent)
        now = time.perf_counter()
        for c in batch.chunks:
            c.request.mark_scheduled(now)
        try:
            logits = self.runner.run(batch)
        except Exception as e:  # noqa: BLE001 - an executor failure ends this batch's requests, not the loop
            for c in batch.chunks:
                self._finish(c.request, "error", e)
            return True
        if self.speculator is not None:
            if any(c.tree is not None for c in batch.chunks):
                self.speculator.stats.verifications += 1
                self.speculator.stats.verify_seconds += time.perf_counter() - now
            self.speculator.prefilled(batch, self.scheduler.n_concurrent)
        if self.speculator is None:
            self._post_process(batch, logits)
        else:
            n_before = [len(c.request.tokens) for c in batch.chunks]
            self._post_process(batch, logits)
            self.speculator.record_step(batch, n_before, time.perf_counter() - t_start)
        self.n_steps += 1
        return True

    def _post_process(self, batch: Batch, logits: list[np.ndarray | None]) -> None:
        now = time.perf_counter()
        for chunk, row in zip(batch.chunks, logits):
            req = chunk.request
            req.n_computed = req.seq.n_tokens
            if chunk.scored_logits is not None:
                try:
                    req.on_logits(chunk.score_first, chunk.scored_logits)
                except Exception as e:  # noqa: BLE001 - a failing consumer ends its own request only
                    self._finish(req, "error", e)
                    continue
            if row is None:
                continue  # a prompt chunk short of the last token
            if chunk.tree is not None:
                req.n_computed = chunk.start + 1  # the root; the accepted path is kept after the walk
                self.speculator.accept(req, chunk, row, lambda r, req=req: self._draw(req, r, now))
                continue
            if req.want_logits and req.logits is None:
                req.logits = np.array(row, np.float32)
            followers, req.followers = req.followers, []
            for f in followers:  # n samples of this prompt: its blocks and these logits are theirs too
                if f.cancel_requested:
                    continue
                f.seq = req.seq.fork(f"request {f.id}")
                f.n_computed = req.n_computed
                f.mark_scheduled(now)
                f.stats.n_prompt_evaluated = 0
                if self.prefix is not None:
                    self.prefix.stats.hit_tokens += f.n_computed
                self.scheduler.activate(f)
                self._sample(f, row, now)
            self._sample(req, row, now)

    def _sample(self, req: Request, row: np.ndarray, now: float) -> None:
        """The next token of ``req`` from its logits row, and the checks that end it."""
        p = req.params
        if req.stats.n_generated >= p.max_tokens:
            self._finish(req, "length")
            return
        token = req.sampler.sample(row, req.tokens)
        if token in req.eog:
            self._finish(req, "eos")
        elif req.append(token, now, None if p.logprobs is None else token_logprobs(row, token, p.logprobs)):
            self._finish(req, "stop")
        elif req.stats.n_generated >= p.max_tokens:
            self._finish(req, "length")
        elif req.n_computed >= self.n_ctx:
            self._finish(req, "context")

    def _draw(self, req: Request, row: np.ndarray, now: float) -> int | None:
        """``_sample`` for the acceptance walk: the token drawn, None once req ended."""
        if req.state is State.FINISHED:
            return None
        self._sample(req, row, now)
        return None if req.state is State.FINISHED else req.tokens[-1]

    def _finish(self, req: Request, reason: str, error: Exception | None = None) -> None:
        if req.seq is not None and req.seq.n_tokens > req.n_computed:
            req.seq.truncate(req.n_computed)  # an unfinished verification's tree rows
        if self.speculator is not None:
            self.speculator.finish(req)
        followers, req.followers = req.followers, []
        for f in followers:  # it ended before its prompt was done: they compute it themselves
            if not f.cancel_requested:
                self.scheduler.add(f)
        self.scheduler.remove(req)
        if self.prefix is not None and req.seq is not None and reason not in ("error", "cancelled"):
            self.scheduler.retain(req.seq)  # the next prompt may extend it (a chat turn)
            req.seq = None
        req.finish(reason, error)

    # ------------------------------------------------------------------ who runs steps
    def step_if_idle(self) -> bool:
        """Run a step on the calling thread unless the engine thread runs them or another
        thread is in one; True when a step ran here."""
        if self._thread is not None or not self._step_lock.acquire(blocking=False):
            return False
        try:
            self.step()
        finally:
            self._step_lock.release()
        return True

    def start(self) -> None:
        """Run steps on an engine thread from now on (requests from any thread)."""
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._serve, name="llcinfer-engine", daemon=True)
            self._thread.start()

    def stop(self, drain: bool = True) -> None:
        """Stop the engine thread; with ``drain`` after every queued request has finished,
        else at once (unfinished requests are cancelled)."""
        thread = self._thread
        if thread is None:
            return
        if not drain:
            for req in list(self.scheduler.running) + list(self.scheduler.waiting):
                self.cancel(req)
        self._stopping = True
        with self._wake:
            self._wake.notify()
        thread.join()
        self._thread = None

    def _serve(self) -> None:
        while True:
            with self._wake:
                while not (self._inbox or self.scheduler.has_work or self._stopping):
                    self._wake.wait()
            if self._stopping and not (self._inbox or self.scheduler.has_work):
                return
            with self._step_lock:
                self.step()

    def reset(self) -> None:
        """Forget every cached prefix (indexed blocks, the last request's sequence)."""
        with self._step_lock:
            self.scheduler.release_retained()
            self.pool.drop_cached()

    def close(self) -> None:
        self.stop(drain=False)
        self.runner.close()
