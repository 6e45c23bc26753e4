"""The Ray Serve application: one deployment per replica (one replica each, on its own
core set, restarted by Ray when it dies) behind one ingress deployment, and running it
from ``llcinfer serve --ray``.

One deployment per replica rather than one deployment of N replicas: each replica's
arguments name its cores, so a replica that Ray restarts comes back on the same cores,
and the ingress, holding one handle per replica, chooses the replica itself (prefix
affinity, load, retries elsewhere) instead of Ray Serve's router choosing for it.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from ..errors import UsageError
from ..hw import detect_topology
from ..model import catalog
from ..planner.replicas import replica_core_sets
from ..serve.app import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_QUEUE, DEFAULT_TIMEOUT_S
from .ray_import import require_ray

APP_NAME = "llcinfer"
HEALTH_CHECK_PERIOD_S = 2.0
HEALTH_CHECK_TIMEOUT_S = 30.0


def replica_cores(replicas="auto", threads: int | None = None, core_sets=None) -> list[list[int]]:
    """The core set of each replica: ``core_sets`` as given, else this machine's split by
    ``replica_core_sets``; ``threads`` keeps that many cores of each set."""
    sets = [sorted(int(c) for c in s) for s in core_sets] if core_sets else \
        replica_core_sets(detect_topology(), replicas)
    if threads is not None:
        if not isinstance(threads, int) or threads < 1 or threads > min(len(s) for s in sets):
            raise UsageError(f"threads must be in 1..{min(len(s) for s in sets)}, the cores of the smallest "
                             f"replica (got {threads!r})")
        sets = [s[:threads] for s in sets]
    return sets


def deployment(model: str | None = None, *, replicas="auto", threads: int | None = None, core_sets=None,
               parallel: int = 4, n_ctx: int | None = None, numerics: str = "llama.cpp", kv_type: str | None = None,
               kv_budget_mb: float | None = None, model_name: str | None = None, api_key: str | None = None,
               max_queue: int = DEFAULT_MAX_QUEUE, request_timeout_s: float | None = DEFAULT_TIMEOUT_S,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, routing: dict | None = None):
    """The Ray Serve application (``serve.run(deployment(...))``) serving ``model`` (a
    catalog name, fetched here once, or a .gguf path) from ``replicas`` replicas ('auto':
    one per LLC instance / NUMA node) of ``parallel`` sequences each.  The other arguments
    are those of ``LLM`` and ``create_app``; ``routing`` those of ``PrefixRouter``."""
    _, serve = require_ray()
    from .ingress import Ingress
    from .replica import Replica

    if not isinstance(parallel, int) or parallel < 1:
        raise UsageError(f"parallel must be a positive integer (got {parallel!r})")
    path = str(catalog.resolve_model(model, progress=True))
    sets = replica_cores(replicas, threads, core_sets)
    llm_options = {"n_ctx": n_ctx, "numerics": numerics, "kv_type": kv_type, "n_seq": parallel,
                   "kv_budget_mb": kv_budget_mb}
    name = model_name or Path(path).stem
    server_options = {"model_name": name, "api_key": None, "max_queue": max_queue,
                      "request_timeout_s": request_timeout_s, "max_body_bytes": max_body_bytes}
    rep = serve.deployment(Replica)
    bound = [rep.options(name=f"replica-{i}", num_replicas=1, max_ongoing_requests=parallel + max_queue + 1,
                         health_check_period_s=HEALTH_CHECK_PERIOD_S, health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S,
                         ray_actor_options={"num_cpus": len(cores)}).bind(path, i, cores, llm_options, server_options)
             for i, cores in enumerate(sets)]
    settings = {"model_name": name, "api_key": api_key, "max_body_bytes": max_body_bytes, "core_sets": sets,
                "routing": {"slack": parallel, **(routing or {})}}
    ingress = serve.deployment(Ingress).options(name="ingress", num_replicas=1,
                                                max_ongoing_requests=len(sets) * (parallel + max_queue) + 16,
                                                ray_actor_options={"num_cpus": 0})
    return ingress.bind(settings, *bound)


def start(app, host: str = "127.0.0.1", port: int = 8000, num_cpus: int | None = None) -> str:
    """Start Ray (a local cluster unless RAY_ADDRESS names one) and Ray Serve's HTTP proxy
    on ``host:port``, run ``app`` and wait for its replicas; returns the base URL."""
    ray, serve = require_ray()
    if not ray.is_initialized():
        ray.init(num_cpus=num_cpus, include_dashboard=False)
    serve.start(http_options={"host": host, "port": port})
    serve.run(app, name=APP_NAME, route_prefix="/")
    return f"http://{host}:{port}"


def stop() -> None:
    """Shut down the application, Ray Serve and this process's Ray."""
    ray, serve = require_ray()
    try:
        serve.shutdown()
    finally:
        ray.shutdown()


def serve_until_interrupted(app, host: str, port: int, on_ready) -> None:
    """``start``, call ``on_ready(url)``, then wait for Ctrl-C or SIGTERM; ``stop`` always."""
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        on_ready(start(app, host, port))
        while not done.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        stop()
