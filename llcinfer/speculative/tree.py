"""Draft trees: what a drafter proposes for one sequence, and how a budget cuts it.

A tree's nodes are candidate next tokens after the sequence's last committed token (the
root, not a node).  Node i has a token, a parent (-1: the root) and a path confidence
(the drafter's estimate that the target will accept every token from the root down to
it); parents come before their children and a child's confidence never exceeds its
parent's, so ranking nodes by confidence keeps every chosen node's ancestors chosen.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class DraftTree:
    tokens: np.ndarray  # [n] int64 token of each node
    parents: np.ndarray  # [n] int64 parent node, -1 for the root's children
    conf: np.ndarray  # [n] f64 path confidence in (0, 1]

    @staticmethod
    def empty() -> "DraftTree":
        return DraftTree(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64))

    @staticmethod
    def chain(tokens, conf) -> "DraftTree":
        n = len(tokens)
        return DraftTree(np.asarray(tokens, np.int64), np.arange(-1, n - 1, dtype=np.int64),
                         np.asarray(conf, np.float64))

    def __len__(self) -> int:
        return int(self.tokens.size)

    @property
    def depth(self) -> np.ndarray:
        """[n] int64 depth of each node (the root's children: 1)."""
        d = np.ones(len(self), np.int64)
        for i, p in enumerate(self.parents):
            if p >= 0:
                d[i] = d[p] + 1
        return d

    def subset(self, keep: np.ndarray) -> "DraftTree":
        """The nodes ``keep``  # [n] bool (closed under ancestors), renumbered in order."""
        keep = np.asarray(keep, bool)
        new_id = np.cumsum(keep) - 1  # [n] index among the kept nodes
        parents = self.parents[keep]
        if np.any((parents >= 0) & ~keep[np.maximum(parents, 0)]):
            raise ValueError("a kept draft node lost its parent")
        return DraftTree(self.tokens[keep], np.where(parents >= 0, new_id[np.maximum(parents, 0)], -1),
                         self.conf[keep])

    def chunk_parents(self) -> np.ndarray:
        """Parents  # [n + 1] of the verification chunk's rows: row 0 the root, row i + 1 node i."""
        return np.concatenate([[-1], self.parents + 1]).astype(np.int64)

    def children(self) -> dict[tuple[int, int], int]:
        """(parent node, token) -> node, for the acceptance walk."""
        return {(int(p), int(t)): i for i, (p, t) in enumerate(zip(self.parents, self.tokens))}


def acceptance_walk(tree: DraftTree, sample) -> tuple[list[int], list[int]]:
    """Walk the verified tree: at the root, then at each accepted node, ``sample(row)``
    draws the target's next token from that row's logits (row 0 the root, row i + 1 node
    i); the walk follows the child holding that token and stops at the first draw no
    child holds (or when ``sample`` returns None: the request ended).  Returns the drawn
    tokens (accepted ones, then the last draw) and the accepted nodes.

    Each emitted token is one draw from the target's own distribution given everything
    before it, exactly as in plain decoding, so the output distribution is the target's
    (lossless), and with the same seed the same tokens come out.  For deterministic
    drafts this is the multi-draft recursive rejection rule of SpecInfer: trying the
    children in turn, accepting child c with probability p(c) / (1 - sum of the rejected
    children's p), gives the same law as one draw from p matched against the children."""
    kids = tree.children()
    node, drawn, path = -1, [], []
    while True:
        x = sample(node + 1)
        if x is None:
            return drawn, path
        drawn.append(x)
        child = kids.get((node, x))
        if child is None:
            return drawn, path
        path.append(child)
        node = child
