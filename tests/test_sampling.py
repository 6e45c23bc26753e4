"""Tests for llcinfer.sampling: parameter validation, the sampler chain, StopMatcher."""

import math

import numpy as np
import pytest

from llcinfer.errors import UsageError
from llcinfer.engine.sampling import Sampler, SamplingParams, StopMatcher, _top_indices, token_logprobs

OFF = dict(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0)


def draws(params, logits, n=2000, history=()):
    s = Sampler(params, len(logits))
    return np.array([s.sample(logits, history) for _ in range(n)])


def logits_of(probs, vocab=None):
    probs = np.asarray(probs, dtype=np.float64)
    out = np.full(vocab or len(probs), -np.inf, dtype=np.float32)
    out[: len(probs)] = np.log(probs)
    return out


# ---------------------------------------------------------------- validation

@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(temperature=-1), "temperature must be >= 0"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(temperature="hot"), "temperature"),
        (dict(top_p=1.5), "top_p must be in (0, 1]"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=float("nan")), "top_p"),
        (dict(min_p=-0.1), "min_p must be in [0, 1]"),
        (dict(min_p=1.1), "min_p"),
        (dict(repeat_penalty=0), "repeat_penalty must be > 0"),
        (dict(repeat_penalty=-1.0), "repeat_penalty"),
        (dict(repeat_last_n=-2), "repeat_last_n"),
        (dict(max_tokens=-1), "max_tokens must be >= 0"),
        (dict(max_tokens=1.5), "max_tokens"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_k=None), "top_k"),
        (dict(top_k=True), "top_k"),
        (dict(seed="abc"), "seed"),
        (dict(stop=("ok", "")), "stop"),
        (dict(stop=("ok", 3)), "stop"),
        (dict(stop=5), "stop"),
        (dict(ignore_eos="yes"), "ignore_eos"),
        (dict(logprobs=-1), "logprobs must be in [0, 20]"),
        (dict(logprobs=21), "logprobs"),
        (dict(logprobs="all"), "logprobs"),
    ],
)
def test_validation_errors(kwargs, name):
    with pytest.raises(UsageError) as exc:
        SamplingParams(**kwargs).validate()
    msg = str(exc.value)
    assert name in msg and "\n" not in msg


def test_validation_message_shows_value():
    with pytest.raises(UsageError, match=r"temperature must be >= 0 \(got -1\)"):
        SamplingParams(temperature=-1).validate()
    with pytest.raises(UsageError, match=r"top_p must be in \(0, 1\] \(got 1.5\)"):
        SamplingParams(top_p=1.5).validate()


def test_validation_coerces_and_accepts_edges():
    p = SamplingParams(temperature="0.5", top_k=40.0, top_p=1, min_p=0, max_tokens=0,
                       stop=["a", "b"], seed=-1).validate()
    assert p.temperature == 0.5 and isinstance(p.top_k, int) and p.top_k == 40
    assert p.stop == ("a", "b") and p.seed is None and p.max_tokens == 0
    assert SamplingParams(stop="END").validate().stop == ("END",)
    assert SamplingParams(top_k=-5).validate().top_k == -5  # <= 0 means off
    assert SamplingParams(temperature=0).greedy and not SamplingParams().greedy
    assert SamplingParams().validate() == SamplingParams()


def test_sampler_rejects_bad_logits_shape():
    s = Sampler(SamplingParams(seed=0), 10)
    with pytest.raises(ValueError):
        s.sample(np.zeros(11, np.float32), [])


# ---------------------------------------------------------------- chain

def test_greedy_is_argmax():
    rng = np.random.default_rng(0)
    s = Sampler(SamplingParams(temperature=0), 1000)
    for _ in range(20):
        x = rng.standard_normal(1000).astype(np.float32)
        assert s.sample(x, []) == int(np.argmax(x))


def test_seed_reproducibility():
    rng = np.random.default_rng(1)
    seq = [rng.standard_normal(500).astype(np.float32) for _ in range(50)]
    a = Sampler(SamplingParams(seed=42, **OFF), 500)
    b = Sampler(SamplingParams(seed=42, **OFF), 500)
    c = Sampler(SamplingParams(seed=43, **OFF), 500)
    ta = [a.sample(x, []) for x in seq]
    assert ta == [b.sample(x, []) for x in seq]
    assert ta != [c.sample(x, []) for x in seq]


