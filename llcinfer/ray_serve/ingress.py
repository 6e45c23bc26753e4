"""The ingress: the OpenAI routes of ``llcinfer serve`` in front of the replicas.

    POST /v1/chat/completions   POST /v1/completions   (answered by a replica)
    GET  /v1/models             GET  /v1/models/{id}
    GET  /v1/replicas           (routing counts and each replica's cores and KV counters)
    GET  /health                GET  /metrics          (open even with an API key)

It checks the key and reads the body as ``llcinfer serve`` does, picks a replica
(routing.py) and relays its answer, adding ``x-llcinfer-replica: i``.  A replica that
dies before anything of the response was sent (a whole response, or a stream before its
first generated text) is marked down until Ray has restarted it, and the request is
retried on another one; a stream that already sent text ends with an error event
(``code: replica_failed``) and ``data: [DONE]``.  Nothing is dropped without an answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import anyio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, WorkerCrashedError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..serve.app import authorize, error_response, guarded, read_json
from ..serve.protocol import APIError
from .routing import PrefixRouter, routing_units

log = logging.getLogger("llcinfer.serve")

REPLICA_DIED = (RayActorError, ActorDiedError, ActorUnavailableError, WorkerCrashedError) + tuple(
    e for e in [getattr(serve.exceptions, "ReplicaUnavailableError", None)] if e is not None)


def replica_died(e: BaseException) -> bool:
    """Whether ``e`` says the replica's process is gone (directly, or as a task error's cause)."""
    return isinstance(e, REPLICA_DIED) or isinstance(getattr(e, "cause", None), REPLICA_DIED)
STATS_TIMEOUT_S = 10.0


class _Counts:
    """The ingress's Prometheus counters (its own registry)."""

    def __init__(self, router: PrefixRouter):
        self.registry = r = CollectorRegistry()
        self.routed = Counter("llcinfer_ray_routed", "Requests sent to a replica, by routing reason",
                              ["replica", "reason"], registry=r)
        self.retried = Counter("llcinfer_ray_retried", "Requests retried after their replica died "
                               "before sending anything", ["replica"], registry=r)
        self.failed = Counter("llcinfer_ray_failed", "Streams ended with an error event: their replica "
                              "died after sending text", ["replica"], registry=r)
        self.unavailable = Counter("llcinfer_ray_unavailable", "Requests answered 503: every try failed",
                                   registry=r)
        load = Gauge("llcinfer_ray_in_flight", "Requests in flight per replica", ["replica"], registry=r)
        for i in range(router.n):
            load.labels(str(i)).set_function(lambda i=i: router.load[i])


