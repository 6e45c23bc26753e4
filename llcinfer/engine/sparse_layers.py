"""The calibration behind sparse/layer_choice.py: the loss of a set of full layers, on the
standard library's sources.

    fill       n tokens densely, every sparse layer writing its index keys
    reference  the next P tokens as one chunk, dense: log p_dense  # [P, vocab]
    loss(F)    the same chunk with the sparse layers in F full and the others shared
               (every probe row sparse), then the chunk dropped again (truncate):
               mean over the rows of KL(p_dense || p_F)
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..kv import PagedSequence
from ..model.tokenizer import Tokenizer
from ..sparse import SparseAttention, SparseConfig, stdlib_text
from ..sparse.layer_choice import greedy_full_layers
from .transformer import Transformer

_CHUNK = 512  # prompt tokens per forward pass of the fill


class _DenseFill:
    """model.sparse while filling: index keys for every layer that has them, dense attention."""

    def __init__(self, sp: SparseAttention):
        self.sp = sp

    def store_index(self, *args) -> None:
        self.sp.store_index(*args)

    def attend(self, seq, layer, q, n_past, scale, out, selected) -> None:
        seq.attention(layer, q, n_past, scale, out)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(1, keepdims=True)
    return z - np.log(np.exp(z).sum(1, keepdims=True))


def choose_full_layers(model: Transformer, tokenizer: Tokenizer, basis: np.ndarray, config: SparseConfig, n_full: int,
                       n_tokens: int, probes: int, log=lambda line: None) -> tuple[list[int], float]:
    """(the ``n_full`` sparse layers (0 = the first after the dense ones) that keep an
    indexer, their mean KL divergence from dense) by the greedy search of
    sparse/layer_choice.py on ``probes`` rows after ``n_tokens`` tokens of calibration text."""
    c = model.config
    tokens = tokenizer.encode(stdlib_text(8 * (n_tokens + probes)))[:n_tokens + probes]
    if len(tokens) < n_tokens + probes or probes < 1:
        raise ValueError(f"choose_full_layers: {len(tokens)} calibration tokens for {n_tokens} + {probes}")
    every = replace(config, min_context=0, full_every=1, full_layers=(), indexers=None)  # an indexer per sparse layer
    pool, prefix = model.new_pool(n_tokens + probes + 8, kv_type="f16")
    seq = PagedSequence(pool, n_tokens + probes + 8, prefix)
    sp = SparseAttention(every, basis, pool, c.n_head)
    probe_ids, rows = tokens[n_tokens:], np.arange(probes)
    saved = model.sparse
    try:
        model.sparse = _DenseFill(sp)
        for i in range(0, n_tokens, _CHUNK):
            model.forward_chunks([(seq, tokens[i:min(n_tokens, i + _CHUNK)])])
        reference = _log_softmax(model.forward_chunks([(seq, probe_ids)], logit_rows=rows))  # [P, vocab]
        seq.truncate(n_tokens)
        p_ref = np.exp(reference)
        model.sparse = sp

        def loss(full: frozenset) -> float:
            sp.kinds = ["dense" if li < every.dense_layers else
                        "full" if li - every.dense_layers in full else "shared" for li in range(c.n_layer)]
            got = _log_softmax(model.forward_chunks([(seq, probe_ids)], logit_rows=rows))  # [P, vocab]
            seq.truncate(n_tokens)
            return float((p_ref * (reference - got)).sum(1).mean())

        return greedy_full_layers(c.n_layer - every.dense_layers, n_full, loss,
                                  lambda n, kl: log(f"  {n} indexers: KL {kl:.5f}"))
    finally:
        model.sparse = saved
        seq.free()
