"""The Python API: ``LLM``.

    from llcinfer import LLM
    llm = LLM("smollm2-135m")
    print(llm.generate("Once upon a time", max_tokens=32, temperature=0))
    for piece in llm.chat([{"role": "user", "content": "Hi!"}], stream=True):
        print(piece, end="")
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from . import catalog
from .chat_template import ChatTemplate
from .engine import Engine, GenerationStats
from .kv import KV_TYPES
from .errors import ChatTemplateError, ModelFileError, UsageError
from .gguf_file import GGUFFile
from .kernels import set_threads
from .model import Transformer
from .sampling import SamplingParams
from .tokenizer import Tokenizer

_SAMPLING_KEYS = {f for f in SamplingParams.__dataclass_fields__}


@dataclass
class Completion:
    """One result of ``LLM.generate_batch``."""

    text: str
    token_ids: list[int]
    stop_reason: str
    error: Exception | None = None
    stats: GenerationStats | None = None


class LLM:
    """A loaded model, ready to generate.

    Args:
        model: a catalog name (``llcinfer models`` lists them; fetched on first use) or the
            path to any ``.gguf`` file.  Default: ``smollm2-135m``.
        threads: kernel threads (default: the physical cores available).
        n_ctx: context length in tokens (default: the model's training context).
        n_batch: prompt tokens per forward pass.
        progress: show a progress bar when a catalog model is downloaded.
        numerics: ``"llama.cpp"`` (default) rounds matmul inputs to 8-bit blocks and the KV
            cache to f16 exactly as llama.cpp does, so greedy output matches it except at
            near-ties; ``"f32"`` keeps activations in float32 (the NumPy oracle's exact mode).
        kv_type: KV cache storage, ``"f16"`` (default with llama.cpp numerics), ``"int8"``
            (per-32-value scales, half the memory) or ``"f32"`` (default with f32 numerics).
        n_seq: sequences the KV pool reserves address space for (``generate_batch``).
        kv_budget_mb: most KV memory committed at once (default: available RAM less the
            model and a margin); a sequence that needs more gets ``OutOfMemoryError``.
    """

    def __init__(self, model: str | os.PathLike | None = None, threads: int | None = None,
                 n_ctx: int | None = None, n_batch: int = 32, progress: bool = True,
                 numerics: str = "llama.cpp", kv_type: str | None = None, n_seq: int = 1,
                 kv_budget_mb: float | None = None):
        if numerics not in ("llama.cpp", "f32"):
            raise UsageError(f"numerics must be 'llama.cpp' or 'f32' (got {numerics!r})")
        if kv_type is not None and kv_type not in KV_TYPES:
            raise UsageError(f"kv_type must be one of {', '.join(KV_TYPES)} (got {kv_type!r})")
        if not isinstance(n_seq, int) or n_seq < 1:
            raise UsageError(f"n_seq must be a positive integer (got {n_seq!r})")
        if kv_budget_mb is not None and not kv_budget_mb > 0:
            raise UsageError(f"kv_budget_mb must be positive (got {kv_budget_mb!r})")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise UsageError(f"threads must be a positive integer (got {threads!r})")
        self.threads = set_threads(threads)
        self.model_path = catalog.resolve_model(model, progress=progress)
        self.gguf = GGUFFile(self.model_path)
        self.model = Transformer(self.gguf, llama_rounding=numerics == "llama.cpp")
        self.config = self.model.config
        self.tokenizer = Tokenizer.from_metadata(self.gguf.metadata)
        if self.tokenizer.vocab_size != self.config.vocab_size:
            raise ModelFileError(
                f"{self.model_path.name}: the vocabulary has {self.tokenizer.vocab_size} tokens but "
                f"token_embd.weight has {self.config.vocab_size} rows"
            )
        self.chat_template = ChatTemplate.from_metadata(self.gguf.metadata, self.tokenizer)
        if n_ctx is None:
            n_ctx = self.config.n_ctx_train
        if not isinstance(n_ctx, int) or n_ctx < 1:
            raise UsageError(f"n_ctx must be a positive integer (got {n_ctx!r})")
        self.n_ctx = n_ctx
        self.plan = None  # the planner's plan the executor runs (None: simple path)
        self.executor_note = self._plan_executor(n_ctx, n_seq)
        budget = None if kv_budget_mb is None else int(kv_budget_mb * 2**20)
        self.engine = Engine(self.model, self.tokenizer, n_ctx, n_batch, kv_type=kv_type, n_seq=n_seq,
                             kv_budget_bytes=budget)
        self.model.warm_up()

    def _plan_executor(self, n_ctx: int, n_seq: int) -> str | None:
        """Plan what runs where for this model, context and concurrency (planner/), and run
        decode steps on the executor with the plan's domains.  Returns why the simple path
        is used instead (None when the executor runs)."""
        from .executor import unsupported_reason
        from .executor.from_plan import domains_from_plan, plan_for_model

        why = unsupported_reason(self.model)
        if why:
            return why
        self.plan = plan_for_model(self.model, n_ctx, n_seq, self.threads)
        return self.model.use_executor(domains_from_plan(self.plan, self.config))

    # ------------------------------------------------------------------ text in, text out
    def generate(self, prompt: str, **sampling) -> str:
        """Complete ``prompt`` (raw text, no chat template) and return the completion.

        Keyword arguments are those of ``SamplingParams``: max_tokens (128), temperature
        (0.8; 0 = greedy), top_k (40), top_p (0.95), min_p (0.05), repeat_penalty (1.0),
        repeat_last_n (64), seed (None = random), stop (list of strings), ignore_eos.
        """
        return "".join(self.stream(prompt, **sampling))

    def stream(self, prompt: str, **sampling) -> Iterator[str]:
        """Like ``generate`` but yields text pieces as they are produced."""
        params = self._params(sampling)
        ids = self.tokenize(prompt, special=False, add_bos=None)
        return self.engine.stream_text(ids, params)

    def chat(self, messages: list[dict], stream: bool = False, **sampling) -> str | Iterator[str]:
        """Answer a conversation ``[{"role": ..., "content": ...}, ...]`` using the model's
        chat template; generation stops at the end-of-turn token."""
        params = self._params(sampling)
        ids = self.tokenize(self.apply_chat_template(messages), special=True)
        pieces = self.engine.stream_text(ids, params)
        return pieces if stream else "".join(pieces)

    def generate_batch(self, prompts: list[str], chat: bool = False, **sampling) -> list[Completion]:
        """Complete several prompts on sequences of one shared KV pool; a common prefix
        (e.g. a system prompt) is computed once and its blocks shared.  ``chat=True``
        treats each prompt as a list of messages.  A prompt that runs out of KV memory
        comes back with ``error`` set (an ``OutOfMemoryError``); the others complete."""
        params = self._params(sampling)
        if chat:
            ids = [self.tokenize(self.apply_chat_template(m), special=True) for m in prompts]
        else:
            ids = [self.tokenize(p, special=False, add_bos=None) for p in prompts]
        out = []
        for r in self.engine.generate_batch(ids, params):
            text = self.detokenize(r.token_ids)
            cut = [text.index(s) for s in params.stop if s in text]
            if cut:
                text, r.stop_reason = text[:min(cut)], "stop"
            out.append(Completion(text, r.token_ids, r.stop_reason, r.error, r.stats))
        return out

    def kv_stats(self) -> dict:
        """The KV pool (committed / cached / reserved blocks) and prefix-sharing counters."""
        d = self.engine.pool.stats()
        if self.engine.prefix is not None:
            d.update({f"prefix_{k}": v for k, v in vars(self.engine.prefix.stats).items()})
        return d

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text the chat template makes of ``messages``."""
        if self.chat_template is None:
            raise ChatTemplateError(f"{self.model_path.name} has no chat template (tokenizer.chat_template)")
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt)

    # ------------------------------------------------------------------ tokens
    def tokenize(self, text: str, special: bool = False, add_bos: bool | None = None) -> list[int]:
        """Token ids of ``text``; ``special=True`` parses special tokens such as <|im_start|>."""
        if not isinstance(text, str):
            raise UsageError(f"text must be a str (got {type(text).__name__})")
        return self.tokenizer.encode(text, special=special, add_bos=add_bos)

    def detokenize(self, ids) -> str:
        """Text of token ids (control tokens render as nothing)."""
        return self.tokenizer.decode(list(ids))

    def logits(self, ids) -> np.ndarray:
        """Float32 logits [vocab] after the last of ``ids`` (a fresh context, no cache reuse)."""
        ids = [int(i) for i in ids]
        if not ids:
            raise UsageError("logits() needs at least one token id")
        if min(ids) < 0 or max(ids) >= self.config.vocab_size:
            raise UsageError(f"token ids must be in [0, {self.config.vocab_size})")
        self.engine.reset()
        return np.asarray(self.engine.prefill(ids), dtype=np.float32)

    # ------------------------------------------------------------------ info
    @property
    def last_stats(self) -> GenerationStats:
        """Prompt and generation timings of the most recent call."""
        return self.engine.stats

    def reset(self) -> None:
        """Forget the cached context (the next prompt is evaluated from scratch)."""
        self.engine.reset()

    def _params(self, sampling: dict) -> SamplingParams:
        unknown = set(sampling) - _SAMPLING_KEYS
        if unknown:
            raise UsageError(f"unknown sampling option(s): {', '.join(sorted(unknown))}")
        return SamplingParams(**sampling).validate()

    def __repr__(self) -> str:
        c = self.config
        return (f"LLM({self.model_path.name}: {c.arch}, {c.n_layer} layers, d_model {c.d_model}, "
                f"n_ctx {self.n_ctx}, threads {self.threads})")
