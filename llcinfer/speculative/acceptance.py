"""How far a drafter's confidences can be trusted, and whether speculating pays at all,
measured as decoding goes.

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

``Pacer`` is the last word: it compares the measured seconds per token each sequence
gains in steps that drafted (verifying or not: drafting that finds nothing worth a row
still costs its time) with those of steps that did not draft, and while speculation is
slower by more than ``MARGIN`` it pauses drafting for a number of steps that doubles
each time, up to ``MAX_PAUSE``, and at least long enough that the drafting of the next
tries costs at most ``MARGIN`` of the time (a draft model catching up on the tokens of a
pause and drafting for three steps costs several plain steps; a lookup a fraction of a
millisecond).  A drafter that costs next to nothing is therefore never
paused for finding nothing, only for verifications that do not pay: a code edit's answer
starts with prose that no lookup finds, and a pause grown long there would miss the
copying that follows.

The plain figure is kept current: one plain step every ``PROBE_EVERY`` drafting steps, and
a plain step faster than the figure replaces it (the first plain steps may run before the
process is warm; a figure left too slow would hide speculation that costs).

A step that drafted and verified nothing is a plain step plus its drafting, and is counted
as the plain figure plus the drafting seconds measured, not by its wall time: three such
steps a few per cent slower by chance (the host's noise) would otherwise start a pause,
and pauses that double in a stretch with nothing to draft (a code edit's opening prose,
Qwen-1.5B: 4, 8, 16, then 32 steps) run on into the copying that follows.
"""

from __future__ import annotations

import numpy as np

from .tree import DraftTree

DECAY = 0.9  # weight of the history at each new observation
PRIOR = 1.0  # claimed and accepted mass at start: ratio 1, trusted until measured
MIN_RATIO = 0.01


class Acceptance:
    def __init__(self):
        self.claimed = PRIOR
        self.accepted = PRIOR
        self._pending: dict[object, tuple[int, np.ndarray, np.ndarray]] = {}  # key -> (start, tokens, raw conf)

    @property
    def ratio(self) -> float:
        return float(min(1.0, max(MIN_RATIO, self.accepted / max(self.claimed, 1e-9))))

    def observe(self, raw_conf: np.ndarray, accepted: np.ndarray) -> None:
        """Nodes with drafter confidences ``raw_conf`` [n], ``accepted`` [n] bool."""
        if len(raw_conf):
            self.claimed = DECAY * self.claimed + float(np.sum(raw_conf))
            self.accepted = DECAY * self.accepted + float(np.sum(accepted))

    def scale(self, tree: DraftTree, ratio: float) -> DraftTree:
        return tree if ratio == 1.0 else DraftTree(tree.tokens, tree.parents, tree.conf * ratio)

    def shadow(self, key, start: int, chain: DraftTree) -> None:
        """Remember a chain proposed after position ``start`` that was not verified."""
        if len(chain) and key not in self._pending:
            self._pending[key] = (start, chain.tokens.copy(), chain.conf.copy())

    def resolve(self, key, tokens: list[int]) -> None:
        """Check ``key``'s unverified chain against its tokens so far, once they decide it:
        node i was right if tokens[start + 1 + i] is its token and every node before was."""
        item = self._pending.get(key)
        if item is None:
            return
        start, chain, conf = item
        known = tokens[start + 1:start + 1 + len(chain)]
        ok = np.asarray(known, np.int64) == chain[:len(known)]
        if ok.all() and len(known) < len(chain):
            return  # all right so far: wait for more tokens
        accepted = np.zeros(len(chain), bool)
        accepted[:int(np.argmin(ok)) if not ok.all() else len(chain)] = True
        self.observe(conf, accepted)
        del self._pending[key]

    def forget(self, key) -> None:
        self._pending.pop(key, None)


