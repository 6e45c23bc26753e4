"""Rewards for ``best_of_n``: a number per candidate, higher is better.

    logprob    the candidate's mean token log-probability under the model that wrote it
    function   a Python callable (prompt, text) -> float, given by ``$ref``
    model      its mean token log-probability under another model (an LLM by ``$ref``, or a
               catalog name / .gguf path loaded on first use), teacher-forced token by token
               through that model's step loop (each step extends the previous sequence)
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import UsageError
from .nodes import Outcome
from .registry import register_reward


@register_reward("logprob")
class LogprobReward:
    ARGS: tuple[str, ...] = ()

    @classmethod
    def from_node(cls, node, path, builder):
        return cls()

    def score(self, prompt, o: Outcome) -> float:
        return -math.inf if o.mean_logprob is None else o.mean_logprob


@register_reward("function")
class FunctionReward:
    ARGS = ("function",)

    def __init__(self, fn):
        self.fn = fn

    @classmethod
    def from_node(cls, node, path, builder):
        fn = builder.resolve(builder.take(node, path, "function", required=True), f"{path}.function")
        if not callable(fn):
            raise builder.error(f"{path}.function", f"function must be a $ref to a callable (got {fn!r:.60})")
        return cls(fn)

    def score(self, prompt, o: Outcome) -> float:
        value = self.fn(prompt, o.text)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise UsageError(f"best_of_n: the reward function returned {value!r}, not a number")
        return float(value)


@register_reward("model")
class ModelReward:
    ARGS = ("model",)

    def __init__(self, model):
        self._model = model  # an LLM, or the name / path to load one from

    @classmethod
    def from_node(cls, node, path, builder):
        model = builder.resolve(builder.take(node, path, "model", required=True), f"{path}.model")
        if not (isinstance(model, str) or hasattr(model, "logits")):
            raise builder.error(f"{path}.model", f"model is a catalog name, a .gguf path or a $ref to an LLM "
                                                 f"(got {model!r:.60})")
        return cls(model)

    def _llm(self):
        if isinstance(self._model, str):
            from ..api import LLM

            self._model = LLM(self._model, progress=False)
        return self._model

    def score(self, prompt, o: Outcome) -> float:
        llm = self._llm()
        if isinstance(prompt, list):
            ids = llm.tokenize(llm.apply_chat_template(prompt), special=True)
        else:
            ids = llm.tokenize(prompt)
        continuation = llm.tokenize(o.text, add_bos=False)
        if not continuation:
            return -math.inf
        total = 0.0
        for token in continuation:
            x = llm.logits(ids).astype(np.float64)  # [vocab]
            m = float(x.max())
            total += float(x[token]) - m - math.log(float(np.exp(x - m).sum()))
            ids.append(token)
        return total / len(continuation)
