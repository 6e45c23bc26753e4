"""Token sampling (llama.cpp's default chain) and stop-string matching.

Chain, applied to one ``[vocab]`` logits vector per token:
repetition penalty -> (greedy: argmax) -> top-k -> top-p -> min-p -> temperature -> draw.
Everything is plain numpy; top-k avoids touching more than a few thousand of the
(up to ~152k) logits after one linear pass, so a default call costs well under 1 ms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from ..errors import UsageError

_F32_MAX = float(np.finfo(np.float32).max)
MAX_TOP_LOGPROBS = 20  # alternatives per token, OpenAI's limit
_TOP_P_EPS = 1e-6  # cumulative-probability slack so p=0.8 over probs (0.5, 0.3, ...) keeps 2


def _number(name: str, value, integer: bool):
    """Coerce ``value`` to a finite float (or an int when ``integer``), else UsageError."""
    if isinstance(value, bool) or value is None:
        raise UsageError(f"{name} must be a number (got {value!r})")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{name} must be a number (got {value!r})") from None
    if not math.isfinite(f):
        raise UsageError(f"{name} must be finite (got {value!r})")
    if integer:
        if f != int(f):
            raise UsageError(f"{name} must be an integer (got {value!r})")
        return int(f)
    return f


@dataclass(frozen=True)
class SamplingParams:
    """Generation settings, with llama.cpp's defaults (except a finite ``max_tokens``).

    ``top_k <= 0``, ``top_p == 1``, ``min_p == 0`` and ``repeat_penalty == 1`` switch the
    corresponding stage off; ``repeat_last_n`` is 0 (off), -1 (whole history) or N.
    ``seed=None`` (or a negative seed, like llama.cpp's ``-1``) draws fresh entropy.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None
    max_tokens: int = 128
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None: off; N >= 0: each token's log-probability and the top N

    def validate(self) -> "SamplingParams":
        """Return a copy with coerced types; raise UsageError naming the bad parameter."""
        t = _number("temperature", self.temperature, False)
        if t < 0:
            raise UsageError(f"temperature must be >= 0 (got {self.temperature})")
        top_k = _number("top_k", self.top_k, True)
        top_p = _number("top_p", self.top_p, False)
        if not 0 < top_p <= 1:
            raise UsageError(f"top_p must be in (0, 1] (got {self.top_p})")
        min_p = _number("min_p", self.min_p, False)
        if not 0 <= min_p <= 1:
            raise UsageError(f"min_p must be in [0, 1] (got {self.min_p})")
        pen = _number("repeat_penalty", self.repeat_penalty, False)
        if pen <= 0:
            raise UsageError(f"repeat_penalty must be > 0 (got {self.repeat_penalty})")
        last_n = _number("repeat_last_n", self.repeat_last_n, True)
        if last_n < -1:
            raise UsageError(f"repeat_last_n must be >= -1 (got {self.repeat_last_n})")
        seed = None if self.seed is None else _number("seed", self.seed, True)
        if seed is not None and seed < 0:
            seed = None
        max_tokens = _number("max_tokens", self.max_tokens, True)
        if max_tokens < 0:
            raise UsageError(f"max_tokens must be >= 0 (got {self.max_tokens})")
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        try:
            stop = tuple(stop or ())
        except TypeError:
            raise UsageError(f"stop must be a string or a list of strings (got {self.stop!r})") from None
        for s in stop:
            if not isinstance(s, str) or not s:
                raise UsageError(f"stop strings must be non-empty strings (got {s!r})")
        if not isinstance(self.ignore_eos, (bool, np.bool_)):
            raise UsageError(f"ignore_eos must be a bool (got {self.ignore_eos!r})")
        logprobs = None if self.logprobs is None else _number("logprobs", self.logprobs, True)
        if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
            raise UsageError(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}] (got {self.logprobs})")
        return replace(self, temperature=t, top_k=top_k, top_p=top_p, min_p=min_p,
                       repeat_penalty=pen, repeat_last_n=last_n, seed=seed,
                       max_tokens=max_tokens, stop=stop, ignore_eos=bool(self.ignore_eos),
                       logprobs=logprobs)

    @property
    def greedy(self) -> bool:
        """True when sampling degenerates to argmax (temperature <= 0)."""
        return self.temperature <= 0


