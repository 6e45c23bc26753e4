"""Speculative decoding: tree attention against the NumPy oracle, the KV a committed path
leaves, greedy identity with plain decoding for every drafter (tiny models and a real
one), the sampling rule's distribution, the budget, and the one-line errors."""

from types import SimpleNamespace

import numpy as np
import pytest

from llcinfer import LLM
from llcinfer.engine.speculation import Speculator, _may_pay
from llcinfer.engine.sampling import SamplingParams
from llcinfer.engine.transformer import Transformer
from llcinfer.errors import UsageError
from llcinfer.kv import PagedSequence, new_pool
from llcinfer.model.gguf_file import GGUFFile
from llcinfer.speculative import (Acceptance, DraftTree, Pacer, Gates, NgramDrafter, SuffixDrafter, VerifyCost, select_per_sequence,
                                  select_super_tree)

from llcinfer.speculative.pacer import CREDIT_STEPS, MARGIN, PROBE_EVERY
import naive
from tiny_models import isolated_runtime, write_tiny_model

FREE = VerifyCost(k_max=64, slope_s=0.0, base_s=1e-3, decode_s=1.0)  # every tree pays: the verification path runs


@pytest.fixture(scope="module", autouse=True)
def _runtime(tmp_path_factory):
    with isolated_runtime(tmp_path_factory.mktemp("llcinfer_home")):
        yield


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("spec_models")
    target = write_tiny_model(d / "target.gguf", "llama", "Q8_0", n_layer=3, seed=11, n_ctx=512)
    draft = write_tiny_model(d / "draft.gguf", "llama", "Q8_0", n_layer=1, seed=11, n_ctx=512)
    return target, draft


def random_tree(rng, n):
    parents = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)], np.int64)
    return parents


def path_of(parents, i):
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out[::-1]


@pytest.mark.parametrize("n_prefix,n_rows,kv_type", [(1, 5, "f32"), (15, 9, "f16"), (33, 17, "f16"), (40, 3, "f32")])
def test_tree_attention_equals_oracle_on_random_trees(n_prefix, n_rows, kv_type):
    rng = np.random.default_rng(n_prefix)
    L, KVH, H, D = 2, 2, 6, 32
    pool, _ = new_pool(L, KVH, D, 256, 3, kv_type, prefix_sharing=False)
    other = PagedSequence(pool, 256, None, "other")
    seq = PagedSequence(pool, 256, None, "tree")
    k = rng.standard_normal((n_prefix + n_rows, KVH, D)).astype(np.float32)
    v = rng.standard_normal((n_prefix + n_rows, KVH, D)).astype(np.float32)
    for i in range(n_prefix + n_rows):  # interleaved with another sequence: blocks scattered in the pool
        for s in (other, seq):
            s.prepare([0])
            s.store(1, s.n_tokens, k[i:i + 1], v[i:i + 1])
            s.finish([0], index=False)
    seq.truncate(n_prefix)
    seq.prepare([0] * n_rows)
    parents = random_tree(rng, n_rows)
    q = rng.standard_normal((n_rows, H, D)).astype(np.float32)
    out = np.empty_like(q)
    rows = seq.tree_rows(parents)
    seq.tree_attention(1, q, n_prefix, rows, 0.125, out)
    rows.release()
    kr, vr = seq.read(1, 0, n_prefix + n_rows)  # the stored values (f16-rounded when f16)
    for i in range(n_rows):
        keep = list(range(n_prefix)) + [n_prefix + a for a in path_of(parents, i)]
        want = naive.attention(q[i:i + 1], kr[keep], vr[keep], len(keep) - 1, 0.125)
        np.testing.assert_allclose(out[i:i + 1], want, rtol=2e-5, atol=2e-5)


