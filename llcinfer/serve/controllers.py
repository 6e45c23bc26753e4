"""Controllers served as models: ``llcinfer serve --controller vote8=vote.yaml`` lists
``vote8`` in ``/v1/models`` beside the model, and a request naming it runs the controller
tree on the request's prompt (messages or text) and answers with the text it chose.

The tree's sampling comes from its config, so a request for a controller may set only
``seed`` (the run seed: leaf i samples with seed + i); the other sampling fields, ``n`` > 1
and log-probabilities are refused.  All leaf generations are submitted at once (the samples
of a node share the prompt's KV blocks) and count against the server's admission as one
sequence each; the request's deadline, a client that goes away and the end of the request
cancel them like any other.  The response is an ordinary completion whose one choice is the
chosen text, whose usage counts every leaf's generated tokens, plus a ``controller`` field:
its type, the answer it chose (majority vote), the score (vote share or reward) and the
number of candidates.  Streamed, the chosen text arrives as one chunk once it is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator

import anyio.to_thread

from ..controllers import Controller, Outcome
from ..engine.request import Completion
from ..errors import LLCInferError
from .protocol import APIError
from .responses import finish_reason

# request fields a controller's config decides
_CONFIG_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "repeat_last_n", "max_tokens",
                  "max_completion_tokens", "stop", "ignore_eos", "logprobs", "top_logprobs", "best_of")


@dataclass
class ServedController:
    """A controller tree as the server offers it: the id clients name, the tree, its type."""

    name: str
    tree: Controller
    type_name: str


def check_request(body: dict, name: str) -> None:
    """Refuse the fields a request for controller ``name`` may not set."""
    for field in _CONFIG_FIELDS:
        if body.get(field) not in (None, False):
            raise APIError(400, f"model '{name}' is a controller: its config sets {field}", param=field,
                           code="unsupported_parameter")
    if body.get("n") not in (None, 1):
        raise APIError(400, f"model '{name}' is a controller: it returns one choice (n must be 1)", param="n",
                       code="unsupported_parameter")


def summary(served: ServedController, outcome: Outcome) -> dict:
    """The response's ``controller`` field."""
    return {"name": served.name, "type": served.type_name, "answer": outcome.answer, "score": outcome.score,
            "n_candidates": len(outcome.candidates)}


def as_completion(outcome: Outcome) -> Completion:
    """The chosen text as the one choice of a response."""
    return Completion(outcome.text, outcome.token_ids, outcome.stop_reason)


async def chunks(run, gen, shape, served: ServedController, wait) -> AsyncIterator[dict]:
    """A streamed controller request: the role, then (once every leaf has ended and the tree
    has chosen) the chosen text and its finish reason, then the usage when asked for."""
    if gen.kind == "chat":
        yield shape.chunk(0, text="", role=True)
    async for _ in run.events():
        pass
    leaves = run.completions()
    outcome = await choose(wait)
    yield shape.chunk(0, outcome.text)
    last = shape.chunk(0, finish=finish_reason(outcome.stop_reason))
    last["controller"] = summary(served, outcome)
    yield last
    if gen.include_usage:
        yield shape.usage_chunk(leaves)


async def choose(wait) -> Outcome:
    """The tree's choice, once its leaves have ended (on a worker thread: a reward may score
    the candidates with a model); a failure there is a 500 naming it."""
    try:
        return await anyio.to_thread.run_sync(wait)
    except LLCInferError as e:
        raise APIError(500, f"the controller failed: {e}", type="server_error", code="controller_error") from None
