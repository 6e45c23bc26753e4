"""Drafters that look the sequence's recent tokens up in text already seen.

``NgramDrafter`` (prompt lookup, as llama.cpp's ngram-simple and HF's prompt lookup):
the request's own prompt and output.  ``SuffixDrafter`` (SuffixDecoding, arXiv
2411.04975): the same over the history of every request the engine has run plus the
request's own tokens.

Both find the occurrences of the longest suffix of the sequence (up to ``max_match``
tokens) in their corpus and merge the continuations that follow them into a trie; a
node's count is how many occurrences continue with its path, and its confidence

    conf(node) = count(node) / n_occurrences * r_n ^ depth(node)

the frequency of that path times the chance that the target follows a looked-up
continuation for depth(node) tokens, r_n the measured per-token acceptance rate of
drafts from n-token matches (``observe``; prior 0.9, worth 10 tokens), so confidences are acceptance
probabilities the budget can weigh against the cost of a row.  r_n is kept apart for
drafts made right after a verified path was accepted whole: while the target copies, the
next path is accepted far more often than after a miss.

The prompt is looked up with the substitutions the target made while copying it
(copy_edits.py): each proposal remembers the prompt tokens under its best path, and the
next proposal compares that path with what the target wrote.
"""

from __future__ import annotations

from array import array

import numpy as np

from .continuations import continuation_chain, continuation_trie
from .copy_edits import CopyEdits
from .tree import DraftTree

COPY_MATCH = 4  # a match this long: the request's text repeats (``guesses``)
_MAX_OCCURRENCES = 24  # most recent occurrences merged into one trie
_SHORT_MATCH, _SHORT_DEPTH = 2, 8  # matches of at most 2 tokens continue at most 8 deep: rarely accepted
# further, and merging 24 continuations 32 deep each step cost 0.45 ms of a 5 ms SmolLM2 step


class NgramIndex:
    """Token lists and, for every n-gram of length 1..max_n, where it ends (the position
    after its last token), appended incrementally.

    Each n-gram ending is an entry: the hash of the n-gram maps to its latest entry, and
    every entry links to the previous one with the same hash, so a lookup walks back from
    the most recent occurrence (comparing tokens: hashes may collide).  The entries live in
    typed arrays and the map holds ints only, which the garbage collector does not track,
    so a long history adds no objects for it to walk."""

    def __init__(self, max_n: int):
        self.max_n = max_n
        self.docs: list[list[int]] = []
        self._indexed: list[int] = []  # tokens of each doc already indexed
        self._latest: dict[int, int] = {}  # hash of an n-gram -> its latest entry
        self._prev = array("i")  # [entry] previous entry with the same hash, -1: none
        self._doc = array("i")  # [entry] document it ends in
        self._end = array("i")  # [entry] position after its last token

    def add(self, tokens: list[int], skip: int = 0) -> int:
        """A new document of ``tokens``; n-grams that end in its first ``skip`` tokens are
        not indexed (text looked up elsewhere)."""
        self.docs.append(list(tokens[:skip]))
        self._indexed.append(len(self.docs[-1]))
        doc = len(self.docs) - 1
        self.extend(doc, tokens[skip:])
        return doc

    def extend(self, doc: int, tokens: list[int]) -> None:
        """Append ``tokens`` to document ``doc`` and index the n-grams that end in them."""
        d = self.docs[doc]
        d.extend(tokens)
        first = self._indexed[doc]
        lo = max(0, first - self.max_n + 1)
        window = tuple(d[lo:])  # the tokens the new n-grams are made of
        latest, prev, docs, ends = self._latest, self._prev, self._doc, self._end
        for end in range(first + 1, len(d) + 1):
            for n in range(1, min(self.max_n, end) + 1):
                h = hash(window[end - n - lo:end - lo])
                prev.append(latest.get(h, -1))
                latest[h] = len(ends)
                docs.append(doc)
                ends.append(end)
        self._indexed[doc] = len(d)

    def occurrences(self, key: tuple[int, ...], exclude: tuple[int, int] | None,
                    limit: int | None = None) -> list[tuple[int, int]]:
        """Ends (doc, end) of earlier occurrences of ``key`` that a token follows, ``exclude``
        left out: the most recent ``limit`` (None: all), oldest first."""
        out: list[tuple[int, int]] = []
        want, n = list(key), len(key)
        e = self._latest.get(hash(key), -1)
        while e >= 0 and (limit is None or len(out) < limit):
            d, end = self._doc[e], self._end[e]
            doc = self.docs[d]
            if n <= end < len(doc) and (d, end) != exclude and doc[end - n:end] == want:
                out.append((d, end))
            e = self._prev[e]
        return out[::-1]


