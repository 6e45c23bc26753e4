"""OpenAI request bodies in, what to ask the engine out; and the API's error object.

``parse(kind, body, ...)`` checks a ``/v1/chat/completions`` (kind "chat") or
``/v1/completions`` (kind "text") body and returns a ``Generation``: the prompt (messages
or text), the sampling keyword arguments for ``LLM.submit``, ``n``, and the streaming and
log-probability options.  Anything out of range raises ``APIError`` (400, or 404 for an
unknown model) naming the parameter, which the app turns into

    {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}

Ranges are OpenAI's (temperature in [0, 2], top_p in (0, 1], top_logprobs in [0, 20]);
``top_k``, ``min_p``, ``repeat_penalty``, ``repeat_last_n`` and ``ignore_eos`` are accepted
as llama-server accepts them.  An omitted sampling field takes llama.cpp's default
(``SamplingParams``), as llama-server does; an omitted ``max_tokens`` generates until an
end-of-generation token or the end of the context.  Fields the engine cannot honour
(tools, non-zero frequency/presence penalties, logit_bias, echo, ...) are refused rather
than ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..engine.sampling import MAX_TOP_LOGPROBS


class APIError(Exception):
    """An error answered as an OpenAI error object with HTTP ``status``."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = "invalid_value", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class Generation:
    """One API request, ready for ``LLM.submit`` / ``LLM.submit_n``."""

    kind: str  # "chat" | "text"
    model: str  # the id the request named (or the served model's)
    prompt: str | list[dict]
    sampling: dict = field(default_factory=dict)  # SamplingParams keyword arguments
    n: int = 1
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    logprobs: int | None = None  # None: off; k: each token's log-probability and the top k


def _bad(param: str, message: str) -> APIError:
    return APIError(400, message, param=param)


def _number(body: dict, name: str, lo: float, hi: float, lo_open: bool = False, integer: bool = False):
    """body[name] as a number in [lo, hi] ((lo, hi] with ``lo_open``); None when absent."""
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not float(v).is_integer()):
        raise _bad(name, f"{name} must be {'an integer' if integer else 'a number'} (got {v!r})")
    if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo):
        left = "(" if lo_open else "["
        right = "]" if math.isfinite(hi) else ")"
        raise _bad(name, f"{name} must be in {left}{lo:g}, {hi:g}{right} (got {v!r})")
    return int(v) if integer else float(v)


def _flag(body: dict, name: str) -> bool:
    v = body.get(name, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise _bad(name, f"{name} must be true or false (got {v!r})")
    return v


def _refuse_unsupported(body: dict) -> None:
    """Fields whose meaning the engine cannot honour: an error, not a silent no-op."""
    for name in ("frequency_penalty", "presence_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise APIError(400, f"{name} is not supported (use repeat_penalty)", param=name,
                           code="unsupported_parameter")
    for name in ("tools", "functions", "logit_bias", "suffix"):
        if body.get(name):
            raise APIError(400, f"{name} is not supported", param=name, code="unsupported_parameter")
    if body.get("echo"):
        raise APIError(400, "echo is not supported", param="echo", code="unsupported_parameter")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise APIError(400, "response_format other than {\"type\": \"text\"} is not supported",
                       param="response_format", code="unsupported_parameter")


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("messages", "messages must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _bad(where, f"{where} must be an object with a string role")
        role, content = m["role"], m.get("content")
        if role not in ("system", "developer", "user", "assistant"):
            raise _bad(f"{where}.role", f"{where}.role must be system, developer, user or assistant (got {role!r})")
        if isinstance(content, list):  # content parts: only text
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise _bad(f"{where}.content", f"{where}.content: only text parts are supported")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise _bad(f"{where}.content", f"{where}.content must be a string or a list of text parts")
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


def _prompt(body: dict) -> str:
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        p = p[0]
    if not isinstance(p, str):
        raise _bad("prompt", "prompt must be a string (send one request per prompt)")
    return p


def _logprobs(kind: str, body: dict) -> int | None:
    if kind == "text":
        return _number(body, "logprobs", 0, MAX_TOP_LOGPROBS, integer=True)
    top = _number(body, "top_logprobs", 0, MAX_TOP_LOGPROBS, integer=True)
    if not _flag(body, "logprobs"):
        if top is not None:
            raise _bad("top_logprobs", "top_logprobs needs logprobs: true")
        return None
    return top or 0


def unknown_model(model: str, model_ids: list[str]) -> APIError:
    return APIError(404, f"The model '{model}' does not exist (this server serves {', '.join(map(repr, model_ids))})",
                    type="not_found_error", param="model", code="model_not_found")


def parse(kind: str, body: dict, model_ids: list[str], max_n: int, n_ctx: int) -> Generation:
    """Check an API request body; ``model_ids``: the ids it may name (the first when it
    names none), ``max_n`` choices at most, ``n_ctx`` the context length (the default
    ``max_tokens``)."""
    model = body.get("model")
    if model is None:
        model = model_ids[0]
    elif model not in model_ids:
        raise unknown_model(model, model_ids)
    _refuse_unsupported(body)
    prompt = _messages(body) if kind == "chat" else _prompt(body)
    sampling: dict = {}
    ranges = {"temperature": (0, 2, False, False), "top_p": (0, 1, True, False), "min_p": (0, 1, False, False),
              "top_k": (-1, math.inf, False, True), "repeat_penalty": (0, math.inf, True, False),
              "repeat_last_n": (-1, math.inf, False, True), "seed": (-math.inf, math.inf, False, True)}
    for name, (lo, hi, lo_open, integer) in ranges.items():
        v = _number(body, name, lo, hi, lo_open, integer)
        if v is not None:
            sampling[name] = v
    max_tokens = _number(body, "max_completion_tokens", 1, math.inf, integer=True)
    if max_tokens is None:
        max_tokens = _number(body, "max_tokens", 1, math.inf, integer=True)
    sampling["max_tokens"] = n_ctx if max_tokens is None else max_tokens  # the context ends it first
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise _bad("stop", "stop must be a non-empty string or a list of them")
        sampling["stop"] = tuple(stop)
    sampling["ignore_eos"] = _flag(body, "ignore_eos")
    n = _number(body, "n", 1, max_n, integer=True) or 1
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise APIError(400, "best_of is not supported", param="best_of", code="unsupported_parameter")
    logprobs = _logprobs(kind, body)
    if logprobs is not None:
        sampling["logprobs"] = logprobs
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise _bad("stream_options", "stream_options is only allowed with stream: true")
        if not isinstance(options, dict):
            raise _bad("stream_options", "stream_options must be an object")
    include_usage = _flag(options or {}, "include_usage")
    return Generation(kind, model, prompt, sampling, n, stream, include_usage, logprobs)
