"""The Python API: ``LLM``.

    from llcinfer import LLM
    llm = LLM("smollm2-135m")
    print(llm.generate("Once upon a time", max_tokens=32, temperature=0))
    for piece in llm.chat([{"role": "user", "content": "Hi!"}], stream=True):
        print(piece, end="")
    h = llm.submit("The three primary colors are", max_tokens=16)   # from any thread
    for piece in h: ...                                             # or h.result(), h.cancel()

Every call is a request in the engine's one step loop (engine/loop.py): concurrent
requests decode together, a finished one's place is taken at once.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from typing import Iterator

import numpy as np

from .engine.loop import DEFAULT_STEP_TOKENS, Engine
from .engine.placement import domains_from_plan, plan_for_model
from .engine.request import Completion, GenerationStats, RequestHandle
from .engine.sampling import SamplingParams
from .engine.sparse_setup import planned_sparse, with_chosen_layers
from .engine.speculation_setup import build_speculator, check_spec_options
from .engine.transformer import Transformer
from . import settings
from .errors import UsageError
from .jit import set_threads
from .kv import KV_TYPES
from .model.model_file import ModelFile
from .sparse import SparseConfig

_SAMPLING_KEYS = {f for f in SamplingParams.__dataclass_fields__}

__all__ = ["LLM", "Completion", "GenerationStats", "RequestHandle"]


class LLM:
    """A loaded model, ready to generate.

    Args:
        model: a catalog name (``llcinfer models`` lists them; fetched on first use), the
            path to any ``.gguf`` file, or a ``ModelFile`` already opened.  Default:
            ``smollm2-135m``.
        threads: kernel threads (default: the physical cores available).
        n_ctx: context length in tokens per sequence (default: the model's training context).
        n_batch: tokens per step of the loop, decode rows and prompt chunks together (a
            longer prompt is prefilled over several steps while the others decode).
        progress: show a progress bar when a catalog model is downloaded.
        numerics: ``"llama.cpp"`` (default) rounds matmul inputs to 8-bit blocks and the KV
            cache to f16 exactly as llama.cpp does, so greedy output matches it except at
            near-ties; ``"f32"`` keeps activations in float32 (the NumPy oracle's exact mode).
        kv_type: KV cache storage, ``"f16"`` (default with llama.cpp numerics), ``"int8"``
            (per-32-value scales, half the memory) or ``"f32"`` (default with f32 numerics).
        n_seq: requests decoded at once (the plan's concurrency; more wait their turn).
        kv_budget_mb: most KV memory committed at once (default: available RAM less the
            model and a margin); past it the newest request is preempted and recomputed
            later, and a request that cannot fit even alone gets ``OutOfMemoryError``.
        speculative: speculative decoding, ``"ngram"`` (prompt lookup), ``"suffix"`` (lookup
            in every request seen), ``"draft:MODEL"`` (a smaller model of the same
            vocabulary), ``"auto"`` or None; lossless (greedy output unchanged, sampling
            from the target's distribution).  ``spec_budget``: tokens per verification step
            for the whole batch (default: the knee measured at start-up); ``spec_policy``
            ``"super-tree"`` (one budget ranked across sequences) or ``"per-sequence"``.
        check_plan: time the chosen plan and the best one of the other kind for a few decode
            steps at start-up and keep the faster (``LLCINFER_CALIBRATE=0`` turns it off,
            and the first-use kernel calibration with it).
        sparse: sparse attention for long contexts: rows with at least ``min_context`` keys
            attend to the first tokens, the last 256 and the top-k tokens (whole
            16-token blocks) a low-rank indexer of the model's own keys scores highest; the
            first layer stays dense; a decode step whose query stays close to the step
            that last scored (up to 4 back) reuses its selection.  ``min_context`` is the planner's: the context from
            which the sparse step is predicted faster than the dense one on this machine
            (``sparse_policy`` says it and both predictions).  The indexer is calibrated on
            first use (seconds, once per model, cached beside the repacked weights), and so
            is its selection cost (once per machine).  Decode steps run it on the executor.
            Not with ``speculative``.
        sparse_top_k: tokens the indexer picks (default: 1024, or 1/16 of ``n_ctx`` where
            that is more).
        sparse_indexers: only this many of the sparse layers own an indexer, the others
            reuse the selection of the last one before them; which ones is chosen on
            calibration loss (IndexCache's greedy search: KL divergence from dense on the
            standard library's sources; minutes, once per model, cached).  Default: all.
    """

    def __init__(self, model: str | os.PathLike | None = None, threads: int | None = None,
                 n_ctx: int | None = None, n_batch: int = DEFAULT_STEP_TOKENS, progress: bool = True,
                 numerics: str = "llama.cpp", kv_type: str | None = None, n_seq: int = 1,
                 kv_budget_mb: float | None = None, check_plan: bool = True, speculative: str | None = None,
                 spec_budget: int | None = None, spec_policy: str = "super-tree", sparse: bool = False,
                 sparse_top_k: int | None = None, sparse_indexers: int | None = None):
        if numerics not in ("llama.cpp", "f32"):
            raise UsageError(f"numerics must be 'llama.cpp' or 'f32' (got {numerics!r})")
        if kv_type is not None and kv_type not in KV_TYPES:
            raise UsageError(f"kv_type must be one of {', '.join(KV_TYPES)} (got {kv_type!r})")
        for name, value in (("n_seq", n_seq), ("n_batch", n_batch)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UsageError(f"{name} must be a positive integer (got {value!r})")
        if kv_budget_mb is not None and not kv_budget_mb > 0:
            raise UsageError(f"kv_budget_mb must be positive (got {kv_budget_mb!r})")
        for name, value in (("sparse_top_k", sparse_top_k), ("sparse_indexers", sparse_indexers)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise UsageError(f"{name} must be a positive integer (got {value!r})")
            if value is not None and not sparse:
                raise UsageError(f"{name} needs sparse=True")
        check_spec_options(speculative, spec_budget, spec_policy)
        if sparse and speculative not in (None, "none"):
            raise UsageError("sparse attention and speculative decoding do not combine yet (draft tree rows "
                             "move K/V the index cache does not follow)")
        sparse_config = SparseConfig.from_options(sparse_top_k, sparse_indexers) if sparse else None
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise UsageError(f"threads must be a positive integer (got {threads!r})")
        self.threads = set_threads(threads)
        self.file = model if isinstance(model, ModelFile) else ModelFile(model, progress=progress)
        self.model_path, self.gguf = self.file.path, self.file.gguf
        self.tokenizer, self.chat_template = self.file.tokenizer, self.file.chat_template
        self.model = Transformer(self.gguf, llama_rounding=numerics == "llama.cpp")
        self.config = self.model.config
        if n_ctx is None:
            n_ctx = self.config.n_ctx_train
        if not isinstance(n_ctx, int) or n_ctx < 1:
            raise UsageError(f"n_ctx must be a positive integer (got {n_ctx!r})")
        self.n_ctx = n_ctx
        # the planner's plan for this machine, context and concurrency: its cores run the decode
        # rows when the runner can put them on the executor (executor_note says why not); with
        # the executor, the kernels are calibrated at first use and the plan checked by timing
        self.plan = self._plan(n_ctx, n_seq, check_plan)
        self.sparse_policy = None  # planner/sparse_policy.SparsePolicy when sparse: from which context it pays
        if sparse_config is not None:
            sparse_config = with_chosen_layers(self.model, self.tokenizer, sparse_config, _stderr)
            sparse_config, self.sparse_policy = planned_sparse(self.model, self.plan, n_ctx, n_seq, sparse_config,
                                                               self._measuring(), _stderr)
        budget = None if kv_budget_mb is None else int(kv_budget_mb * 2**20)
        speculator = build_speculator(speculative, self.model, list(self.gguf.metadata.get("tokenizer.ggml.tokens", [])),
                                      n_ctx, n_seq, spec_budget, spec_policy, progress, numerics == "llama.cpp",
                                      kv_type)
        self.engine = Engine(self.model, self.tokenizer, n_ctx, n_batch, kv_type=kv_type, n_seq=n_seq,
                             kv_budget_bytes=budget, domains=domains_from_plan(self.plan, self.config),
                             speculator=speculator, sparse=sparse_config)
        self.executor_note = self.engine.runner.executor_note  # why decode rows skip the executor (None: they don't)
        self.engine.runner.warm_up(self.engine.new_sequence)
        if speculator is not None:
            speculator.measure_cost(self.model, self.engine.runner, self.engine.new_sequence)
        self._last_stats = GenerationStats()

    def _measuring(self) -> bool:
        """Whether this machine's kernels are measured at first use (and the plan checked)."""
        from .executor import unsupported_reason

        return settings.calibrate_enabled() and settings.executor_enabled() and unsupported_reason(self.model) is None

    def _plan(self, n_ctx: int, n_seq: int, check: bool):
        from .engine.calibrate import ensure_calibration
        from .engine.plan_check import check_plan
        from .planner import detect_machine

        machine = detect_machine(probe=False)
        measure = self._measuring()
        cal = ensure_calibration(self.model, machine, self.threads) if measure else None
        plan, work = plan_for_model(self.model, n_ctx, n_seq, self.threads, machine, cal)
        if measure and check:
            plan = check_plan(self.model, plan, machine, cal, work)
        return plan

    # ------------------------------------------------------------------ requests
    def submit(self, prompt: str | list[dict], **sampling) -> RequestHandle:
        """Queue a request and return its handle at once (any thread may call this).

        ``prompt``: raw text, or a conversation ``[{"role": ..., "content": ...}, ...]`` put
        through the chat template.  Iterate the handle for text pieces, or call
        ``result()`` for the whole ``Completion``; ``cancel()`` ends it and frees its KV."""
        return self.engine.submit(self._prompt_ids(prompt), self._params(sampling))

    def submit_n(self, prompt: str | list[dict], n: int, **sampling) -> list[RequestHandle]:
        """``n`` samples of one prompt, which is computed once: the others share its KV
        blocks and its logits.  With ``seed``, sample i draws from seed + i."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise UsageError(f"n must be a positive integer (got {n!r})")
        params = self._params(sampling)
        seeds = [None] * n if params.seed is None else [params.seed + i for i in range(n)]
        return self.engine.submit_n(self._prompt_ids(prompt), [replace(params, seed=s) for s in seeds])

    def _prompt_ids(self, prompt: str | list[dict]) -> list[int]:
        return self.file.prompt_ids(prompt)

    def generate(self, prompt: str, **sampling) -> str:
        """Complete ``prompt`` (raw text, no chat template) and return the completion.

        Keyword arguments are those of ``SamplingParams``: max_tokens (128), temperature
        (0.8; 0 = greedy), top_k (40), top_p (0.95), min_p (0.05), repeat_penalty (1.0),
        repeat_last_n (64), seed (None = random), stop (list of strings), ignore_eos.
        """
        return "".join(self.stream(prompt, **sampling))

    def stream(self, prompt: str, **sampling) -> Iterator[str]:
        """Like ``generate`` but yields text pieces as they are produced."""
        if not isinstance(prompt, str):
            raise UsageError(f"prompt must be a str (got {type(prompt).__name__})")
        return self._pieces(self.submit(prompt, **sampling))

    def chat(self, messages: list[dict], stream: bool = False, **sampling) -> str | Iterator[str]:
        """Answer a conversation ``[{"role": ..., "content": ...}, ...]`` using the model's
        chat template; generation stops at the end-of-turn token."""
        if not isinstance(messages, list):
            raise UsageError(f"messages must be a list of dicts (got {type(messages).__name__})")
        pieces = self._pieces(self.submit(messages, **sampling))
        return pieces if stream else "".join(pieces)

    def generate_batch(self, prompts: list, chat: bool = False, **sampling) -> list[Completion]:
        """Complete several prompts at once (continuous batching: up to ``n_seq`` decode
        together, a finished one's place is refilled at once); a common prefix, e.g. a
        system prompt, is computed once and its blocks shared.  ``chat=True`` treats each
        prompt as a list of messages.  A prompt that cannot fit in the KV budget even
        alone comes back with ``error`` set (an ``OutOfMemoryError``); the others complete."""
        handles = []
        for p in prompts:
            if chat != isinstance(p, list):
                raise UsageError("generate_batch: with chat=True every prompt is a list of messages, else a str")
            handles.append(self.submit(p, **sampling))
        return [h.result() for h in handles]

    def _pieces(self, handle: RequestHandle) -> Iterator[str]:
        try:
            yield from handle
        finally:
            self._last_stats = handle.stats

    def kv_stats(self) -> dict:
        """The KV pool (committed / cached / reserved blocks) and prefix-sharing counters;
        with ``sparse``, the index cache's bytes per token (against the KV's) and committed,
        and the fraction of the keys the sparse rows attended.

        ``in_use_blocks`` are held by live requests: the committed blocks less the cached
        ones (indexed for prefix reuse, evictable) and ``retained_blocks``, those only the
        last finished request's sequence holds (kept for its next turn, freed when the pool
        needs them).  Safe to call while the engine thread runs; exact when it is idle."""
        pool = self.engine.pool
        d = pool.stats()
        kept = self.engine.scheduler.retained
        only_kept = 0 if kept is None else int(np.count_nonzero(pool.refcount[kept.table[:kept.n_blocks]] == 1))
        d["capacity_blocks"] = pool.capacity_blocks
        d["retained_blocks"] = only_kept
        d["in_use_blocks"] = d["committed_blocks"] - d["cached_blocks"] - only_kept
        if self.engine.prefix is not None:
            d.update({f"prefix_{k}": v for k, v in vars(self.engine.prefix.stats).items()})
        d["preemptions"] = self.engine.scheduler.n_preemptions
        d["reused_tokens"] = self.engine.scheduler.n_reused_tokens  # from the last finished request's sequence
        if self.engine.sparse is not None:  # index cache bytes (full layers only) and what ran sparse
            d.update(self.engine.sparse.kv_stats())
        return d

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text the chat template makes of ``messages``."""
        return self.file.apply_chat_template(messages, add_generation_prompt)

    # ------------------------------------------------------------------ tokens
    def tokenize(self, text: str, special: bool = False, add_bos: bool | None = None) -> list[int]:
        """Token ids of ``text``; ``special=True`` parses special tokens such as <|im_start|>."""
        return self.file.tokenize(text, special, add_bos)

    def detokenize(self, ids) -> str:
        """Text of token ids (control tokens render as nothing)."""
        return self.tokenizer.decode(list(ids))

    def logits(self, ids) -> np.ndarray:
        """Float32 logits [vocab] after the last of ``ids`` (a request that generates nothing)."""
        try:
            ids = [int(i) for i in ids]
        except (TypeError, ValueError):
            raise UsageError("logits() takes a list of token ids") from None
        if not ids:
            raise UsageError("logits() needs at least one token id")
        handle = self.engine.submit(ids, SamplingParams(max_tokens=0), want_logits=True)
        done = handle.result()
        if done.error is not None:
            raise done.error
        return handle.request.logits

    # ------------------------------------------------------------------ running
    def start(self) -> None:
        """Run the step loop on an engine thread of its own from now on (a server, or many
        threads submitting); without it, a thread waiting for a request runs the steps."""
        self.engine.start()

    def close(self) -> None:
        """Stop the engine thread (cancelling what still runs) and the executor's workers."""
        self.engine.close()

    @property
    def spec_stats(self):
        """Speculative decoding counters since load (engine/speculation.py SpecStats), or
        None without speculation."""
        sp = self.engine.speculator
        return None if sp is None else sp.stats

    @property
    def last_stats(self) -> GenerationStats:
        """Prompt and generation timings of the most recent ``generate`` / ``stream`` / ``chat``."""
        return self._last_stats

    def reset(self) -> None:
        """Forget cached prefixes: the next prompt is evaluated from scratch."""
        self.engine.reset()

    def _params(self, sampling: dict) -> SamplingParams:
        unknown = set(sampling) - _SAMPLING_KEYS
        if unknown:
            raise UsageError(f"unknown sampling option(s): {', '.join(sorted(unknown))}")
        return SamplingParams(**sampling).validate()

    def __repr__(self) -> str:
        c = self.config
        return (f"LLM({self.model_path.name}: {c.arch}, {c.n_layer} layers, d_model {c.d_model}, "
                f"n_ctx {self.n_ctx}, threads {self.threads}, n_seq {self.engine.scheduler.max_seqs})")


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
