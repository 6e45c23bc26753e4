"""Turning sparse attention on for a model and its KV pool: the index-key basis from the
cache beside the repacked weights, or calibrated now on the standard library's sources
(sparse/basis.py), then a SparseAttention the forward pass uses; which sparse layers own
an indexer is chosen on calibration when the configuration asks for fewer than all
(``with_chosen_layers``), and the context from which rows run sparse is the planner's
(``planned_sparse``)."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from ..model.tokenizer import Tokenizer
from ..planner import Calibration, cache_key, detect_machine, workload_from_model
from ..planner.sparse_policy import SparsePolicy, sparse_policy
from ..kv import KVPool
from ..sparse import SparseAttention, SparseConfig, basis_file, fit_basis, load_basis, rotate_to, save_basis, stdlib_text
from ..sparse.layer_choice import choice_file, load_choice, save_choice
from .calibrate_sparse import ensure_sparse_calibration
from .sparse_layers import choose_full_layers
from .transformer import Transformer

CALIBRATION_TOKENS = 4096  # of stdlib text; measured in perf/sparse_bench.py
_CHUNK = 512  # prompt tokens per forward pass while calibrating
LAYER_TOKENS, LAYER_PROBES = 6144, 32  # calibration text and probe rows of the layer choice


def calibrate_basis(model: Transformer, tokens: list[int], rank: int, seed: int = 0) -> np.ndarray:
    """basis  # [L, KVH, rank, D] f32 of the keys ``tokens`` produce (dense pass, f32 KV),
    each key re-rotated to a position drawn uniformly over the trained context."""
    c = model.config
    saved, model.sparse = model.sparse, None
    seq = model.new_cache(len(tokens) + 1, kv_type="f32")
    try:
        for i in range(0, len(tokens), _CHUNK):
            model.forward_chunks([(seq, tokens[i:i + _CHUNK])])
        rng = np.random.default_rng(seed)
        n = seq.n_tokens
        pos = np.arange(n)
        horizon = max(n, int(c.n_ctx_train or 0))
        keys = [rotate_to(seq.keys(li), pos, rng.integers(0, horizon, n), model.inv_freq, c.rope_neox)
                for li in range(c.n_layer)]  # per layer [n, KVH, D]
    finally:
        seq.free()
        model.sparse = saved
    return fit_basis(keys, rank)


def model_basis(model: Transformer, tokenizer: Tokenizer, rank: int, n_tokens: int = CALIBRATION_TOKENS) -> np.ndarray:
    """The cached basis of ``model`` at ``rank``, calibrated (and cached) on first use."""
    c = model.config
    path = basis_file(model.gguf.path, rank)
    basis = load_basis(path, c.n_layer, c.n_kv_head, c.head_dim, rank)
    if basis is None:
        tokens = tokenizer.encode(stdlib_text(8 * n_tokens))[:n_tokens]
        basis = calibrate_basis(model, tokens, rank)
        save_basis(path, basis)
    return basis


def enable_sparse(model: Transformer, tokenizer: Tokenizer, pool: KVPool, config: SparseConfig) -> SparseAttention:
    """Sparse attention for every sequence on ``pool`` from now on (model.sparse)."""
    sp = SparseAttention(config, model_basis(model, tokenizer, config.rank), pool, model.config.n_head)
    model.sparse = sp
    return sp


def with_chosen_layers(model: Transformer, tokenizer: Tokenizer, config: SparseConfig, log,
                       n_tokens: int = LAYER_TOKENS, probes: int = LAYER_PROBES) -> SparseConfig:
    """``config`` with its ``indexers`` full layers chosen on calibration loss
    (sparse/layer_choice.py, engine/sparse_layers.py; progress to ``log``), once per model
    and selection rule and cached beside the basis; ``config`` itself when it asks for an
    indexer on every sparse layer or names its full layers."""
    n_sparse = model.config.n_layer - config.dense_layers
    if config.indexers is None or config.full_layers or not 1 <= config.indexers < n_sparse:
        return config
    path = choice_file(basis_file(model.gguf.path, config.rank), config, config.indexers)
    full = load_choice(path, n_sparse, config.indexers)
    if full is None:
        log(f"choosing the {config.indexers} of {n_sparse} sparse layers that own an indexer (once per model)")
        t0 = time.perf_counter()
        full, kl = choose_full_layers(model, tokenizer, model_basis(model, tokenizer, config.rank), config,
                                      config.indexers, n_tokens, probes, log)
        save_choice(path, full)
        log(f"  layers {', '.join(str(config.dense_layers + f) for f in full)}: KL {kl:.5f} from dense "
            f"({time.perf_counter() - t0:.1f} s)")
    return replace(config, full_layers=tuple(config.dense_layers + f for f in full))


NEVER = 1 << 40  # min_context of a configuration the planner predicts never to pay


def planned_sparse(model: Transformer, plan, n_ctx: int, n_seq: int, config: SparseConfig, measure: bool,
                   log) -> tuple[SparseConfig, SparsePolicy]:
    """``config`` for ``n_ctx`` (its top-k, SparseConfig.for_context) with the context from
    which the planner predicts sparse attention to pay on ``plan`` (planner/sparse_policy.py),
    and that policy; ``measure``: measure this machine's selection cost first if it is not
    cached (engine/calibrate_sparse.py, its progress to ``log``).  Where sparse never pays,
    every row stays dense (min_context NEVER)."""
    config = config.for_context(n_ctx)
    machine = detect_machine(probe=False)
    cal = (ensure_sparse_calibration(model, config, machine, plan.threads, log) if measure else
           Calibration.load(cache_key(machine)))
    work = workload_from_model(model, ctx=n_ctx, concurrency=n_seq)
    policy = sparse_policy(plan, machine, work, config, cal)
    return replace(config, min_context=policy.min_context or NEVER), policy
