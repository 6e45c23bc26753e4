"""When the speculator drafts: not where even perfect drafts or the draft model's catch-up
could not pay, an account forgiven for new requests, a paused draft model resuming, and
what a draft model reads (its copies, a late prompt, the prompts drafting could repay)."""

from types import SimpleNamespace

import numpy as np
import pytest

from llcinfer.engine.speculation import Speculator
from llcinfer.speculative import DraftTree, NgramDrafter, VerifyCost
from llcinfer.speculative.lookup import COPY_MATCH
from llcinfer.speculative.pacer import MARGIN, PROBE_EVERY


def _flat_speculator(drafter) -> Speculator:
    """A speculator whose verifications of 1 to 64 rows all take a 10 ms decode step, its
    plain step timed at 10 ms."""
    sp = Speculator(drafter)
    sp.cost, sp.pacer.plain_s = VerifyCost.fit([1, 2, 4, 8, 16, 32, 64], [0.010] * 7, decode_s=0.010), 0.010
    return sp


def test_no_drafting_where_even_perfect_drafts_would_not_pay():
    """Rows compute-bound past 4 (2.2-2.6 ms per row): one sequence gains from drafts, eight do
    not even if every draft were accepted, and with a drafter whose step costs 3 ms
    four do not either; there the speculator neither drafts nor prefills the drafter."""
    class Stub(NgramDrafter):
        calls = 0

        def propose(self, *a, chain=False):
            Stub.calls += 1
            return super().propose(*a, chain=chain)

        def prefill(self, requests):
            Stub.calls += 1

    cost = VerifyCost.fit([1, 2, 4, 8, 16, 32, 64], [0.010, 0.0105, 0.011, 0.020, 0.041, 0.083, 0.167], decode_s=0.010)
    lookup = Speculator(NgramDrafter())
    lookup.cost = cost
    assert lookup.can_pay(1) and lookup.can_pay(4) and not lookup.can_pay(8)
    assert cost.max_paying_sequences() == 7 and cost.max_paying_sequences(0.003) == 3  # `llcinfer plan` shows it
    drafter = Stub()
    drafter.step_s = 0.003
    sp = Speculator(drafter)
    sp.cost = cost
    assert sp.can_pay(1) and not sp.can_pay(4)
    reqs = [SimpleNamespace(id=i, n_prompt=4, tokens=[1, 2, 3, 1, 2, 3], params=SimpleNamespace(max_tokens=99),
                            stats=SimpleNamespace(n_generated=2)) for i in range(4)]
    batch = SimpleNamespace(chunks=[SimpleNamespace(start=5, tokens=[3], request=r, tree=None) for r in reqs], n_tokens=4)
    sp.extend(batch, 64, 64)
    sp.prefilled(SimpleNamespace(chunks=[SimpleNamespace(start=0, tokens=[1, 2], request=reqs[0], tree=None)]), 4)
    assert Stub.calls == 0 and sp.stats.plain_steps == 1 and all(c.tree is None for c in batch.chunks)


def test_no_drafting_where_catching_the_draft_up_costs_more_than_the_request_can_gain():
    """A draft model 200 tokens behind (1 ms a token to catch up) drafts for a request with
    many steps left (each two-sequence step 10 ms, its share 5 ms, 0.28 s to gain), not
    for one two steps from its end; once its drafts are measured to fail, only where the
    request's last tokens occur earlier in its text (the drafter copies there, reading nothing)."""
    class Behind(NgramDrafter):
        def catch_up_s(self, key, tokens):
            return 200 * 0.001

        def guesses(self, key, tokens):
            return False

        def propose_many(self, asks, chain=False):
            self.asked = [max_nodes for _, _, max_nodes in asks]
            return [DraftTree.empty() for _ in asks]

    sp = _flat_speculator(Behind())
    reqs = [SimpleNamespace(id=i, n_prompt=4, tokens=[1, 2, 3, 1, 2, 3], params=SimpleNamespace(max_tokens=m),
                            stats=SimpleNamespace(n_generated=2)) for i, m in enumerate((99, 5))]
    batch = SimpleNamespace(chunks=[SimpleNamespace(start=5, tokens=[3], request=r, tree=None) for r in reqs], n_tokens=2)
    sp.extend(batch, 64, 64)  # new requests: a plain step first (Pacer.fresh)
    sp.extend(batch, 64, 64)
    assert sp.drafter.asked == [58, 0]  # 96 steps left (n_ctx 64 leaves 58): drafts; 2 left: none
    for _ in range(40):  # drafts measured to fail: caught up only where the request's text repeats ...
        sp.acceptance.observe(np.full(4, 0.5), np.zeros(4, bool))
    sp.drafter.guesses, sp.drafter.asked = (lambda key, tokens: False), None
    sp.extend(batch, 64, 64)
    assert sp.acceptance.node_rate < 0.01 and sp.drafter.asked is None  # a plain step
    sp.drafter.guesses = lambda key, tokens: key == 0  # ... where it copies, with no catch-up to pay
    sp.extend(batch, 64, 64)  # proposed again to measure them by
    assert sp.drafter.asked == [58, 0]


