"""The lookup drafters (prompt lookup and suffix): the continuations they propose, what
``repeats`` says, and the n-gram index against a scan."""

import numpy as np

from llcinfer.speculative import NgramDrafter, SuffixDrafter
from llcinfer.speculative.lookup import COPY_MATCH


def test_ngram_and_suffix_drafters_propose_seen_continuations():
    ng = NgramDrafter()
    toks = [1, 2, 3, 4, 5, 9, 1, 2, 3]
    tree = ng.propose("a", toks, 8)
    assert tree.tokens[:3].tolist() == [4, 5, 9] and tree.parents[:3].tolist() == [-1, 0, 1]
    assert np.all(np.diff(tree.conf[:3]) <= 0)
    sx = SuffixDrafter()
    sx.finish("old", [7, 8, 9, 10, 11])
    t2 = sx.propose("new", [3, 7, 8], 4)
    assert t2.tokens.tolist() == [9, 10, 11]  # from another request's history
    sx.forget_history()
    assert len(sx.propose("newer", [3, 7, 8], 4)) == 0  # the finished requests forgotten
    assert len(ng.propose("b", [1, 2, 3], 8)) == 0  # nothing seen twice


def test_repeats_says_what_a_proposal_would_match():
    """NgramDrafter.repeats(key, tokens, n) against its oracle, a proposal matching n
    tokens or more, on sequences over a small alphabet (repeats of every length), token by
    token as a request grows, its prompt and output both, and for the suffix drafter
    another request's history too; ``guesses`` (asked at every paused step, with its own
    n-gram set) says what repeats(key, tokens, COPY_MATCH) says."""
    rng = np.random.default_rng(5)
    for d in (NgramDrafter(max_match=8, min_match=2), SuffixDrafter(max_match=8, min_match=2)):
        if isinstance(d, SuffixDrafter):
            d.finish("old", rng.integers(0, 5, 60).tolist())
        for key in range(3):
            tokens = rng.integers(0, 5, 12).tolist()
            seen = set()
            for _ in range(40):
                guessed = d.guesses(key, tokens)  # the substitutions learned first
                got = {n: d.repeats(key, tokens, n) for n in (2, COPY_MATCH, 5, 8)}
                matched = d.match_length(key) if len(d.propose(key, tokens, 4)) else 0
                assert got == {n: matched >= n for n in (2, COPY_MATCH, 5, 8)} and guessed == got[COPY_MATCH]
                seen |= set(got.values())
                tokens = tokens + [int(rng.integers(0, 5))]
            assert seen == {True, False}


def test_ngram_index_finds_what_a_scan_finds_and_adds_no_objects_per_entry():
    """NgramIndex.occurrences against a brute-force scan of the documents (every n, with
    and without a limit, one end excluded), on documents added whole and extended piece
    by piece; and indexing 20K more tokens leaves the garbage collector no more objects
    to walk than a handful (the history of a long-running server stays out of its way)."""
    import gc

    from llcinfer.speculative.lookup import NgramIndex

    rng = np.random.default_rng(3)
    idx = NgramIndex(4)
    docs = [rng.integers(0, 6, 300).tolist() for _ in range(3)]
    idx.add(docs[0])
    idx.add(docs[1][:7], skip=3)
    for a in range(7, 300, 13):
        idx.extend(1, docs[1][a:a + 13])
    idx.add(docs[2])
    for key in [(1,), (2, 3), (0, 0, 1), (5, 4, 3, 2), (1, 1, 1, 1)]:
        n = len(key)
        scan = [(d, e) for d, doc in enumerate(docs) for e in range(n, len(doc))
                if (d != 1 or e > 3) and tuple(doc[e - n:e]) == key]
        assert idx.occurrences(key, None) == scan
        assert idx.occurrences(key, None, 5) == scan[-5:]
        if scan:
            assert idx.occurrences(key, scan[-1]) == scan[:-1]
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(10):
        idx.add(rng.integers(0, 50_000, 2_000).tolist())
    gc.collect()
    assert len(gc.get_objects()) - before < 50
