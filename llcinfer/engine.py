"""The step loop: plan the prompt into batches, run the model, post-process each token
(sample, detokenize, stop checks) and stream text out.

One ``Engine`` owns one paged KV pool (llcinfer.kv) that many sequences share.  Its
default sequence (``engine.cache``) serves generate / chat: a new prompt that extends the
tokens it holds (the next chat turn) only runs the new tokens, and any prompt first looks
for its longest indexed prefix in the pool (a common system prompt, an earlier turn).
``generate_batch`` runs several prompts on sequences of their own, sharing prefix blocks;
a sequence that cannot get memory ends with an error while the others go on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from .errors import ContextLengthError, OutOfMemoryError
from .kv import DEFAULT_BLOCK_SIZE, PagedSequence
from .model import Transformer
from .sampling import Sampler, SamplingParams, StopMatcher
from .tokenizer import Tokenizer

DEFAULT_BATCH = 32  # prompt tokens per forward call


@dataclass
class GenerationStats:
    """Timings of the last generation (tokenization excluded)."""

    n_prompt: int = 0  # prompt tokens submitted
    n_prompt_evaluated: int = 0  # of those, run through the model (the rest came from the cache)
    n_generated: int = 0
    prompt_seconds: float = 0.0
    generation_seconds: float = 0.0
    stop_reason: str = ""  # "eos", "stop", "length", "context", "interrupted"

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
        return (
            f"prompt: {self.n_prompt_evaluated} tokens, {self.prompt_tps:.1f} tok/s | "
            f"generation: {self.n_generated} tokens, {self.generation_tps:.1f} tok/s, "
            f"TPOT {self.tpot_ms:.2f} ms | stop: {self.stop_reason}"
        )


@dataclass
class BatchResult:
    """One prompt of ``generate_batch``: its tokens, or the error that ended it."""

    token_ids: list[int]
    stop_reason: str = ""
    error: Exception | None = None
    stats: GenerationStats | None = None


class Engine:
    """Args: n_seq sequences of up to n_ctx tokens share the pool (its reservation);
    kv_type "f16" | "int8" | "f32" (None: the model's default); kv_budget_bytes caps the
    committed KV memory (None: available RAM less the model and a margin)."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, n_ctx: int, n_batch: int = DEFAULT_BATCH,
                 kv_type: str | None = None, n_seq: int = 1, block_size: int = DEFAULT_BLOCK_SIZE,
                 kv_budget_bytes: int | None = None, prefix_sharing: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.n_ctx = int(n_ctx)
        self.n_batch = max(1, int(n_batch))
        self.pool, self.prefix = model.new_pool(self.n_ctx, n_seq, kv_type, block_size, kv_budget_bytes,
                                                prefix_sharing)
        self._n_seq_made = 0
        self.cache = self.new_sequence()  # the default sequence (generate, chat)
        self.stats = GenerationStats()

    def new_sequence(self) -> PagedSequence:
        """A new, empty sequence on the shared pool (free it with ``seq.free()``)."""
        seq = PagedSequence(self.pool, self.n_ctx, self.prefix, f"sequence {self._n_seq_made}")
        self._n_seq_made += 1
        return seq

    @property
    def cached_tokens(self) -> list[int]:
        """Tokens whose K/V the default sequence holds (read only)."""
        return self.cache.tokens

    def reset(self) -> None:
        """Empty the default sequence (its indexed blocks stay shareable)."""
        self.cache.clear()

    # -- plan ---------------------------------------------------------------------------
    def _reuse_prefix(self, prompt: list[int], seq: PagedSequence) -> int:
        """Keep the longest known prefix of ``prompt`` (at least one token left to run):
        what ``seq`` holds already, or the pool's indexed blocks, whichever is longer."""
        n = 0
        held = seq.tokens
        limit = min(len(held), len(prompt) - 1)
        while n < limit and held[n] == prompt[n]:
            n += 1
        if self.prefix is not None:
            blocks, _ = self.prefix.match(prompt, len(prompt) - 1)
            if min(len(blocks) * seq.block_size, len(prompt) - 1) > n:
                seq.clear()
                return seq.adopt_prefix(prompt, len(prompt) - 1)
        seq.truncate(n)
        return n

    # -- run ----------------------------------------------------------------------------
    def _run(self, tokens: list[int], seq: PagedSequence | None = None) -> np.ndarray:
        """Feed tokens in batches of n_batch; return the last position's logits [vocab]."""
        seq = self.cache if seq is None else seq
        logits = None
        for i in range(0, len(tokens), self.n_batch):
            logits = self.model.forward(tokens[i:i + self.n_batch], seq)
        return logits

    def prefill(self, prompt: list[int], seq: PagedSequence | None = None) -> np.ndarray:
        """Make the sequence (default: ``self.cache``) hold ``prompt``; return the logits
        after its last token.  Sets ``self.stats``."""
        seq = self.cache if seq is None else seq
        if not prompt:
            raise ValueError("empty prompt: nothing to condition on")
        if len(prompt) > self.n_ctx:
            raise ContextLengthError(f"prompt of {len(prompt)} tokens exceeds the context length {self.n_ctx}")
        reused = self._reuse_prefix(prompt, seq)
        t0 = time.perf_counter()
        logits = self._run(prompt[reused:], seq)
        self.stats = GenerationStats(n_prompt=len(prompt), n_prompt_evaluated=len(prompt) - reused,
                                     prompt_seconds=time.perf_counter() - t0)
        return logits

    def generate_ids(self, prompt: list[int], params: SamplingParams) -> Iterator[int]:
        """Yield sampled token ids; sets ``stats.stop_reason`` when it ends."""
        params = params.validate()
        logits = self.prefill(prompt)
        stats = self.stats
        if params.max_tokens == 0:
            stats.stop_reason = "length"
            return
        sampler = Sampler(params, self.model.config.vocab_size)
        eog = self.tokenizer.eog_ids
        history = list(prompt)
        t0 = None
        while True:
            token = sampler.sample(logits, history)
            if token in eog and not params.ignore_eos:
                stats.stop_reason = "eos"
                return
            history.append(token)
            stats.n_generated += 1
            if t0 is None:
                t0 = time.perf_counter()  # TPOT counts the steps after the first token
            yield token
            if stats.n_generated >= params.max_tokens:
                stats.stop_reason = "length"
                return
            if self.cache.n_tokens >= self.n_ctx:
                stats.stop_reason = "context"
                return
            self.model.settle_weights()
            logits = self.model.forward([token], self.cache)
            stats.generation_seconds = time.perf_counter() - t0

    def generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[BatchResult]:
        """Generate for every prompt, each on a sequence of its own in the shared pool.

        Prompts are prefilled one after the other (a common prefix, e.g. a system prompt,
        is computed once: later prompts adopt its blocks), then the live sequences decode
        round-robin, one token each per round.  A sequence that cannot get KV memory (or
        hits the context length) ends with ``error`` / ``stop_reason`` set and the others go
        on.  Every sequence is freed at the end (indexed blocks stay shareable).
        """
        params = params.validate()
        eog = self.tokenizer.eog_ids
        vocab = self.model.config.vocab_size
        results = [BatchResult([]) for _ in prompts]
        seqs: list[PagedSequence] = []
        live = []  # [index, sequence, sampler, history, logits]
        try:
            for i, prompt in enumerate(prompts):
                seq = self.new_sequence()
                seqs.append(seq)
                try:
                    logits = self.prefill(list(prompt), seq)
                except (OutOfMemoryError, ContextLengthError) as e:
                    results[i].error, results[i].stop_reason = e, "error"
                    results[i].stats = GenerationStats(n_prompt=len(prompt), stop_reason="error")
                    seq.free()
                    continue
                results[i].stats = self.stats
                if params.max_tokens == 0:
                    results[i].stop_reason = self.stats.stop_reason = "length"
                    seq.free()
                    continue
                live.append([i, seq, Sampler(params, vocab), list(prompt), logits])
            while live:
                still, going = [], []
                for st in live:
                    i, seq, sampler, history, logits = st
                    res = results[i]
                    token = sampler.sample(logits, history)
                    stop = ""
                    if token in eog and not params.ignore_eos:
                        stop = "eos"
                    else:
                        history.append(token)
                        res.token_ids.append(token)
                        res.stats.n_generated += 1
                        if res.stats.n_generated >= params.max_tokens:
                            stop = "length"
                        elif seq.n_tokens >= self.n_ctx:
                            stop = "context"
                    if stop:
                        res.stop_reason = res.stats.stop_reason = stop
                        seq.free()
                    else:
                        going.append((st, token))
                if going:  # one decode step for every live sequence (batched when possible)
                    t0 = time.perf_counter()
                    failed = self._decode_round(going)
                    dt = time.perf_counter() - t0
                    for st, _ in going:
                        res = results[st[0]]
                        res.stats.generation_seconds += dt  # each sequence waited for the whole step
                        if id(st) in failed:
                            res.error, res.stop_reason = failed[id(st)], "error"
                            res.stats.stop_reason = "error"
                            st[1].free()
                        else:
                            still.append(st)
                live = still
        finally:
            for seq in seqs:
                seq.free()
        return results

    def _decode_round(self, going: list) -> dict:
        """Run one token for each (state, token) of ``going``; stores the logits in each
        state; returns {id(state): error} for the sequences that ran out of KV memory."""
        self.model.settle_weights()
        try:
            logits = self.model.decode_batch([t for _, t in going], [st[1] for st, _ in going])
            for (st, _), row in zip(going, logits):
                st[4] = row
            return {}
        except OutOfMemoryError:  # find which ones fail, one at a time
            failed = {}
            for st, token in going:
                try:
                    st[4] = self.model.forward([token], st[1])
                except OutOfMemoryError as e:
                    failed[id(st)] = e
            return failed

    # -- post-process -------------------------------------------------------------------
    def stream_text(self, prompt: list[int], params: SamplingParams) -> Iterator[str]:
        """Yield decoded text pieces: whole UTF-8 characters only, stop strings removed."""
        params = params.validate()
        decoder = self.tokenizer.stream_decoder()
        stopper = StopMatcher(params.stop)
        ids = self.generate_ids(prompt, params)
        try:
            for token in ids:
                text, stopped = stopper.push(decoder.push(token))
                if text:
                    yield text
                if stopped:
                    self.stats.stop_reason = "stop"
                    return
            text, stopped = stopper.push(decoder.flush())
            tail = text if stopped else text + stopper.flush()
            if stopped:
                self.stats.stop_reason = "stop"
            if tail:
                yield tail
        except GeneratorExit:
            self.stats.stop_reason = self.stats.stop_reason or "interrupted"
            raise
        finally:
            ids.close()
