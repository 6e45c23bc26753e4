"""The budget of speculative verification: the cost of checking T draft rows in one
step, its knee K_max and the slope beyond it.

A step of T rows reads every weight once and multiplies it T times, so its time is
about flat while the weight stream (or the fixed per-operator cost) dominates, then grows
by the per-row compute:

    t(T) ~= base + slope * max(0, T - K_max)

K_max is the verification budget per step for the whole batch (rows of all sequences
together); past it a row pays only when its acceptance probability beats
``slope / decode_s`` (``VerifyCost.break_even``).  ``predict_verify_cost`` evaluates the
TPOT model (cost.py) at T = 1 .. 64 rows, with the executor's hand-offs (drafted chains
are verified on the executor) or operator barriers (trees on the batched pass), and fits the same form as the engine's start-up measurement
(engine/speculation.py), so ``llcinfer plan`` shows the predicted budget and
perf/verify_cost.py the two side by side.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from .bandwidth import Rates
from .calibration import Calibration
from .cost import forward_seconds, predict
from ..hw.machine import Machine
from .workload import Workload

# verification sizes measured at start-up and predicted; 3 too: the commonest chain of
# two drafts, whose tile (vnni_matmul's 3-row loops) differs from the 2- and 4-row ones
VERIFY_ROWS = (1, 2, 3, 4, 8, 16, 32, 64)
KNEE_RATIO = 1.25  # the knee: the largest T costing at most this times a 1-row forward


@dataclass
class VerifyCost:
    """Seconds of one verification step of T rows  t(T) = base + slope * max(0, T - k_max),
    and of one plain decode step, ``decode_s``."""

    k_max: int
    slope_s: float
    base_s: float
    decode_s: float
    curve_rows: tuple = ()  # [n] the measured (or predicted) rows ...
    curve_s: tuple = ()  # [n] ... and seconds the fit came from: seconds() interpolates them

    def seconds(self, rows: int) -> float:
        """t(rows): the curve interpolated where there is one (a row before the knee is
        not free), past its end and without one the fitted form."""
        table = self.seconds_upto(rows)
        return float(table[rows])

    def seconds_upto(self, rows: int) -> np.ndarray:
        """t(0), t(1), ... t(at least ``rows``)  # [>= rows + 1], ``seconds_of`` evaluated
        once and kept (the step loop asks for the same few sizes every step); made again
        should ``k_max`` change, as the budget override sets it after the fit."""
        table, k_max = self.__dict__.get("_table", (None, None))
        if table is None or table.size <= rows or k_max != self.k_max:
            size = max(int(rows) + 1, 128, 2 * table.size if table is not None else 0)
            table = self.seconds_of(np.arange(size))
            self.__dict__["_table"] = (table, self.k_max)  # not a field: asdict, replace and == ignore it
        return table

    def seconds_of(self, rows: np.ndarray) -> np.ndarray:
        """``seconds`` of each entry of ``rows``."""
        rows = np.asarray(rows, np.float64)
        if not self.curve_rows:
            return self.base_s + self.slope_s * np.maximum(0.0, rows - self.k_max)
        last = self.curve_rows[-1]
        return np.where(rows <= last, np.interp(rows, self.curve_rows, self.curve_s),
                        self.curve_s[-1] + self.slope_s * (rows - last))

    def growth(self, n: int) -> float:
        """t(n) / t(1): how much longer a step of n rows takes than a step of one."""
        return self.seconds(n) / self.seconds(1)

    def plain_s(self, n: int) -> float:
        """A plain decode step of n sequences: the decode step scaled by ``growth(n)``."""
        return self.decode_s * self.growth(n)

    def speedup(self, n: int, draft_step_s: float = 0.0, accept: float = 1.0, max_rows: int = 64) -> float:
        """How many times faster n sequences decode speculating than in plain steps of n
        rows, at best over r <= max_rows draft rows beyond the n roots: chains of
        floor(r / n) or ceil(r / n) rows, drafted in ceil(r / n) draft steps of n rows
        (``draft_step_s`` one sequence's, scaled as this curve; 0 for lookups), each node
        accepted with probability ``accept`` where its parent was, so a chain of d rows
        brings accept + accept^2 + ... + accept^d tokens besides its root's."""
        step = draft_step_s * self.growth(n)
        plain = n / self.plain_s(n)
        chain = np.concatenate([[0.0], np.cumsum(float(accept) ** np.arange(1, max_rows // n + 2))])  # [depth] tokens a chain of depth brings
        r = np.arange(1, max_rows + 1)  # [r] draft rows beyond the roots
        depth, deeper = np.divmod(r, n)  # ``deeper`` chains of depth + 1, the others of depth
        tokens = n + deeper * chain[depth + 1] + (n - deeper) * chain[depth]
        seconds = self.seconds_upto(n + max_rows)[n + 1:n + max_rows + 1]  # [r] t(n + r)
        return float(np.max(tokens / (seconds + -(-r // n) * step))) / plain

    def can_pay(self, n: int, draft_step_s: float = 0.0, max_rows: int = 64) -> bool:
        """Whether n sequences decoding could go faster speculating if every draft were
        accepted (``speedup`` at acceptance 1)."""
        return self.speedup(n, draft_step_s, 1.0, max_rows) > 1.0

    def max_paying_sequences(self, draft_step_s: float = 0.0, most: int = 64) -> int:
        """The largest n <= most at which ``can_pay``; 0 when none."""
        return max((n for n in range(1, most + 1) if self.can_pay(n, draft_step_s)), default=0)

    @property
    def break_even(self) -> float:
        """Acceptance probability a row past the knee must beat to pay for itself."""
        return min(1.0, self.slope_s / max(self.decode_s, 1e-9))

    def to_dict(self) -> dict:
        return asdict(self)

    def with_decode(self, decode_s: float) -> "VerifyCost":
        """This cost once a plain decode step takes ``decode_s``.  Slower than when it was
        measured: the weight stream has slowed (the host's bandwidth moved), the rows'
        compute has not, so one row costs what it did times decode_s / self.decode_s and
        every larger step at least that.  Faster: the plain step alone is taken to have
        sped up and the verification rows not, as how much of each measured step was
        weight stream cannot be told from it: speculation is judged at its least."""
        if decode_s == self.decode_s or not self.curve_rows:
            return self
        if decode_s < self.decode_s:
            return replace(self, decode_s=float(decode_s))
        first = self.curve_s[0] * decode_s / self.decode_s  # curve_rows[0] is 1
        sec = [first] + [max(t, first) for t in self.curve_s[1:]]
        return VerifyCost.fit(list(self.curve_rows), sec, decode_s)

    @staticmethod
    def fit(rows: list[int], seconds: list[float], decode_s: float, knee_ratio: float = KNEE_RATIO) -> "VerifyCost":
        """From (rows, seconds), rows ascending from 1: the knee is the largest T costing at
        most ``knee_ratio`` x the single-row forward; the slope a least-squares fit past it."""
        rows, sec = np.asarray(rows, np.float64), np.asarray(seconds, np.float64)
        base = float(sec[0])
        under = rows[sec <= knee_ratio * base]
        k = int(under.max()) if under.size else 1
        past = rows > k
        if past.sum() >= 1:
            x, y = rows[past] - k, sec[past] - base
            slope = float(max((x * y).sum() / (x * x).sum(), 0.0))
        else:
            slope = float((sec[-1] - base) / max(rows[-1] - 1, 1))
        return VerifyCost(k, slope, base, float(decode_s), tuple(int(r) for r in rows), tuple(float(x) for x in sec))


def predict_verify_cost(plan, m: Machine, w: Workload, cal: Calibration | None = None, rates: Rates | None = None,
                        rows: tuple[int, ...] = VERIFY_ROWS, sync: str = "handoff") -> tuple[VerifyCost, list[float]]:
    """(fitted VerifyCost, predicted seconds per entry of ``rows``) for verifying on
    ``plan``'s cores, ``sync`` "handoff" (the executor) or "barrier" (the batched pass);
    ``decode_s`` is the plan's predicted plain decode step."""
    cal = cal or Calibration()
    rates = rates or Rates(m)
    seconds = [forward_seconds(plan, m, w, int(t), cal, rates, sync=sync) for t in rows]
    decode_s = plan.prediction.tpot_s if plan.prediction is not None else predict(plan, m, w, cal, rates).tpot_s
    return VerifyCost.fit(list(rows), seconds, decode_s), seconds


def explain_verify(cost: VerifyCost) -> str:
    """One line for ``llcinfer plan``."""
    return (f"speculative verification (one executor step of drafted chains): K_max = {cost.k_max} rows per step "
            f"at {cost.base_s * 1e3:.1f} ms, then +{cost.slope_s * 1e3:.2f} ms per row; plain decode step "
            f"{cost.decode_s * 1e3:.1f} ms, break-even acceptance past the knee {cost.break_even:.2f}; "
            f"lookup drafts can pay up to {cost.max_paying_sequences()} sequences decoding")
