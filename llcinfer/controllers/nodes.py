"""The controller types: ``generate`` (one sampled completion), ``majority_vote`` and
``best_of_n`` (n runs of a child controller, one chosen).

Running a tree is two passes.  ``start`` submits every leaf generation of the tree to the
step loop at once (a node whose child is a plain ``generate`` asks for its n samples with
``LLM.submit_n``: the prompt is computed once and the samples share its KV blocks) and
returns a function that waits for them; only then does anything wait.  Seeds: with a run
seed s, the leaves get s, s + 1, ... in depth-first order (child i of a node starts at
s + i * child.n_leaves); a ``generate`` node's own ``seed`` replaces s for its subtree.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable

from ..errors import UsageError
from ..engine.sampling import SamplingParams
from .registry import register_controller

_SAMPLING_ARGS = tuple(f for f in SamplingParams.__dataclass_fields__ if f != "logprobs")


@dataclass
class Outcome:
    """What a controller chose: its text, the answer extracted from it (majority vote), its
    score (best-of-N: the reward; majority vote: the winning answer's share of the votes),
    and the candidates it chose among (each an Outcome itself)."""

    text: str
    token_ids: list[int]
    mean_logprob: float | None
    stop_reason: str
    answer: str | None = None
    score: float | None = None
    candidates: list["Outcome"] = field(default_factory=list)


def _rank(o: Outcome) -> float:
    return -math.inf if o.mean_logprob is None else o.mean_logprob


class Controller:
    """A node of the tree.  ``n_leaves``: the generations one run of it submits."""

    type_name = ""
    ARGS: tuple[str, ...] = ()
    n_leaves = 1

    def bind(self, llm) -> "Controller":
        self.llm = llm
        return self

    def run(self, prompt, seed: int | None = None) -> Outcome:
        """Run the tree on ``prompt`` (text, or chat messages) and return its choice.  If
        waiting fails or is interrupted, the leaves still running are cancelled."""
        llm = getattr(self, "llm", None)
        if llm is None:
            raise UsageError("this controller is not bound to an LLM (from_config(config, llm) or .bind(llm))")
        handles, wait = self.launch(llm, prompt, seed)
        try:
            return wait()
        finally:
            _cancel(handles)

    def launch(self, llm, prompt, seed: int | None) -> tuple[list, Callable[[], Outcome]]:
        """Submit every leaf of one run; returns their request handles (to wait for, time
        out or cancel) and the function that waits for the outcome.  A failure while
        submitting cancels what was already submitted."""
        recorder = _Recorder(llm)
        try:
            wait = self.start(recorder, prompt, seed)
        except BaseException:
            _cancel(recorder.handles)
            raise
        return recorder.handles, wait

    def start(self, llm, prompt, seed: int | None) -> Callable[[], Outcome]:
        raise NotImplementedError


class _Recorder:
    """The LLM as one run sees it: the requests the run submits are recorded."""

    def __init__(self, llm):
        self._llm = llm
        self.handles: list = []

    def submit(self, prompt, **sampling):
        handle = self._llm.submit(prompt, **sampling)
        self.handles.append(handle)
        return handle

    def submit_n(self, prompt, n: int, **sampling) -> list:
        handles = self._llm.submit_n(prompt, n, **sampling)
        self.handles.extend(handles)
        return handles

    def __getattr__(self, name):
        return getattr(self._llm, name)


def _cancel(handles) -> None:
    for h in handles:
        if not h.done:
            h.cancel()


@register_controller("generate")
class Generate(Controller):
    """One completion with the node's sampling parameters (SamplingParams' fields)."""

    ARGS = _SAMPLING_ARGS

    def __init__(self, sampling: dict):
        self.sampling = sampling

    @classmethod
    def from_node(cls, node: dict, path: str, builder) -> "Generate":
        sampling = {k: v for k, v in node.items() if k != "type"}
        try:
            SamplingParams(**sampling).validate()
        except UsageError as e:
            raise builder.error(path, str(e)) from None
        return cls(sampling)

    def _params(self, seed: int | None) -> dict:
        own = self.sampling.get("seed")
        return {**self.sampling, "seed": own if own is not None else seed, "logprobs": 0}

    def start(self, llm, prompt, seed):
        return _waiter(llm.submit(prompt, **self._params(seed)))

    def start_n(self, llm, prompt, n: int, seed) -> list[Callable[[], Outcome]]:
        """n samples of the prompt, computed once (``LLM.submit_n``: sample i draws from seed + i)."""
        return [_waiter(h) for h in llm.submit_n(prompt, n, **self._params(seed))]


def _waiter(handle) -> Callable[[], Outcome]:
    def wait() -> Outcome:
        c = handle.result()
        if c.error is not None:
            raise c.error
        return Outcome(c.text, c.token_ids, c.mean_logprob, c.stop_reason)
    return wait


class _Sampled(Controller):
    """A node that runs its child n times."""

    def __init__(self, n: int, child: Controller):
        self.n, self.child = n, child
        self.n_leaves = n * child.n_leaves

    def bind(self, llm):
        self.child.bind(llm)
        return super().bind(llm)

    def _start_children(self, llm, prompt, seed) -> list[Callable[[], Outcome]]:
        if isinstance(self.child, Generate):
            return self.child.start_n(llm, prompt, self.n, seed)
        step = self.child.n_leaves
        return [self.child.start(llm, prompt, None if seed is None else seed + i * step) for i in range(self.n)]

    @staticmethod
    def _child(node, path, builder) -> Controller:
        return builder.controller(builder.take(node, path, "child", required=True), f"{path}.child")


@register_controller("majority_vote")
class MajorityVote(_Sampled):
    """n runs of the child; the answer most of them give wins (``extract``: a regex whose
    first group, or whole match, is the answer, or a function text -> answer or None).
    Equal votes go to the answer whose candidates have the higher mean log-probability;
    the chosen text is the likeliest candidate giving the winning answer."""

    ARGS = ("n", "extract", "child")

    def __init__(self, n: int, child: Controller, extract: Callable[[str], str | None]):
        super().__init__(n, child)
        self.extract = extract

    @classmethod
    def from_node(cls, node, path, builder):
        n = builder.samples(node, path)
        raw = builder.resolve(builder.take(node, path, "extract", required=True), f"{path}.extract")
        if isinstance(raw, str):
            try:
                pattern = re.compile(raw)
            except re.error as e:
                raise builder.error(f"{path}.extract", f"invalid regular expression {raw!r}: {e}") from None
            extract = _regex_extractor(pattern)
        elif callable(raw):
            extract = raw
        else:
            raise builder.error(f"{path}.extract", f"extract is a regex or a $ref to a function (got {raw!r:.60})")
        return cls(n, cls._child(node, path, builder), extract)

    def start(self, llm, prompt, seed):
        waits = self._start_children(llm, prompt, seed)

        def wait() -> Outcome:
            outs = [w() for w in waits]
            for o in outs:
                o.answer = self._answer(o.text)
            return vote(outs)
        return wait

    def _answer(self, text: str) -> str | None:
        got = self.extract(text)
        if got is not None and not isinstance(got, str):
            raise UsageError(f"majority_vote: the extractor returned {got!r}, not a string or None")
        return got


def _regex_extractor(pattern: re.Pattern) -> Callable[[str], str | None]:
    def extract(text: str) -> str | None:
        m = pattern.search(text)
        if m is None:
            return None
        return (m.group(1) if pattern.groups else m.group(0)).strip()
    return extract


def vote(outs: list[Outcome]) -> Outcome:
    """The majority answer of ``outs`` (their ``answer`` set), ties broken by the mean of
    its candidates' mean log-probabilities; no answer at all: the likeliest candidate."""
    groups: dict[str, list[Outcome]] = {}
    for o in outs:
        if o.answer is not None:
            groups.setdefault(o.answer, []).append(o)
    if not groups:
        best = max(outs, key=_rank)
        return Outcome(best.text, best.token_ids, best.mean_logprob, best.stop_reason, None, 0.0, outs)
    answer, members = max(groups.items(), key=lambda kv: (len(kv[1]), sum(map(_rank, kv[1])) / len(kv[1])))
    best = max(members, key=_rank)
    return Outcome(best.text, best.token_ids, best.mean_logprob, best.stop_reason, answer,
                   len(members) / len(outs), outs)


@register_controller("best_of_n")
class BestOfN(_Sampled):
    """n runs of the child, scored by ``reward``; the highest score wins (the first of equals)."""

    ARGS = ("n", "reward", "child")

    def __init__(self, n: int, child: Controller, reward):
        super().__init__(n, child)
        self.reward = reward

    @classmethod
    def from_node(cls, node, path, builder):
        n = builder.samples(node, path)
        reward = builder.reward(builder.take(node, path, "reward", required=True), f"{path}.reward")
        return cls(n, cls._child(node, path, builder), reward)

    def start(self, llm, prompt, seed):
        waits = self._start_children(llm, prompt, seed)

        def wait() -> Outcome:
            outs = [w() for w in waits]
            scores = [self.reward.score(prompt, o) for o in outs]
            i = max(range(len(outs)), key=lambda j: scores[j])
            best = outs[i]
            for o, s in zip(outs, scores):
                o.score = s
            return Outcome(best.text, best.token_ids, best.mean_logprob, best.stop_reason, best.answer,
                           scores[i], outs)
        return wait

