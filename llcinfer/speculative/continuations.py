"""Continuations merged into a draft: where a lookup drafter (lookup.py) found its
sequence's suffix, the tokens that followed each occurrence become one tree, every
distinct path a node counted by the occurrences that continue with it, or just the
tree's most frequent path where only chains are verified (the executor's steps).
Confidences are path frequencies times rate ** depth (lookup.py's module doc)."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from .tree import DraftTree


def continuation_trie(conts: list[list[int]], max_nodes: int, rate: float) -> DraftTree:
    """Merge the continuations ``conts`` (one per occurrence of the matched suffix) into a
    tree of at most ``max_nodes`` nodes, the most frequent paths first (module doc).

    Each distinct path of tokens that starts some continuation is a node, counted once per
    continuation that starts with it; the ``max_nodes`` of highest count are kept (ties:
    the shallower, then the first met), which keeps every kept node's parent (a parent's
    count is at least its child's).  Nodes come in the order of their paths by (length,
    tokens).  The trie is built once per distinct continuation, one dict probe a token."""
    distinct = Counter(map(tuple, conts))  # continuation -> how many occurrences it follows, first met first
    child: dict[int, int] = {}  # (parent node << 32) | token -> node; the root is node -1
    count: list[int] = []  # [node] continuations starting with its path
    parent: list[int] = []  # [node]
    token: list[int] = []  # [node]
    depth: list[int] = []  # [node]
    for cont, times in distinct.items():
        node = -1
        for d, t in enumerate(cont, 1):
            key = (node << 32) | t
            nxt = child.get(key)
            if nxt is None:
                nxt = child[key] = len(count)
                count.append(0)
                parent.append(node)
                token.append(t)
                depth.append(d)
            count[nxt] += times
            node = nxt
    if not count:
        return DraftTree.empty()
    kept = range(len(count))
    if len(count) > max_nodes:
        kept = sorted(kept, key=lambda i: (-count[i], depth[i]))[:max_nodes]
    levels: dict[int, list[int]] = defaultdict(list)  # depth -> kept nodes
    for i in kept:
        levels[depth[i]].append(i)
    place = {-1: -1}  # node -> its index in the tree
    order: list[int] = []
    for d in sorted(levels):  # paths of one length in order: by their parent's place, then token
        for i in sorted(levels[d], key=lambda i: (place[parent[i]], token[i])):
            place[i] = len(order)
            order.append(i)
    share = 1.0 / len(conts)
    return DraftTree(np.asarray([token[i] for i in order], np.int64),
                     np.asarray([place[parent[i]] for i in order], np.int64),
                     np.asarray([count[i] * share * rate ** depth[i] for i in order], np.float64))


def continuation_chain(conts: list[list[int]], max_nodes: int, rate: float) -> DraftTree:
    """The most frequent path of ``continuation_trie(conts, ...)`` with no node limit, its
    first ``max_nodes`` nodes: from the root, the child that most continuations follow
    (ties: the smaller token), as ``DraftTree.best_chain`` takes it, without building the
    rest of the trie.  What a drafter proposes where only chains are verified."""
    group = list(Counter(map(tuple, conts)).items())  # the distinct continuations that follow the path so far
    tokens: list[int] = []
    counts: list[int] = []  # [node] continuations starting with its path
    d = 0
    while d < max_nodes and group:
        if len(group) == 1:  # one continuation left: the rest of the path is its own
            cont, times = group[0]
            rest = cont[d:max_nodes]
            tokens += rest
            counts += [times] * len(rest)
            break
        follow: dict[int, int] = {}  # next token -> continuations with it
        for cont, times in group:
            if len(cont) > d:
                follow[cont[d]] = follow.get(cont[d], 0) + times
        if not follow:
            break
        best = min(follow, key=lambda t: (-follow[t], t))
        tokens.append(best)
        counts.append(follow[best])
        group = [(cont, times) for cont, times in group if len(cont) > d and cont[d] == best]
        d += 1
    share = 1.0 / max(len(conts), 1)
    return DraftTree.chain(tokens, [c * share * rate ** (i + 1) for i, c in enumerate(counts)])
