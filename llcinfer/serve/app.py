"""The ASGI app: an OpenAI-compatible API on one ``LLM``'s step loop (Starlette).

    POST /v1/chat/completions   POST /v1/completions   (stream or not)
    GET  /v1/models             GET  /v1/models/{id}
    GET  /health                GET  /metrics          (open even with an API key)

Controller trees given at start (``controllers``) are served as further model ids
(llcinfer.serve.controllers).

Admission: the server holds at most ``parallel + max_queue`` sequences (a request with
``n`` samples counts ``n``), ``parallel`` being the engine's concurrency; past that a
request gets 429 with ``Retry-After``.  Each request has ``request_timeout_s`` from
admission to its last token (queueing included); past it the request is cancelled and
answered 408 (a stream: an error event).  A body over ``max_body_bytes`` gets 413.
Every error is an OpenAI error object; an unexpected one is logged as one line and
answered 500 without a traceback.
"""

from __future__ import annotations

import hmac
import json
import logging
import time

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..api import LLM
from ..errors import ChatTemplateError, ContextLengthError, UsageError
from . import controllers as served_controllers
from .controllers import ServedController
from .metrics import Metrics
from .protocol import APIError, Generation, parse, unknown_model
from .responses import Shape
from .streaming import EventStream, Run, guarded_sse, sse

log = logging.getLogger("llcinfer.serve")

DEFAULT_MAX_QUEUE = 64
DEFAULT_TIMEOUT_S = 600.0  # llama-server's default --timeout
DEFAULT_MAX_BODY_BYTES = 4 << 20


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def authorize(request: Request, api_key: str | None) -> None:
    """Raise a 401 ``APIError`` unless ``request`` carries ``Authorization: Bearer api_key``
    (nothing to check when ``api_key`` is None)."""
    if api_key is None:
        return
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), api_key.encode()):
        raise APIError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                       type="authentication_error", code="invalid_api_key")


async def read_json(request: Request, limit: int) -> dict:
    """The request's body as a JSON object: 413 past ``limit`` bytes, 400 when it is not one."""
    too_big = APIError(413, f"request body larger than {limit} bytes", code="request_too_large")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_big
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_big
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "request body must be a JSON object", code="invalid_json")
    return data


