"""From the engine's requests to the event loop: waiting for text without blocking the
loop, server-sent events, cancellation and the per-request deadline.

Each request's text pieces arrive on a thread-safe queue that the engine thread fills
(``Request.pieces``, then ``None`` at the end).  A ``Run`` waits for them on a worker
thread (one per HTTP request, from the app's own limiter so queued requests never starve
running ones of threads), ``n`` queues at once for the samples of one prompt, and hands
them to the event loop in batches.  ``Run.close()`` is the one exit: it cancels what still
runs, which frees its KV blocks at once, whether the request completed, timed out, failed
or its client went away.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from typing import AsyncIterator, Callable

import anyio
import anyio.to_thread
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse

from ..engine.request import Completion, RequestHandle
from ..errors import ContextLengthError, LLCInferError, OutOfMemoryError
from .protocol import APIError, Generation
from .responses import Shape, finish_reason

log = logging.getLogger("llcinfer.serve")

_POLL_S = 0.05  # a waiting worker re-checks whether its run was closed


def _drain(queues: list) -> list[tuple[int, str | None]]:
    out = []
    for i, q in enumerate(queues):
        while True:
            try:
                piece = q.get_nowait()
            except queue.Empty:
                break
            out.append((i, piece))
            if piece is None:
                break
    return out


def _wait_pieces(queues: list, stop: threading.Event, deadline: float | None) -> list[tuple[int, str | None]]:
    """On a worker thread: block until one of ``queues`` holds something, then take all
    there is as (queue index, piece) pairs; [] once ``stop`` is set or ``deadline`` passed."""
    while not stop.is_set():
        got = _drain(queues)
        if got:
            return got
        wait = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
        if wait <= 0:
            return []
        try:
            first = queues[0].get(timeout=wait)  # the samples of one prompt advance together
        except queue.Empty:
            continue
        return [(0, first)] + _drain(queues)
    return []


def engine_error(exc: Exception) -> APIError:
    """The API error for a request the engine ended with ``exc``."""
    if isinstance(exc, ContextLengthError):
        return APIError(400, str(exc), code="context_length_exceeded")
    if isinstance(exc, OutOfMemoryError):  # it cannot fit in the KV budget even alone
        return APIError(400, str(exc), code="kv_budget_exceeded")
    if isinstance(exc, LLCInferError):
        return APIError(500, str(exc), type="server_error", code="engine_error")
    log.error("request failed in the engine: %s: %s", type(exc).__name__, exc)
    return APIError(500, "the engine failed on this request", type="server_error", code="engine_error")


class Run:
    """The engine requests of one API request (``n`` samples of its prompt), from
    submission to ``close()``.  ``outcome``: "ok", "timeout", "error", or "disconnected"
    when it was closed before it ended."""

    def __init__(self, handles: list[RequestHandle], timeout_s: float | None, limiter: anyio.CapacityLimiter,
                 on_close: Callable[["Run"], None]):
        self.handles, self.timeout_s, self._limiter, self._on_close = handles, timeout_s, limiter, on_close
        self.deadline = None if not timeout_s else time.monotonic() + timeout_s
        self.outcome: str | None = None
        self._stop = threading.Event()
        self._seen = [0] * len(handles)  # log-probabilities handed out per choice
        self._closed = False

    async def events(self) -> AsyncIterator[tuple[int, str | None]]:
        """(choice index, text piece) as the pieces come; (index, None) when a choice ends.
        Raises a 408 ``APIError`` when the deadline passes first."""
        live = list(range(len(self.handles)))
        while live:
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self.outcome = "timeout"
                raise APIError(408, f"the request did not finish within the server's timeout of {self.timeout_s:g} s",
                               type="timeout_error", code="request_timeout")
            queues = [self.handles[i].request.pieces for i in live]
            got = await anyio.to_thread.run_sync(_wait_pieces, queues, self._stop, self.deadline,
                                                 abandon_on_cancel=True, limiter=self._limiter)
            ended = set()
            for j, piece in got:
                yield live[j], piece
                if piece is None:
                    ended.add(live[j])
            live = [i for i in live if i not in ended]

    def new_logprobs(self, index: int, shape: Shape) -> dict | None:
        """Log-probabilities of choice ``index``'s tokens since the last call (None when
        the request did not ask for them)."""
        req = self.handles[index].request
        if req.logprobs is None:
            return None
        # the loop appends logprobs, then top_logprobs, then the token: count what all three hold
        have = min(len(req.logprobs), len(req.top_logprobs), len(req.tokens) - req.n_prompt)
        lo, self._seen[index] = self._seen[index], have
        start = req.n_prompt
        return shape.logprobs(index, req.tokens[start + lo:start + have], req.logprobs[lo:have],
                              req.top_logprobs[lo:have])

    def completions(self) -> list[Completion]:
        """The finished choices; an engine failure raises its API error."""
        done = [h.result() for h in self.handles]
        for c in done:
            if c.error is not None:
                self.outcome = "error"
                raise engine_error(c.error)
        return done

    async def collect(self, receive) -> list[Completion]:
        """Wait for every choice (a whole response); the client going away cancels the run."""
        failure = None
        async with anyio.create_task_group() as tg:
            async def watch_disconnect():
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()

            tg.start_soon(watch_disconnect)
            try:
                async for _ in self.events():
                    pass
            except APIError as e:
                failure = e
            tg.cancel_scope.cancel()
        if failure is not None:
            raise failure
        if not all(h.done for h in self.handles):  # cancelled: the client is gone
            raise ClientDisconnect()
        return self.completions()

    def close(self) -> None:
        """Cancel whatever still runs (its blocks are freed now), then report (once)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for h in self.handles:
            if not h.done:
                h.cancel()
        if self.outcome is None:
            self.outcome = "disconnected"
        self._on_close(self)


