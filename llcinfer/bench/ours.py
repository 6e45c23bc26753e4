"""Our side of the benchmark: llama-bench's methodology on an ``LLM``.

Load once per (model, threads) with the context a user gets (``LLM``'s default unless
``--ctx`` says otherwise), so the plan that runs is the one planned for that context and
not for depth + tokens; fill the KV cache to the depth once per depth (untimed);
each pp repetition runs ``n`` random tokens in chunks of the step loop's token budget, each tg
repetition feeds ``n`` random tokens one at a time through the runner's decode rows (no
sampling, as llama-bench), and the
cache is rolled back to the depth (``cache.truncate``) before every repetition.  With
``sparse`` the LLM runs sparse attention, and a synthetic fill writes the index keys of
its random K too.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from ..api import LLM
from ..weights.repack_cache import wait_loaded
from .report import kv_bytes_read


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def default_ctx(path) -> int:
    """The context ``LLM(path)`` runs with by default (the model's training context)."""
    from ..model.architectures import get_architecture
    from ..model.gguf_file import GGUFFile

    f = GGUFFile(path)
    return int(get_architecture(f.require("general.architecture")).read_config(f).n_ctx_train)


class OursBench:
    def __init__(self, model: str, threads: int, n_ctx: int, seed: int = 0, sparse: bool = False,
                 sparse_top_k: int | None = None, sparse_indexers: int | None = None):
        self.llm = LLM(model, threads=threads, n_ctx=n_ctx, progress=False, sparse=sparse, sparse_top_k=sparse_top_k,
                       sparse_indexers=sparse_indexers)
        self.sparse = self.llm.engine.sparse  # SparseAttention or None
        self.sparse_top_k = None if self.sparse is None else self.sparse.config.top_k  # None: dense
        # keys from which rows run sparse (the planner's break-even; huge: never)
        self.sparse_min_context = None if self.sparse is None else self.sparse.config.min_context
        # what the decode rows run on: the plan's label, or why they skip the executor
        self.plan = self.llm.plan.label if self.llm.executor_note is None else f"batched ({self.llm.executor_note})"
        wait_loaded()  # measure the steady state: weights on 2 MiB pages, not the file's map
        self.model = self.llm.model
        self.runner = self.llm.engine.runner  # decode rows run as the step loop runs them
        self.cache = self.llm.engine.new_sequence("bench")
        self.n_batch = self.llm.engine.scheduler.max_step_tokens
        self.cfg = self.model.config
        self.depth = 0
        self.fill = None  # how the current depth was filled
        self.rng = np.random.default_rng(seed)

    # -- bytes -----------------------------------------------------------------------------
    def weight_bytes_per_token(self) -> int:
        """Matmul weights one decode step reads: every layer's plus the output matrix (the
        token embedding is a row lookup; when tied, it *is* the output matrix)."""
        w = self.model.weights
        embd_only = 0 if w.output is w.token_embd else w.token_embd.nbytes
        return int(w.nbytes - embd_only)

    def bytes_per_token(self, depth: int, n_gen: int) -> float:
        """Weights + KV read per decode step, at the mean context of a tg run from ``depth``."""
        c = self.cfg
        ctx = depth + (n_gen - 1) / 2.0
        return self.weight_bytes_per_token() + kv_bytes_read(c.n_layer, c.n_kv_head, c.head_dim, ctx,
                                                             self.cache.itemsize)

    # -- runs ------------------------------------------------------------------------------
    def _tokens(self, n: int) -> list[int]:
        return self.rng.integers(0, self.cfg.vocab_size, n).tolist()

    def _run_batches(self, n: int) -> None:
        toks = self._tokens(n)
        for i in range(0, n, self.n_batch):
            self.model.forward(toks[i:i + self.n_batch], self.cache)

    def pp(self, n: int) -> float:
        """Seconds to process an ``n``-token prompt on top of the depth."""
        self.cache.truncate(self.depth)
        t0 = time.perf_counter()
        self._run_batches(n)
        dt = time.perf_counter() - t0
        self.cache.truncate(self.depth)
        return dt

    def tg(self, n: int) -> float:
        """Seconds to generate ``n`` tokens one at a time on top of the depth."""
        self.cache.truncate(self.depth)
        toks = self._tokens(n)
        t0 = time.perf_counter()
        for tok in toks:
            self.runner.decode([self.cache], [tok])
        dt = time.perf_counter() - t0
        self.cache.truncate(self.depth)
        return dt

    def warmup(self) -> None:
        """Compile and touch every kernel path (batched and single-token)."""
        self.cache.truncate(self.depth)
        self._run_batches(min(self.n_batch, 8))
        self.runner.decode([self.cache], [0])
        self.cache.truncate(self.depth)

    # -- depth -----------------------------------------------------------------------------
    def set_depth(self, depth: int, mode: str = "auto", limit_s: float = 1200.0) -> str:
        """Make the cache hold ``depth`` tokens; returns how: "real", "synthetic" or
        "synthetic after N real" (auto switches when the projected real fill > limit_s).

        Synthetic K/V are normal values with each layer's K and V standard deviation (from
        the real tokens run first), rounded to f16; attention cost does not depend on them.
        """
        if depth == self.depth and self.fill is not None:
            return self.fill
        # a deeper depth after a real fill extends it; anything else starts from scratch
        keep = self.depth if depth > self.depth and self.fill in ("real", "none") and mode != "synthetic" else 0
        self.cache.truncate(keep)
        self.depth = 0
        if depth == 0:
            self.fill = "none"
            return self.fill
        real_target = depth if mode in ("real", "auto") else min(depth, 4 * self.n_batch)
        t0 = last = time.perf_counter()
        done = keep
        while done < real_target:
            m = min(self.n_batch, real_target - done)
            self.model.forward(self._tokens(m), self.cache)
            done += m
            now = time.perf_counter()
            rate = (done - keep) / (now - t0)
            # attention makes later tokens slower: project with a 1.5x margin
            eta = (depth - done) / rate * 1.5
            if mode == "auto" and now - t0 > 30 and eta > limit_s - (now - t0):
                _log(f"  fill d{depth}: {done} real tokens at {rate:.0f} t/s; projected {eta:.0f} s more "
                     f"> {limit_s:.0f} s limit: synthetic fill for the rest")
                break
            if now - last > 15:
                _log(f"  fill d{depth}: {done}/{depth} tokens, {rate:.1f} t/s, ~{(depth - done) / rate:.0f} s left")
                last = now
        if done < depth:
            self._synthetic(done, depth)
            self.fill = "synthetic" if mode == "synthetic" else f"synthetic after {done} real"
        else:
            self.fill = "real"
        self.cache.n_tokens = depth
        self.depth = depth
        _log(f"  fill d{depth}: {self.fill}, {time.perf_counter() - t0:.0f} s")
        return self.fill

    def _synthetic(self, start: int, stop: int) -> None:
        c = self.cache  # read / store per layer
        shape = (stop - start, self.cfg.n_kv_head, self.cfg.head_dim)  # [token, kv_head, head_dim]
        for layer in range(self.cfg.n_layer):
            refs = c.read(layer, 0, start) if start else (None, None)  # [start, kv_head, head_dim] each
            k, v = ((self.rng.standard_normal(shape, dtype=np.float32) * (float(r.std()) if start else 1.0))
                    .astype(np.float16).astype(np.float32) for r in refs)
            c.store(layer, start, k, v)
            if self.sparse is not None:  # the indexer scores these keys as it would real ones
                n = stop - start
                self.sparse.store_index(layer, k.reshape(n, -1), np.arange(start, stop, dtype=np.int64),
                                        np.zeros(n, np.int64), c.table[None, :c.n_blocks].astype(np.int32))
