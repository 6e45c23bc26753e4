"""Speculative decoding end to end: tree attention against the NumPy oracle, the KV a
committed path leaves, greedy identity with plain decoding for every drafter (tiny models
and a real one), the sampling rule's distribution, and the one-line errors.  The parts:
test_draft_model.py, test_lookup_drafters.py, test_spec_budget.py, test_spec_pacer.py and
test_spec_decisions.py."""

import numpy as np
import pytest

from llcinfer import LLM
from llcinfer.engine.transformer import Transformer
from llcinfer.errors import UsageError
from llcinfer.kv import PagedSequence, new_pool
from llcinfer.model.gguf_file import GGUFFile

import naive
from spec_helpers import FREE, generate_tokens, write_spec_pair
from tiny_models import isolated_runtime


@pytest.fixture(scope="module", autouse=True)
def _runtime(tmp_path_factory):
    with isolated_runtime(tmp_path_factory.mktemp("llcinfer_home")):
        yield


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_spec_pair(tmp_path_factory.mktemp("spec_models"))


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
    want = generate_tokens(plain, prompts)
    plain.close()
    for spec in ("ngram", "suffix", f"draft:{draft}"):
        llm = LLM(str(target), threads=2, n_ctx=512, n_seq=4, speculative=spec, spec_policy=policy)
        assert (llm.engine.speculator.executor is not None) == executor
        if spec.startswith("draft:"):  # the draft's steps on its own executor, on the target's threads
            assert (getattr(llm.engine.speculator.drafter, "executor", None) is not None) == executor
        llm.engine.speculator.cost = FREE
        got = generate_tokens(llm, prompts)
        st = llm.spec_stats
        llm.close()
        assert got == want, spec
        assert st.verified > 0 and st.accepted > 0, spec


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
        a = generate_tokens(plain, [prompt], seed=s, **kw)[0]
        b = generate_tokens(sp, [prompt], seed=s, **kw)[0]
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
