"""The lookup drafters' merge of continuations (speculative/continuations.py): the trie
against a readable oracle that counts every path prefix, and the chain (what a drafter
proposes where only chains are verified) against the trie's most confident path."""

from collections import Counter

import numpy as np
import pytest

from llcinfer.speculative.continuations import continuation_chain, continuation_trie
from llcinfer.speculative.lookup import NgramDrafter


def oracle_trie(conts: list[list[int]], max_nodes: int, rate: float):
    """Every path prefix counted over the continuations; the max_nodes of highest count
    kept (ties: shallower, then first met); ordered by (length, path); the path
    confidence count / len(conts) * rate ** length."""
    counts: Counter = Counter()
    for cont in conts:
        for k in range(1, len(cont) + 1):
            counts[tuple(cont[:k])] += 1
    kept = sorted(counts, key=lambda p: (-counts[p], len(p)))[:max_nodes]  # Counter keeps first-met order
    order = sorted(kept, key=lambda p: (len(p), p))
    place = {p: i for i, p in enumerate(order)}
    tokens = [p[-1] for p in order]
    parents = [place[p[:-1]] if len(p) > 1 else -1 for p in order]
    conf = [counts[p] / len(conts) * rate ** len(p) for p in order]
    return tokens, parents, conf


def random_conts(rng) -> list[list[int]]:
    """Continuations as a lookup finds them: copies of one text, cut short or diverging,
    over a small alphabet so that paths share prefixes and counts tie."""
    vocab, depth = int(rng.integers(1, 5)), int(rng.integers(0, 12))
    base = rng.integers(0, vocab, depth).tolist()
    conts = []
    for _ in range(int(rng.integers(1, 30))):
        length = int(rng.integers(0, depth + 1)) if rng.random() < 0.5 else depth
        if rng.random() < 0.5:
            conts.append(base[:length])
        else:
            cut = int(rng.integers(0, length + 1))
            conts.append(base[:cut] + rng.integers(0, vocab, length - cut).tolist())
    return conts


@pytest.mark.parametrize("seed", range(4))
def test_trie_equals_the_prefix_counting_oracle(seed):
    rng = np.random.default_rng(seed)
    trimmed = 0
    for _ in range(300):
        conts = random_conts(rng)
        max_nodes, rate = int(rng.integers(1, 40)), float(rng.uniform(0.1, 1.0))
        tree = continuation_trie(conts, max_nodes, rate)
        tokens, parents, conf = oracle_trie(conts, max_nodes, rate)
        assert tree.tokens.tolist() == tokens and tree.parents.tolist() == parents
        np.testing.assert_allclose(tree.conf, conf, rtol=1e-12)
        trimmed += len(tree) == max_nodes
    assert trimmed > 30  # the node limit was exercised


@pytest.mark.parametrize("seed", range(4))
def test_chain_is_the_untrimmed_tries_best_path(seed):
    rng = np.random.default_rng(100 + seed)
    for _ in range(300):
        conts = random_conts(rng)
        max_nodes, rate = int(rng.integers(1, 40)), float(rng.uniform(0.1, 1.0))
        best = continuation_trie(conts, 10 ** 6, rate).best_chain()
        chain = continuation_chain(conts, max_nodes, rate)
        assert chain.is_chain
        assert chain.tokens.tolist() == best.tokens[:max_nodes].tolist()
        np.testing.assert_allclose(chain.conf, best.conf[:max_nodes], rtol=1e-12)


def test_a_drafter_proposes_the_chain_of_what_it_would_merge():
    """propose(..., chain=True) is the best path of the tree propose would merge, where the
    tree is not cut by its node limit, on text that repeats with variations."""
    rng = np.random.default_rng(7)
    phrase = [5, 6, 7, 8, 9, 10]
    tokens = []
    for _ in range(40):
        tokens += phrase[:int(rng.integers(2, 7))] + rng.integers(11, 16, 2).tolist()
    trees, chains = NgramDrafter(), NgramDrafter()
    compared = 0
    for end in range(2, len(tokens)):
        tree = trees.propose("r", tokens[:end], 64)
        chain = chains.propose("r", tokens[:end], 64, chain=True)
        if len(tree) < 64:
            assert chain.tokens.tolist() == tree.best_chain().tokens.tolist()
            np.testing.assert_allclose(chain.conf, tree.best_chain().conf)
            compared += len(chain) > 0
    assert compared > 100