def test_an_account_overdrawn_on_earlier_requests_is_forgiven_when_new_ones_decode():
    """Debt from failed drafts pauses drafting for the request that ran them and for one
    that joins it, not for requests that start decoding after them: those draft after one
    plain step, where drafts of the measured worth could pay for as many sequences as are
    running and waiting."""
    class Counting(NgramDrafter):
        proposed: list = []

        def propose(self, key, tokens, max_nodes, chain=False):
            self.proposed.append(key)
            return DraftTree.empty()

    sp = Speculator(Counting())
    sp.cost = VerifyCost.fit([1, 2, 4, 8, 16, 32, 64], [0.010, 0.0105, 0.011, 0.020, 0.041, 0.083, 0.167], decode_s=0.010)
    sp.pacer.plain_s = 0.010

    def step(ids, n_concurrent=1):
        reqs = [SimpleNamespace(id=i, n_prompt=4, tokens=[1, 2, 3, 4, 5, 6], params=SimpleNamespace(max_tokens=99),
                                stats=SimpleNamespace(n_generated=2)) for i in ids]
        batch = SimpleNamespace(chunks=[SimpleNamespace(start=5, tokens=[3], request=r, tree=None) for r in reqs],
                                n_tokens=len(reqs))
        sp.extend(batch, 64, 64, n_concurrent)

    step([0])  # a new request: a plain step first
    step([0])
    assert sp.drafter.proposed == [0]
    sp.pacer.credit = -0.05  # its drafts failed
    step([0])
    step([0, 1])
    assert sp.drafter.proposed == [0] and sp.pacer.credit == -0.05
    step([2, 3])  # a plain step that times plain decoding again ...
    assert sp.drafter.proposed == [0] and sp.pacer.credit == 0.0
    step([2, 3])  # ... then drafts
    assert sp.drafter.proposed == [0, 2, 3]
    sp.pacer.credit = -0.05
    step([4], n_concurrent=8)  # its first decode step, 7 prompts still to run: 8 sequences, rows compute-bound
    assert sp.drafter.proposed == [0, 2, 3] and sp.pacer.credit == -0.05
    for _ in range(40):  # drafts measured to fail: at that worth no probe could pay for itself
        sp.acceptance.observe(np.full(4, 0.5), np.zeros(4, bool))
    step([5, 6])
    assert sp.drafter.proposed == [0, 2, 3] and sp.pacer.credit == -0.05


def test_an_overdrawn_lookup_drafts_only_where_the_text_repeats():
    """With the pacer overdrawn, a lookup drafts where the request's last COPY_MATCH tokens
    occur earlier in its text (a copy), not where only shorter ones do, and such drafting
    is charged as copies."""
    class Counting(NgramDrafter):
        proposed = 0

        def propose(self, key, tokens, max_nodes, chain=False):
            Counting.proposed += 1
            return DraftTree.empty()

    sp = _flat_speculator(Counting())
    run = list(range(1, COPY_MATCH + 1))
    tokens = [7, *run, 99, 50, *run[1:]]  # its last COPY_MATCH - 1 tokens occurred before, its last COPY_MATCH not
    req = SimpleNamespace(id=0, n_prompt=4, tokens=tokens, params=SimpleNamespace(max_tokens=99),
                          stats=SimpleNamespace(n_generated=len(tokens) - 4))
    chunk = SimpleNamespace(start=len(tokens) - 1, tokens=tokens[-1:], request=req, tree=None)
    batch = SimpleNamespace(chunks=[chunk], n_tokens=1)
    sp.extend(batch, 64, 64)  # a new request: a plain step first (Pacer.fresh)
    sp.pacer.credit = -0.001
    sp.extend(batch, 64, 64)
    assert Counting.proposed == 0 and not sp._drafted
    tokens[COPY_MATCH + 2] = 1  # now they did: run, 99 before
    sp.extend(batch, 64, 64)
    assert Counting.proposed == 1 and sp._drafted and sp._copying
    sp.pacer.copy_spent = 1.0  # its allowance spent
    sp.extend(batch, 64, 64)
    assert Counting.proposed == 1


def test_a_draft_model_resumes_after_a_pause_once_the_credit_covers_its_catch_up():
    """A draft model paused for an overdraft falls behind; resuming costs catching it up
    (5 ms here).  It drafts again once the credit covers that, not as soon as the credit
    is back to zero, and at once where the request's text repeats (there it copies, with
    no draft step, even while overdrawn); a request that was never paused drafts with any
    credit."""
    class Lagging(NgramDrafter):
        repeats, proposed = False, 0

        def catch_up_s(self, key, tokens):
            return 0.005

        def guesses(self, key, tokens):
            return self.repeats

        def propose(self, key, tokens, max_nodes, chain=False):
            Lagging.proposed += 1
            return DraftTree.empty()

    sp = _flat_speculator(Lagging())
    req = SimpleNamespace(id=0, n_prompt=4, tokens=[1, 2, 3, 1, 2, 3], params=SimpleNamespace(max_tokens=99),
                          stats=SimpleNamespace(n_generated=2))
    batch = SimpleNamespace(chunks=[SimpleNamespace(start=5, tokens=[3], request=req, tree=None)], n_tokens=1)
    sp.extend(batch, 64, 64)  # a new request: a plain step first (Pacer.fresh)
    sp.extend(batch, 64, 64)
    assert Lagging.proposed == 1  # credit 0, never paused: the catch-up is a usual one
    sp.pacer.credit = -0.001
    sp.extend(batch, 64, 64)
    sp.pacer.credit = 0.004
    sp.extend(batch, 64, 64)
    assert Lagging.proposed == 1 and sp.pacer.overdrawn
    sp.drafter.repeats = True
    sp.extend(batch, 64, 64)
    assert Lagging.proposed == 2 and not sp.pacer.overdrawn
    sp.drafter.repeats = False
    sp.pacer.credit = -0.001
    sp.extend(batch, 64, 64)
    sp.pacer.credit = 0.006
    sp.extend(batch, 64, 64)
    assert Lagging.proposed == 3
    sp.pacer.credit, sp.drafter.repeats = -0.001, True  # overdrawn, where the text repeats: it copies ...
    sp.extend(batch, 64, 64)
    assert Lagging.proposed == 4 and sp.pacer.overdrawn
    sp.pacer.credit, sp.pacer.since_plain = 0.001, PROBE_EVERY  # ... but not in a plain step that times plain decoding
    sp.extend(batch, 64, 64)
    assert Lagging.proposed == 4 and not sp.pacer.overdrawn


def test_a_draft_models_copies_do_not_price_what_it_reads():
    """What reading a prompt or a catch-up into the draft could repay (gain_s) follows the
    draft model's own chains: copies of repeating text, accepted whole, leave it where
    the chains' rejections put it."""
    class Copying(NgramDrafter):
        step_s, copied = 0.0, {0}

        def catch_up_s(self, key, tokens):
            return 0.0

    sp = Speculator(Copying())
    sp.cost = VerifyCost.fit([1, 2, 4, 8, 16, 32, 64], [0.010, 0.0105, 0.011, 0.020, 0.041, 0.083, 0.167], decode_s=0.010)
    tree = DraftTree.chain([5, 6, 7], [0.5, 0.25, 0.125])

    def walk(key, drawn):
        req = SimpleNamespace(id=key, seq=None, stats=SimpleNamespace(spec_verified=0, spec_accepted=0))
        sp.accept(req, SimpleNamespace(tree=tree, start=0), np.arange(4), lambda r: drawn[r])

    for _ in range(10):
        walk(1, [9])  # the draft's own chains: rejected at their first node
        for _ in range(3):
            walk(0, [5, 6, 7, 9])  # copies: accepted whole
    assert sp.own_drafts.node_rate < 0.3 < 0.8 < sp.acceptance.node_rate
    cost = sp.current_cost()
    assert sp.gain_s(1, 100) == pytest.approx(100 * cost.plain_s(1) * (1 - 1 / cost.speedup(1, 0.0, sp.own_drafts.node_rate)))
    assert sp.gain_s(1, 100) < 100 * cost.plain_s(1) * (1 - 1 / cost.speedup(1, 0.0, sp.acceptance.node_rate))


