"""Prefix-aware choice of a replica: the same conversation, or the same long prefix, goes
to the replica that served it last (its KV blocks are still there); the rest by load.

A request's routing key is a list of text units (a conversation's messages as
``role + content``, or a completion's prompt).  Each unit is cut into chunks of
``chunk_chars`` characters and the chunks are hash-chained, so every prefix of the key
that ends at a chunk or unit boundary has one hash.  The router remembers, for recent
hashes, the replica that last served a key with that prefix.  A request goes to the
replica of its deepest remembered prefix when that prefix is long (``min_prefix_chars``
or more) or covers at least two whole messages (an earlier turn of the conversation),
unless that replica already holds ``slack`` more requests than the least loaded one;
otherwise to the least loaded replica (ties in turn).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

CHUNK_CHARS = 128
MIN_PREFIX_CHARS = 256  # about 64 tokens: four KV blocks worth sharing
MAX_ENTRIES = 1 << 16


def routing_units(kind: str, body: dict) -> list[str]:
    """The routing key of an API request body ([] when the body has none worth using: the
    replica will answer it, or refuse it)."""
    if kind == "chat":
        msgs = body.get("messages")
        if not isinstance(msgs, list):
            return []
        out = []
        for m in msgs:
            if not isinstance(m, dict):
                return out
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict)
                                  and isinstance(p.get("text"), str))
            out.append(f"{m.get('role')}\x1f{content}")
        return out
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return [prompt] if isinstance(prompt, str) else []


def prefix_hashes(units: list[str], chunk_chars: int = CHUNK_CHARS) -> list[tuple[bytes, int, int]]:
    """(hash, characters covered, whole units covered) of every chunk-boundary prefix."""
    out, h, chars = [], b"", 0
    for n, unit in enumerate(units):
        pieces = [unit[i:i + chunk_chars] for i in range(0, len(unit), chunk_chars)] or [""]
        for k, piece in enumerate(pieces):
            last = k == len(pieces) - 1
            h = hashlib.blake2b(h + piece.encode("utf-8", "surrogatepass") + (b"\x1e" if last else b""),
                                digest_size=8).digest()
            chars += len(piece)
            out.append((h, chars, n + 1 if last else n))
    return out


class PrefixRouter:
    """The choice of a replica for each request, and per-replica counts (the ingress's own:
    it is the only one that routes)."""

    def __init__(self, n_replicas: int, slack: int = 4, chunk_chars: int = CHUNK_CHARS,
                 min_prefix_chars: int = MIN_PREFIX_CHARS, max_entries: int = MAX_ENTRIES):
        if n_replicas < 1:
            raise ValueError("PrefixRouter needs at least one replica")
        self.n, self.slack, self.chunk_chars = n_replicas, slack, chunk_chars
        self.min_prefix_chars, self.max_entries = min_prefix_chars, max_entries
        self.load = [0] * n_replicas  # requests in flight per replica
        self.routed = [0] * n_replicas
        self.affinity = [0] * n_replicas  # routed by a remembered prefix
        self.last_reason = ""  # why the last choice: 'affinity' or 'load'
        self._table: OrderedDict[bytes, int] = OrderedDict()
        self._turn = 0

    def choose(self, units: list[str], avoid=()) -> int:
        """The replica for a request with routing key ``units``, not one of ``avoid``
        (unless every replica is); counts it as started."""
        cands = [i for i in range(self.n) if i not in avoid] or list(range(self.n))
        least = min(self.load[i] for i in cands)
        hashes = prefix_hashes(units, self.chunk_chars)
        pick = None
        for h, chars, whole in reversed(hashes):
            r = self._table.get(h)
            if r is None or r not in cands:
                continue
            if (chars >= self.min_prefix_chars or whole >= 2) and self.load[r] <= least + self.slack:
                pick = r
                self.affinity[r] += 1
            break
        self.last_reason = "load" if pick is None else "affinity"
        if pick is None:
            idle = [i for i in cands if self.load[i] == least]
            pick = idle[self._turn % len(idle)]
            self._turn += 1
        for h, _, _ in hashes:
            self._table[h] = pick
            self._table.move_to_end(h)
        while len(self._table) > self.max_entries:
            self._table.popitem(last=False)
        self.load[pick] += 1
        self.routed[pick] += 1
        return pick

    def finished(self, i: int) -> None:
        self.load[i] -= 1

    def forget(self, i: int) -> None:
        """Replica ``i`` restarted: the prefixes it held are gone."""
        for h in [h for h, r in self._table.items() if r == i]:
            del self._table[h]
