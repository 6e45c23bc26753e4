"""Controllers (llcinfer.controllers): config parsing and its errors, a depth-3 tree on a
tiny model, majority vote and best-of-N under fixed seeds, the N samples of a node
submitted together and sharing the prompt's blocks, and ``llcinfer run``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from cli_run import assert_one_error_line, run_cli
from real_models import real_model_path
from tiny_models import isolated_runtime, write_tiny_model

from llcinfer import LLM
from llcinfer.controllers import from_config, load_config
from llcinfer.controllers.nodes import Outcome, vote
from llcinfer.errors import ConfigError

HOT = {"type": "generate", "temperature": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "max_tokens": 6,
       "ignore_eos": True}
PROMPT = "abc abc abc"


def first_char(text: str) -> str | None:
    return text[:1] or None


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    with isolated_runtime(tmp_path_factory.mktemp("home")):
        path = write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf", arch="llama", qtype="Q8_0",
                                d_model=128, n_head=4, n_kv_head=2, d_ff=96, n_ctx=512)
        llm = LLM(str(path), threads=1, n_seq=8, n_ctx=512)
        yield llm
        llm.close()


# ---------------------------------------------------------------- config and its errors

@pytest.mark.parametrize("config, fragments", [
    ({"type": "beam"}, ["at controller:", "unknown controller type 'beam'", "majority_vote"]),
    ({"n": 3}, ["at controller:", "missing argument 'type'"]),
    ({"type": "majority_vote", "n": 4, "extract": "x"}, ["at controller:", "missing argument 'child'"]),
    ({"type": "best_of_n", "reward": "logprob", "child": HOT}, ["missing argument 'n'"]),
    ({"type": "best_of_n", "n": 0, "reward": "logprob", "child": HOT}, ["at controller.n:", "[1, 64]", "got 0"]),
    ({"type": "best_of_n", "n": 65, "reward": "logprob", "child": HOT}, ["controller.n", "got 65"]),
    ({"type": "best_of_n", "n": True, "reward": "logprob", "child": HOT}, ["controller.n", "got True"]),
    ({"type": "best_of_n", "n": "8", "reward": "logprob", "child": HOT}, ["controller.n", "got '8'"]),
    ({"type": "majority_vote", "n": 2, "extract": "(", "child": HOT}, ["at controller.extract:", "invalid regular"]),
    ({"type": "majority_vote", "n": 2, "extract": {"$ref": "nope"}, "child": HOT},
     ["at controller.extract:", "unresolved $ref 'nope'"]),
    ({"type": "best_of_n", "n": 2, "reward": {"$ref": "score"}, "child": HOT},
     ["at controller.reward.function:", "unresolved $ref 'score'"]),
    ({"type": "best_of_n", "n": 2, "reward": "likes", "child": HOT}, ["at controller.reward:", "unknown reward type"]),
    ({"type": "majority_vote", "n": 2, "extract": "x", "child": {"type": "generate", "temperature": -1}},
     ["at controller.child:", "temperature must be >= 0"]),
    ({"type": "majority_vote", "n": 2, "extract": "x",
      "child": {"type": "best_of_n", "n": 2, "reward": "logprob", "child": {"type": "generate", "beams": 2}}},
     ["at controller.child.child:", "unknown argument 'beams'"]),
    ({"type": "generate", "logprobs": 3}, ["unknown argument 'logprobs'"]),
])
def test_config_errors_name_the_node(config, fragments):
    with pytest.raises(ConfigError) as e:
        from_config(config)
    msg = str(e.value)
    assert "\n" not in msg
    for f in fragments:
        assert f in msg, msg


def test_yaml_and_json_files(tmp_path):
    yaml_path = tmp_path / "vote.yaml"
    yaml_path.write_text("type: majority_vote\nn: 8\nextract: '(-?\\d+)'\nchild:\n  type: generate\n"
                         "  temperature: 0.7\n  max_tokens: 64\n")
    json_path = tmp_path / "vote.json"
    json_path.write_text(json.dumps(load_config(yaml_path)))
    for path in (yaml_path, json_path):
        ctl = from_config(path)
        assert ctl.type_name == "majority_vote" and ctl.n == 8 and ctl.n_leaves == 8
        assert ctl.extract("so the answer is -12, not 3") == "-12"
        assert ctl.child.sampling == {"temperature": 0.7, "max_tokens": 64}
    bad = tmp_path / "bad.yaml"
    bad.write_text("type: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        from_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        from_config(tmp_path / "missing.yaml")


def test_vote_counts_and_breaks_ties_by_mean_logprob():
    def o(answer, lp):
        return Outcome(f"text {answer} {lp}", [], lp, "length", answer)

    outs = [o("1", -2.0), o("2", -0.5), o("1", -1.0), o("2", -3.0), o(None, -0.1)]
    # 1 and 2 have two votes each; means -1.5 and -1.75: 1 wins, its likelier candidate is chosen
    got = vote(outs)
    assert got.answer == "1" and got.text == "text 1 -1.0" and got.score == pytest.approx(2 / 5)
    got = vote(outs + [o("2", -2.0)])  # three votes beat a better mean
    assert got.answer == "2" and got.text == "text 2 -0.5"
    got = vote([o(None, -3.0), o(None, -0.2)])
    assert got.answer is None and got.text == "text None -0.2"


# ---------------------------------------------------------------- running on a tiny model

def _alone(llm, seed: int) -> str:
    params = {k: v for k, v in HOT.items() if k != "type"}
    return llm.submit(PROMPT, seed=seed, **params).result().text


def test_depth_3_tree_is_deterministic_and_seeds_its_leaves(llm):
    config = {"type": "majority_vote", "n": 2, "extract": {"$ref": "first_char"},
              "child": {"type": "best_of_n", "n": 2, "reward": "logprob", "child": HOT}}
    ctl = from_config(config, llm, refs={"first_char": first_char})
    assert ctl.n_leaves == 4
    got = ctl.run(PROMPT, seed=5)
    again = ctl.run(PROMPT, seed=5)
    leaves = [[leaf.text for leaf in c.candidates] for c in got.candidates]
    assert leaves == [[leaf.text for leaf in c.candidates] for c in again.candidates]
    assert got.text == again.text and got.answer == again.answer
    # leaf i of the run drew from seed 5 + i, exactly as that request alone
    assert leaves == [[_alone(llm, 5), _alone(llm, 6)], [_alone(llm, 7), _alone(llm, 8)]]
    assert len({t for pair in leaves for t in pair}) > 1
    for c in got.candidates:  # best_of_n kept its likeliest sample
        assert c.mean_logprob == max(leaf.mean_logprob for leaf in c.candidates)
        assert c.score == c.mean_logprob
    answers = [first_char(c.text) for c in got.candidates]
    assert got.answer in answers
    if answers[0] != answers[1]:  # one vote each: the likelier candidate's answer wins
        assert got.mean_logprob == max(c.mean_logprob for c in got.candidates)
    assert ctl.run(PROMPT, seed=9).candidates[0].candidates[0].text == _alone(llm, 9)


def test_best_of_n_with_a_function_reward(llm):
    ctl = from_config({"type": "best_of_n", "n": 4, "reward": {"$ref": "score"}, "child": HOT}, llm,
                      refs={"score": lambda prompt, text: float(len(text.encode()))})
    got = ctl.run(PROMPT, seed=1)
    lengths = [len(c.text.encode()) for c in got.candidates]
    assert [c.score for c in got.candidates] == lengths
    assert got.text == got.candidates[int(np.argmax(lengths))].text
    assert [c.text for c in got.candidates] == [_alone(llm, s) for s in range(1, 5)]


def test_model_reward_is_the_models_mean_logprob(llm):
    """Scored by a model (here the same one, by $ref), a greedy candidate whose text
    tokenizes back to its tokens gets the mean log-probability it was generated with."""
    ctl = from_config({"type": "best_of_n", "n": 1, "reward": {"type": "model", "model": {"$ref": "m"}},
                       "child": {"type": "generate", "temperature": 0, "max_tokens": 5, "ignore_eos": True}},
                      llm, refs={"m": llm})
    checked = 0
    for prompt in ("abc abc abc", "hello there", "a b c d", "xyz"):
        got = ctl.run(prompt)
        if llm.tokenize(got.text) == got.token_ids:
            assert got.score == pytest.approx(got.mean_logprob, abs=2e-2)
            checked += 1
    assert checked >= 1


def test_samples_are_submitted_together_and_share_the_prompt(llm):
    prompt = " ".join(["token"] * 30)
    n_prompt = len(llm.tokenize(prompt))
    events = []

    class Recording:
        """The LLM, logging each submission and each wait."""

        def submit(self, p, **kw):
            return Handle(llm.submit(p, **kw))

        def submit_n(self, p, n, **kw):
            return [Handle(h) for h in llm.submit_n(p, n, **kw)]

    class Handle:
        def __init__(self, h):
            events.append("submit")
            self.h = h

        def result(self):
            events.append("wait")
            return self.h.result()

        def __getattr__(self, name):  # done, cancel
            return getattr(self.h, name)

    llm.reset()
    before = llm.kv_stats()["prefix_hit_tokens"]
    ctl = from_config({"type": "majority_vote", "n": 4, "extract": {"$ref": "first_char"}, "child": HOT},
                      Recording(), refs={"first_char": first_char})
    ctl.run(prompt, seed=0)
    assert events == ["submit"] * 4 + ["wait"] * 4
    assert llm.kv_stats()["prefix_hit_tokens"] - before >= 3 * n_prompt  # computed once, forked 3 times
    events.clear()
    nested = from_config({"type": "best_of_n", "n": 3, "reward": "logprob",
                          "child": {"type": "best_of_n", "n": 2, "reward": "logprob", "child": HOT}}, Recording())
    nested.run(prompt, seed=0)
    assert events == ["submit"] * 6 + ["wait"] * 6


def test_an_interrupted_run_cancels_its_leaves(llm, monkeypatch):
    from llcinfer.engine.request import RequestHandle

    def interrupted(self):  # Ctrl-C a few steps into the wait
        for _ in range(3):
            llm.engine.step_if_idle()
        raise KeyboardInterrupt

    long = {**HOT, "max_tokens": 400}
    ctl = from_config({"type": "majority_vote", "n": 4, "extract": "(x)", "child": long}, llm)
    monkeypatch.setattr(RequestHandle, "result", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ctl.run(PROMPT, seed=0)
    monkeypatch.undo()
    s = llm.engine.scheduler
    assert not s.running and not s.waiting and llm.kv_stats()["in_use_blocks"] == 0


def test_unbound_controller_is_a_usage_error():
    with pytest.raises(Exception, match="not bound to an LLM"):
        from_config(HOT).run("hi")


# ---------------------------------------------------------------- the command line

def test_cli_bad_config_is_one_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("type: best_of_n\nn: 100\nreward: logprob\nchild: {type: generate}\n")
    proc = run_cli("run", "--controller", cfg, "hi")
    assert_one_error_line(proc, 2, "controller.n", "got 100")


def test_cli_run_matches_the_api():
    path = real_model_path("smollm2-135m")
    config = {"type": "majority_vote", "n": 3, "extract": r"(\d+)",
              "child": {"type": "generate", "temperature": 0.8, "max_tokens": 12}}
    prompt = "Q: What is 2 + 3?\nA: The answer is"
    llm = LLM(path, threads=1, n_seq=3, progress=False)
    expected = from_config(config, llm).run(prompt, seed=11)
    llm.close()
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "vote.json"
        cfg.write_text(json.dumps(config))
        proc = run_cli("run", "--controller", cfg, "-m", path, "-t", "1", "--seed", "11", prompt)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == expected.text + "\n"
    assert math.isfinite(expected.mean_logprob)
