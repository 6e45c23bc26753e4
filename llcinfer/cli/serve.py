"""``llcinfer serve``: the OpenAI-compatible server (llcinfer.serve) under uvicorn.

    llcinfer serve -m smollm2-135m [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--parallel 4]
                   [--controller vote8=vote.yaml ...] [--ref NAME=module:attribute ...]

Each ``--controller ID=FILE`` serves the controller tree of FILE as the model id ID
(llcinfer.serve.controllers); its config is checked before the port is bound.

The port is bound before the model loads (a port in use fails at once).  Ctrl-C or
SIGTERM stops accepting connections, lets the requests in flight finish, then closes the
model; a second Ctrl-C quits at once.
"""

from __future__ import annotations

import copy
import ipaddress
import os
import signal
import socket

import click

from ..errors import LLCInferError, UsageError
from .options import import_refs, kv_options, model_options, ref_option


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as e:
        reason = os.strerror(e.errno) if e.errno else str(e)
        raise LLCInferError(f"cannot listen on {host}:{port}: {reason}") from None


def _controllers(specs, refs) -> list:
    """ID=FILE pairs, each built into a served controller tree."""
    from ..controllers import from_config
    from ..serve.controllers import ServedController

    out = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--controller takes ID=FILE (got {spec!r})")
        tree = from_config(path, refs=refs)
        out.append(ServedController(name, tree, tree.type_name))
    return out


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _log_config() -> dict:
    """uvicorn's logging, with llcinfer.serve's lines through the same handler."""
    from uvicorn.config import LOGGING_CONFIG

    cfg = copy.deepcopy(LOGGING_CONFIG)
    cfg["loggers"]["llcinfer.serve"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return cfg


@click.command()
@model_options
@kv_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", type=int, default=8080, show_default=True, help="TCP port.")
@click.option("--api-key", default=None, help="Require 'Authorization: Bearer KEY' on /v1/ requests.")
@click.option("--parallel", type=int, default=4, show_default=True,
              help="Requests decoded at once (llama-server's --parallel).")
@click.option("--max-queue", type=int, default=64, show_default=True,
              help="Requests that may wait beyond --parallel; more get 429 with Retry-After.")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True,
              help="Seconds a request may take, queueing included, before it is cancelled (0: no limit).")
@click.option("--max-body-kb", type=int, default=4096, show_default=True, help="Largest request body, KiB (413 past it).")
@click.option("--controller", "controller_specs", multiple=True,
              help="ID=FILE: serve the controller tree of FILE (YAML or JSON) as model ID (repeatable).")
@ref_option
@click.option("--ray", "use_ray", is_flag=True,
              help="Serve replicas on Ray Serve, each pinned to its planner core set (the 'ray' extra).")
@click.option("--replicas", default="auto", show_default=True,
              help="With --ray: replicas, or 'auto' (one per LLC instance / NUMA node); -t is per replica.")
def serve(model, threads, n_ctx, numerics, kv_type, kv_budget_mb, host, port, api_key, parallel, max_queue,
          timeout_s, max_body_kb, controller_specs, refs, use_ray, replicas):
    """Serve MODEL over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions,
    /v1/models, /health, /metrics)."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be in 0..65535 (got {port})")
    if parallel < 1:
        raise UsageError(f"--parallel must be >= 1 (got {parallel})")
    if max_queue < 0 or timeout_s < 0 or max_body_kb < 1:
        raise UsageError("--max-queue and --timeout must be >= 0, --max-body-kb >= 1")
    controllers = _controllers(controller_specs, import_refs(refs))
    if use_ray:
        if controllers:
            raise UsageError("--controller is not served on --ray replicas yet; serve controllers without --ray")
        return _serve_on_ray(model, threads, n_ctx, numerics, kv_type, kv_budget_mb, host, port, api_key, parallel,
                             max_queue, timeout_s, max_body_kb, replicas)
    sock = _listen(host, port)
    import uvicorn

    from ..api import LLM
    from ..serve import create_app

    llm = LLM(model, threads=threads, n_ctx=n_ctx, numerics=numerics, kv_type=kv_type, n_seq=parallel,
              kv_budget_mb=kv_budget_mb)
    try:
        app = create_app(llm, controllers=controllers, api_key=api_key, max_queue=max_queue, request_timeout_s=timeout_s,
                         max_body_bytes=max_body_kb << 10)
        if api_key is None and not _is_loopback(host):
            click.echo(f"warning: listening on {host} without --api-key: anyone who reaches the port may use it",
                       err=True)
        click.echo(f"serving {llm.model_path.stem} ({llm.config.arch}, n_ctx {llm.n_ctx}, parallel {parallel}, "
                   f"threads {llm.threads}) on http://{host}:{sock.getsockname()[1]}/v1", err=True)
        for c in controllers:
            click.echo(f"  controller {c.name}: {c.type_name}, {c.tree.n_leaves} generations a request", err=True)
        server = uvicorn.Server(uvicorn.Config(app, log_config=_log_config(), timeout_graceful_shutdown=None))
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # drained like Ctrl-C (uvicorn re-raises it)
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:
            pass  # uvicorn drained the requests in flight, then passed the signal on
    finally:
        llm.close()
    click.echo("stopped", err=True)


def _serve_on_ray(model, threads, n_ctx, numerics, kv_type, kv_budget_mb, host, port, api_key, parallel, max_queue,
                  timeout_s, max_body_kb, replicas):
    """``serve --ray``: the replicas on a local Ray cluster (or RAY_ADDRESS's), Serve's proxy
    on host:port."""
    from ..planner.replicas import parse_replicas
    from ..ray_serve import deployment, replica_cores, require_ray, serve_until_interrupted

    require_ray()
    parse_replicas(replicas)
    _listen(host, port).close()  # a port in use fails now, not after the replicas load
    sets = replica_cores(replicas, threads)
    app = deployment(model, core_sets=sets, parallel=parallel, n_ctx=n_ctx, numerics=numerics, kv_type=kv_type,
                     kv_budget_mb=kv_budget_mb, api_key=api_key, max_queue=max_queue, request_timeout_s=timeout_s,
                     max_body_bytes=max_body_kb << 10)
    if api_key is None and not _is_loopback(host):
        click.echo(f"warning: listening on {host} without --api-key: anyone who reaches the port may use it", err=True)
    cores = "; ".join(",".join(map(str, s)) for s in sets)
    serve_until_interrupted(app, host, port, lambda url: click.echo(
        f"serving on Ray Serve: {len(sets)} replica{'s' if len(sets) > 1 else ''} (cores {cores}), parallel "
        f"{parallel} each, on {url}/v1", err=True))
    click.echo("stopped", err=True)
