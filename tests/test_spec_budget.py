"""The verification budget: best chains, the acceptance scale of confidences, the
super-tree and per-sequence selections, what pays against a plain step (against a
one-node-at-a-time oracle), the speedup of drafts and the confidence gates."""

import numpy as np
import pytest

from llcinfer.engine.speculation import Speculator, _may_pay
from llcinfer.speculative import Acceptance, DraftTree, Gates, NgramDrafter, VerifyCost, select_per_sequence, select_super_tree


def test_best_chain_follows_the_most_confident_child():
    tree = DraftTree(np.array([10, 11, 12, 13, 14]), np.array([-1, -1, 0, 0, 3]), np.array([0.3, 0.6, 0.2, 0.25, 0.1]))
    assert not tree.is_chain
    chain = tree.best_chain()
    assert chain.is_chain and chain.tokens.tolist() == [11]  # the root's best child has no children
    tree.conf[:] = [0.7, 0.2, 0.3, 0.5, 0.4]
    chain = tree.best_chain()
    assert chain.tokens.tolist() == [10, 13, 14] and chain.conf.tolist() == [0.7, 0.5, 0.4]
    assert chain.best_chain() is chain and DraftTree.empty().best_chain().is_chain


def test_acceptance_scales_confidence_by_what_was_accepted():
    acc = Acceptance()
    assert acc.ratio == 1.0
    for _ in range(30):  # claimed 0.5 a node, one node in ten accepted
        acc.observe(np.full(10, 0.5), np.arange(10) == 0)
    assert 0.15 < acc.ratio < 0.25
    tree = DraftTree.chain([4, 5], [0.5, 0.4])
    assert np.allclose(acc.scale(tree, 0.2).conf, [0.1, 0.08])
    # an unverified chain is checked against the tokens decoding then produced
    acc.shadow("r", 3, DraftTree.chain([7, 8, 9], [0.9, 0.8, 0.7]))
    before = acc.accepted
    acc.resolve("r", [0, 1, 2, 3, 7])  # only node 0 known, and right: undecided
    assert acc.accepted == before
    acc.resolve("r", [0, 1, 2, 3, 7, 8, 1])  # node 2 wrong: nodes 0 and 1 accepted
    assert acc.accepted == pytest.approx(0.9 * before + 2)
    acc.resolve("r", [0, 1, 2, 3, 7, 8, 9])  # resolved once only
    assert acc.accepted == pytest.approx(0.9 * before + 2)
    for _ in range(60):  # the drafts become good again
        acc.observe(np.full(4, 0.5), np.ones(4, bool))
    assert acc.ratio == 1.0


def test_super_tree_budget_ranks_across_sequences_and_keeps_ancestors():
    confident = DraftTree.chain([1, 2, 3, 4, 5], [0.9, 0.85, 0.8, 0.7, 0.6])
    weak = DraftTree(np.array([6, 7, 8]), np.array([-1, 0, -1]), np.array([0.3, 0.05, 0.2]))
    cost = VerifyCost(k_max=7, slope_s=0.01, base_s=0.01, decode_s=0.02)  # break-even 0.5 past the knee
    a, b = select_super_tree([confident, weak], cost, None, max_rows=64)
    assert len(a) == 5  # the confident chain goes deep
    assert b.tokens.tolist() == []  # 2 roots + 5 rows reach the knee; the weak nodes are below break-even
    a2, b2 = select_per_sequence([confident, weak], cost, max_rows=64)
    assert len(a2) == 2 and len(b2) == 2 and b2.tokens.tolist() == [6, 8]
    for t in (a, b, a2, b2):
        assert np.all(t.parents < np.arange(len(t)))


def test_drafts_pay_against_a_plain_step_of_as_many_rows():
    """With n sequences decoding, plain decoding makes n tokens in a step of n rows, not in
    the one-row step: 4 chains of 0.9 / 0.8 pay for their 8 rows (10.8 expected tokens in
    32 ms against 4 in 15 ms), where against 4 tokens in the 10 ms one-row step none would."""
    sp = Speculator(NgramDrafter())
    cost = VerifyCost.fit([1, 2, 4, 8, 16], [0.010, 0.011, 0.015, 0.024, 0.040], decode_s=0.010)
    kept = sp._pays([DraftTree.chain([1, 2], [0.9, 0.8]) for _ in range(4)], cost)
    assert [len(t) for t in kept] == [2, 2, 2, 2]
    (alone,) = sp._pays([DraftTree.chain([1], [0.05])], cost)  # 1.05 tokens in 11 ms: slower than plain
    assert len(alone) == 0


