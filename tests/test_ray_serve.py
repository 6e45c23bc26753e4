"""``llcinfer serve --ray`` (llcinfer.ray_serve): two single-thread replicas of a tiny model
on a local Ray cluster that this module starts (loopback, 2 CPUs, no dashboard) and stops,
driven by the real ``openai`` client and by httpx: routing, prefix affinity (the turns of
one conversation land on one replica and reuse its blocks), a replica killed under load
(requests retried or ended with a clear error, none lost, the replica back), and the
one-line error without Ray.  The router's choice is also checked alone, without Ray."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from tiny_models import write_tiny_model

from llcinfer.ray_serve import EXTRA_HINT, PrefixRouter, routing_units

N_CTX = 1024
PARALLEL = 2
SYSTEM = {"role": "system", "content": "You are terse."}


# ---------------------------------------------------------------------------------------
# the router alone


def test_router_keeps_conversations_and_long_prefixes_and_balances_the_rest():
    r = PrefixRouter(2, slack=2)
    turn1 = routing_units("chat", {"messages": [SYSTEM, {"role": "user", "content": "hi"}]})
    a = r.choose(turn1)
    b = r.choose(routing_units("chat", {"messages": [SYSTEM, {"role": "user", "content": "other"}]}))
    assert {a, b} == {0, 1} and r.load == [1, 1]  # a shared short system prompt does not pull
    turn2 = turn1 + ["assistant\x1fhello", "user\x1fmore"]
    assert r.choose(turn2) == a and r.last_reason == "affinity"
    long = "x" * 600
    c = r.choose([long + "tail one"])
    assert r.choose([long + "tail two"]) == c and r.last_reason == "affinity"
    r.load[c] += 10  # far busier than the other: load wins over affinity
    assert r.choose([long + "tail three"]) != c and r.last_reason == "load"
    assert r.choose(turn2, avoid={a}) != a
    r.forget(a)
    assert all(v != a for v in r._table.values())
    assert routing_units("text", {"prompt": ["p"]}) == ["p"] and routing_units("chat", {"messages": 3}) == []


# ---------------------------------------------------------------------------------------
# a local Ray cluster


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def _ray_stop() -> None:
    ray_cli = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    if ray_cli:
        subprocess.run([ray_cli, "stop", "--force"], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(base URL, model path) of the app on a fresh local cluster; everything stopped after."""
    ray = pytest.importorskip("ray")
    import numba

    from llcinfer.ray_serve import deployment, start, stop

    home = tmp_path_factory.mktemp("home")
    path = write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf", arch="llama", qtype="Q8_0", d_model=128,
                            n_head=4, n_kv_head=2, d_ff=96, n_ctx=N_CTX)
    # the replicas inherit this: a throw-away home, the kernels already compiled for this tree
    env = {"LLCINFER_HOME": str(home), "NUMBA_CACHE_DIR": numba.config.CACHE_DIR, "RAY_USAGE_STATS_ENABLED": "0"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    port = _free_port()
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
        app = deployment(str(path), core_sets=[[0], [1]] if os.cpu_count() >= 2 else [[0], [0]], parallel=PARALLEL,
                         n_ctx=N_CTX, model_name="tiny", max_queue=16)
        base = start(app, "127.0.0.1", port)
        yield base, path
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        with contextlib.suppress(Exception):
            stop()
        _ray_stop()


def _client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60)


def _replicas(base: str) -> list[dict]:
    return httpx.get(base + "/v1/replicas", timeout=30).json()["data"]


def test_routes_through_the_openai_client(cluster):
    base, _ = cluster
    client = _client(base)
    raw = client.chat.completions.with_raw_response.create(model="tiny", messages=[SYSTEM, {"role": "user",
                                                           "content": "Say hello."}], max_tokens=12, temperature=0)
    chat = raw.parse()
    assert raw.headers["x-llcinfer-replica"] in ("0", "1") and chat.choices[0].message.content
    assert chat.usage.completion_tokens == 12
    whole = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=10, temperature=0,
                                      extra_body={"ignore_eos": True})
    parts = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=10, temperature=0,
                                      stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in parts if c.choices) == whole.choices[0].text
    streamed = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=6, temperature=0, stream=True)
    chunks = list(streamed)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason == "length"
    assert [m.id for m in client.models.list()] == ["tiny"]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="x", temperature=5)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="x")
    r = httpx.get(base + "/v1/nothing", timeout=10)
    assert r.status_code == 404 and "error" in r.json()
    rows = _replicas(base)
    assert [row["cores"] for row in rows] == [[0], [1]] if os.cpu_count() >= 2 else True
    for row in rows:  # each replica pinned to its core, planned for one thread
        assert row["stats"]["pinned"] == row["cores"] and row["stats"]["threads"] == 1