class NgramDrafter:
    """Prompt lookup over the request's own tokens (module doc)."""

    name = "ngram"

    def __init__(self, max_match: int = 4, min_match: int = 1, depth: int = 32):
        self.max_match, self.min_match, self.depth = max_match, min_match, depth
        self._own: dict[object, tuple[NgramIndex, int]] = {}  # request key -> its index and doc
        self._tally = np.zeros((max_match + 1, 2, 2))  # [match length, copying, (accepted, tried)] draft tokens
        self._last_match: dict[object, tuple[int, int]] = {}  # request key -> (match length, copying), last proposal
        self._copying: dict[object, int] = {}  # request key -> 1 while its last verified path was accepted whole
        self._edits: dict[object, CopyEdits] = {}  # request key -> its prompt and learned substitutions
        self._pending: dict[object, tuple] = {}  # request key -> its last proposal's best path (_learn)
        self._grams: dict[object, tuple[set, int]] = {}  # request key -> (its own COPY_MATCH-grams a token
        # follows, the end of the next one to add) (guesses)

    def rate(self, n: int, copying: int = 0) -> float:
        """Per-token acceptance rate of drafts from n-token matches, made right after a
        verified path was accepted whole (``copying`` 1) or not (module doc)."""
        acc, tried = self._tally[n, copying]
        return float((acc + 9.0) / (tried + 10.0))

    def match_length(self, key) -> int:
        """Tokens of the suffix that the last proposal for ``key`` found (valid right after
        a proposal that returned a tree)."""
        return self._last_match.get(key, (0, 0))[0]

    def observe(self, key, n_accepted: int, n_deepest: int) -> None:
        """The target accepted ``n_accepted`` tokens of the last proposal for ``key``, whose
        deepest verified node was ``n_deepest`` deep."""
        last = self._last_match.pop(key, None)
        if last is not None:
            self._tally[last] += (n_accepted, n_accepted + (n_accepted < n_deepest))
        self._copying[key] = int(0 < n_deepest == n_accepted)

    def _own_index(self, key, tokens: list[int]) -> tuple[NgramIndex, int]:
        if key not in self._own:
            idx = NgramIndex(self.max_match)
            self._own[key] = (idx, idx.add(tokens, skip=max(0, len(tokens) - 2)))  # the prompt: CopyEdits
            self._edits[key] = CopyEdits(tokens[:-1])  # what it started from: before its first proposal's root
            self._pending.pop(key, None)
            self._grams[key] = (set(), len(tokens) - 1)  # the n-grams the index has, as above
        idx, doc = self._own[key]
        have = len(idx.docs[doc])
        if tokens[:have] != idx.docs[doc]:  # rewound (never in the engine): start over
            del self._own[key]
            return self._own_index(key, tokens)
        idx.extend(doc, tokens[have:])
        return idx, doc

    def _indexes(self, key, tokens):
        """(index, document of this request or None) pairs to look the suffix up in."""
        idx, doc = self._own_index(key, tokens)
        return [(idx, doc)]

    def _learn(self, key, tokens: list[int]) -> None:
        """Compare the last proposal's best path with what the target wrote after it: where
        it replaced a prompt token the path copied, learn the substitution (copy_edits.py)."""
        pending = self._pending.pop(key, None)
        if pending is None:
            return
        start, path, origin = pending
        wrote = tokens[start:start + len(path)]
        acc = 0
        while acc < len(wrote) and wrote[acc] == path[acc]:
            acc += 1
        if 0 < acc < len(wrote) and origin[acc] is not None:  # aligned: a token of the path was accepted
            self._edits[key].learn(origin[acc], wrote[acc])

    def repeats(self, key, tokens: list[int], n: int) -> bool:
        """Whether the last ``n`` tokens (n <= max_match) occur earlier in the request's
        prompt, as the target edits it, or in its output (or another request's, for the
        suffix drafter), with a token after them: whether ``propose`` would match at least
        n tokens.  One lookup of one pattern, where ``propose`` may try every shorter one."""
        if not self.min_match <= n <= min(self.max_match, len(tokens)):
            return False
        indexes = self._indexes(key, tokens)
        self._learn(key, tokens)
        pattern = tuple(tokens[-n:])
        for idx, doc in indexes:
            if doc is None:
                if idx.occurrences(pattern, None, 1):
                    return True
            elif len(self._edits[key].ends(pattern)) or idx.occurrences(pattern, (doc, len(tokens)), 1):
                return True
        return False

    def guesses(self, key, tokens: list[int]) -> bool:
        """Whether the request's text repeats: ``repeats`` for its last ``COPY_MATCH`` tokens
        (``max_match`` if fewer): where a copy is likely, and drafting goes on while the
        pacer is overdrawn (pacer.py, ``copies``).  Asked at every step drafting is
        paused, so it leaves the index to catch up at the next proposal and looks the
        request's own tokens up in a set of their n-grams (which assumes, as the engine
        does, that ``tokens`` only grow)."""
        n = min(COPY_MATCH, self.max_match)
        if not self.min_match <= n < len(tokens):
            return False
        if key not in self._own:
            self._own_index(key, tokens)
        self._learn(key, tokens)
        grams, upto = self._grams[key]
        for end in range(max(upto, n), len(tokens)):  # those a token follows
            grams.add(tuple(tokens[end - n:end]))
        self._grams[key] = (grams, max(upto, len(tokens)))
        pattern = tuple(tokens[-n:])
        return pattern in grams or bool(self._edits[key].ends(pattern)) or self._elsewhere(pattern)

    def _elsewhere(self, pattern: tuple[int, ...]) -> bool:
        """Whether ``pattern`` occurs, a token after it, in text other than the request's."""
        return False

    def propose(self, key, tokens: list[int], max_nodes: int, chain: bool = False) -> DraftTree:
        """A tree of at most ``max_nodes`` nodes continuing ``tokens`` (its last one is the
        root); with ``chain``, only its most frequent path (``continuation_chain``)."""
        if max_nodes <= 0:
            return DraftTree.empty()
        indexes = self._indexes(key, tokens)
        self._learn(key, tokens)
        edits = self._edits[key]
        longest = min(self.max_match, len(tokens))
        prompt_ends = edits.ends_upto(tokens[-longest:]) if longest >= self.min_match else []  # [n - 1] ends
        for n in range(longest, self.min_match - 1, -1):
            pattern = tuple(tokens[-n:])
            depth = self.depth if n > _SHORT_MATCH else min(self.depth, _SHORT_DEPTH)
            conts: list[list[int]] = []  # continuations, oldest first: other requests', the prompt's, the output's
            starts: list[int | None] = []  # where each starts in the prompt (None: not in the prompt)
            for idx, doc in indexes:
                if doc is None:  # another request's history
                    found = [idx.docs[d][e:e + depth] for d, e in idx.occurrences(pattern, None, _MAX_OCCURRENCES)]
                    conts += found
                    starts += [None] * len(found)
                    continue
                for e in prompt_ends[n - 1][-_MAX_OCCURRENCES:]:  # the prompt, as the target edits it
                    conts.append(edits.continuation(e, depth, tokens))
                    starts.append(e)
                found = [idx.docs[d][e:e + depth]  # the request's own output
                         for d, e in idx.occurrences(pattern, (doc, len(tokens)), _MAX_OCCURRENCES)]
                conts += found
                starts += [None] * len(found)
            if conts:
                copying = self._copying.get(key, 0)
                self._last_match[key] = (n, copying)
                conts, starts = conts[-_MAX_OCCURRENCES:], starts[-_MAX_OCCURRENCES:]
                merge = continuation_chain if chain else continuation_trie
                tree = merge(conts, max_nodes, self.rate(n, copying))
                self._remember(key, tokens, tree.best_chain().tokens.tolist(), conts, starts, depth)
                return tree
        return DraftTree.empty()

    def _remember(self, key, tokens, path: list[int], conts: list, starts: list, depth: int) -> None:
        """Keep the best ``path`` proposed and the prompt tokens under it (the most recent
        prompt continuation that starts with it) for ``_learn``."""
        for cont, start in zip(reversed(conts), reversed(starts)):
            if start is not None and cont[:len(path)] == path[:len(cont)]:
                origin = self._edits[key].origin(start, depth)
                self._pending[key] = (len(tokens), path, origin + [None] * (len(path) - len(origin)))
                return

    def finish(self, key, tokens: list[int]) -> None:
        """The request ended with ``tokens``: forget its index."""
        for d in (self._own, self._last_match, self._copying, self._edits, self._pending, self._grams):
            d.pop(key, None)


class SuffixDrafter(NgramDrafter):
    """Lookup over every finished request's tokens and the request's own (module doc)."""

    name = "suffix"

    def __init__(self, max_match: int = 8, min_match: int = 1, depth: int = 32, max_history_tokens: int = 1 << 20):
        super().__init__(max_match, min_match, depth)
        self.history = NgramIndex(max_match)
        self.max_history_tokens = max_history_tokens
        self._history_tokens = 0

    def _indexes(self, key, tokens):
        return [(self.history, None)] + super()._indexes(key, tokens)

    def _elsewhere(self, pattern: tuple[int, ...]) -> bool:
        return bool(self.history.occurrences(pattern, None, 1))

    def finish(self, key, tokens: list[int]) -> None:
        super().finish(key, tokens)
        if self._history_tokens + len(tokens) > self.max_history_tokens:
            self.forget_history()  # start a fresh history rather than grow without bound
        self.history.add(list(tokens))
        self._history_tokens += len(tokens)

    def forget_history(self) -> None:
        """Drop the tokens of every finished request (a running request keeps its own)."""
        self.history = NgramIndex(self.max_match)
        self._history_tokens = 0