def _data(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


class Preamble(str):
    """An event sent before any generated text (a chat stream's role chunks): a relay may
    hold it back and still retry the request elsewhere."""


def role_chunks(gen: Generation, shape: Shape, n: int):
    """A chat stream's first events: the role of each choice (nothing for completions)."""
    if gen.kind == "chat":
        for i in range(n):
            yield Preamble(_data(shape.chunk(i, text="", role=True)))


def sse(run: Run, gen: Generation, shape: Shape) -> AsyncIterator[str]:
    """The server-sent events of a streamed request."""
    async def chunks():
        for event in role_chunks(gen, shape, gen.n):
            yield event
        async for i, piece in run.events():
            if piece is None:
                c = run.handles[i].result()
                if c.error is not None:
                    run.outcome = "error"
                    raise engine_error(c.error)
                yield shape.chunk(i, logprobs=run.new_logprobs(i, shape), finish=finish_reason(c.stop_reason))
            else:
                yield shape.chunk(i, piece, logprobs=run.new_logprobs(i, shape))
        if gen.include_usage:
            yield shape.usage_chunk(run.completions())

    return guarded_sse(run, chunks())


async def guarded_sse(run: Run, chunks: AsyncIterator) -> AsyncIterator[str]:
    """``chunks`` (objects, or events already written: ``Preamble``) as server-sent events,
    ``data: [DONE]`` last; an error after the stream started is sent as an ``{"error": ...}``
    event (vLLM's way)."""
    try:
        async for obj in chunks:
            yield obj if isinstance(obj, Preamble) else _data(obj)
        run.outcome = "ok"
    except APIError as e:
        yield _data(e.body())
    except Exception as e:  # noqa: BLE001 - the stream has started: end it with an error event
        run.outcome = "error"
        log.error("streaming failed: %s: %s", type(e).__name__, e)
        yield _data(APIError(500, "internal server error", type="server_error", code="internal_error").body())
    yield "data: [DONE]\n\n"


class EventStream(StreamingResponse):
    """A ``text/event-stream`` response that closes its run however it ends (done, client
    gone, server shutting down).  A relay that reads ``body_iterator`` itself closes ``run``."""

    def __init__(self, run: Run, body: AsyncIterator[str]):
        super().__init__(body, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.run = run

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except ClientDisconnect:
            pass
        finally:
            self.run.close()