MAX_PAUSE = 64  # the doubling pause grows up to this many plain steps ...
MAX_COSTLY_PAUSE = 512  # ... and a pause that keeps costly drafting under MARGIN up to this
EMA = 0.3  # weight of the newest step in the measured seconds per token
MARGIN = 0.05  # speculation paused while its seconds per token exceed plain decoding's by more
TRIES = 3  # drafting steps measured before judging them
PROBE_EVERY = 64  # drafting steps between plain ones that keep the plain figure current


class Pacer:
    """Step kinds: "verified" (drafts verified), "drafted" (drafting ran, nothing paid for
    its row), "plain" (no drafting)."""

    def __init__(self):
        self._spec: np.ndarray | None = None  # [seconds, drafting seconds, tokens per sequence] of drafting steps
        self.plain_s: float | None = None  # seconds per token per sequence, steps that did not draft
        self.pause = 0  # plain steps left before drafting again
        self.next_pause = 4
        self.tries = 0  # drafting steps since the last pause
        self.since_plain = 0  # drafting steps since the last plain one

    def paused(self) -> bool:
        """Whether this step decodes plainly without drafting (counts the step): during a
        pause, and once every PROBE_EVERY drafting steps, to keep plain_s current."""
        if self.pause > 0:
            self.pause -= 1
            if self.pause == 0:
                self.tries = 0
            return True
        if self.plain_s is not None and self.since_plain >= PROBE_EVERY:
            self.since_plain = 0  # one step, recorded or not (a prompt chunk beside it is not timed)
            return True
        return False

    def _pause(self, steps: int | None = None) -> None:
        self.pause = self.next_pause if steps is None else steps
        if steps is None:
            self.next_pause = min(MAX_PAUSE, 2 * self.next_pause)

    @property
    def spec_s(self) -> float | None:
        """Seconds per token per sequence of the steps that drafted (a ratio of averages:
        one step that verified a long draft and kept one token does not outweigh the step
        that kept eight)."""
        return None if self._spec is None else float(self._spec[0] / self._spec[2])

    @property
    def draft_s(self) -> float:
        """Of spec_s, the drafting (draft model steps, lookups)."""
        return 0.0 if self._spec is None else float(self._spec[1] / self._spec[2])

    def _slower(self) -> None:
        """Speculation measured slower: pause, long enough that the drafting of the TRIES
        steps after the pause, draft_s / plain_s plain steps each, is at most MARGIN of the
        time.  (Verification rows that did not pay are not counted: the drafts' measured
        worth, ``Acceptance``, already trims them for the next tries.)"""
        drafting = TRIES * self.draft_s / self.plain_s  # plain steps
        self._pause()
        self.pause = max(self.pause, round(min(MAX_COSTLY_PAUSE, drafting / MARGIN)))

    def record(self, kind: str, seconds: float, tokens: float = 1.0, drafting: float = 0.0) -> None:
        """A step of ``seconds``, in which each sequence gained ``tokens`` on average, and of
        which ``drafting`` seconds went to drafting."""
        def ema(old, new):
            return new if old is None else (1 - EMA) * old + EMA * new

        if kind == "plain":
            now = seconds / tokens  # a faster plain step is taken whole: the first ones ran cold
            self.plain_s = now if self.plain_s is None or now < self.plain_s else ema(self.plain_s, now)
            self.since_plain = 0
            return
        if kind == "drafted" and self.plain_s is not None:
            seconds = self.plain_s * tokens + drafting  # a plain step and the drafting: its wall time adds only noise
        self._spec = ema(self._spec, np.array([seconds, drafting, tokens]))
        self.tries += 1
        self.since_plain += 1
        if self.tries < TRIES:
            return  # a few drafting steps before judging them
        if self.plain_s is None:
            self._pause(2)  # nothing to judge against yet: time two plain steps
            return
        if self.spec_s > self.plain_s * (1 + MARGIN):
            self._slower()
            self._spec = None  # judged afresh after the pause
        else:
            self.next_pause = 4
