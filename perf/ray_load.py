"""``llcinfer serve --ray`` under serve_load.py's load: 1 replica x T threads against R
replicas x T/R threads, what Ray adds per request against plain ``llcinfer serve``, and
a replica killed during the load.

    python perf/ray_load.py [--model smollm2-135m] [--cores 2] [--replicas 2] [--requests 60]
                            [--concurrency 4] [--max-tokens 32] [--short 100]
                            [--only plain,ray-1,ray-n,kill] [--json perf/results/ray-load-TAG.json]

Each configuration is a server started as a subprocess on a free loopback port
(serve_load.start, ``--parallel`` = the client concurrency per replica): ``plain`` is
``llcinfer serve -t CORES``; ``ray-1`` is ``--ray --replicas 1 -t CORES``; ``ray-n`` is
``--ray --replicas R -t CORES/R``.  Each gets, in order:

- short requests: ``--short`` whole (not streamed) /v1/completions of one greedy token on
  a 3-token prompt, one at a time; the client's latency, median and p90 (what a request
  costs besides its tokens: HTTP, routing, Ray's handle calls);
- the load: serve_load's request set (same seed, prompts of mixed lengths, a tenth
  cancelled by the client, malformed ones) from ``--concurrency`` clients, with its
  checks and figures (throughput, TTFT, TPOT, KV blocks in use back to 0), every
  completed output compared with the same request on ``plain``.

``kill`` runs ``ray-n``'s load again and SIGKILLs replica 1's process once 40% of
``ray-n``'s undisturbed wall time has passed; each request is then completed, retried
(the ingress's count), ended with a ``replica_failed`` error event, or lost (no answer:
must be 0).  Results are merged into the JSON file under the configuration's name, so the
configurations can run as separate commands.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "perf"))

import serve_load  # noqa: E402

from llcinfer.model import catalog  # noqa: E402


def short_latency(base: str, n: int) -> dict:
    """Median and p90 latency (ms) of ``n`` one-token whole completions, one at a time."""
    body = {"prompt": "The capital of", "max_tokens": 1, "temperature": 0}
    lat = []
    with httpx.Client(timeout=60) as client:
        for _ in range(3):  # warm the path
            client.post(base + "/v1/completions", json=body).raise_for_status()
        for _ in range(n):
            t0 = time.perf_counter()
            client.post(base + "/v1/completions", json=body).raise_for_status()
            lat.append(1e3 * (time.perf_counter() - t0))
    return {"n": n, "median_ms": float(np.median(lat)), "p90_ms": float(np.percentile(lat, 90)),
            "min_ms": float(np.min(lat))}


def _replica_rows(base: str) -> list[dict]:
    return httpx.get(base + "/v1/replicas", timeout=30).json()["data"]


async def _kill_after(base: str, delay_s: float, victim: int) -> dict:
    await asyncio.sleep(delay_s)
    async with httpx.AsyncClient(timeout=30) as client:
        rows = (await client.get(base + "/v1/replicas")).json()["data"]
    pid = rows[victim]["stats"]["pid"]
    os.kill(pid, signal.SIGKILL)
    return {"pid": pid, "at_s": delay_s, "in_flight_then": rows[victim]["in_flight"]}


async def _load_with_kill(base, jobs, a, delay_s):
    kill = asyncio.create_task(_kill_after(base, delay_s, 1))
    records, wall = await serve_load.drive(base, jobs, a.concurrency, a.max_tokens, a.timeout)
    return records, wall, await kill


def run(name: str, a, model: str, jobs: list[dict], doc: dict) -> dict:
    threads = a.cores if name in ("plain", "ray-1") else a.cores // a.replicas
    ours = {"plain": [], "ray-1": ["--ray", "--replicas", "1"]}.get(name, ["--ray", "--replicas", str(a.replicas)])
    log = ROOT / "perf" / "results" / f"ray-load-{name}.log.tmp"
    t0 = time.perf_counter()
    proc, base = serve_load.start("llcinfer", model, threads, a.concurrency, a.ctx, log, ("native", []), tuple(ours))
    row = {"config": name, "args": ours, "threads_per_replica": threads, "startup_s": time.perf_counter() - t0}
    reference = doc.get("plain", {}).get("texts")
    try:
        asyncio.run(serve_load.drive(base, [{"i": "w", "kind": "greedy", "prompt": "def warm_up():"}], 1, 8, a.timeout))
        if name != "kill":
            row["short"] = short_latency(base, a.short)
        kv_before = serve_load.kv_in_use(base)
        if name == "kill":
            delay = 0.4 * doc["ray-n"]["load"]["wall_s"]
            records, wall, row["killed"] = asyncio.run(_load_with_kill(base, jobs, a, delay))
        else:
            records, wall = asyncio.run(serve_load.drive(base, jobs, a.concurrency, a.max_tokens, a.timeout))
        if ours:
            row["replicas"] = [{k: r[k] for k in ("replica", "cores", "routed", "affinity", "retried", "failed")}
                               for r in _replica_rows(base)]
            if name == "kill":  # wait for Ray to restart the victim before the KV check
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and any(r["down"] for r in _replica_rows(base)):
                    time.sleep(1)
                row["restarted"] = not any(r["down"] for r in _replica_rows(base))
        kv_after = serve_load.kv_in_use(base)
    finally:
        serve_load.stop(proc)
    row["load"] = serve_load.summarize(records, wall, reference)
    row["load"].update(kv_in_use_before=kv_before, kv_in_use_after=kv_after)
    if name == "plain":
        row["texts"] = {r["i"]: r["text"] for r in records if r["kind"] == "greedy" and r.get("done")}
    if name == "kill":
        failed = [r for r in records if isinstance(r.get("error"), dict) and r["error"].get("code") == "replica_failed"]
        row["outcome"] = {"requests": len(records), "completed": row["load"]["completed"],
                          "cancelled": row["load"]["cancelled"], "malformed_4xx": row["load"]["malformed_answered_4xx"],
                          "retried": sum(r["retried"] for r in row["replicas"]),
                          "failed_cleanly": len(failed), "lost": row["load"]["lost"],
                          "other_errors": row["load"]["unexpected_errors"] - len(failed)}
    _print(row)
    return row


def _print(row: dict) -> None:
    ld = row["load"]
    short = row.get("short")
    s = f" | short {short['median_ms']:.1f}/{short['p90_ms']:.1f} ms" if short else ""
    print(f"{row['config']:6s} start {row['startup_s']:5.1f} s{s} | {ld['completed']} done, {ld['lost']} lost, "
          f"{ld['unexpected_errors']} unexpected | {ld['tps']:6.1f} tok/s | TTFT p50 {ld['ttft_p50_s'] or 0:.3f} s | "
          f"TPOT p50 {ld['tpot_p50_ms'] or 0:.1f} ms | equal {ld.get('equal_to_alone', '-')}/{ld.get('compared', '-')}"
          f" | KV {ld['kv_in_use_before']:.0f}->{ld['kv_in_use_after']:.0f}", flush=True)
    if "outcome" in row:
        print(f"kill   {row['killed']} -> {row['outcome']}", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--cores", type=int, default=2, help="threads of the one-replica servers")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompt-chars", default="200,800,2000")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--short", type=int, default=100, help="one-token requests for the per-request latency")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="plain,ray-1,ray-n,kill")
    ap.add_argument("--json", default=f"perf/results/ray-load-{time.strftime('%Y-%m-%d')}.json")
    a = ap.parse_args(argv)
    path = Path(a.json)
    doc = json.loads(path.read_text()) if path.exists() else {}
    model = str(catalog.resolve_model(a.model, progress=True))
    jobs = serve_load.make_jobs(a.requests, 0.1, 5, [int(c) for c in a.prompt_chars.split(",")], a.seed)
    for name in a.only.split(","):
        doc.setdefault("settings", {})[name] = {k: v for k, v in vars(a).items() if k != "only"}
        doc[name] = run(name, a, model, jobs, doc)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
