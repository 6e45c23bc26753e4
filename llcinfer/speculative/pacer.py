"""Whether drafting pays for itself, measured as decoding goes: the pacer keeps an
account of the time speculation gained or lost against plain decoding, and pauses
drafting while the account is overdrawn.

Every step earns an allowance of ``MARGIN`` of a plain step per token and is charged its
drafting; a step that verified drafts is also booked against plain decoding of the same
tokens:

    credit += MARGIN * tokens * plain_s - drafting
    gain    = tokens * plain_s - (seconds - drafting)          (steps that verified)

(``tokens`` each sequence gained on average, ``plain_s`` the seconds of a plain step of
the batch; a plain step earns MARGIN * seconds).  A gain is banked, up to
``CREDIT_STEPS`` plain steps, and the bank shrinks by ``KEEP`` a drafting step, so recent
gains pay for losses and old ones do not.  A loss (a verification that kept less than it
cost) is paid from the bank down to zero and never beyond: whether drafts are worth
their rows is for their measured worth to decide (acceptance.py and the budget's
pays-for-itself test), step by step; the pacer's part is what drafting costs.

While the credit is below zero the steps decode plainly, so drafting costs at most
MARGIN of the time beyond what it gains: a lookup that costs less than MARGIN of a step
drafts on through text it finds nothing in, a dearer one every few steps.  Where the
request's text repeats (its last tokens occur earlier in its prompt or output: the
drafter ``guesses``, and a copy is likely) drafting goes on while overdrawn (``copies``),
so a code edit's answer is drafted from its first copied tokens however long the prose
before them; such drafting is charged like any other, and stops once it and the
verifications it brought have cost ``COPY_STEPS`` plain steps more than plain decoding
without a gain between (text that repeats where the target does not copy it), until a
verification gains or new requests decode.  A draft model resumes only once the credit
also covers catching up on the tokens it missed while paused (``paused(resume_s)``),
which grows faster than MARGIN earns; where the text repeats it copies meanwhile, with
no draft step.

An account overdrawn on earlier requests is forgiven, and the copies' allowance renewed,
when a new set of requests starts decoding (``fresh``; the speculator calls it where
drafts of their measured worth could pay for that many sequences): what drafting lost on
other text says little about a new prompt's, so each new workload gets one probe; under
load the decoding set overlaps from one step to the next and the account carries on.

The plain figure is kept current by the plain steps and by the steps that drafted and
verified nothing (their time less the drafting), and by one plain step every
``PROBE_EVERY`` verifying steps; a step faster than the figure replaces it (the first
ones may run before the process is warm; a figure left too slow would hide speculation
that costs).
"""

from __future__ import annotations

MARGIN = 0.005  # share of the plain steps' time that drafting may cost beyond what it gains
COPY_STEPS = 4  # plain steps of drafting on repeating text, while overdrawn, that may go without a gain
CREDIT_STEPS = 16  # the most credit kept, in plain steps ...
KEEP = 0.9  # ... and the share of it a drafting step keeps: recent gains pay for losses, old ones do not
EMA = 0.3  # weight of the newest plain step in plain_s, where it is not faster
PROBE_EVERY = 64  # verifying steps between plain ones that keep plain_s current


class Pacer:
    """Step kinds: "verified" (drafts verified), "drafted" (drafting ran, nothing paid for
    its row), "plain" (no drafting)."""

    def __init__(self):
        self.plain_s: float | None = None  # seconds per token per sequence of a step that verifies nothing
        self.credit = 0.0  # seconds speculation is ahead of plain decoding (below 0: paused)
        self.since_plain = 0  # verifying steps since the last plain one
        self._retime = False  # the next plain step's time replaces plain_s whole (fresh)
        self.overdrawn = False  # paused for an overdraft since the last drafting step
        self.copy_spent = 0.0  # seconds drafting on repeating text while overdrawn lost, since the last gain

    def paused(self, resume_s: float = 0.0) -> bool:
        """Whether this step decodes plainly without drafting (counts the step): before
        the first plain step is timed, while the credit is overdrawn, after an overdraft
        until the credit also covers ``resume_s`` (what the first drafting step would cost
        beyond a usual one: a draft model catching up on the tokens it missed), and once
        every PROBE_EVERY verifying steps, to keep plain_s current."""
        if self.plain_s is None:
            return True
        if self.credit < (resume_s if self.overdrawn else 0.0):
            self.overdrawn = True
            return True
        self.overdrawn = False
        if self.since_plain >= PROBE_EVERY:
            self.since_plain = 0  # one step, recorded or not (a prompt chunk beside it is not timed)
            return True
        return False

    def copies(self) -> bool:
        """While paused for an overdraft: whether drafting still goes on where a request's
        text repeats, until such drafting (its verifications' losses included) has cost
        COPY_STEPS plain steps without a gain."""
        return self.overdrawn and self.copy_spent < COPY_STEPS * self.plain_s

    def fresh(self) -> None:
        """A new set of requests decodes: an overdrawn account starts again at zero, and the
        next step decodes plainly, its time taken whole as plain_s (the figure may be from
        another moment of the host's, the cold steps after loading included)."""
        self.credit, self.overdrawn, self.copy_spent = max(self.credit, 0.0), False, 0.0
        if self.plain_s is not None:
            self.since_plain, self._retime = PROBE_EVERY, True

    def record(self, kind: str, seconds: float, tokens: float = 1.0, drafting: float = 0.0,
               copying: bool = False) -> None:
        """A step of ``seconds``, in which each sequence gained ``tokens`` on average, and of
        which ``drafting`` seconds went to drafting; ``copying``: it drafted only because
        the text repeats (``copies``)."""
        if kind != "verified":  # a plain step, with its drafting where it drafted
            now = (seconds - drafting) / tokens  # a faster plain step is taken whole: the first ones ran cold
            whole = self.plain_s is None or now < self.plain_s or self._retime
            self.plain_s = now if whole else (1 - EMA) * self.plain_s + EMA * now
            self._retime = False
        if kind == "plain":
            self.since_plain = 0
            self._book(MARGIN * seconds)
            return
        if self.plain_s is None:
            return  # nothing to book against (paused() keeps this from happening)
        if self.credit > 0:
            self.credit *= KEEP
        self._book(MARGIN * tokens * self.plain_s - drafting)
        gain = tokens * self.plain_s - (seconds - drafting) if kind == "verified" else 0.0
        if kind == "verified":
            self.since_plain += 1
            self._book(gain if gain > 0 else max(gain, -max(self.credit, 0.0)))  # a loss empties the bank at most
        if gain > 0:
            self.copy_spent = 0.0
        elif copying:
            self.copy_spent += drafting - gain

    def _book(self, seconds: float) -> None:
        self.credit = min(self.credit + seconds, CREDIT_STEPS * self.plain_s)
