"""How far a drafter's confidences can be trusted, measured as decoding goes.

A lookup drafter's confidence is a match statistic, not a probability: on free chat the
n-gram drafter claims 0.3-0.5 for drafts the target accepts a few per cent of the time,
and spending verification rows on them makes decoding slower than plain.  ``Acceptance``
keeps the ratio of accepted draft nodes to the confidence claimed for them,

    ratio = sum(accepted) / sum(claimed confidence)   (each sum decayed by DECAY per event)

and scales every proposed node's confidence by it (never up: ratio <= 1), so the budget
and the pays-for-itself test (engine/speculation.py) see what the drafts are worth now.
Both verified drafts and drafts that were proposed but not verified count: an unverified
chain is checked against the tokens plain decoding then produced (``shadow`` /
``resolve``), so a drafter that fell silent is noticed when its drafts become good again.

The same walks give the drafts' acceptance rate per node, whatever their confidences:
each node the walk reached was accepted or ended the walk, so

    node_rate = accepted nodes / (accepted nodes + walks a rejection ended)

(the estimate of a per-node acceptance probability from runs that end at the first
failure; decayed as the ratio), which prices what drafting could gain before it is
started (engine/speculation.py: whether a draft model reads a prompt).

Whether speculating pays at all is the pacer's to judge (pacer.py).
"""

from __future__ import annotations

import numpy as np

from .tree import DraftTree

DECAY = 0.9  # weight of the history at each new observation
PRIOR = 1.0  # claimed and accepted mass at start: ratio 1, trusted until measured
MIN_RATIO = 0.01
NODE_PRIOR = 4.0  # accepted nodes assumed at start: node_rate is 1 until walks are measured, and one walk does not overturn it


class Acceptance:
    def __init__(self):
        self.claimed = PRIOR
        self.accepted = PRIOR
        self.nodes_accepted = NODE_PRIOR  # decayed sums of node_rate's terms
        self.walks_rejected = 0.0
        self._pending: dict[object, tuple[int, list[int], np.ndarray]] = {}  # key -> (start, tokens, raw conf)

    @property
    def ratio(self) -> float:
        return float(min(1.0, max(MIN_RATIO, self.accepted / max(self.claimed, 1e-9))))

    @property
    def node_rate(self) -> float:
        return self.nodes_accepted / (self.nodes_accepted + self.walks_rejected)

    def observe(self, raw_conf: np.ndarray, accepted: np.ndarray, rejected: bool | None = None) -> None:
        """One walk over nodes with drafter confidences ``raw_conf`` [n], ``accepted`` [n]
        bool; ``rejected``: whether a rejected node ended it (None: a chain's, so where
        some node was not accepted)."""
        if len(raw_conf):
            self.claimed = DECAY * self.claimed + float(np.sum(raw_conf))
            self.accepted = DECAY * self.accepted + float(np.sum(accepted))
            self.nodes_accepted = DECAY * self.nodes_accepted + float(np.sum(accepted))
            self.walks_rejected = DECAY * self.walks_rejected + float(not accepted.all() if rejected is None else rejected)

    def scale(self, tree: DraftTree, ratio: float) -> DraftTree:
        return tree if ratio == 1.0 else DraftTree(tree.tokens, tree.parents, tree.conf * ratio)

    def shadow(self, key, start: int, chain: DraftTree) -> None:
        """Remember a chain proposed after position ``start`` that was not verified."""
        if len(chain) and key not in self._pending:
            self._pending[key] = (start, chain.tokens.tolist(), chain.conf.copy())

    def resolve(self, key, tokens: list[int]) -> None:
        """Check ``key``'s unverified chain against its tokens so far, once they decide it:
        node i was right if tokens[start + 1 + i] is its token and every node before was."""
        item = self._pending.get(key)
        if item is None:
            return
        start, chain, conf = item  # chain: its tokens, a list
        known = tokens[start + 1:start + 1 + len(chain)]
        right = 0  # nodes right so far
        while right < len(known) and known[right] == chain[right]:
            right += 1
        if right == len(known) < len(chain):
            return  # all right so far: wait for more tokens
        accepted = np.zeros(len(chain), bool)
        accepted[:right] = True
        self.observe(conf, accepted)
        del self._pending[key]

    def forget(self, key) -> None:
        self._pending.pop(key, None)