def test_tree_rows_and_committed_path_match_plain_decoding_bit_for_bit(tiny):
    target, _ = tiny
    m = Transformer(GGUFFile(target))
    prompt = [5, 77, 12, 9, 140, 33, 21, 8, 61, 19, 100, 4, 7, 250, 66, 18, 30]  # 17: the tree crosses a block
    rng = np.random.default_rng(3)
    parents = random_tree(rng, 11)
    tokens = [int(t) for t in rng.integers(1, 200, 11)]
    tree_seq = m.new_cache(128)
    m.forward(prompt, tree_seq)
    logits = m.forward_chunks([(tree_seq, tokens)], np.arange(11), trees=[parents])
    for i in (10, 7, 3):
        path = path_of(parents, i)
        plain = m.new_cache(128)
        m.forward(prompt, plain)
        want = m.forward([tokens[a] for a in path], plain, all_logits=True)
        assert np.array_equal(logits[path], want)
    path = path_of(parents, 10)
    tree_seq.commit_path(len(prompt), path[1:])
    plain = m.new_cache(128)
    m.forward(prompt + [tokens[a] for a in path], plain)
    assert tree_seq.n_tokens == plain.n_tokens and tree_seq.tokens == plain.tokens
    for layer in range(m.config.n_layer):
        for got, want in zip(tree_seq.read(layer, 0, plain.n_tokens), plain.read(layer, 0, plain.n_tokens)):
            assert np.array_equal(got, want)


def _generate(llm, prompts, **kw):
    params = SamplingParams(**{"temperature": 0, "max_tokens": 40, "ignore_eos": True, **kw})
    return [c.token_ids for c in llm.engine.generate(prompts, params)]


@pytest.mark.parametrize("policy,executor", [("super-tree", True), ("per-sequence", True), ("super-tree", False)])
def test_greedy_identity_every_drafter_tiny_model(tiny, policy, executor, monkeypatch):
    """Chains verified on the executor, and trees on the batched pass (executor off)."""
    if not executor:
        monkeypatch.setenv("LLCINFER_EXECUTOR", "0")
    target, draft = tiny
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(1, 250, n)] for n in (3, 9, 17, 30, 41, 5)]
    prompts.append(prompts[1] * 3)  # a repeated prompt: lookup drafters find long matches
    plain = LLM(str(target), threads=2, n_ctx=512, n_seq=4)
    want = _generate(plain, prompts)
    plain.close()
    for spec in ("ngram", "suffix", f"draft:{draft}"):
        llm = LLM(str(target), threads=2, n_ctx=512, n_seq=4, speculative=spec, spec_policy=policy)
        assert (llm.engine.speculator.executor is not None) == executor
        if spec.startswith("draft:"):  # the draft's steps on its own executor, on the target's threads
            assert (getattr(llm.engine.speculator.drafter, "executor", None) is not None) == executor
        llm.engine.speculator.cost = FREE
        got = _generate(llm, prompts)
        st = llm.spec_stats
        llm.close()
        assert got == want, spec
        assert st.verified > 0 and st.accepted > 0, spec


def test_staged_draft_takes_the_guessed_tokens_its_own_steps_would_draft(tiny):
    """A guess rides in the draft's first step as extra rows: the chain equals the one the
    draft model drafts alone token by token (path confidences too), the guess's tokens up
    to its first wrong one taken from that one forward, and the draft's sequence holds the
    request's tokens and the chain's after them, as drafting alone leaves it."""
    from llcinfer.speculative.draft_model import DraftModelDrafter
    model = Transformer(GGUFFile(tiny[1]))
    tokens = [int(t) for t in np.random.default_rng(3).integers(1, 200, 37)]
    drafters, steps = [], []
    for _ in range(2):
        d = DraftModelDrafter(model, 256, 2, depth=12)
        d.min_conf = 0.0  # chains of the full depth
        d.prefill([("a", tokens[:-1])])
        calls = []
        step = d._step
        d._step = lambda chunks, want, step=step, calls=calls: calls.append(sum(want)) or step(chunks, want)
        drafters.append(d)
        steps.append(calls)
    alone, staged = drafters
    alone._guess = lambda key, toks, room: []
    oracle = alone.propose("a", tokens, 13)  # a chain of 12, and one root sibling
    chain = oracle.tokens[:12].tolist()
    assert steps[0] == [1] * 12 and alone._seqs["a"].tokens == tokens + chain[:-1]
    wrong = (chain[5] + 1) % model.config.vocab_size
    staged._guess = lambda key, toks, room: (chain[:5] + [wrong] + chain[6:])[:room]
    tree = staged.propose("a", tokens, 13)
    assert tree.tokens.tolist() == oracle.tokens.tolist() and tree.parents.tolist() == oracle.parents.tolist()
    np.testing.assert_allclose(tree.conf, oracle.conf, rtol=1e-5)
    assert steps[1] == [13] + [1] * 6  # 12 guessed rows: up to the wrong one, 6 chain tokens from the first step
    assert staged._seqs["a"].tokens == tokens + chain[:-1]


