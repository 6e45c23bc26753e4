"""A draft tree's rows after a sequence's committed tokens (speculative verification):
their ancestor paths and the scratch blocks their virtual tails are written to, for
``PagedSequence.tree_attention`` (block_table.py, which makes them: ``seq.tree_rows``)."""

from __future__ import annotations

import numpy as np

from ..errors import OutOfMemoryError


class TreeRows:
    """A draft tree's rows after ``seq.n_tokens`` committed tokens, for tree_attention:

        paths   # [M, max depth + 1] int64  row i's ancestors by depth, root first, i last
        depth   # [M] int64
        tables  # [M, blocks] int32  the prefix's blocks, then row i's scratch blocks
    """

    def __init__(self, seq, parents: np.ndarray):  # seq: a PagedSequence (not imported: no cycle)
        parents = np.asarray(parents, np.int64).reshape(-1)
        M = parents.size
        depth = np.zeros(M, np.int64)
        for i in range(1, M):
            depth[i] = depth[parents[i]] + 1
        paths = np.zeros((M, depth.max() + 1), np.int64)
        for i in range(M):
            node = i
            for d in range(depth[i], -1, -1):
                paths[i, d] = node
                node = parents[node]
        bs, n0 = seq.block_size, seq.n_tokens
        first = n0 // bs  # the first block a row's virtual tail rewrites
        n_tail = -(-(n0 + int(depth.max()) + 1) // bs) - first
        self.pool = seq.pool
        self.scratch: list[int] = []
        try:
            for _ in range(M * n_tail):
                self.scratch.append(self.pool.allocate(f"{seq.name} (draft tree)"))
        except OutOfMemoryError:
            self.release()
            raise
        tables = np.zeros((M, first + n_tail), np.int32)
        tables[:, :first] = seq.table[:first]
        tables[:, first:] = np.asarray(self.scratch, np.int32).reshape(M, n_tail)
        self.paths, self.depth, self.tables = paths, depth, tables

    def release(self) -> None:
        for b in self.scratch:
            self.pool.release(b)
        self.scratch = []
