"""Which sparse layers own an indexer ("full") and which reuse the selection of the last
full layer before them ("shared"), chosen on calibration loss (IndexCache's training-free
greedy search).

    sparse layers  0 .. S-1 (the layers after the dense ones, in order); layer 0 is
                   always full (nothing before it to share)
    loss(F)        the model's loss with the set F of full layers (engine/sparse_layers.py:
                   KL divergence of the next-token distribution from the dense model's)
    greedy         F = all layers; while |F| > n_full: drop the layer of F whose removal
                   gives the least loss(F - {layer})

S + (S-1) + ... + (n_full + 1) evaluations of the loss.  Dropping several layers per
round on one ranking (fewer evaluations) chose worse layers: on SmolLM2, 14 of 28, PPL
5.3646 against 5.3293 one at a time (perf/README.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

CHOICE_VERSION = 1


def greedy_full_layers(n_sparse: int, n_full: int, loss: Callable[[frozenset], float],
                       progress: Callable[[int, float], None] = lambda n, value: None) -> tuple[list[int], float]:
    """(the ``n_full`` sparse layers that keep an indexer, ascending, 0 among them; their
    loss) by the greedy search of the module doc; ``progress(n, loss)`` after each drop."""
    if not 1 <= n_full <= n_sparse:
        raise ValueError(f"greedy_full_layers: {n_full} full layers of {n_sparse}")
    full = frozenset(range(n_sparse))
    value = loss(full)
    while len(full) > n_full:
        value, drop = min((loss(full - {layer}), layer) for layer in sorted(full - {0}))
        full = full - {drop}
        progress(len(full), value)
    return sorted(full), value


def choice_file(basis_path: Path, config, n_full: int) -> Path:
    """The cached choice of ``n_full`` full layers for a model's basis file and selection
    rule (sparse.SparseConfig)."""
    return basis_path.with_name(f"{basis_path.stem}-full{n_full}-k{config.top_k}-s{config.sink}-w{config.window}"
                                f"-d{config.dense_layers}-{config.phi}-{config.agg}-v{CHOICE_VERSION}.txt")


def load_choice(path: Path, n_sparse: int, n_full: int) -> list[int] | None:
    """The cached sparse layers, or None when absent or not a valid choice."""
    try:
        layers = [int(t) for t in path.read_text().split()]
    except (OSError, ValueError):
        return None
    ok = len(layers) == n_full and layers == sorted(set(layers)) and layers[:1] == [0] and layers[-1] < n_sparse
    return layers if ok else None


def save_choice(path: Path, layers: list[int]) -> None:
    """Atomic write; a cache that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(" ".join(map(str, layers)) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass
