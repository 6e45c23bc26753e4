"""The pacer's account of what speculation gains and costs against plain decoding, and
the decode step the speculator follows as it measures."""

from types import SimpleNamespace

import pytest

from llcinfer.engine.speculation import Speculator
from llcinfer.speculative import Pacer, NgramDrafter, VerifyCost
from llcinfer.speculative.pacer import COPY_STEPS, CREDIT_STEPS, MARGIN, PROBE_EVERY

from spec_helpers import FREE


def test_pacer_pauses_drafting_that_costs_more_than_its_margin():
    pacer = Pacer()
    assert pacer.paused()  # no plain figure yet: the first step is timed plain
    pacer.record("plain", 0.008)
    for _ in range(50):  # a lookup finding nothing at MARGIN / 2 of a step: never paused
        assert not pacer.paused()
        pacer.record("drafted", 0.008 * (1 + MARGIN / 2), drafting=MARGIN / 2 * 0.008)
    steps, drafting = 0, 0
    for _ in range(400):  # a dearer one finding nothing, 4 * MARGIN of a step: one step in four drafts
        steps += 1
        if pacer.paused():
            pacer.record("plain", 0.008)
            continue
        drafting += 1
        pacer.record("drafted", 0.008 * (1 + 4 * MARGIN), drafting=4 * MARGIN * 0.008)
    assert drafting * 4 * MARGIN * 0.008 == pytest.approx(MARGIN * 0.008 * steps, rel=0.05)
    pacer.record("drafted", 0.088, drafting=0.080)  # a draft model catching up: 10 plain steps
    paused = 0
    while pacer.paused():
        paused += 1
        pacer.record("plain", 0.008)
    assert paused == pytest.approx(10 / MARGIN, abs=2)  # it costs at most MARGIN of the time


def test_pacer_banks_what_speculation_gains_for_the_verifications_that_fail():
    pacer = Pacer()
    pacer.paused()
    pacer.record("plain", 0.008)
    for _ in range(4):  # copying: 8 tokens a verification of 2 plain steps
        assert not pacer.paused()
        pacer.record("verified", 0.016, tokens=8)
    assert pacer.credit == pytest.approx(CREDIT_STEPS * 0.008)  # banked up to CREDIT_STEPS plain steps
    pacer.record("verified", 0.016, tokens=1)  # where the target leaves the text: paid from the bank
    assert not pacer.paused()
    for _ in range(200):  # verifications that keep failing spend the bank ...
        if pacer.paused():
            pacer.record("plain", 0.008)  # (the probe of the plain figure)
        pacer.record("verified", 0.016, tokens=1)
    assert pacer.credit == 0.0  # ... and are never a debt: whether the next one is verified is
    # for the drafts' measured worth to decide (Acceptance)
    pacer.record("verified", 0.017, tokens=1, drafting=0.001)  # its drafting is
    assert pacer.paused()


def test_overdrawn_drafting_goes_on_where_the_text_repeats_until_it_costs_copy_steps():
    """Paused for an overdraft, drafting on repeating text (copies) is allowed until it has
    cost COPY_STEPS plain steps without a gain, its verifications' losses counted; a
    verification that gains renews the allowance, and so do new requests."""
    pacer = Pacer()
    pacer.record("plain", 0.010)
    assert not pacer.paused() and not pacer.copies()  # not overdrawn: drafting as usual
    pacer.record("drafted", 0.011, drafting=0.001)
    assert pacer.paused() and pacer.copies()
    copies = 0
    while pacer.paused() and pacer.copies():  # repeating text whose drafts verify nothing
        copies += 1
        pacer.record("drafted", 0.011, drafting=0.001, copying=True)
    assert copies == pytest.approx(COPY_STEPS * 10, abs=1) and pacer.credit < 0
    pacer.record("plain", 0.010)  # ... nor does the margin renew it
    assert pacer.paused() and not pacer.copies()
    pacer.fresh()
    assert pacer.paused() and not pacer.overdrawn  # new requests: the plain figure's probe first ...
    pacer.record("plain", 0.010)
    pacer.credit = -0.001
    assert pacer.paused() and pacer.copies()  # ... and the allowance renewed
    for _ in range(COPY_STEPS * 10 - 11):
        pacer.record("drafted", 0.011, drafting=0.001, copying=True)
    pacer.record("verified", 0.020, tokens=1, drafting=0.001, copying=True)  # one that lost 9 ms, as 9 drafts
    assert pacer.copies()
    pacer.record("drafted", 0.011, drafting=0.001, copying=True)
    assert not pacer.copies()
    pacer.record("verified", 0.012, tokens=8, drafting=0.001, copying=True)  # a copy that gained
    assert pacer.copy_spent == 0.0 and pacer.credit > 0 and not pacer.paused()


def test_pacer_keeps_its_plain_figure_current():
    """A plain figure taken while the process ran cold (twice too slow) would make slower
    speculation look fast for ever: a faster step that verified nothing replaces it at
    once (less its drafting), and a plain probe every PROBE_EVERY verifying steps brings
    one."""
    pacer = Pacer()
    pacer.paused()
    pacer.record("plain", 0.016)  # cold
    for _ in range(PROBE_EVERY):
        assert not pacer.paused()
        pacer.record("verified", 0.009, tokens=1)
    assert pacer.paused()  # the probe
    pacer.record("plain", 0.008)
    assert pacer.plain_s == 0.008  # taken whole
    pacer.record("plain", 0.010)  # a slower one moves the figure by EMA only
    assert 0.008 < pacer.plain_s < 0.010
    pacer.record("drafted", 0.0075, drafting=0.0005)
    assert pacer.plain_s == pytest.approx(0.007)
    fresh = Pacer()
    fresh.record("plain", 0.008)
    for _ in range(PROBE_EVERY):
        fresh.record("verified", 0.004)
    assert fresh.paused() and not fresh.paused()  # a probe is one step, even when it went unrecorded


def test_a_new_workload_times_plain_decoding_again():
    """Plain steps timed fast (a quiet minute) would make speculation look slow for the next
    request, and ones timed slow make it look fast: when new requests decode, the next
    step is plain and its time replaces the figure whole, slower or faster."""
    pacer = Pacer()
    pacer.record("plain", 0.008)
    for _ in range(4):
        assert not pacer.paused()
        pacer.record("verified", 0.009, tokens=2)
    pacer.fresh()
    assert pacer.paused() and pacer.credit > 0  # the bank stays: only a debt is forgiven
    pacer.record("plain", 0.012)
    assert pacer.plain_s == 0.012 and not pacer.paused()
    pacer.record("plain", 0.016)  # after it, a slower step moves the figure by EMA only
    assert 0.012 < pacer.plain_s < 0.016


def test_pacer_weighs_steps_by_the_tokens_they_gained():
    """Verifications of 88 ms that keep 8 tokens and 1 token in turn take 9.8 ms a token
    against plain's 30: the account gains (an average of the steps' own rates, 11 and 88
    ms, would call it slower), and drafting goes on."""
    pacer = Pacer()
    pacer.record("plain", 0.030)
    plain = 0
    for i in range(40):
        if pacer.paused():
            plain += 1
            pacer.record("plain", 0.030)
        pacer.record("verified", 0.088, tokens=1 if i % 2 else 8)
    assert pacer.credit > 0.030 and plain == 40 // PROBE_EVERY  # the probes of the plain figure only


def test_speculator_follows_the_decode_steps_it_measures():
    """Plain one-sequence steps (drafting time taken out) slower than the start-up
    measurement raise the verification cost's decode step and its bandwidth-bound rows;
    a cost set by hand without a curve (FREE) is left as it is."""
    sp = Speculator(NgramDrafter(), budget=6)
    sp.cost = VerifyCost.fit([1, 2, 4, 8], [0.020, 0.024, 0.030, 0.050], decode_s=0.021)
    sp.cost.k_max = 6
    req = SimpleNamespace(n_prompt=4, tokens=list(range(10)))
    batch = SimpleNamespace(chunks=[SimpleNamespace(start=9, request=req, tree=None)])
    assert sp.current_cost() is sp.cost
    for _ in range(20):
        req.tokens.append(1)
        sp.record_step(batch, [len(req.tokens) - 1], 0.030)  # plain: not drafted
    now = sp.current_cost()
    assert now.decode_s == pytest.approx(0.030, rel=1e-3) and now.seconds(8) == 0.050
    assert now.k_max == 6  # the budget given stays
    assert sp.current_cost() is now  # refitted only when the decode time moves
    sp.cost = FREE
    assert sp.current_cost() is FREE