def _top_indices(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest entries of ``x`` (unordered; 0 < k < len(x)).

    A strided subsample's k-th largest value is a lower bound for the full array's k-th
    largest, so ``x >= bound`` is a small superset of the top k; partition only that.
    """
    n = x.shape[0]
    stride = int(math.sqrt(n / k))  # balances the subsample and the candidate set
    if stride >= 4:
        sub = x[::stride]
        bound = np.partition(sub, sub.shape[0] - k)[sub.shape[0] - k]
        cand = np.flatnonzero(x >= bound)
        if cand.shape[0] <= n // 4:
            if cand.shape[0] == k:
                return cand
            part = np.argpartition(x[cand], cand.shape[0] - k)[cand.shape[0] - k:]
            return cand[part]
    return np.argpartition(x, n - k)[n - k:]


def token_logprobs(logits: np.ndarray, token: int, top_n: int) -> tuple[float, list[tuple[int, float]]]:
    """log softmax(logits)[token] and the ``top_n`` most likely (token, log-probability)
    pairs, most likely first, under the model's distribution (before any sampling stage).

    log p_i = x_i - (m + log sum_j exp(x_j - m)),  m = max_j x_j
    """
    x = np.asarray(logits, dtype=np.float32)
    finite = np.where(np.isfinite(x), x, -np.inf)
    m = float(finite.max())
    if m == -np.inf:
        return -math.inf, []
    lse = m + math.log(float(np.exp(finite.astype(np.float64) - m).sum()))
    top: list[tuple[int, float]] = []
    if top_n > 0:
        k = min(top_n, x.shape[0])
        idx = _top_indices(finite, k) if k < x.shape[0] else np.arange(x.shape[0])
        idx = idx[np.argsort(-finite[idx], kind="stable")]
        top = [(int(i), float(finite[i]) - lse) for i in idx]
    return float(finite[token]) - lse, top


class Sampler:
    """Picks the next token from logits with a fixed :class:`SamplingParams` and RNG."""

    def __init__(self, params: SamplingParams, vocab_size: int):
        self.params = params.validate()
        vocab_size = _number("vocab_size", vocab_size, True)
        if vocab_size <= 0:
            raise UsageError(f"vocab_size must be > 0 (got {vocab_size})")
        self.vocab_size = vocab_size
        self.rng = np.random.Generator(np.random.PCG64(self.params.seed))

    def _penalize(self, x: np.ndarray, history) -> np.ndarray:
        """``x`` with the repetition penalty applied over the distinct tokens of the window
        (a copy where it changes anything)."""
        p = self.params
        n = p.repeat_last_n
        if p.repeat_penalty == 1.0 or n == 0 or len(history) == 0:
            return x
        window = np.asarray(history[-n:] if n > 0 else history, dtype=np.int64).ravel()
        toks = np.unique(window)
        toks = toks[(toks >= 0) & (toks < x.shape[0])]
        vals = x[toks]
        x = x.copy()  # never the caller's logits
        x[toks] = np.where(vals > 0, vals / p.repeat_penalty, vals * p.repeat_penalty)
        return x

    def sample(self, logits: np.ndarray, history: Sequence[int] | np.ndarray) -> int:
        """Return the next token id; ``history`` is every token so far (prompt included).

        The caller's ``logits`` is never modified. NaN counts as -inf, +inf as the largest
        float32; if every logit is NaN or -inf, token 0 (the argmax) is returned.
        """
        p = self.params
        x = np.asarray(logits, dtype=np.float32)  # the caller's row when f32: every change below makes a copy
        if x.ndim != 1 or x.shape[0] != self.vocab_size:
            raise ValueError(f"logits must have shape ({self.vocab_size},), got {x.shape}")
        top = float(x.max())
        if not math.isfinite(top):  # max propagates NaN and +inf
            x = np.nan_to_num(x, nan=-np.inf, posinf=_F32_MAX, neginf=-np.inf)
            top = float(x.max())
        if top == -np.inf:
            return int(np.argmax(x))
        x = self._penalize(x, history)
        if p.greedy:
            return int(np.argmax(x))

        n = x.shape[0]
        total = None  # softmax mass of all current candidates, relative to the max logit
        if 0 < p.top_k < n:
            idx = _top_indices(x, p.top_k)
        elif p.top_p < 1.0:
            idx, total = self._nucleus_superset(x)
        else:
            idx = np.arange(n)
        vals = x[idx].astype(np.float64)
        order = np.argsort(-vals)  # descending; deterministic for equal inputs
        idx, vals = idx[order], vals[order]
        finite = int(np.count_nonzero(vals > -np.inf))
        idx, vals = idx[: max(finite, 1)], vals[: max(finite, 1)]

        if p.top_p < 1.0 and idx.shape[0] > 1:
            probs = np.exp(vals - vals[0])
            cum = np.cumsum(probs)
            mass = cum[-1] if total is None else total
            keep = int(np.searchsorted(cum, (p.top_p - _TOP_P_EPS) * mass)) + 1
            idx, vals = idx[:keep], vals[:keep]
        if p.min_p > 0.0 and idx.shape[0] > 1:
            keep = max(int(np.count_nonzero(vals >= vals[0] + math.log(p.min_p))), 1)
            idx, vals = idx[:keep], vals[:keep]

        if idx.shape[0] == 1:
            return int(idx[0])
        cum = np.cumsum(np.exp((vals - vals[0]) / p.temperature))
        i = int(np.searchsorted(cum, self.rng.random() * cum[-1], side="right"))
        return int(idx[min(i, idx.shape[0] - 1)])

    def _nucleus_superset(self, x: np.ndarray) -> tuple[np.ndarray, float]:
        """Top-m indices holding at least ``top_p`` of the mass, and the total mass.

        Used when top-k is off, so the nucleus is found without sorting the whole vocab.
        The mass is ``sum(exp(x - max(x)))`` over every token.
        """
        n = x.shape[0]
        e = np.exp(x.astype(np.float64) - float(x.max()))
        total = float(e.sum())
        need = (self.params.top_p - _TOP_P_EPS) * total
        m = 256
        while m < n:
            idx = _top_indices(x, m)
            if float(e[idx].sum()) >= need:
                return idx, total
            m *= 4
        return np.arange(n), total


class StopMatcher:
    """Streams decoded text, cutting it at the first occurrence of any stop string."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(s for s in ((stops,) if isinstance(stops, str) else stops) if s)
        self._buf = ""
        self.stopped = False

    def push(self, text: str) -> tuple[str, bool]:
        """Feed new text; return (text safe to emit now, whether a stop string completed).

        A tail that could begin a stop string is held back until it is resolved. On a
        match the text before the stop string is returned and everything after is dropped.
        """
        if self.stopped:
            return "", True
        buf = self._buf + text
        if not self.stops:
            return buf, False
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self._buf, self.stopped = "", True
            return buf[: min(hits)], True
        hold = 0
        for k in range(min(len(buf), max(map(len, self.stops)) - 1), 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self.stops):
                hold = k
                break
        self._buf = buf[len(buf) - hold:]
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        """Return (and clear) the held-back text at the end of generation."""
        out, self._buf = ("" if self.stopped else self._buf), ""
        return out