def test_a_prompt_the_draft_reads_late_is_prefill_not_drafting():
    """A draft model that did not read a request's prompt with the target reads it in
    its first proposal (1 s here, of a 1.06 s step): the account is charged that step's
    drafting (0.05 s), not the prompt."""
    class LateReader(NgramDrafter):
        read_s = 0.0

        def catch_up_s(self, key, tokens):
            return 0.0 if self.read_s else 0.001 * len(tokens)  # the prompt, until read

        def guesses(self, key, tokens):
            return True

        def propose_many(self, asks, chain=False):
            self.read_s = 1.0
            return [DraftTree.empty() for _ in asks]

    sp = _flat_speculator(LateReader())
    req = SimpleNamespace(id=0, n_prompt=4, tokens=[1, 2, 3, 1, 2], params=SimpleNamespace(max_tokens=99),
                          stats=SimpleNamespace(n_generated=1))
    chunk = SimpleNamespace(start=4, tokens=[2], request=req, tree=None)
    sp.extend(SimpleNamespace(chunks=[chunk], n_tokens=1), 64, 64)  # a new request: one plain step
    assert not sp._drafted
    sp.extend(SimpleNamespace(chunks=[chunk], n_tokens=1), 64, 64)
    assert sp._drafted and sp._prompt_read_s == pytest.approx(min(1.0, sp._draft_step_s))
    sp._draft_step_s, sp._prompt_read_s = 1.05, 1.0  # as timed on a real host
    req.tokens.append(3)
    sp.record_step(SimpleNamespace(chunks=[chunk]), [5], 1.06)
    assert sp.pacer.plain_s == pytest.approx(0.010)  # the step less its drafting and the prompt
    assert sp.pacer.credit == pytest.approx(MARGIN * 0.010 - 0.05)  # charged the second, about -1.05


class PromptReader(NgramDrafter):
    """A drafter with its own model: 1 ms a prompt token to read."""

    def __init__(self):
        super().__init__()
        self.read: list = []

    def catch_up_s(self, key, tokens):
        return len(tokens) * 0.001

    def prefill(self, requests):
        self.read += [key for key, _ in requests]


def test_a_draft_model_reads_the_prompts_drafting_could_repay():
    """Verifying any rows costs one 10 ms step: a request with 99 tokens to go could save
    up to about 0.97 s drafting alone, 0.49 s with a second request decoding, so the draft
    reads its 100-token prompt (0.1 s) and not a 2000-token one (2 s); once its drafts are
    measured to be accepted one node in twenty (1.05x at best), not even the short one."""
    cost = VerifyCost.fit([1, 2, 4, 8, 16, 32, 64], [0.010] * 7, decode_s=0.010)
    sp = Speculator(PromptReader())
    sp.cost = cost
    reqs = [SimpleNamespace(id=i, n_prompt=n, tokens=list(range(n)), params=SimpleNamespace(max_tokens=99))
            for i, n in enumerate((100, 2000))]
    batch = SimpleNamespace(chunks=[SimpleNamespace(start=0, tokens=r.tokens[:16], request=r, tree=None) for r in reqs])
    sp.prefilled(batch, 2)
    assert sp.drafter.read == [0]
    assert sp.gain_s(2, 99) == pytest.approx(99 * 0.010 / 2 * (1 - 1 / 33))  # chains of 32 all accepted
    for _ in range(10):  # one node in twenty accepted: a walk of one, 19 walks of none
        sp.acceptance.observe(np.full(10, 0.5), np.arange(10) == 0)
        for _ in range(18):
            sp.acceptance.observe(np.full(10, 0.5), np.zeros(10, bool))
    assert 0 < sp.acceptance.node_rate < 0.06  # the latest walks weigh most
    sp.prefilled(batch, 1)
    assert sp.drafter.read == [0]
