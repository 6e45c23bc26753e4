"""A bounded loopback load on ``llcinfer serve``, next to llama-server: correctness under load, throughput, TTFT and TPOT.

    python perf/serve_load.py [--model smollm2-135m] [--threads 2] [--requests 200]
                              [--concurrency 1,4,16] [--max-tokens 64] [--cancel-fraction 0.1]
                              [--malformed 5] [--vs llama-server|none] [--llama-config native]
                              [--llama-args "-nr"]
                              [--json perf/results/serve-load-TAG.json]

Per concurrency C, each server is started as a subprocess on a free loopback port with C
slots (``llcinfer serve --parallel C``; llama-server ``--parallel C -c C*ctx``, the native
build from the same llama.cpp sources, same model file and threads) and gets the same
load from C concurrent clients (httpx, streamed /v1/completions): ``--requests`` greedy
requests (temperature 0, ``--max-tokens`` each, end of text ignored) whose prompts are
slices of mixed lengths of the CPython standard library's sources; a ``--cancel-fraction``
of them closed by the client after a few tokens; ``--malformed`` bad requests (bad JSON,
out-of-range values, unknown model) that must get a 4xx.

Checked for our server: 0 unexpected errors, 0 lost requests (each one answered:
completed, cancelled by us, or 4xx as expected), every completed output equal to the same
request at concurrency 1 (levels run in increasing order; the first is the reference and
is run at C = 1 whatever the list says), and its KV blocks in use (/metrics) back to 0
after the run.  llama-server's outputs are compared with its own C = 1 run and recorded.
Figures, measured by the client: aggregate completion tokens per second of the level's
wall time, TTFT (request sent to first token) and TPOT ((last - first token) / (tokens -
1)) at p50 / p99.  Every request has a client timeout; the servers are stopped at the end.
A llama-server that does not start (a native build using AMX where the kernel refuses
it dies at its first matmul; ``--llama-args -nr`` avoids that path) is recorded as such.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llcinfer.bench import llama_cpp  # noqa: E402
from llcinfer.jit import child_env  # noqa: E402
from llcinfer.model import catalog  # noqa: E402

MALFORMED = [  # (raw body, what it tests); each must get a 4xx with an error object (max_tokens: a
    # server that accepts one anyway is not kept busy by it)
    (b'{"prompt": "unterminated', "bad JSON"),
    (json.dumps({"prompt": "x", "max_tokens": 4, "temperature": 5}).encode(), "temperature out of range"),
    (json.dumps({"prompt": "x", "max_tokens": 4, "model": "no-such-model"}).encode(), "unknown model"),
    (json.dumps({"prompt": "x", "max_tokens": 4, "top_p": -1}).encode(), "top_p out of range"),
    (json.dumps({"max_tokens": 4}).encode(), "no prompt"),
]


def _pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(xs, np.float64), q)) if xs else None


def make_jobs(n: int, cancel_fraction: float, n_malformed: int, chars: list[int], seed: int) -> list[dict]:
    """The load: n prompts cut from the standard library's sources at line starts, lengths
    drawn from ``chars``; a seeded subset marked for cancellation; malformed requests at
    evenly spaced places."""
    text = "".join(p.read_text(errors="replace") for p in sorted(Path(os.__file__).parent.glob("*.py")))
    starts = [i + 1 for i, c in enumerate(text) if c == "\n"]
    rng = np.random.default_rng(seed)
    cancel = set(rng.choice(n, size=round(n * cancel_fraction), replace=False).tolist())
    jobs = []
    for i in range(n):
        start = int(rng.choice(starts))
        jobs.append({"i": i, "kind": "cancel" if i in cancel else "greedy",
                     "prompt": text[start:start + int(rng.choice(chars))], "cancel_after": int(rng.integers(1, 5))})
    for k in range(n_malformed):
        body, what = MALFORMED[k % len(MALFORMED)]
        jobs.insert((k + 1) * len(jobs) // (n_malformed + 1), {"i": f"m{k}", "kind": "malformed", "body": body,
                                                                 "what": what})
    return jobs


async def one(client: httpx.AsyncClient, base: str, job: dict, max_tokens: int) -> dict:
    """Send one job and record what came back, with the client's timings."""
    rec = {"i": job["i"], "kind": job["kind"]}
    url = base + "/v1/completions"
    if job["kind"] == "malformed":
        rec["what"] = job["what"]
        r = await client.post(url, content=job["body"], headers={"Content-Type": "application/json"})
        rec["status"] = r.status_code
        try:
            rec["expected"] = 400 <= r.status_code < 500 and "error" in r.json()
        except ValueError:  # not JSON
            rec["expected"] = False
        return rec
    body = {"prompt": job["prompt"], "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    parts, times = [], []
    sent = time.perf_counter()
    async with client.stream("POST", url, json=body) as r:
        rec["status"] = r.status_code
        if r.status_code != 200:
            rec["error"] = (await r.aread()).decode(errors="replace")[:300]
            return rec
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                rec["done"] = True
                break
            event = json.loads(line[6:])
            if "error" in event:
                rec["error"] = event["error"]
                break
            if event.get("usage"):
                rec["tokens"] = event["usage"]["completion_tokens"]
            for choice in event.get("choices", []):
                if choice.get("text"):
                    parts.append(choice["text"])
                    times.append(time.perf_counter())
            if job["kind"] == "cancel" and len(times) >= job["cancel_after"]:
                rec["cancelled"] = True
                break  # leaving the block closes the connection: the server cancels the request
    rec["text"] = "".join(parts)
    n = rec.get("tokens", len(times))
    if times:
        rec["ttft_s"] = times[0] - sent
        if n > 1 and not rec.get("cancelled"):
            rec["tpot_ms"] = 1e3 * (times[-1] - times[0]) / (n - 1)
    return rec


async def drive(base: str, jobs: list[dict], concurrency: int, max_tokens: int, timeout_s: float) -> tuple:
    """Every job through ``concurrency`` clients; (records, wall seconds)."""
    todo: asyncio.Queue = asyncio.Queue()
    for j in jobs:
        todo.put_nowait(j)
    records = []

    async def worker(client):
        while not todo.empty():
            job = todo.get_nowait()
            try:
                records.append(await asyncio.wait_for(one(client, base, job, max_tokens), timeout_s))
            except Exception as e:  # noqa: BLE001 - a request with no answer is a lost request
                records.append({"i": job["i"], "kind": job["kind"], "lost": f"{type(e).__name__}: {e}"})

    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        return records, time.perf_counter() - t0


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def start(name: str, model: str, threads: int, concurrency: int, ctx: int, log: Path, llama: tuple,
          ours: tuple = ()) -> tuple:
    """(process, base URL) of a server with ``concurrency`` slots, once /health answers;
    RuntimeError when it exits or does not answer within 10 minutes.  ``llama``: the
    llama.cpp build config and extra llama-server arguments; ``ours``: extra ``llcinfer
    serve`` arguments (``--ray --replicas 2``)."""
    port = _free_port()
    if name == "llcinfer":
        cmd = [sys.executable, "-c", "from llcinfer.cli import main; main()", "serve", "-m", model, "-t",
               str(threads), "-c", str(ctx), "--parallel", str(concurrency), "--port", str(port), *ours]
        env = None
    else:
        config, extra = llama
        cmd = [str(llama_cpp.binary(config, "llama-server")), "-m", model, "-t", str(threads), "-tb", str(threads), "--parallel", str(concurrency),
               "-c", str(ctx * concurrency), "--host", "127.0.0.1", "--port", str(port), *extra]
        env = child_env()
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop(proc)
    raise RuntimeError(f"{name} did not start (exit code {proc.returncode}; log: {log})")


def stop(proc: subprocess.Popen) -> None:
    """Ctrl-C (both drain and exit), then kill after 60 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kv_in_use(base: str) -> float:
    """Our server's KV blocks in use (/metrics), once nothing is in flight (or 10 s passed)."""
    from prometheus_client.parser import text_string_to_metric_families

    deadline = time.monotonic() + 10
    while True:
        text = httpx.get(base + "/metrics", timeout=10).text
        got: dict[str, float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:  # summed over labels: the replicas of `serve --ray` are labelled apart
                got[s.name] = got.get(s.name, 0.0) + s.value
        if got["llcinfer_requests_in_flight"] == 0 or time.monotonic() > deadline:
            return got["llcinfer_kv_blocks_in_use"]
        time.sleep(0.1)


def summarize(records: list[dict], wall_s: float, reference: dict | None) -> dict:
    """Counts, checks and figures of one level's records."""
    greedy = [r for r in records if r["kind"] == "greedy" and r.get("done")]
    unexpected = [r for r in records if "lost" not in r and not (
        r.get("expected") if r["kind"] == "malformed" else
        r.get("status") == 200 and "error" not in r and (r.get("done") or r.get("cancelled")))]
    out = {"requests": len(records), "completed": len(greedy),
           "cancelled": sum(1 for r in records if r.get("cancelled")),
           "malformed_answered_4xx": sum(1 for r in records if r.get("expected")),
           "unexpected_errors": len(unexpected), "lost": sum(1 for r in records if "lost" in r),
           "wall_s": wall_s, "tokens": sum(r.get("tokens", 0) for r in greedy)}
    out["tps"] = out["tokens"] / wall_s
    ttft = [r["ttft_s"] for r in records if "ttft_s" in r]
    tpot = [r["tpot_ms"] for r in greedy if "tpot_ms" in r]
    out.update(ttft_p50_s=_pct(ttft, 50), ttft_p99_s=_pct(ttft, 99), tpot_p50_ms=_pct(tpot, 50),
               tpot_p99_ms=_pct(tpot, 99))
    if reference is not None:
        compared = [r for r in greedy if r["i"] in reference]
        out["equal_to_alone"] = sum(r["text"] == reference[r["i"]] for r in compared)
        out["compared"] = len(compared)
        out["differ"] = [r["i"] for r in compared if r["text"] != reference[r["i"]]]
    out["problems"] = [{k: v for k, v in r.items() if k != "text"} for r in unexpected if "lost" not in r][:10] + \
        [r for r in records if "lost" in r][:10]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", default="1,4,16", help="client concurrency = server slots, per level")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-chars", default="200,800,2000,4000", help="prompt lengths (characters) to draw from")
    ap.add_argument("--ctx", type=int, default=2048, help="context per slot (tokens)")
    ap.add_argument("--cancel-fraction", type=float, default=0.1)
    ap.add_argument("--malformed", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=600.0, help="client timeout per request (seconds)")
    ap.add_argument("--vs", default="llama-server", choices=["llama-server", "none"])
    ap.add_argument("--llama-config", default="native", choices=list(llama_cpp.CONFIGS),
                    help="the llama.cpp build whose llama-server runs")
    ap.add_argument("--llama-args", default="", help="extra llama-server arguments, e.g. -nr")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    levels = sorted({1, *(int(c) for c in a.concurrency.split(","))})
    servers = ["llcinfer"]
    if a.vs == "llama-server":
        if llama_cpp.binary(a.llama_config, "llama-server") is None:
            raise SystemExit(f"llama-server is not built: python perf/llama_cpp.py build --config {a.llama_config}")
        servers.append("llama-server")
    model = str(catalog.resolve_model(a.model, progress=True))
    jobs = make_jobs(a.requests, a.cancel_fraction, a.malformed, [int(c) for c in a.prompt_chars.split(",")], a.seed)
    logs = ROOT / "perf" / "results"
    logs.mkdir(parents=True, exist_ok=True)
    rows, reference = [], {}
    for k, c in enumerate(levels):
        for name in (servers if k % 2 == 0 else servers[::-1]):  # A B, B A, ...: drift hits both
            try:
                proc, base = start(name, model, a.threads, c, a.ctx, logs / f"serve-load-{name}.log.tmp",
                                   (a.llama_config, shlex.split(a.llama_args)))
            except RuntimeError as e:
                if name == "llcinfer":
                    raise SystemExit(str(e)) from None
                rows.append({"server": name, "concurrency": c, "error": str(e)})
                print(f"{name:12s} C={c:2d} | {e}", flush=True)
                continue
            try:
                asyncio.run(drive(base, [{"i": "w", "kind": "greedy", "prompt": "def warm_up():"}], 1, 8, a.timeout))
                kv_before = kv_in_use(base) if name == "llcinfer" else None
                records, wall = asyncio.run(drive(base, jobs, c, a.max_tokens, a.timeout))
                kv_after = kv_in_use(base) if name == "llcinfer" else None
            finally:
                stop(proc)
            if c == 1:
                reference[name] = {r["i"]: r["text"] for r in records if r["kind"] == "greedy" and r.get("done")}
            row = {"server": name, "concurrency": c, **summarize(records, wall, reference.get(name) if c > 1 else None)}
            if kv_before is not None:
                row.update(kv_in_use_before=kv_before, kv_in_use_after=kv_after)
            rows.append(row)
            _print_row(row)
    ours = [r for r in rows if r["server"] == "llcinfer"]
    ok = all(r["unexpected_errors"] == 0 and r["lost"] == 0 and r.get("differ", []) == [] and
             r["kv_in_use_after"] == r["kv_in_use_before"] == 0 for r in ours)
    doc = {"settings": vars(a), "model_path": model, "ok": ok, "rows": rows}
    path = Path(a.json or f"perf/results/serve-load-{time.strftime('%Y-%m-%d')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{'PASS' if ok else 'FAIL'}: our server's checks; wrote {path}")
    sys.exit(0 if ok else 1)


def _print_row(r: dict) -> None:
    def f(x, digits):
        return "-" if x is None else f"{x:.{digits}f}"

    eq = f" | equal to alone {r['equal_to_alone']}/{r['compared']}" if "compared" in r else ""
    kv = f" | KV in use {r['kv_in_use_before']:.0f} -> {r['kv_in_use_after']:.0f}" if "kv_in_use_after" in r else ""
    print(f"{r['server']:12s} C={r['concurrency']:2d} | {r['completed']} done, {r['cancelled']} cancelled, "
          f"{r['malformed_answered_4xx']} malformed->4xx, {r['unexpected_errors']} unexpected, {r['lost']} lost | "
          f"{r['tps']:6.1f} tok/s | TTFT {f(r['ttft_p50_s'], 3)}/{f(r['ttft_p99_s'], 3)} s | "
          f"TPOT {f(r['tpot_p50_ms'], 1)}/{f(r['tpot_p99_ms'], 1)} ms{eq}{kv}", flush=True)


if __name__ == "__main__":
    main()