class Ingress:
    """Routes and relays (module doc).  ``replicas``: Ray Serve handles, one per replica
    deployment (each deployment is one replica on its own core set)."""

    def __init__(self, settings: dict, *replicas):
        self.replicas = list(replicas)
        self.model_name, self.api_key = settings["model_name"], settings.get("api_key")
        self.max_body_bytes = settings["max_body_bytes"]
        self.core_sets = settings["core_sets"]
        self.router = PrefixRouter(len(self.replicas), **settings.get("routing", {}))
        self.counts = _Counts(self.router)
        self.n_retried = [0] * len(self.replicas)
        self.n_failed = [0] * len(self.replicas)
        self.n_unavailable = 0
        self.down: set[int] = set()  # died; back once a call to it answers again
        self._watch: set = set()  # the tasks waiting for them (held: the loop keeps weak references)
        self.created = int(time.time())
        self.routes = {("POST", "/v1/chat/completions"): guarded(lambda r: self.generate(r, "chat")),
                       ("POST", "/v1/completions"): guarded(lambda r: self.generate(r, "text")),
                       ("GET", "/v1/models"): guarded(self.models), ("GET", "/v1/replicas"): guarded(self.stats),
                       ("GET", "/health"): guarded(self.health), ("GET", "/metrics"): guarded(self.metrics)}

    async def __call__(self, request: Request) -> Response:
        path, method = request.url.path.rstrip("/") or "/", request.method
        handler = self.routes.get((method, path))
        if handler is None and method == "GET" and path.startswith("/v1/models/"):
            return await guarded(self.model)(request)
        if handler is None:
            known = any(p == path for _, p in self.routes)
            status = 405 if known else 404
            return error_response(APIError(status, f"{method} {path}: {'Method Not Allowed' if known else 'Not Found'}",
                                           type="not_found_error" if status == 404 else "invalid_request_error",
                                           code=None))
        return await handler(request)

    # ------------------------------------------------------------------ generation
    async def generate(self, request: Request, kind: str) -> Response:
        authorize(request, self.api_key)
        body = await read_json(request, self.max_body_bytes)
        i, head, first, gen = await self._open(kind, body, routing_units(kind, body))
        headers = {**head.get("headers", {}), "x-llcinfer-replica": str(i)}
        if not head["stream"]:
            return Response(head["body"], status_code=head["status"], headers=headers, media_type="application/json")
        headers.update({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return StreamingResponse(self._relay(i, first, gen), media_type="text/event-stream", headers=headers)

    async def _open(self, kind: str, body: dict, units: list[str]):
        """(replica, head, first event or None, stream) of the first replica that answers;
        a replica that dies first is marked down and the next one tried."""
        tried: set[int] = set()
        for _ in range(len(self.replicas) + 1):
            i = self.router.choose(units, avoid=tried | self.down)
            gen = self.replicas[i].options(stream=True).call.remote(kind, body)
            try:
                head = await gen.__anext__()
                first = await gen.__anext__() if head["stream"] else None
            except BaseException as e:
                self.router.finished(i)
                if not replica_died(e):
                    gen.cancel()
                    raise
                self._died(i, e)
                tried.add(i)
                self.n_retried[i] += 1
                self.counts.retried.labels(str(i)).inc()
                continue
            if not head["stream"]:
                self.router.finished(i)
            self.counts.routed.labels(str(i), self.router.last_reason).inc()
            return i, head, first, gen
        self.n_unavailable += 1
        self.counts.unavailable.inc()
        raise APIError(503, "no replica could answer: each one tried failed before responding; retry shortly",
                       type="server_error", code="replica_unavailable", headers={"Retry-After": "5"})

    async def _relay(self, i: int, first: str, gen):
        ended = False
        try:
            yield first
            async for event in gen:
                yield event
            ended = True
        except Exception as e:  # noqa: BLE001 - the stream has started: end it with an error event
            if replica_died(e):
                self._died(i, e)
                self.n_failed[i] += 1
                self.counts.failed.labels(str(i)).inc()
                err = APIError(502, f"replica {i} failed after the stream had started; the answer is incomplete "
                                    f"({type(e).__name__})", type="server_error", code="replica_failed")
            else:
                log.error("relaying replica %d failed: %s: %s", i, type(e).__name__, e)
                err = APIError(500, "internal server error", type="server_error", code="internal_error")
            yield f"data: {json.dumps(err.body())}\n\n"
            yield "data: [DONE]\n\n"
            ended = True
        finally:
            self.router.finished(i)
            if not ended:
                gen.cancel()

    def _died(self, i: int, e: BaseException) -> None:
        if i in self.down:
            return
        log.warning("replica %d died (%s); routing around it until Ray has restarted it", i, type(e).__name__)
        self.down.add(i)
        self.router.forget(i)
        self._watch.add(asyncio.get_running_loop().create_task(self._until_back(i)))

    async def _until_back(self, i: int) -> None:
        while True:
            try:
                await self.replicas[i].stats.remote()
                break
            except Exception as e:  # noqa: BLE001 - not back yet
                if not replica_died(e):
                    log.warning("replica %d: %s: %s", i, type(e).__name__, e)
                await anyio.sleep(0.5)
        self.down.discard(i)
        self._watch = {t for t in self._watch if not t.done()}
        log.warning("replica %d is back", i)

    # ------------------------------------------------------------------ the rest
    def _card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "llcinfer"}

    async def models(self, request: Request) -> Response:
        authorize(request, self.api_key)
        return JSONResponse({"object": "list", "data": [self._card()]})

    async def model(self, request: Request) -> Response:
        authorize(request, self.api_key)
        name = request.url.path[len("/v1/models/"):]
        if name != self.model_name:
            raise APIError(404, f"The model '{name}' does not exist", type="not_found_error", param="model",
                           code="model_not_found")
        return JSONResponse(self._card())

    async def stats(self, request: Request) -> Response:
        """Routing counts per replica with each live replica's own stats."""
        authorize(request, self.api_key)
        out = []
        for i, handle in enumerate(self.replicas):
            row = {"replica": i, "cores": self.core_sets[i], "in_flight": self.router.load[i],
                   "routed": self.router.routed[i], "affinity": self.router.affinity[i],
                   "retried": self.n_retried[i], "failed": self.n_failed[i], "down": i in self.down}
            if i not in self.down:
                try:
                    with anyio.fail_after(STATS_TIMEOUT_S):
                        row["stats"] = await handle.stats.remote()
                except Exception as e:  # noqa: BLE001 - a replica restarting or gone: say so, answer the rest
                    row["stats"] = {"error": type(e).__name__}
            out.append(row)
        return JSONResponse({"object": "list", "unavailable": self.n_unavailable, "data": out})

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "replicas": len(self.replicas), "down": sorted(self.down)})

    async def metrics(self, request: Request) -> Response:
        """The routing counters, then every live replica's own metrics labelled with it."""
        texts = []
        for i, handle in enumerate(self.replicas):
            if i in self.down:
                continue
            try:
                with anyio.fail_after(STATS_TIMEOUT_S):
                    texts.append((i, await handle.metrics.remote()))
            except Exception:  # noqa: BLE001 - a replica restarting or gone: the others' metrics still come
                pass
        body = generate_latest(self.counts.registry).decode() + merge_labelled(texts)
        return Response(body, media_type=CONTENT_TYPE_LATEST)


def merge_labelled(texts: list[tuple[int, str]]) -> str:
    """Prometheus expositions of several replicas as one: ``replica="i"`` added to every
    sample, each family's HELP and TYPE once and its samples of every replica together."""
    families: dict[str, list[str]] = {}
    for replica, text in texts:
        family = None
        for line in text.splitlines():
            if line.startswith("#"):
                parts = line.split(" ", 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    family = parts[2]
                    head = families.setdefault(family, [])
                    if not any(x.startswith(f"# {parts[1]} ") for x in head):
                        head.append(line)
                continue
            if not line or family is None:
                continue
            name, sep, rest = line.partition("{")
            if not sep:
                name, _, rest = line.partition(" ")
                rest = "} " + rest
            families[family].append(f'{name}{{replica="{replica}"' + ("," if not rest.startswith("}") else "") + rest)
    return "".join(line + "\n" for lines in families.values() for line in lines)