def test_where_the_text_repeats_the_draft_model_copies_without_running(tiny):
    """A request whose last 8 tokens occur earlier in it gets the lookup's continuation
    (the tokens that followed them) and the draft model runs no step; where nothing
    repeats it drafts again, reading first what it missed while copying."""
    from llcinfer.speculative.draft_model import REPEAT_MATCH, DraftModelDrafter
    model = Transformer(GGUFFile(tiny[1]))
    d = DraftModelDrafter(model, 256, 2, depth=4)
    d.min_conf = 0.0
    steps = []
    step = d._step
    d._step = lambda chunks, want: steps.append([len(t) for _, t in chunks]) or step(chunks, want)
    text = [int(t) for t in np.random.default_rng(9).integers(1, 200, 30)]
    d.prefill([("a", text)])
    tokens = text + text[:REPEAT_MATCH]
    assert d.guesses("a", tokens)
    tree = d.propose("a", tokens, 6)
    assert tree.best_chain().tokens.tolist() == text[REPEAT_MATCH:REPEAT_MATCH + 6] and steps == []
    assert d._seqs["a"].n_tokens == len(text)  # behind by the copied tokens
    tokens = tokens + [201, 202]  # new text: nothing repeats
    assert not d.guesses("a", tokens)
    tree = d.propose("a", tokens, 4)
    assert len(tree) == 4 and steps[0] == [REPEAT_MATCH + 2] and steps[1:] == [[1]] * 3
    assert d._seqs["a"].tokens[:len(tokens)] == tokens


@pytest.mark.parametrize("vocab", [7, 1001, 65537])
def test_draft_top_tokens_and_probabilities_equal_the_softmax_oracle(vocab):
    from llcinfer.speculative.draft_model import _top
    rng = np.random.default_rng(vocab)
    for _ in range(5):
        row = (3 * rng.standard_normal(vocab)).astype(np.float32)  # [vocab] logits
        p = np.exp(row.astype(np.float64) - row.max())
        p /= p.sum()
        for k in (1, 3):
            ids, probs = _top(row, k)
            assert ids.tolist() == np.argsort(-p, kind="stable")[:k].tolist()
            np.testing.assert_allclose(probs, p[ids], rtol=1e-5)


def test_a_draft_models_step_price_follows_its_timed_steps(tiny):
    """The draft step is priced from the weight bytes, then timed: every draft step of one
    sequence and one token (not the first, which catches the sequence up) moves step_s,
    and min_conf with it: (step + slope) / target decode step."""
    from llcinfer.speculative.draft_model import DraftModelDrafter
    model = Transformer(GGUFFile(tiny[1]))
    d = DraftModelDrafter(model, 256, 2, depth=6)
    d.price(0.010, 0.001, 4 * model.weights.nbytes)
    assert d.step_s == pytest.approx(0.0025, rel=0.05) and d.min_conf == pytest.approx(0.35, rel=0.05)
    timed = []
    d._timed_step = timed.append
    d.min_conf = 0.0  # chains of the full depth
    tokens = [int(t) for t in np.random.default_rng(5).integers(1, 200, 20)]
    d.propose("a", tokens, 6)
    assert len(timed) == 5 and all(t > 0 for t in timed)  # a chain of 6: 1 + 5 steps
    del d._timed_step
    for _ in range(40):
        d._timed_step(0.004)
    assert d.step_s == pytest.approx(0.004) and d.min_conf == pytest.approx(0.5)