def test_does_not_mutate_logits():
    """Neither the NaN mapping nor the penalty writes into the caller's row (the step
    loop hands the sampler the executor's own logits buffer)."""
    x = np.random.default_rng(2).standard_normal(300).astype(np.float32)
    finite, finite_before = x.copy(), x.copy()
    x[5] = np.nan
    before = x.copy()
    Sampler(SamplingParams(seed=0, repeat_penalty=1.5), 300).sample(x, [1, 2, 3])
    np.testing.assert_array_equal(x, before)
    for t in (0.0, 0.8):  # greedy and sampled, the penalty applied to tokens 1-3
        Sampler(SamplingParams(seed=0, temperature=t, repeat_penalty=1.5), 300).sample(finite, [1, 2, 3])
        np.testing.assert_array_equal(finite, finite_before)


def test_top_k_support():
    x = np.random.default_rng(3).standard_normal(5000).astype(np.float32)
    top = set(np.argsort(-x)[:7].tolist())
    got = draws(SamplingParams(seed=0, **{**OFF, "top_k": 7}), x)
    assert set(got.tolist()) <= top and len(set(got.tolist())) == 7


@pytest.mark.parametrize("n, k", [(152064, 40), (152064, 1), (1000, 999), (10, 3), (300000, 256)])
def test_top_indices_exact(n, k):
    x = np.random.default_rng(n + k).standard_normal(n).astype(np.float32)
    assert sorted(_top_indices(x, k).tolist()) == sorted(np.argsort(-x)[:k].tolist())


def test_top_indices_ties_and_inf():
    x = np.zeros(100000, np.float32)  # all tied: any k of them, no duplicates
    idx = _top_indices(x, 40)
    assert len(set(idx.tolist())) == 40
    x[:] = -np.inf
    x[[7, 99999]] = 1.0
    assert sorted(_top_indices(x, 2).tolist()) == [7, 99999]


PROBS = [0.5, 0.3, 0.1, 0.05, 0.03, 0.02]


@pytest.mark.parametrize("top_p, support", [(0.8, {0, 1}), (0.81, {0, 1, 2}), (0.5, {0}),
                                            (0.3, {0}), (1.0, set(range(6)))])
@pytest.mark.parametrize("top_k", [0, 40])
def test_top_p_minimal_nucleus(top_p, support, top_k):
    x = logits_of(PROBS, vocab=2000)
    x[len(PROBS):] = -30.0  # a long, negligible but finite tail
    got = set(draws(SamplingParams(seed=1, **{**OFF, "top_p": top_p, "top_k": top_k}), x).tolist())
    assert got == support


def test_top_p_without_top_k_large_vocab():
    # Flat tail with most mass outside any small top-m: exercises the widening search.
    rng = np.random.default_rng(4)
    x = rng.standard_normal(152064).astype(np.float32) * 0.1
    s = Sampler(SamplingParams(seed=0, **{**OFF, "top_p": 0.5}), len(x))
    order = np.argsort(-x.astype(np.float64), kind="stable")
    p = np.exp(x[order].astype(np.float64) - x.max())
    cum = np.cumsum(p) / p.sum()
    nucleus = set(order[: int(np.searchsorted(cum, 0.5 + 1e-6)) + 1].tolist())  # + tie slack
    got = {s.sample(x, []) for _ in range(40)}
    assert got <= nucleus


def test_top_p_uses_probabilities_of_top_k_candidates():
    x = logits_of([0.3, 0.2, 0.19, 0.11, 0.1, 0.1])
    # After top-k=3 the candidates renormalise to ~(0.43, 0.29, 0.27): p=0.7 keeps two.
    got = set(draws(SamplingParams(seed=5, **{**OFF, "top_k": 3, "top_p": 0.7}), x).tolist())
    assert got == {0, 1}
    got = set(draws(SamplingParams(seed=5, **{**OFF, "top_p": 0.7}), x).tolist())
    assert got == {0, 1, 2, 3}  # without top-k: cumulative 0.3, 0.5, 0.69, 0.8


