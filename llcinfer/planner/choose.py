"""Choosing a plan: every candidate layout (candidates.py) built (plan.py) and scored by
the cost model (cost.py); the fastest plan the executor can run wins, the best of the other
families are its runners-up (layer-group plans among them only as what-ifs)."""

from __future__ import annotations

from ..hw.machine import Machine
from .bandwidth import Rates
from .calibration import Calibration, cache_key
from .candidates import budget_cores, layouts
from .cost import predict
from .plan import Plan, build
from .workload import Workload, workload_key


def make_plan(machine: Machine, workload: Workload, threads: int | None = None,
              calibration: Calibration | None = None, sync: str = "handoff", n_runners_up: int = 6) -> Plan:
    """The runnable candidate with the lowest predicted TPOT; ``runners_up`` holds the best
    of every other candidate family (and the next best of the winner's), fastest first.
    Plans the executor cannot run (``what_if``) are never chosen.

    ``calibration`` defaults to the one saved for this machine and kernel version
    (``Calibration.load(cache_key(machine))``); ``sync='barrier'`` predicts operator-barrier
    synchronisation instead of hand-offs.  Each plan carries the TPOT last observed for it
    on this workload (``Plan.observed``), where the calibration has one.
    """
    cal = calibration or Calibration.load(cache_key(machine))
    rates = Rates(machine)
    cores = budget_cores(machine, threads)
    scored = []
    for family, kind, label, domains in layouts(machine, workload, cores):
        plan = build(machine, workload, domains, kind, label, rates, cal)
        plan.prediction = predict(plan, machine, workload, cal, rates, sync)
        plan.observed = cal.observation(workload_key(workload, plan.threads), plan.label)
        scored.append((plan.what_if, plan.prediction.tpot_s, family, plan))
    scored.sort(key=lambda x: (x[0], x[1]))
    _, _, best_family, best = scored[0]
    taken, runners = {best_family: 1}, []
    for _, _, family, plan in sorted(scored[1:], key=lambda x: x[1]):  # the winner's family may show its next best
        if taken.get(family, 0) < (2 if family == best_family else 1):
            taken[family] = taken.get(family, 0) + 1
            runners.append(plan)
    best.runners_up = runners[:n_runners_up]
    return best