class Server:
    """What the routes share: the model, the admission count, the metrics (``create_app``
    builds one; a Ray replica holds one to answer request bodies with ``respond``)."""

    def __init__(self, llm: LLM, model_name: str, controllers: list[ServedController], api_key: str | None,
                 max_queue: int, timeout_s: float | None, max_body_bytes: int):
        self.llm, self.model_name, self.api_key = llm, model_name, api_key
        self.controllers = {c.name: c for c in controllers}
        self.model_ids = [model_name] + list(self.controllers)
        self.parallel = llm.engine.scheduler.max_seqs
        self.capacity = self.parallel + max_queue
        self.timeout_s, self.max_body_bytes = timeout_s, max_body_bytes
        self.in_flight = 0  # sequences admitted and not yet answered (the event loop is the only writer)
        self.limiter = anyio.CapacityLimiter(self.capacity)  # a waiting worker thread per admitted request
        self.metrics = Metrics(llm, lambda: self.in_flight)
        self.created = int(time.time())

    # ------------------------------------------------------------------ checks
    def authorize(self, request: Request) -> None:
        authorize(request, self.api_key)

    async def read_json(self, request: Request) -> dict:
        return await read_json(request, self.max_body_bytes)

    # ------------------------------------------------------------------ generation
    def admit(self, gen: Generation, n: int, submit):
        """``submit()`` for a request of ``n`` sequences, if they fit beside those in flight."""
        if self.in_flight + n > self.capacity:
            raise APIError(429, f"the server is full ({self.in_flight} sequences in flight, at most "
                                f"{self.capacity}); retry shortly", type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": "1"})
        try:
            submitted = submit()
        except ContextLengthError as e:
            raise APIError(400, str(e), param="messages" if gen.kind == "chat" else "prompt",
                           code="context_length_exceeded") from None
        except (UsageError, ChatTemplateError) as e:
            raise APIError(400, str(e)) from None
        self.in_flight += n
        return submitted

    def submit(self, gen: Generation, served: ServedController | None) -> tuple[list, object]:
        """The engine requests of ``gen`` and, for a controller, the function that waits for its choice."""
        if served is not None:
            return self.admit(gen, served.tree.n_leaves,
                              lambda: served.tree.launch(self.llm, gen.prompt, gen.sampling.get("seed")))
        if gen.n == 1:
            return self.admit(gen, 1, lambda: [self.llm.submit(gen.prompt, **gen.sampling)]), None
        return self.admit(gen, gen.n, lambda: self.llm.submit_n(gen.prompt, gen.n, **gen.sampling)), None

    async def generate(self, request: Request, kind: str, endpoint: str) -> Response:
        try:
            self.authorize(request)
            body = await self.read_json(request)
        except APIError:
            self.metrics.finished(endpoint, "invalid", [])
            raise
        return await self.respond(kind, endpoint, body, request.receive)

    async def respond(self, kind: str, endpoint: str, body: dict, receive) -> Response:
        """The response to a checked-out request body: a JSON response, or an
        ``EventStream`` (whose ``run`` ends when it is closed).  ``receive`` is the ASGI
        channel whose ``http.disconnect`` cancels a whole (not streamed) response."""
        try:
            served = self.controllers.get(body.get("model"))
            if served is not None:
                served_controllers.check_request(body, served.name)
            gen = parse(kind, body, self.model_ids, self.parallel, self.llm.n_ctx)
            handles, wait = self.submit(gen, served)
        except APIError as e:
            self.metrics.finished(endpoint, "rejected" if e.status == 429 else "invalid", [])
            raise

        def on_close(run: Run) -> None:
            self.in_flight -= len(run.handles)
            self.metrics.finished(endpoint, run.outcome, [h.stats for h in run.handles])

        run = Run(handles, self.timeout_s, self.limiter, on_close)
        shape = Shape(kind, gen.model, self.llm.tokenizer)
        if gen.stream:
            chunks = sse(run, gen, shape) if served is None else \
                guarded_sse(run, served_controllers.chunks(run, gen, shape, served, wait))
            return EventStream(run, chunks)
        try:
            done = await run.collect(receive)
            if served is None:
                out = shape.response(done)
            else:
                outcome = await served_controllers.choose(wait)
                out = shape.response([served_controllers.as_completion(outcome)], counted=done)
                out["controller"] = served_controllers.summary(served, outcome)
            run.outcome = "ok"
            return JSONResponse(out)
        finally:
            run.close()

    # ------------------------------------------------------------------ the rest
    def model_card(self, model_id: str) -> dict:
        card = {"id": model_id, "object": "model", "created": self.created, "owned_by": "llcinfer"}
        if model_id in self.controllers:
            card["controller"] = {"type": self.controllers[model_id].type_name, "model": self.model_name}
        return card


def guarded(handler):
    """An endpoint whose every failure is an OpenAI error object."""

    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except APIError as e:
            return error_response(e)
        except ClientDisconnect:
            return Response(status_code=499)  # nobody reads it
        except Exception as e:  # noqa: BLE001 - a bug answers 500 and a log line, not a traceback
            log.error("%s %s failed: %s: %s", request.method, request.url.path, type(e).__name__, e)
            return error_response(APIError(500, "internal server error", type="server_error", code="internal_error"))

    return run


def create_server(llm: LLM, *, model_name: str | None = None, controllers: list[ServedController] = (),
                  api_key: str | None = None,
                  max_queue: int = DEFAULT_MAX_QUEUE, request_timeout_s: float | None = DEFAULT_TIMEOUT_S,
                  max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> Server:
    """The checked settings of ``create_app`` as a ``Server`` on ``llm``, whose engine
    thread it starts."""
    if not isinstance(max_queue, int) or max_queue < 0:
        raise UsageError(f"max_queue must be a non-negative integer (got {max_queue!r})")
    if request_timeout_s is not None and not request_timeout_s >= 0:
        raise UsageError(f"request_timeout_s must be >= 0 (got {request_timeout_s!r})")
    if not isinstance(max_body_bytes, int) or max_body_bytes < 1:
        raise UsageError(f"max_body_bytes must be a positive integer (got {max_body_bytes!r})")
    model_name = model_name or llm.model_path.stem
    ids = [model_name] + [c.name for c in controllers]
    for c in controllers:
        if ids.count(c.name) != 1:
            raise UsageError(f"controller id '{c.name}' is given twice or is the model's own id")
    server = Server(llm, model_name, list(controllers), api_key, max_queue, request_timeout_s or None,
                    max_body_bytes)
    for c in controllers:
        if c.tree.n_leaves > server.capacity:
            raise UsageError(f"controller '{c.name}' runs {c.tree.n_leaves} generations at once, more than the "
                             f"server admits ({server.parallel} parallel + {max_queue} queued)")
    llm.start()
    return server


def create_app(llm: LLM, *, model_name: str | None = None, controllers: list[ServedController] = (),
               api_key: str | None = None,
               max_queue: int = DEFAULT_MAX_QUEUE, request_timeout_s: float | None = DEFAULT_TIMEOUT_S,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> Starlette:
    """The ASGI app serving ``llm`` (mount it, or run it with uvicorn).  Starts the LLM's
    engine thread; closing the LLM is the caller's.

    ``model_name``: the id clients name (default: the model file's stem, which for a
    catalog model is its catalog name); ``api_key``: require ``Authorization: Bearer
    KEY`` on /v1/; ``controllers``: controller trees served under their own ids (one
    run's leaves must fit in ``parallel + max_queue``); ``max_queue``: sequences that may wait beyond the engine's
    concurrency before 429; ``request_timeout_s``: None or 0 for no limit."""
    server = create_server(llm, model_name=model_name, controllers=controllers, api_key=api_key, max_queue=max_queue,
                           request_timeout_s=request_timeout_s, max_body_bytes=max_body_bytes)

    async def chat(request: Request) -> Response:
        return await server.generate(request, "chat", "chat")

    async def completions(request: Request) -> Response:
        return await server.generate(request, "text", "completions")

    async def models(request: Request) -> Response:
        server.authorize(request)
        return JSONResponse({"object": "list", "data": [server.model_card(m) for m in server.model_ids]})

    async def model(request: Request) -> Response:
        server.authorize(request)
        model_id = request.path_params["model"]
        if model_id not in server.model_ids:
            raise unknown_model(model_id, server.model_ids)
        return JSONResponse(server.model_card(model_id))

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request) -> Response:
        body, content_type = server.metrics.exposition()
        return Response(body, media_type=content_type)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                                       type=kind, code=None))

    routes = [
        Route("/v1/chat/completions", guarded(chat), methods=["POST"]),
        Route("/v1/completions", guarded(completions), methods=["POST"]),
        Route("/v1/models", guarded(models), methods=["GET"]),
        Route("/v1/models/{model:path}", guarded(model), methods=["GET"]),
        Route("/health", guarded(health), methods=["GET"]),
        Route("/metrics", guarded(metrics), methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})