def reference_support(x, p):
    """Support of llama.cpp's chain computed the slow way (full sort)."""
    x = x.astype(np.float64)
    order = np.argsort(-x, kind="stable")
    if p.top_k > 0:
        order = order[: p.top_k]
    v = x[order]
    if p.top_p < 1:
        c = np.cumsum(np.exp(v - v[0]))
        keep = int(np.searchsorted(c, p.top_p * c[-1])) + 1
        order, v = order[:keep], v[:keep]
    if p.min_p > 0:
        order = order[v >= v[0] + math.log(p.min_p)]
    return set(order.tolist())


@pytest.mark.parametrize("top_k, top_p, min_p", [(40, 0.95, 0.05), (0, 0.9, 0.0), (0, 0.95, 0.05),
                                                 (100, 1.0, 0.01), (40, 0.5, 0.0)])
def test_chain_matches_reference_on_large_vocab(top_k, top_p, min_p):
    rng = np.random.default_rng(top_k)
    x = (rng.standard_normal(152064) * 3.5).astype(np.float32)
    p = SamplingParams(seed=6, temperature=1.5, top_k=top_k, top_p=top_p, min_p=min_p)
    ref = reference_support(x, p)
    s = Sampler(p, len(x))
    got = {s.sample(x, []) for _ in range(300)}
    assert got <= ref and len(got) > min(3, len(ref) - 1)


def test_min_p_support():
    probs = np.array([0.4, 0.3, 0.15, 0.1, 0.05])
    x = logits_of(probs)
    for min_p, allowed in [(0.3, {0, 1, 2}), (0.2, {0, 1, 2, 3}), (0.9, {0}), (0.0, set(range(5)))]:
        got = set(draws(SamplingParams(seed=2, **{**OFF, "min_p": min_p}), x, n=3000).tolist())
        assert got == allowed, (min_p, got)


def test_temperature_sharpens_and_flattens():
    x = logits_of([0.6, 0.3, 0.1])
    freq = {t: np.bincount(draws(SamplingParams(seed=3, **{**OFF, "temperature": t}), x, 4000),
                           minlength=3) / 4000 for t in (0.5, 1.0, 2.0)}
    assert freq[0.5][0] > freq[1.0][0] + 0.05 > freq[2.0][0] + 0.1
    assert freq[0.5][2] < freq[1.0][2] < freq[2.0][2]


def test_matches_softmax_when_everything_off():
    rng = np.random.default_rng(5)
    x = rng.standard_normal(8).astype(np.float32)
    p = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    n = 20000
    counts = np.bincount(draws(SamplingParams(seed=4, **OFF), x, n), minlength=8)
    chi2 = float(((counts - n * p) ** 2 / (n * p)).sum())
    assert chi2 < 24.3  # 7 dof, p = 0.001


def test_repeat_penalty_rule_and_window():
    x = np.array([2.0, -2.0, 1.0, 1.0, 0.5], dtype=np.float32)
    s = Sampler(SamplingParams(repeat_penalty=4.0, repeat_last_n=2), 5)
    out = s._penalize(x.copy(), [2, 3, 0, 1, 1])  # window = [1, 1]: only token 1
    np.testing.assert_allclose(out, [2.0, -8.0, 1.0, 1.0, 0.5])
    out = s._penalize(x.copy(), [1, 0])  # window = [1, 0]
    np.testing.assert_allclose(out, [0.5, -8.0, 1.0, 1.0, 0.5])
    whole = Sampler(SamplingParams(repeat_penalty=2.0, repeat_last_n=-1), 5)
    np.testing.assert_allclose(whole._penalize(x.copy(), np.array([0, 1, 0, 9, -1])),
                               [1.0, -4.0, 1.0, 1.0, 0.5])  # out-of-range ids ignored
    off = Sampler(SamplingParams(repeat_penalty=2.0, repeat_last_n=0), 5)
    np.testing.assert_allclose(off._penalize(x.copy(), [0, 1]), x)


def test_repeat_penalty_changes_greedy_choice():
    x = np.array([3.0, 2.0, -1.0], dtype=np.float32)
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=2.0, repeat_last_n=64), 3)
    assert s.sample(x, []) == 0
    assert s.sample(x, [0]) == 1  # 3/2 = 1.5 < 2
    assert s.sample(x, [0] + [2] * 64) == 0  # token 0 fell out of the window


