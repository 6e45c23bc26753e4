"""The step loop: plan the prompt into batches, run the model, post-process each token
(sample, detokenize, stop checks) and stream text out.

One ``Engine`` owns one sequence's KV cache.  It remembers the tokens that cache holds,
so a new prompt that extends the previous one (the next chat turn) only runs the new
tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from .errors import ContextLengthError
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


class Engine:
    def __init__(self, model: Transformer, tokenizer: Tokenizer, n_ctx: int, n_batch: int = DEFAULT_BATCH):
        self.model = model
        self.tokenizer = tokenizer
        self.n_ctx = int(n_ctx)
        self.n_batch = max(1, int(n_batch))
        self.cache = model.new_cache(self.n_ctx)
        self.cached_tokens: list[int] = []  # tokens whose K/V the cache holds, in order
        self.stats = GenerationStats()

    # -- plan ---------------------------------------------------------------------------
    def _reuse_prefix(self, prompt: list[int]) -> int:
        """Keep the longest cached prefix of ``prompt`` (at least one token left to run)."""
        n = 0
        limit = min(len(self.cached_tokens), len(prompt) - 1)
        while n < limit and self.cached_tokens[n] == prompt[n]:
            n += 1
        self.cache.truncate(n)
        del self.cached_tokens[n:]
        return n

    # -- run ----------------------------------------------------------------------------
    def _run(self, tokens: list[int]) -> np.ndarray:
        """Feed tokens in batches of n_batch; return the last position's logits [vocab]."""
        logits = None
        for i in range(0, len(tokens), self.n_batch):
            chunk = tokens[i:i + self.n_batch]
            logits = self.model.forward(chunk, self.cache)
            self.cached_tokens.extend(chunk)
        return logits

    def prefill(self, prompt: list[int]) -> np.ndarray:
        """Make the cache hold ``prompt``; return the logits after its last token."""
        if not prompt:
            raise ValueError("empty prompt: nothing to condition on")
        if len(prompt) > self.n_ctx:
            raise ContextLengthError(f"prompt of {len(prompt)} tokens exceeds the context length {self.n_ctx}")
        reused = self._reuse_prefix(prompt)
        t0 = time.perf_counter()
        logits = self._run(prompt[reused:])
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
            logits = self.model.forward([token], self.cache)
            self.cached_tokens.append(token)
            stats.generation_seconds = time.perf_counter() - t0

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
