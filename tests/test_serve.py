"""``llcinfer serve``'s API (llcinfer.serve.create_app) under uvicorn on a loopback port,
driven by the real ``openai`` client (sync and async, streamed and not) and by raw HTTP
for the error cases: outputs equal the same request on the LLM alone, n samples share
the prompt's blocks, a client that goes away frees its KV at once, every error is an
OpenAI error object, and /metrics counts what happened."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from http_serving import openai_client, served
from tiny_models import isolated_runtime, write_tiny_model

from llcinfer import LLM
from llcinfer.serve import create_app

N_CTX = 1024
PARALLEL = 4
MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello there."}]
LONG = {"max_tokens": 1000, "ignore_eos": True}  # with slow_steps: 10 s, far past the time a test needs to act


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    with isolated_runtime(tmp_path_factory.mktemp("home")):
        path = write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf", arch="llama", qtype="Q8_0",
                                d_model=128, n_head=4, n_kv_head=2, d_ff=96, n_ctx=N_CTX)
        llm = LLM(str(path), threads=1, n_seq=PARALLEL, n_ctx=N_CTX)
        yield llm
        llm.close()


@pytest.fixture(scope="module")
def url(llm):
    with served(create_app(llm, model_name="tiny")) as base:
        yield base


@contextlib.contextmanager
def slow_steps(llm, seconds: float = 0.01):
    """Every engine step takes at least ``seconds`` (the tiny model is done in microseconds,
    a real one is not): requests stay in flight while a test acts on them."""
    run = llm.engine.runner.run

    def slow(batch):
        time.sleep(seconds)
        return run(batch)

    llm.engine.runner.run = slow
    try:
        yield
    finally:
        llm.engine.runner.run = run


def _metrics(base: str) -> dict:
    text = httpx.get(base + "/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _count(base: str, endpoint: str, outcome: str) -> float:
    return _metrics(base).get(("llcinfer_requests_total", (("endpoint", endpoint), ("outcome", outcome))), 0.0)


def _until(cond, timeout=10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def _idle(llm) -> bool:
    s = llm.engine.scheduler
    return not s.running and not s.waiting and llm.kv_stats()["in_use_blocks"] == 0


# ---------------------------------------------------------------------------- the openai client
def test_sync_client_matches_the_llm(llm, url):
    client = openai_client(url)
    want_chat = llm.chat(MSGS, temperature=0, max_tokens=12)
    got = client.chat.completions.create(model="tiny", messages=MSGS, temperature=0, max_tokens=12)
    assert got.object == "chat.completion" and got.model == "tiny"
    assert got.choices[0].message.content == want_chat and got.choices[0].message.role == "assistant"
    n_prompt = len(llm.tokenize(llm.apply_chat_template(MSGS), special=True))
    n_gen = len(llm.submit(MSGS, temperature=0, max_tokens=12).result().token_ids)
    assert got.usage.prompt_tokens == n_prompt and got.usage.completion_tokens == n_gen
    assert got.usage.total_tokens == n_prompt + n_gen
    assert got.choices[0].finish_reason == ("length" if n_gen == 12 else "stop")

    chunks = list(client.chat.completions.create(model="tiny", messages=MSGS, temperature=0, max_tokens=12,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want_chat
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == n_gen
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == got.choices[0].finish_reason

    want_text = llm.generate("The three primary colors are", temperature=0, max_tokens=10, ignore_eos=True)
    text = client.completions.create(model="tiny", prompt="The three primary colors are", temperature=0,
                                     max_tokens=10, extra_body={"ignore_eos": True})
    assert text.object == "text_completion" and text.choices[0].text == want_text
    assert text.choices[0].finish_reason == "length" and text.usage.completion_tokens == 10
    streamed = client.completions.create(model="tiny", prompt="The three primary colors are", temperature=0,
                                         max_tokens=10, stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed) == want_text
    stop = want_text[len(want_text) // 2]
    cut = client.completions.create(model="tiny", prompt="The three primary colors are", temperature=0,
                                    max_tokens=10, stop=[stop], extra_body={"ignore_eos": True})
    assert cut.choices[0].text == want_text[:want_text.index(stop)] and cut.choices[0].finish_reason == "stop"


def test_async_client_concurrent_requests_match_alone(llm, url):
    prompts = [f"Request number {i} asks about {'the weather ' * i}" for i in range(6)]
    alone = [llm.generate(p, temperature=0, max_tokens=16, ignore_eos=True) for p in prompts]

    async def one(client, i):
        kw = dict(model="tiny", prompt=prompts[i], temperature=0, max_tokens=16, extra_body={"ignore_eos": True})
        if i % 2:
            return "".join([c.choices[0].text async for c in await client.completions.create(stream=True, **kw)])
        return (await client.completions.create(**kw)).choices[0].text

    async def main():
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30) as client:
            return await asyncio.gather(*(one(client, i) for i in range(len(prompts))))

    assert asyncio.run(main()) == alone


def test_logprobs_in_both_formats(llm, url):
    client = openai_client(url)
    engine = llm.submit(MSGS, temperature=0, max_tokens=8, logprobs=3).result()
    got = client.chat.completions.create(model="tiny", messages=MSGS, temperature=0, max_tokens=8,
                                         logprobs=True, top_logprobs=3)
    content = got.choices[0].logprobs.content
    assert [e.logprob for e in content] == pytest.approx(engine.logprobs)
    assert [e.bytes for e in content] == [list(llm.tokenizer.token_bytes(t)) for t in engine.token_ids]
    for e, top in zip(content, engine.top_logprobs):
        assert len(e.top_logprobs) == 3 and [a.logprob for a in e.top_logprobs] == pytest.approx([x for _, x in top])
        assert e.top_logprobs[0].bytes == e.bytes  # greedy: the chosen token is the most likely
    streamed = client.chat.completions.create(model="tiny", messages=MSGS, temperature=0, max_tokens=8,
                                              logprobs=True, top_logprobs=3, stream=True)
    entries = [e for c in streamed if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.logprob for e in entries] == pytest.approx(engine.logprobs)

    text = client.completions.create(model="tiny", prompt="hello there", temperature=0, max_tokens=6, logprobs=2,
                                     extra_body={"ignore_eos": True})
    lp = text.choices[0].logprobs
    alone = llm.submit("hello there", temperature=0, max_tokens=6, logprobs=2, ignore_eos=True).result()
    assert lp.token_logprobs == pytest.approx(alone.logprobs)
    assert all(len(d) <= 2 and max(d.values()) == pytest.approx(x) for d, x in zip(lp.top_logprobs, lp.token_logprobs))
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]


def test_n_samples_share_the_prompt_blocks(llm, url):
    client = openai_client(url)
    prompt = "Samples of one prompt " + "share its blocks " * 6
    kw = dict(model="tiny", prompt=prompt, temperature=1.5, top_p=1.0, max_tokens=8,
              extra_body={"ignore_eos": True, "top_k": 0, "min_p": 0})
    hits = llm.kv_stats()["prefix_hit_tokens"]
    got = client.completions.create(n=3, seed=11, **kw)
    shared = llm.kv_stats()["prefix_hit_tokens"] - hits
    assert [c.index for c in got.choices] == [0, 1, 2]
    assert shared >= 2 * got.usage.prompt_tokens  # the 2 followers forked the prompt's blocks
    assert got.usage.completion_tokens == 24
    singles = [client.completions.create(seed=11 + i, **kw).choices[0].text for i in range(3)]
    assert [c.text for c in got.choices] == singles  # sample i draws from seed + i
    texts = ["", "", ""]
    for chunk in client.completions.create(n=3, seed=11, stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == singles


# ---------------------------------------------------------------------------- cancellation
def test_a_client_that_goes_away_frees_its_kv(llm, url):
    assert _until(lambda: _idle(llm))
    before = _count(url, "completions", "disconnected")
    generated = _metrics(url)[("llcinfer_generation_tokens_total", ())]
    body = {"model": "tiny", "prompt": "a stream its client drops", "stream": True, "n": 2, **LONG}
    with slow_steps(llm), httpx.Client(timeout=30) as http:
        with http.stream("POST", url + "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            assert llm.kv_stats()["in_use_blocks"] > 0
    assert _until(lambda: _idle(llm)), llm.kv_stats()
    assert _until(lambda: _count(url, "completions", "disconnected") == before + 1)
    assert _metrics(url)[("llcinfer_generation_tokens_total", ())] - generated < 2 * LONG["max_tokens"]

    # a whole-response request whose client hangs up is cancelled too
    payload = json.dumps({"model": "tiny", "prompt": "nobody waits for this", "n": 4, **LONG}).encode()
    host, port = url.removeprefix("http://").split(":")
    with slow_steps(llm), socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
        assert _until(lambda: llm.kv_stats()["in_use_blocks"] > 0)
    assert _until(lambda: _idle(llm)), llm.kv_stats()
    assert _until(lambda: _count(url, "completions", "disconnected") == before + 2)


# ---------------------------------------------------------------------------- errors
def _error(r: httpx.Response, status: int, code: str | None = None, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    assert "Traceback" not in r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code, err
    if param is not None:
        assert err["param"] == param, err
    return err


@pytest.mark.parametrize("path, body, status, code, param", [
    ("/v1/chat/completions", {"messages": MSGS, "temperature": 2.5}, 400, "invalid_value", "temperature"),
    ("/v1/chat/completions", {"messages": MSGS, "top_p": 0}, 400, "invalid_value", "top_p"),
    ("/v1/completions", {"prompt": "x", "top_p": 1.5}, 400, "invalid_value", "top_p"),
    ("/v1/completions", {"prompt": "x", "n": 0}, 400, "invalid_value", "n"),
    ("/v1/completions", {"prompt": "x", "n": PARALLEL + 1}, 400, "invalid_value", "n"),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, 400, "invalid_value", "logprobs"),
    ("/v1/chat/completions", {"messages": MSGS, "logprobs": True, "top_logprobs": 21}, 400, "invalid_value",
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": MSGS, "top_logprobs": 2}, 400, "invalid_value", "top_logprobs"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "invalid_value", "max_tokens"),
    ("/v1/completions", {"prompt": "x", "temperature": "hot"}, 400, "invalid_value", "temperature"),
    ("/v1/completions", {"prompt": "x", "stop": [""]}, 400, "invalid_value", "stop"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, 400, "invalid_value",
     "stream_options"),
    ("/v1/completions", {"prompt": "x", "presence_penalty": 0.5}, 400, "unsupported_parameter", "presence_penalty"),
    ("/v1/chat/completions", {"messages": []}, 400, "invalid_value", "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "invalid_value", None),
    ("/v1/completions", {"prompt": 12}, 400, "invalid_value", "prompt"),
    ("/v1/completions", {"prompt": "hello " * 400}, 400, "context_length_exceeded", "prompt"),
    ("/v1/chat/completions", {"messages": MSGS, "model": "gpt-4o"}, 404, "model_not_found", "model"),
])
def test_bad_requests_get_openai_errors(url, path, body, status, code, param):
    _error(httpx.post(url + path, json=body, timeout=10), status, code, param)


def test_malformed_http_gets_openai_errors(llm, url):
    _error(httpx.post(url + "/v1/chat/completions", content=b'{"messages": [', timeout=10), 400, "invalid_json")
    _error(httpx.post(url + "/v1/completions", content=b'["a list"]', timeout=10), 400, "invalid_json")
    _error(httpx.get(url + "/v1/completions", timeout=10), 405)
    _error(httpx.get(url + "/v1/nothing", timeout=10), 404)
    _error(httpx.get(url + "/v1/models/gpt-4o", timeout=10), 404, "model_not_found")
    with pytest.raises(openai.NotFoundError):
        openai_client(url).chat.completions.create(model="gpt-4o", messages=MSGS)
    with pytest.raises(openai.BadRequestError, match="context length"):
        openai_client(url).completions.create(model="tiny", prompt="hello " * 400)
    with served(create_app(llm, max_body_bytes=2048)) as small:
        _error(httpx.post(small + "/v1/completions", json={"prompt": "x" * 4096}, timeout=10), 413,
               "request_too_large")
        ok = httpx.post(small + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10)
        assert ok.status_code == 200 and ok.json()["model"] == llm.model_path.stem


def test_api_key_is_required_when_set(llm):
    with served(create_app(llm, model_name="tiny", api_key="sesame")) as base:
        _error(httpx.post(base + "/v1/completions", json={"prompt": "x"}, timeout=10), 401, "invalid_api_key")
        _error(httpx.get(base + "/v1/models", headers={"Authorization": "Bearer nope"}, timeout=10), 401)
        with pytest.raises(openai.AuthenticationError):
            openai_client(base, "wrong").models.list()
        assert [m.id for m in openai_client(base, "sesame").models.list()] == ["tiny"]
        assert openai_client(base, "sesame").completions.create(model="tiny", prompt="x", max_tokens=2).usage.total_tokens
        assert httpx.get(base + "/health", timeout=10).json() == {"status": "ok"}  # open: load balancers probe it


def test_a_full_queue_answers_429(llm):
    assert _until(lambda: _idle(llm))
    with slow_steps(llm), served(create_app(llm, model_name="tiny", max_queue=0)) as base:  # PARALLEL sequences
        body = {"prompt": "fills every slot", "stream": True, "n": PARALLEL, **LONG}
        with httpx.Client(timeout=30) as http, http.stream("POST", base + "/v1/completions", json=body) as r:
            lines = r.iter_lines()  # held: a dropped iterator closes the connection
            assert next(lines).startswith("data: ")
            err = _error(httpx.post(base + "/v1/completions", json={"prompt": "one more"}, timeout=10), 429,
                         "queue_full")
            assert "full" in err["message"]
            assert httpx.post(base + "/v1/completions", json={"prompt": "x"}, timeout=10).headers["retry-after"] == "1"
            with pytest.raises(openai.RateLimitError):
                openai_client(base).completions.create(model="tiny", prompt="x")
        assert _until(lambda: _metrics(base)[("llcinfer_requests_in_flight", ())] == 0)
        assert _until(lambda: _idle(llm))
        assert httpx.post(base + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10).status_code == 200


def test_a_request_past_its_timeout_is_cancelled(llm):
    with slow_steps(llm), served(create_app(llm, model_name="tiny", request_timeout_s=0.2)) as base:
        _error(httpx.post(base + "/v1/completions", json={"prompt": "slow", "n": PARALLEL, **LONG}, timeout=10),
               408, "request_timeout")
        with pytest.raises(openai.APIError, match="timeout"):
            for _ in openai_client(base).chat.completions.create(model="tiny", messages=MSGS, stream=True, n=PARALLEL,
                                                           max_tokens=1000, extra_body={"ignore_eos": True}):
                pass
        assert _until(lambda: _idle(llm))
        assert _count(base, "completions", "timeout") == 1 and _count(base, "chat", "timeout") == 1


# ---------------------------------------------------------------------------- the other endpoints
def test_models_health_and_metrics(llm, url):
    client = openai_client(url)
    assert [m.id for m in client.models.list()] == ["tiny"]
    assert client.models.retrieve("tiny").owned_by == "llcinfer"
    assert httpx.get(url + "/health", timeout=10).json() == {"status": "ok"}
    before = _metrics(url)
    got = client.completions.create(model="tiny", prompt="count me", max_tokens=5, extra_body={"ignore_eos": True})
    after = _metrics(url)
    key = ("llcinfer_requests_total", (("endpoint", "completions"), ("outcome", "ok")))
    assert after[key] == before.get(key, 0) + 1
    for name, grew in (("llcinfer_generation_tokens_total", 5), ("llcinfer_prompt_tokens_total",
                                                                 got.usage.prompt_tokens)):
        assert after[(name, ())] - before[(name, ())] == grew
    assert after[("llcinfer_time_to_first_token_seconds_count", ())] == before[
        ("llcinfer_time_to_first_token_seconds_count", ())] + 1
    assert after[("llcinfer_time_per_output_token_seconds_count", ())] > 0
    for gauge in ("requests_waiting", "requests_running", "requests_in_flight", "kv_blocks_in_use"):
        assert after[(f"llcinfer_{gauge}", ())] == 0
    assert after[("llcinfer_kv_blocks_capacity", ())] == llm.kv_stats()["capacity_blocks"] > 0


# ---------------------------------------------------------------------------- the command
def test_ctrl_c_drains_in_flight_requests_then_exits(tmp_path):
    """``llcinfer serve`` as a user runs it: Ctrl-C mid-stream lets the stream finish whole,
    then the process exits 0 without a traceback."""
    import numba

    path = write_tiny_model(tmp_path / "tiny.gguf", arch="llama", qtype="Q8_0", d_model=128, n_head=4,
                            n_kv_head=2, d_ff=96, n_ctx=4096)
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    env = {**os.environ, "LLCINFER_HOME": str(tmp_path / "home"), "NUMBA_CACHE_DIR": numba.config.CACHE_DIR}
    cmd = [sys.executable, "-c", "from llcinfer.cli import main; main()", "serve", "-m", str(path), "-t", "1",
           "-c", "4096", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        assert _until(lambda: proc.poll() is not None or _healthy(base), timeout=120), "the server did not start"
        body = {"prompt": "drain me", "stream": True, "n": PARALLEL, "max_tokens": 4000, "ignore_eos": True,
                "stream_options": {"include_usage": True}}
        with httpx.Client(timeout=60) as http, http.stream("POST", base + "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            proc.send_signal(signal.SIGINT)
            events = [ln for ln in lines if ln]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2].removeprefix("data: "))["usage"]["completion_tokens"] == PARALLEL * 4000
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "Traceback" not in err and "stopped" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _healthy(base: str) -> bool:
    try:
        return httpx.get(base + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# ---------------------------------------------------------------------------- a real model
@pytest.mark.slow
def test_smollm2_chat_through_the_openai_client():
    llm = LLM("smollm2-135m", threads=2, n_ctx=512, n_seq=2, progress=False)
    try:
        msgs = [{"role": "user", "content": "What is the capital of France?"}]
        want = llm.chat(msgs, temperature=0, max_tokens=24)
        with served(create_app(llm)) as base:
            stream = openai_client(base).chat.completions.create(model="smollm2-135m", messages=msgs, temperature=0,
                                                           max_tokens=24, stream=True)
            got = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert got == want and got.strip()
    finally:
        llm.close()
