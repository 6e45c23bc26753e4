"""Sparse attention for long contexts: a training-free indexer built from the model's own
keys (basis.py), its paged index cache beside the KV pool (index_cache.py), and the
per-row selection and exact attention on the selected blocks (attention.py).  The fused
scorer and the index-key store are numba kernels in kernels/sparse_index.py.

    basis = fit_basis(keys_per_layer, rank)             # calibrated once per model, cached
    sp = SparseAttention(SparseConfig(), basis, pool, n_head)
    model.sparse = sp                                   # Transformer.forward_chunks uses it
"""

from .attention import SparseAttention, SparseConfig, SparseStats
from .basis import basis_file, fit_basis, load_basis, rotate_to, save_basis, stdlib_text
from .index_cache import IndexCache

__all__ = ["SparseAttention", "SparseConfig", "SparseStats", "IndexCache", "basis_file", "fit_basis", "load_basis",
           "rotate_to", "save_basis", "stdlib_text"]
