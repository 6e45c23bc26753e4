"""Controller trees served as model ids (``create_app(controllers=...)``, ``llcinfer serve
--controller ID=FILE``): a request naming one gets the text the tree chooses when run on
the LLM alone with the same seed, streamed or not; its usage counts every leaf; the leaves
share the prompt's blocks and are cancelled with the request; fields the config decides
are refused; bad --controller values fail before the port is bound."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from cli_run import assert_one_error_line, run_cli
from http_serving import openai_client, served
from tiny_models import isolated_runtime, write_tiny_model

from llcinfer import LLM
from llcinfer.controllers import from_config
from llcinfer.errors import UsageError
from llcinfer.serve import create_app
from llcinfer.serve.controllers import ServedController

PARALLEL = 4
MSGS = [{"role": "user", "content": "Pick a word."}]
GEN = {"type": "generate", "temperature": 1.2, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "max_tokens": 6,
       "ignore_eos": True}
VOTE = {"type": "majority_vote", "n": 3, "extract": r"(\S)", "child": GEN}
BEST = {"type": "best_of_n", "n": 2, "reward": "logprob", "child": VOTE}  # depth 3: 6 leaves


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    with isolated_runtime(tmp_path_factory.mktemp("home")):
        path = write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf", arch="llama", qtype="Q8_0",
                                d_model=128, n_head=4, n_kv_head=2, d_ff=96, n_ctx=512)
        llm = LLM(str(path), threads=1, n_seq=PARALLEL, n_ctx=512)
        yield llm
        llm.close()


def _served(name, config):
    tree = from_config(config)
    return ServedController(name, tree, tree.type_name)


@pytest.fixture(scope="module")
def url(llm):
    app = create_app(llm, model_name="tiny", controllers=[_served("vote3", VOTE), _served("best2x3", BEST)])
    with served(app) as base:
        yield base


def _idle(llm) -> bool:
    s = llm.engine.scheduler
    return not s.running and not s.waiting and llm.kv_stats()["in_use_blocks"] == 0


def test_models_lists_the_controllers(url):
    models = openai_client(url).models.list()
    assert [m.id for m in models] == ["tiny", "vote3", "best2x3"]
    card = httpx.get(url + "/v1/models/best2x3", timeout=10).json()
    assert card["controller"] == {"type": "best_of_n", "model": "tiny"}


@pytest.mark.parametrize("name,config", [("vote3", VOTE), ("best2x3", BEST)])
def test_a_controller_request_returns_the_trees_choice(llm, url, name, config):
    alone = from_config(config, llm).run(MSGS, seed=21)
    hits = llm.kv_stats()["prefix_hit_tokens"]
    got = openai_client(url).chat.completions.create(model=name, messages=MSGS, seed=21)
    assert got.model == name and len(got.choices) == 1
    assert got.choices[0].message.content == alone.text
    assert got.choices[0].finish_reason == "length"
    n_leaves = from_config(config).n_leaves
    assert got.usage.completion_tokens == 6 * n_leaves  # every leaf's tokens
    assert llm.kv_stats()["prefix_hit_tokens"] - hits >= (n_leaves - 1) * got.usage.prompt_tokens // 2
    extra = got.model_extra["controller"]
    assert extra["type"] == config["type"] and extra["n_candidates"] == config["n"]
    assert extra["answer"] == alone.answer and extra["score"] == pytest.approx(alone.score)
    assert _idle(llm)


def test_a_streamed_controller_request_sends_the_choice(llm, url):
    alone = from_config(VOTE, llm).run("Once upon a time", seed=4)
    stream = openai_client(url).completions.create(model="vote3", prompt="Once upon a time", seed=4, stream=True,
                                                   stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == alone.text
    assert chunks[-1].usage.completion_tokens == 18
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals[0].model_extra["controller"]["answer"] == alone.answer


@pytest.mark.parametrize("body,param", [
    ({"temperature": 0.5}, "temperature"),
    ({"max_tokens": 3}, "max_tokens"),
    ({"n": 2}, "n"),
    ({"logprobs": True}, "logprobs"),
    ({"stop": ["x"]}, "stop"),
])
def test_fields_the_config_sets_are_refused(llm, url, body, param):
    r = httpx.post(url + "/v1/chat/completions", json={"model": "vote3", "messages": MSGS, **body}, timeout=10)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "unsupported_parameter" and err["param"] == param and "vote3" in err["message"]
    assert _idle(llm)


def test_a_timed_out_controller_request_cancels_its_leaves(llm):
    slow = {**VOTE, "child": {**GEN, "max_tokens": 400}}
    run = llm.engine.runner.run

    def sleepy(batch):
        import time
        time.sleep(0.01)
        return run(batch)

    llm.engine.runner.run = sleepy
    try:
        app = create_app(llm, model_name="tiny", controllers=[_served("slow", slow)], request_timeout_s=0.3)
        with served(app) as base:
            with pytest.raises(openai.APIStatusError) as e:
                openai_client(base).chat.completions.create(model="slow", messages=MSGS)
            assert e.value.status_code == 408
    finally:
        llm.engine.runner.run = run
    assert _idle(llm)


def test_create_app_checks_the_controllers(llm):
    with pytest.raises(UsageError, match="twice"):
        create_app(llm, model_name="tiny", controllers=[_served("tiny", VOTE)])
    with pytest.raises(UsageError, match="twice"):
        create_app(llm, model_name="tiny", controllers=[_served("v", VOTE), _served("v", BEST)])
    wide = {"type": "majority_vote", "n": 64, "extract": "(x)", "child": GEN}
    with pytest.raises(UsageError, match="64 generations"):
        create_app(llm, model_name="tiny", controllers=[_served("wide", wide)], max_queue=4)


def test_serve_refuses_bad_controllers_before_listening(tmp_path):
    assert_one_error_line(run_cli("serve", "--controller", "vote.yaml"), 2, "--controller takes ID=FILE")
    bad = tmp_path / "bad.yaml"
    bad.write_text("type: majority_vote\nn: 0\nextract: '(x)'\nchild: {type: generate}\n")
    assert_one_error_line(run_cli("serve", "--controller", f"v={bad}"), 2, "controller.n")
    assert_one_error_line(run_cli("serve", "--controller", f"v={tmp_path / 'none.yaml'}"), 2, "cannot read")
    good = tmp_path / "vote.json"
    good.write_text(json.dumps(VOTE))
    assert_one_error_line(run_cli("serve", "--ray", "--controller", f"v={good}"), 2, "not served on --ray")
