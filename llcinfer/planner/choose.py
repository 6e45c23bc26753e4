"""Choosing a plan: every candidate layout (candidates.py) built (plan.py) and scored by
the cost model (cost.py); the fastest wins, the best of the other families are its
runners-up."""

from __future__ import annotations

from ..hw.machine import Machine
from .bandwidth import Rates
from .candidates import budget_cores, layouts
from .cost import Calibration, predict
from .plan import Plan, build
from .workload import Workload


def make_plan(machine: Machine, workload: Workload, threads: int | None = None,
              calibration: Calibration | None = None, sync: str = "handoff", n_runners_up: int = 6) -> Plan:
    """The candidate with the lowest predicted TPOT; ``runners_up`` holds the best of every
    other candidate family (and the next best of the winner's), fastest first.

    ``calibration`` defaults to the one saved for this machine (``Calibration.load``);
    ``sync='barrier'`` predicts operator-barrier synchronisation instead of hand-offs.
    """
    cal = calibration or Calibration.load(machine.key())
    rates = Rates(machine)
    cores = budget_cores(machine, threads)
    scored = []
    for family, kind, label, domains in layouts(machine, workload, cores):
        plan = build(machine, workload, domains, kind, label, rates, cal)
        plan.prediction = predict(plan, machine, workload, cal, rates, sync)
        scored.append((plan.prediction.tpot_s, family, plan))
    scored.sort(key=lambda x: x[0])
    _, best_family, best = scored[0]
    taken, runners = {best_family: 1}, []
    for _, family, plan in scored[1:]:  # the winner's family may show its next best too
        if taken.get(family, 0) < (2 if family == best_family else 1):
            taken[family] = taken.get(family, 0) + 1
            runners.append(plan)
    best.runners_up = runners[:n_runners_up]
    return best