def test_nan_and_inf_logits():
    x = np.full(50, np.nan, dtype=np.float32)
    x[[10, 20]] = [1.0, 2.0]
    assert Sampler(SamplingParams(temperature=0), 50).sample(x, []) == 20
    got = set(draws(SamplingParams(seed=0, **OFF), x, 500).tolist())
    assert got <= {10, 20} and got
    x[30] = np.inf
    assert set(draws(SamplingParams(seed=0), x, 200).tolist()) == {30}
    allbad = np.full(50, np.nan, dtype=np.float32)
    allbad[3:] = -np.inf
    assert Sampler(SamplingParams(seed=0), 50).sample(allbad, []) in range(50)
    assert Sampler(SamplingParams(seed=0), 50).sample(np.full(50, -np.inf, np.float32), []) == 0


def test_accepts_float64_and_list_logits():
    s = Sampler(SamplingParams(temperature=0), 4)
    assert s.sample([0.0, 5.0, 1.0, 2.0], (1,)) == 1
    assert s.sample(np.array([0.0, 5.0, 1.0, 7.0]), np.array([1])) == 3


# ---------------------------------------------------------------- StopMatcher

def run_stream(stops, chunks):
    m = StopMatcher(stops)
    out, stopped = "", False
    for c in chunks:
        text, stopped = m.push(c)
        out += text
        if stopped:
            break
    return (out if stopped else out + m.flush()), stopped


def test_stop_split_across_pushes():
    assert run_stream(["</s>"], ["Hello <", "/", "s> tail"]) == ("Hello ", True)


def test_stop_holds_back_only_possible_prefix():
    m = StopMatcher(["STOP"])
    assert m.push("abc ST") == ("abc ", False)
    assert m.push("X") == ("STX", False)
    assert m.flush() == ""


def test_multiple_stops_earliest_wins():
    assert run_stream(["world", "lo"], ["hello world"]) == ("hel", True)
    assert run_stream(["\n\n", "User:"], ["Hi", " there", "\nUs", "er: x"]) == ("Hi there\n", True)


def test_no_stop():
    assert run_stream(["xyz"], ["abc", "xy", "x done"]) == ("abcxyx done", False)
    assert run_stream([], ["a", "b"]) == ("ab", False)
    m = StopMatcher(["xyz"])
    assert m.push("ab xy") == ("ab ", False)
    assert m.flush() == "xy"


def test_stop_at_very_start():
    assert run_stream(["###"], ["###", "more"]) == ("", True)
    m = StopMatcher(["###"])
    assert m.push("#") == ("", False)
    assert m.push("##rest") == ("", True)
    assert m.push("later") == ("", True) and m.flush() == ""


def test_overlapping_prefixes():
    assert run_stream(["abc"], ["a", "b", "a", "b", "c", "d"]) == ("ab", True)
    assert run_stream(["aab"], ["a", "a", "a", "a", "b"]) == ("aa", True)
    assert run_stream(["ab", "abcd"], ["xab", "cd"]) == ("x", True)
    assert run_stream(["abcd", "bc"], ["ab", "c"]) == ("a", True)


def test_unicode_and_single_char_stop():
    assert run_stream(["。"], ["你好", "。再见"]) == ("你好", True)
    assert run_stream(["\n"], ["line one", "\nline two"]) == ("line one", True)


# ---------------------------------------------------------------- log-probabilities

@pytest.mark.parametrize("vocab, top_n", [(1, 0), (7, 3), (997, 5), (49157, 20)])
def test_token_logprobs_match_log_softmax(vocab, top_n):
    x = np.random.default_rng(vocab).normal(0, 4, vocab).astype(np.float32)
    x[vocab // 2] = -np.inf if vocab > 1 else x[0]
    ref = x.astype(np.float64) - np.log(np.exp(x.astype(np.float64) - x.max()).sum()) - x.max()
    token = vocab - 1
    lp, top = token_logprobs(x, token, top_n)
    assert lp == pytest.approx(ref[token], abs=1e-4)
    want = np.argsort(-ref, kind="stable")[: min(top_n, vocab)]
    assert [t for t, _ in top] == want.tolist()
    assert [v for _, v in top] == pytest.approx(ref[want].tolist(), abs=1e-4)
