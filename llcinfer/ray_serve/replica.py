"""One replica: an ``LLM`` pinned to its core set, answering API request bodies with the
same ``Server`` as ``llcinfer serve`` (checks, admission, timeouts, response shapes).

``Replica`` is a plain class; ``deployment()`` makes a Ray Serve deployment of it.  Its
``call(kind, body)`` is an async generator, read by the ingress through a streaming
handle: first a head ``{"status", "headers", "stream"}`` (with ``"body"``, the JSON bytes,
when the response is not streamed), then, for a stream, its server-sent events.  A chat
stream's role chunks are held back and sent with its first generated text, so a replica
that dies before any text has nothing on the wire for that request and the ingress may
retry it elsewhere.
"""

from __future__ import annotations

import logging
import os

import anyio

from ..api import LLM
from ..hw.affinity import pin_process
from ..serve.app import create_server, error_response
from ..serve.protocol import APIError
from ..serve.streaming import EventStream, Preamble

log = logging.getLogger("llcinfer.serve")

_ENDPOINT = {"chat": "chat", "text": "completions"}


async def _connected() -> dict:
    """The ASGI receive of a request whose client is the ingress: it never disconnects
    (the ingress cancels the call instead)."""
    await anyio.sleep_forever()
    return {"type": "http.disconnect"}  # pragma: no cover - never reached


def _head(response) -> dict:
    return {"status": response.status_code, "stream": False, "body": bytes(response.body),
            "headers": {k: v for k, v in response.headers.items() if k.lower() == "retry-after"}}


class Replica:
    """An ``LLM`` on ``cores`` (this process's threads are pinned there first, so the
    planner plans for those cores alone) behind a ``Server``."""

    def __init__(self, model: str, index: int, cores: list[int], llm_options: dict, server_options: dict):
        self.index, self.cores = index, list(cores)
        self.pinned = pin_process(self.cores)
        self.llm = LLM(model, threads=len(self.cores), progress=False, **llm_options)
        self.server = create_server(self.llm, **server_options)

    async def call(self, kind: str, body: dict):
        """The head, then the events of a streamed response (module doc)."""
        try:
            response = await self.server.respond(kind, _ENDPOINT[kind], body, _connected)
        except APIError as e:
            yield _head(error_response(e))
            return
        except Exception as e:  # noqa: BLE001 - a bug answers 500 and a log line, not a traceback
            log.error("replica %d: %s failed: %s: %s", self.index, kind, type(e).__name__, e)
            yield _head(error_response(APIError(500, "internal server error", type="server_error",
                                                code="internal_error")))
            return
        if not isinstance(response, EventStream):
            yield _head(response)
            return
        try:
            yield {"status": 200, "stream": True, "headers": {}}
            held = ""
            async for event in response.body_iterator:
                if isinstance(event, Preamble):
                    held += event
                    continue
                yield held + event
                held = ""
        finally:
            response.run.close()

    def stats(self) -> dict:
        """Where this replica runs and its KV pool's counters."""
        return {"index": self.index, "pid": os.getpid(), "cores": self.cores, "pinned": self.pinned,
                "threads": self.llm.threads, "plan": self.llm.plan.label, "in_flight": self.server.in_flight,
                "kv": self.llm.kv_stats()}

    def metrics(self) -> str:
        """This replica's /metrics exposition (Prometheus text)."""
        body, _ = self.server.metrics.exposition()
        return body.decode() if isinstance(body, bytes) else body

    def __del__(self):
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.close()