def _random_chains(rng, conf_of) -> tuple[VerifyCost, list[DraftTree]]:
    """A random cost curve and 1-4 chains of 0-12 nodes, ``conf_of(k)`` the confidences
    of a chain of k."""
    cost = VerifyCost.fit([1, 2, 4, 8, 16, 32, 64], np.cumsum(rng.uniform(0.0005, 0.004, 7)).tolist(),
                          decode_s=float(rng.uniform(0.002, 0.006)))
    lengths = [int(rng.integers(0, 13)) for _ in range(int(rng.integers(1, 5)))]
    return cost, [DraftTree(np.arange(k, dtype=np.int64), np.arange(-1, k - 1, dtype=np.int64), conf_of(k))
                  for k in lengths]


def test_pays_keeps_the_nodes_a_one_node_at_a_time_oracle_keeps():
    """The vectorised rate test against its readable form: add the best nodes one at a
    time, keep the count of the highest expected tokens per second, if it beats plain."""
    def oracle(trees, cost):
        n = len(trees)
        cand = sorted((-float(t.conf[i]), s, i) for s, t in enumerate(trees) for i in range(len(t)))
        best_r, best, expected = 0, n / cost.plain_s(n), float(n)
        for r, (neg_conf, _, _) in enumerate(cand, 1):
            expected -= neg_conf
            if expected / cost.seconds(n + r) > best:
                best_r, best = r, expected / cost.seconds(n + r)
        return {(s, i) for _, s, i in cand[:best_r]}

    rng = np.random.default_rng(7)
    sp = Speculator(NgramDrafter())
    for case in range(60):
        cost, trees = _random_chains(rng, lambda k: np.round(np.cumprod(rng.uniform(0.3, 1.0, k)), 1 + case % 3))
        kept = sp._pays(trees, cost)  # confidences rounded: ties across trees
        assert {(s, int(i)) for s, t in enumerate(trees) for i in range(len(t))
                if t.tokens[i] in kept[s].tokens} == oracle(trees, cost)


def test_may_pay_is_false_only_where_the_budget_and_pays_keep_nothing():
    """The early exit of a step's drafts against the whole selection (the super-tree or
    per-sequence budget, then _pays): where it says no node can pay, none is kept; over
    random batches it also lets through every batch where some node is kept."""
    rng = np.random.default_rng(11)
    sp = Speculator(NgramDrafter())
    kept_any = exited = 0
    for case in range(200):
        cost, trees = _random_chains(rng, lambda k: np.cumprod(rng.uniform(0.02, 1.0, k)) * rng.uniform(0.05, 1.0))
        for select in (lambda t: select_super_tree(t, cost, None, 64), lambda t: select_per_sequence(t, cost, 64)):
            kept = sum(len(t) for t in sp._pays(select(trees), cost))
            if not _may_pay(trees, cost):
                exited += 1
                assert kept == 0, case
            kept_any += kept > 0
    assert exited > 20 and kept_any > 20  # both sides of the test were exercised


def test_acceptance_rate_per_node_counts_the_walks_a_rejection_ended():
    acc = Acceptance()
    assert acc.node_rate == 1.0  # trusted until measured
    for _ in range(100):  # chains of 4: three accepted, then a rejection
        acc.observe(np.full(4, 0.5), np.arange(4) < 3)
    assert acc.node_rate == pytest.approx(0.75, abs=1e-3)
    for _ in range(100):  # a tree whose walk accepted its chain and left the root's siblings
        acc.observe(np.full(4, 0.5), np.arange(4) < 3, rejected=False)
    assert acc.node_rate > 0.999


def test_speedup_of_drafts_accepted_with_a_probability():
    """Any number of rows verified in one plain step's time: one sequence speculating gets
    1 + a + a^2 + ... tokens a step, two get as much each with half the rows apiece; a
    3 ms draft step per token drafted makes deep chains cost."""
    cost = VerifyCost.fit([1, 2, 4, 8, 16, 32, 64], [0.010] * 7, decode_s=0.010)
    assert cost.speedup(1, accept=1.0, max_rows=8) == pytest.approx(9.0)
    assert cost.speedup(1, accept=0.5) == pytest.approx(2.0)
    assert cost.speedup(2, accept=0.5) == pytest.approx(2.0)
    assert cost.speedup(2, accept=0.5, max_rows=3) == pytest.approx((2 + 0.75 + 0.5) / 2)
    assert cost.speedup(1, 0.003, accept=0.5) == pytest.approx(1.5 / 1.3)  # one row: 1.5 tokens in 13 ms
    assert cost.can_pay(1, 0.003) and not cost.can_pay(1, 0.010 * 64)


def test_gates_calibrate_on_separating_depths():
    g = Gates(warmup_steps=4)
    rng = np.random.default_rng(0)
    for _ in range(4):
        conf = rng.uniform(0, 1, 40)
        depth = rng.integers(1, 4, 40)
        g.record(depth, conf, conf > 0.5, break_even=0.2)
    assert g.calibrated and 1 in g.thresholds
    assert 0.2 < g.thresholds[1] <= 0.6
    cut = g.cut(DraftTree.chain([1, 2, 3], [0.1, 0.1, 0.05]))
    assert len(cut) == 0
