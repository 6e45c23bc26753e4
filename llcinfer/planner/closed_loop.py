"""The closed loop: a chosen plan checked against measurement.

``close_loop`` times the chosen plan and the best runner-up of the other kind (shared vs
split) with a timer it is given (engine/plan_check.py runs the executor; tests pass a
synthetic machine), keeps the faster, and records both measured TPOTs next to the model's
predictions (and their attention parts) in the calibration, from which every later
prediction takes its fed-back factors (``Calibration.record``, ``Calibration.feedback``).  The planner itself never
times anything.
"""

from __future__ import annotations

from typing import Callable

from .calibration import Calibration
from .plan import Plan
from .workload import Workload, workload_key


def other_kind(plan: Plan) -> Plan | None:
    """The best runnable runner-up whose kind differs from the chosen plan's (None if none)."""
    return next((p for p in plan.runners_up if p.kind != plan.kind and not p.what_if), None)


def close_loop(plan: Plan, workload: Workload, cal: Calibration, timer: Callable[[Plan], float],
               reuse: bool = False) -> tuple[Plan, dict]:
    """(the faster of ``plan`` and ``other_kind(plan)`` as measured by ``timer`` (seconds per
    step), {label: measured seconds}); both observations go into ``cal``.  With ``reuse``,
    a plan already observed on this workload is not timed again.  The plan kept carries
    its observation (``Plan.observed``) and the other as its first runner-up."""
    rival = other_kind(plan)
    contenders = [plan] + ([rival] if rival is not None else [])
    key = workload_key(workload, plan.threads)
    measured = {}
    for p in contenders:
        if reuse and p.observed is not None:
            measured[p.label] = float(p.observed["measured_s"])
            continue
        measured[p.label] = float(timer(p))
        p.observed = cal.record(key, p.shape, p.label, p.kind, p.prediction.model_s or p.prediction.tpot_s,
                                measured[p.label], p.prediction.attention_s)
    best = min(contenders, key=lambda p: measured[p.label])
    if best is not plan:
        best.runners_up = [plan] + [r for r in plan.runners_up if r is not best]
    return best, measured
