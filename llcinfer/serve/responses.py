"""OpenAI response objects: ``chat.completion`` and its ``chat.completion.chunk`` stream,
``text_completion`` (whole or streamed), ``usage`` and both log-probability formats.

    chat:        "logprobs": {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}
    completions: "logprobs": {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}

Finish reasons: an end-of-generation token or a stop string is "stop", ``max_tokens`` or
the end of the context is "length".  A log-probability of -inf (a masked logit) is
written as -9999.0, as vLLM does: JSON has no infinity.
"""

from __future__ import annotations

import math
import time
import uuid

from ..engine.request import Completion
from ..model.tokenizer import Tokenizer

_FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}
_NEG_INF = -9999.0


def finish_reason(stop_reason: str) -> str | None:
    return _FINISH.get(stop_reason)


def usage(completions: list[Completion]) -> dict:
    """Prompt tokens once (the samples of ``n`` share them), generated tokens of every
    choice, and the prompt tokens that came from cached blocks."""
    lead = completions[0].stats
    done = sum(c.stats.n_generated for c in completions)
    return {"prompt_tokens": lead.n_prompt, "completion_tokens": done, "total_tokens": lead.n_prompt + done,
            "prompt_tokens_details": {"cached_tokens": lead.n_prompt - lead.n_prompt_evaluated}}


def _lp(x: float) -> float:
    return x if math.isfinite(x) else _NEG_INF


class Shape:
    """The objects of one request: its id, creation time and model, in the chat or the
    completions format (``kind``)."""

    def __init__(self, kind: str, model: str, tokenizer: Tokenizer):
        self.kind, self.model, self.tokenizer = kind, model, tokenizer
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self._offsets: dict[int, int] = {}  # completions: text offset of each choice's next token

    # ------------------------------------------------------------------ log-probabilities
    def _token(self, token_id: int) -> tuple[str, list[int]]:
        raw = self.tokenizer.token_bytes(token_id)
        return raw.decode("utf-8", errors="replace"), list(raw)

    def logprobs(self, index: int, ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]]) -> dict:
        """The log-probabilities of choice ``index``'s next tokens ``ids`` (in order: a
        stream calls this once per chunk)."""
        if self.kind == "chat":
            content = []
            for t, lp, top in zip(ids, lps, tops):
                text, raw = self._token(t)
                alts = []
                for a, alp in top:
                    a_text, a_raw = self._token(a)
                    alts.append({"token": a_text, "logprob": _lp(alp), "bytes": a_raw})
                content.append({"token": text, "logprob": _lp(lp), "bytes": raw, "top_logprobs": alts})
            return {"content": content}
        tokens, offsets, top_dicts = [], [], []
        at = self._offsets.get(index, 0)
        for t, top in zip(ids, tops):
            text, _ = self._token(t)
            tokens.append(text)
            offsets.append(at)
            at += len(text)
            alts: dict[str, float] = {}
            for a, alp in top:  # most likely first: two tokens of one text keep the likelier
                alts.setdefault(self._token(a)[0], _lp(alp))
            top_dicts.append(alts)
        self._offsets[index] = at
        return {"tokens": tokens, "token_logprobs": [_lp(x) for x in lps], "top_logprobs": top_dicts,
                "text_offset": offsets}

    def _completion_logprobs(self, index: int, c: Completion) -> dict | None:
        if c.logprobs is None:
            return None
        return self.logprobs(index, c.token_ids, c.logprobs, c.top_logprobs)

    # ------------------------------------------------------------------ whole responses
    def response(self, completions: list[Completion], counted: list[Completion] | None = None) -> dict:
        """The whole response with ``completions`` as its choices; the usage counts
        ``counted`` (default: the choices themselves)."""
        choices = []
        for i, c in enumerate(completions):
            choice = {"index": i}
            if self.kind == "chat":
                choice["message"] = {"role": "assistant", "content": c.text}
            else:
                choice["text"] = c.text
            choice["logprobs"] = self._completion_logprobs(i, c)
            choice["finish_reason"] = finish_reason(c.stop_reason)
            choices.append(choice)
        return {"id": self.id, "object": "chat.completion" if self.kind == "chat" else "text_completion",
                "created": self.created, "model": self.model, "choices": choices,
                "usage": usage(counted or completions)}

    # ------------------------------------------------------------------ stream chunks
    def chunk(self, index: int, text: str | None = None, logprobs: dict | None = None,
              finish: str | None = None, role: bool = False) -> dict:
        """One choice's chunk: new text (chat: the first one also carries the role), its
        tokens' log-probabilities, and the finish reason on the last."""
        if self.kind == "chat":
            delta = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": index, "delta": delta}
        else:
            choice = {"index": index, "text": text or ""}
        choice["logprobs"] = logprobs
        choice["finish_reason"] = finish
        return self._chunk([choice])

    def usage_chunk(self, completions: list[Completion]) -> dict:
        """The last chunk of a stream with ``include_usage``: no choices, the usage."""
        out = self._chunk([])
        out["usage"] = usage(completions)
        return out

    def _chunk(self, choices: list[dict]) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk" if self.kind == "chat" else "text_completion",
                "created": self.created, "model": self.model, "choices": choices}