def test_a_conversation_stays_on_its_replica(cluster):
    base, _ = cluster
    client = _client(base)
    first, cached = {}, []
    for k in range(6):
        msgs = [SYSTEM, {"role": "user", "content": f"Conversation {k}: tell me about topic {k}."}]
        raw = client.chat.completions.with_raw_response.create(model="tiny", messages=msgs, max_tokens=8,
                                                               temperature=0)
        first[k] = raw.headers["x-llcinfer-replica"]
        msgs += [{"role": "assistant", "content": raw.parse().choices[0].message.content},
                 {"role": "user", "content": "And then?"}]
        raw2 = client.chat.completions.with_raw_response.create(model="tiny", messages=msgs, max_tokens=8,
                                                                temperature=0)
        assert raw2.headers["x-llcinfer-replica"] == first[k], k
        cached.append(raw2.parse().usage.prompt_tokens_details.cached_tokens)
    assert set(first.values()) == {"0", "1"}  # new conversations go by load: both replicas serve
    assert all(c > 0 for c in cached), cached  # the second turn reused the first turn's blocks
    assert sum(row["affinity"] for row in _replicas(base)) >= 6


async def _stream(client: httpx.AsyncClient, base: str, i: int, max_tokens: int) -> dict:
    rec = {"i": i, "text": ""}
    body = {"prompt": f"Request {i} says", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", base + "/v1/completions", json=body) as r:
        rec["status"], rec["replica"] = r.status_code, r.headers.get("x-llcinfer-replica")
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                rec["done"] = True
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                if "error" in event:
                    rec["error"] = event["error"]
                for c in event.get("choices", []):
                    rec["text"] += c.get("text", "")
                if event.get("usage"):
                    rec["n"] = event["usage"]["completion_tokens"]
    return rec


def test_a_replica_killed_under_load_loses_nothing(cluster):
    base, _ = cluster
    victim = 1
    pid = next(row["stats"]["pid"] for row in _replicas(base) if row["replica"] == victim)

    async def load():
        async with httpx.AsyncClient(timeout=120) as client:
            tasks = [asyncio.create_task(_stream(client, base, i, 600)) for i in range(12)]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # kill once the victim streams text and holds queued requests
                rows = {row["replica"]: row for row in (await client.get(base + "/v1/replicas")).json()["data"]}
                if rows[victim]["in_flight"] > PARALLEL and rows[victim]["stats"]["kv"]["in_use_blocks"] > 0:
                    break
                await asyncio.sleep(0.05)
            os.kill(pid, signal.SIGKILL)
            return await asyncio.gather(*tasks, return_exceptions=True)

    records = asyncio.run(load())
    lost = [r for r in records if isinstance(r, BaseException)]
    assert not lost, lost
    done = [r for r in records if r.get("done") and "error" not in r and r.get("n") == 600]
    failed = [r for r in records if r.get("error", {}).get("code") == "replica_failed" and r.get("done")]
    assert len(done) + len(failed) == 12, records
    assert 1 <= len(failed) <= PARALLEL and all(r["replica"] == str(victim) for r in failed)
    rows = _replicas(base)
    assert rows[victim]["retried"] >= 1 and rows[victim]["failed"] == len(failed)
    deadline = time.monotonic() + 90  # Ray restarts the replica; it serves again on its cores
    while time.monotonic() < deadline:
        rows = _replicas(base)
        if not rows[victim]["down"] and rows[victim]["stats"].get("pid") not in (None, pid):
            break
        time.sleep(0.5)
    assert not rows[victim]["down"] and rows[victim]["stats"]["pid"] != pid
    assert rows[victim]["stats"]["pinned"] == rows[victim]["cores"]


# ---------------------------------------------------------------------------------------
# without Ray


def test_without_ray_serve_ray_is_one_line(monkeypatch, capsys):
    from llcinfer.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    monkeypatch.setitem(sys.modules, "ray.serve", None)
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--ray", "-m", "smollm2-135m", "--port", "0"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err == f"error: {EXTRA_HINT}\n" and '".[ray]"' in err
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--ray", "--replicas", "lots"])
    assert exc.value.code == 2 and capsys.readouterr().err.count("\n") == 1
