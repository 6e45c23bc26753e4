"""Prefix sharing: full KV blocks indexed by a hash chain of the tokens they hold.

Block i of a sequence gets the id ``h_i = hash((h_{i-1}, tokens of block i))`` (h_{-1} = 0),
so one id names the whole prefix up to the end of that block: two sequences whose
prompts agree on the first k * block_size tokens find the same k blocks.  Entries keep
their tokens and parent id and are checked on lookup (no trust in hash collisions).

A block is indexed once it is full; the pool keeps indexed blocks committed after their
last user ends (LRU cache) and calls ``forget`` when it evicts one.  A sequence that
must write into an indexed block copies it first (copy-on-write, in PagedSequence).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PrefixStats:
    lookups: int = 0  # sequences that asked for a prefix
    hit_blocks: int = 0  # blocks adopted instead of computed
    hit_tokens: int = 0  # tokens whose K/V came from shared blocks
    registered: int = 0  # full blocks indexed so far
    evicted: int = 0
    cow_copies: int = 0  # shared blocks copied before a write


class PrefixCache:
    def __init__(self, block_size: int):
        self.block_size = int(block_size)
        self._by_id: dict[int, tuple[int, int, tuple]] = {}  # id -> (block, parent id, tokens)
        self._id_of: dict[int, int] = {}  # block -> id
        self.stats = PrefixStats()

    @staticmethod
    def chain(parent: int, tokens) -> int:
        return hash((parent, tuple(tokens)))

    def is_registered(self, block: int) -> bool:
        return block in self._id_of

    def register(self, parent: int, tokens: tuple, block: int) -> int:
        """Index a full block; returns its id (an equal block indexed earlier is kept)."""
        bid = self.chain(parent, tokens)
        if bid not in self._by_id and block not in self._id_of:
            self._by_id[bid] = (block, parent, tokens)
            self._id_of[block] = bid
            self.stats.registered += 1
        return bid

    def forget(self, block: int) -> None:
        bid = self._id_of.pop(block, None)
        if bid is not None:
            del self._by_id[bid]
            self.stats.evicted += 1

    def match(self, tokens: list[int], max_tokens: int | None = None) -> tuple[list[int], list[int]]:
        """(blocks, ids) of the longest indexed chain of full blocks that prefixes ``tokens``,
        covering at most ``max_tokens`` tokens rounded up to a whole block."""
        bs = self.block_size
        limit = len(tokens) if max_tokens is None else min(len(tokens), max_tokens)
        blocks, ids = [], []
        parent = 0
        for i in range(0, -(-limit // bs)):
            chunk = tuple(tokens[i * bs:(i + 1) * bs])
            if len(chunk) < bs:
                break
            bid = self.chain(parent, chunk)
            entry = self._by_id.get(bid)
            if entry is None or entry[1] != parent or entry[2] != chunk:
                break
            blocks.append(entry[0])
            ids.append(bid)
            parent = bid
        return blocks, ids
