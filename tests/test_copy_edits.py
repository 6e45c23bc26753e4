"""Prompt lookup that learns the target's edits (speculative/copy_edits.py): the edited
prompt's occurrences against a plain scan, substitutions learned and unlearned, and a
drafter that copies an edited prompt in fewer verifications than plain lookup does."""

import numpy as np
import pytest

from llcinfer.speculative import NgramDrafter, SuffixDrafter
from llcinfer.speculative import copy_edits
from llcinfer.speculative.copy_edits import MAX_SUBSTITUTIONS, CopyEdits


def scan_ends(edited: list[int], pattern: tuple[int, ...]) -> list[int]:
    """The oracle: every e with edited[e - n:e] == pattern and a token after it."""
    n = len(pattern)
    return [e for e in range(n, len(edited)) if tuple(edited[e - n:e]) == pattern]


@pytest.mark.parametrize("size", [1, 2, 7, 61, 300])
def test_ends_match_a_plain_scan_of_the_edited_prompt(size):
    rng = np.random.default_rng(size)
    prompt = rng.integers(0, 5, size).tolist()  # a small alphabet: many repeats
    ed = CopyEdits(prompt)
    ed.learn(2, 9)
    ed.learn(4, 0)
    edited = [{2: 9, 4: 0}.get(t, t) for t in prompt]
    assert ed.edited.tolist() == edited
    for n in (1, 2, 3, 5):
        for start in range(0, max(size - n, 0) + 1, 3):
            pattern = tuple(edited[start:start + n])
            if len(pattern) == n:
                assert ed.ends(pattern) == scan_ends(edited, pattern)
        assert ed.ends((7,) * n) == []
    for end in range(0, size + 1, 5):  # every suffix length of the last 5 tokens up to ``end`` at once
        suffix = edited[max(0, end - 5):end]
        got = ed.ends_upto(suffix)
        assert got == [scan_ends(edited, tuple(suffix[-n:])) for n in range(1, len(suffix) + 1)]
    ed.learn(1, 2)  # a substitution learned after lookups: they see it
    edited = [{1: 2}.get(t, t) for t in edited]
    for start in range(0, max(size - 2, 0) + 1, 3):
        assert ed.ends(tuple(edited[start:start + 2])) == scan_ends(edited, tuple(edited[start:start + 2]))


def test_substitutions_learned_undone_and_bounded():
    ed = CopyEdits([5, 1, 5, 2, 5])
    ed.learn(5, 6)
    assert ed.edited.tolist() == [6, 1, 6, 2, 6] and ed.subs == {5: 6}
    ed.learn(5, 7)  # learned again from what the target wrote instead
    assert ed.edited.tolist() == [7, 1, 7, 2, 7]
    ed.learn(5, 5)  # the target kept the prompt's token: dropped
    assert ed.edited.tolist() == [5, 1, 5, 2, 5] and ed.subs == {}
    ed.learn(3, 3)  # nothing to drop
    assert ed.subs == {}
    big = CopyEdits(list(range(200)))
    for t in range(MAX_SUBSTITUTIONS + 10):
        big.learn(t, 1000 + t)
    assert len(big.subs) == MAX_SUBSTITUTIONS
    assert big.edited[MAX_SUBSTITUTIONS + 5] == MAX_SUBSTITUTIONS + 5


def test_continuation_runs_on_into_the_output():
    ed = CopyEdits([10, 11, 12, 13])
    ed.learn(12, 22)
    assert ed.continuation(2, 4, [10, 11, 12, 13, 30, 31, 32]) == [22, 13, 30, 31]
    assert ed.origin(2, 4) == [12, 13]


def copy_run(drafter, prompt: list[int], answer: list[int]) -> int:
    """Verifications a greedy target that writes ``answer`` after ``prompt`` needs when
    each step verifies the drafter's best path whole."""
    tokens = prompt + answer[:1]
    i, steps = 1, 0
    while i < len(answer):
        path = drafter.propose("r", tokens, 64).best_chain().tokens.tolist()
        acc = 0
        while acc < len(path) and i + acc < len(answer) and path[acc] == answer[i + acc]:
            acc += 1
        drafter.observe("r", acc, len(path))
        tokens += answer[i:i + acc + 1]
        i += acc + 1
        steps += 1
    return steps


@pytest.mark.parametrize("cls", [NgramDrafter, SuffixDrafter])
def test_drafter_learns_a_rename_and_copies_the_edited_prompt(cls, monkeypatch):
    rng = np.random.default_rng(3)
    body = rng.permutation(np.arange(100, 400))[:240].tolist()  # distinct tokens: one occurrence each
    for at in range(10, 230, 22):
        body[at] = 7  # a name used 10 times
        body[at + 5] = 3  # and an indent
    answer = [{7: 8, 3: 4}.get(t, t) for t in body]  # the target copies it with both changed
    prompt = [1, 2] + body + [5]
    edits = cls()
    steps = copy_run(edits, prompt, answer)
    assert edits._edits["r"].subs == {7: 8, 3: 4}
    monkeypatch.setattr(copy_edits.CopyEdits, "learn", lambda self, src, out: None)
    plain = copy_run(cls(), prompt, answer)
    assert steps * 2 < plain  # plain lookup restarts its match after every changed token


def test_a_wrong_substitution_is_unlearned():
    body = list(range(100, 160))
    body[20] = body[40] = 7
    answer = body[:20] + [9] + body[21:]  # the first 7 became 9, the second stays 7
    drafter = NgramDrafter()
    copy_run(drafter, [1] + body + [2], answer)
    assert drafter._edits["r"].subs == {}  # learned 7 -> 9, then saw the target keep 7
