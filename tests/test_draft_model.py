"""The draft-model drafter: staged drafting with guessed tokens, copying where the text
repeats, its top tokens against the softmax oracle, its step price, and its LM head of
the first token ids staying lossless."""

import numpy as np
import pytest

from llcinfer import LLM
from llcinfer.engine.transformer import Transformer
from llcinfer.model.gguf_file import GGUFFile

from spec_helpers import FREE, generate_tokens, write_spec_pair
from tiny_models import isolated_runtime


@pytest.fixture(scope="module", autouse=True)
def _runtime(tmp_path_factory):
    with isolated_runtime(tmp_path_factory.mktemp("llcinfer_home")):
        yield


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_spec_pair(tmp_path_factory.mktemp("spec_models"))


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
    want = generate_tokens(plain, prompts)
    plain.close()
    llm = LLM(str(target), threads=2, n_ctx=512, n_seq=4, speculative=f"draft:{draft}")
    assert (llm.engine.speculator.drafter.executor is not None) == executor
    llm.engine.speculator.cost = FREE
    got = generate_tokens(llm, prompts)
    st = llm.spec_stats
    row_s = llm.engine.speculator.drafter.row_s
    llm.close()
    assert got == want
    assert row_s > 0  # the 23-token prompt's prefill timed the draft's catch-up rows
    assert max(t for out in want for t in out) >= 128  # the answers need ids the head does not cover
    drafted = np.concatenate([t.tokens for t in proposed])
    assert len(drafted) and drafted.max() < 128
    assert st.accepted > 0