@pytest.mark.parametrize("executor", [True, False])
def test_draft_head_of_the_first_token_ids_stays_lossless(tiny, executor, monkeypatch):
    """A draft model whose LM head covers the first 128 of 272 token ids proposes only
    those, and greedy output stays plain greedy's where the answer needs the others."""
    from llcinfer.speculative import draft_model

    if not executor:
        monkeypatch.setenv("LLCINFER_EXECUTOR", "0")
    monkeypatch.setattr(draft_model, "HEAD_ROWS", 128)
    proposed = []
    propose = draft_model.DraftModelDrafter.propose_many
    monkeypatch.setattr(draft_model.DraftModelDrafter, "propose_many",
                        lambda self, asks, chain=False: [proposed.append(t) or t for t in propose(self, asks, chain)])
    target, draft = tiny
    rng = np.random.default_rng(1)
    prompts = [[int(t) for t in rng.integers(1, 250, n)] for n in (4, 11, 23)]
    plain = LLM(str(target), threads=2, n_ctx=512, n_seq=4)
    want = _generate(plain, prompts)
    plain.close()
    llm = LLM(str(target), threads=2, n_ctx=512, n_seq=4, speculative=f"draft:{draft}")
    assert (llm.engine.speculator.drafter.executor is not None) == executor
    llm.engine.speculator.cost = FREE
    got = _generate(llm, prompts)
    st = llm.spec_stats
    row_s = llm.engine.speculator.drafter.row_s
    llm.close()
    assert got == want
    assert row_s > 0  # the 23-token prompt's prefill timed the draft's catch-up rows
    assert max(t for out in want for t in out) >= 128  # the answers need ids the head does not cover
    drafted = np.concatenate([t.tokens for t in proposed])
    assert len(drafted) and drafted.max() < 128
    assert st.accepted > 0


@pytest.mark.parametrize("model", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_greedy_identity_real_model_code_edit(model, monkeypatch):
    """The lookup drafters on a real code edit; Qwen copies the function with the rename
    the instruction asks for, and the drafters learn it (copy_edits.py)."""
    import inspect
    import textwrap

    from llcinfer.speculative import copy_edits

    llm = LLM(model, threads=2, n_ctx=2048, progress=False)
    instruction = "Rename the parameter `text` to `source`:\n\n"
    msgs = [{"role": "user", "content": instruction + inspect.getsource(textwrap.indent)}]
    want = llm.chat(msgs, max_tokens=96, temperature=0)
    llm.close()
    learned = []
    learn = copy_edits.CopyEdits.learn
    monkeypatch.setattr(copy_edits.CopyEdits, "learn", lambda self, a, b: (learned.append((a, b)), learn(self, a, b)))
    for spec in ("ngram", "suffix"):
        learned.clear()
        sp = LLM(model, threads=2, n_ctx=2048, progress=False, speculative=spec)
        assert sp.engine.speculator.executor is not None  # chains verified on the executor
        sp.engine.speculator.cost = FREE
        got = sp.chat(msgs, max_tokens=96, temperature=0)
        rename = (sp.tokenize("text"), sp.tokenize("source"))
        accepted = sp.spec_stats.accepted
        sp.close()
        assert got == want, spec
        assert accepted > 10, spec  # the answer copies the input: drafts are accepted
        if model.startswith("qwen"):
            assert [(a, b) for a, b in learned if ([a], [b]) == rename], spec


def test_sampling_same_seed_same_tokens_and_target_distribution(tiny):
    """With a seed, speculative sampling draws exactly the tokens plain sampling draws; over
    many seeds the tokens drawn at verified rows (the 2nd at the tree's root, the 3rd at an
    accepted node) follow the target's own distribution (chi-square)."""
    target, draft = tiny
    prompt = [5, 77, 12, 9]
    temp = 0.7
    kw = dict(temperature=temp, top_k=0, top_p=1.0, min_p=0.0, max_tokens=3, ignore_eos=True)
    plain = LLM(str(target), threads=1, n_ctx=256, n_seq=8)
    sp = LLM(str(target), threads=1, n_ctx=256, n_seq=8, speculative=f"draft:{draft}")
    sp.engine.speculator.cost = FREE
    sp.engine.speculator.pacer.paused = lambda resume_s=0.0: False  # every request drafts, whatever drafting costs here
    triples = []
    for s in range(600):
        a = _generate(plain, [prompt], seed=s, **kw)[0]
        b = _generate(sp, [prompt], seed=s, **kw)[0]
        assert a == b
        triples.append(tuple(b))
    st = sp.spec_stats
    assert st.verified > 0 and 0 < st.accepted < st.verified
    t = np.array(triples)  # [seed, 3]
    x1 = int(np.bincount(t[:, 0]).argmax())
    at1 = t[t[:, 0] == x1]
    x2 = int(np.bincount(at1[:, 1]).argmax())
    at2 = at1[at1[:, 1] == x2]
    checks = [(t[:, 0], prompt), (at1[:, 1], prompt + [x1]), (at2[:, 2], prompt + [x1, x2])]
    for sample, context in checks:
        assert sample.size >= 40
        assert _chi_square_ok(sample, _probs(plain.logits(context), temp))
    plain.close()
    sp.close()


def _probs(logits, temp):
    z = logits.astype(np.float64) / temp
    e = np.exp(z - z.max())
    return e / e.sum()


def _chi_square_ok(sample, p) -> bool:
    """Chi-square goodness of fit at 0.1 %, cells with expected count >= 5 (the rest pooled);
    the critical value by Wilson-Hilferty's approximation."""
    n = sample.size
    counts = np.bincount(sample, minlength=p.size).astype(np.float64)
    big = p * n >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(p[big] * n, p[~big].sum() * n)
    keep = exp > 0
    stat = (((obs - exp) ** 2)[keep] / exp[keep]).sum()
    k = max(int(keep.sum()) - 1, 1)
    critical = k * (1 - 2 / (9 * k) + 3.09 * np.sqrt(2 / (9 * k))) ** 3
    return stat < critical


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
    another request's history too."""
    rng = np.random.default_rng(5)
    for d in (NgramDrafter(max_match=8, min_match=2), SuffixDrafter(max_match=8, min_match=2)):
        if isinstance(d, SuffixDrafter):
            d.finish("old", rng.integers(0, 5, 60).tolist())
        for key in range(3):
            tokens = rng.integers(0, 5, 12).tolist()
            seen = set()
            for _ in range(40):
                got = {n: d.repeats(key, tokens, n) for n in (2, 5, 8)}  # the substitutions learned first
                matched = d.match_length(key) if len(d.propose(key, tokens, 4)) else 0
                assert got == {n: matched >= n for n in (2, 5, 8)}
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

    sp = Speculator(Behind())
    sp.cost, sp.pacer.plain_s = VerifyCost.fit([1, 2, 4, 8, 16, 32, 64], [0.010] * 7, decode_s=0.010), 0.010
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
        reqs = [SimpleNamespace(id=i, n_prompt=4, tokens=[1, 2, 3, 1, 2, 3], params=SimpleNamespace(max_tokens=99),
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

    sp = Speculator(Lagging())
    sp.cost = VerifyCost.fit([1, 2, 4, 8, 16, 32, 64], [0.010] * 7, decode_s=0.010)
    sp.pacer.plain_s = 0.010
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

    sp = Speculator(LateReader())
    sp.cost = VerifyCost.fit([1, 2, 4, 8, 16, 32, 64], [0.010] * 7, decode_s=0.010)
    sp.pacer.plain_s = 0.010
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


def test_bad_speculative_arguments_are_one_line_errors(tiny):
    target, draft = tiny
    with pytest.raises(UsageError, match="speculative must be one of"):
        LLM(str(target), threads=1, n_ctx=128, speculative="bogus")
    for bad, message in ((dict(speculative="draft:"), "speculative must be one of"),
                         (dict(speculative="ngram", spec_budget=0), "budget must be a positive integer"),
                         (dict(speculative="ngram", spec_policy="greedy"), "policy must be")):
        with pytest.raises(UsageError, match=message):  # before the model file is even looked for
            LLM(str(target.parent / "no-such-model.gguf"), threads=1, **bad)
    with pytest.raises(UsageError, match="not smaller than the target"):
        LLM(str(draft), threads=1, n_ctx=128, speculative=f"draft:{target}")
    with pytest.raises(UsageError, match="does not share the target's vocabulary"):
        LLM(str(target), threads=1, n_ctx=128, speculative="draft:qwen2.5-coder-0.5b", progress=False)
    with pytest.raises(UsageError, match="f16 or f32 KV"):
        LLM(str(target), threads=1, n_ctx=128, speculative="ngram", kv_type="int8")
