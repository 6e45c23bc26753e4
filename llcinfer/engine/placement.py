"""Executor domains from a planner Plan (what runs where), and the plan for a model."""

from __future__ import annotations

from ..executor.decode import Domains
from ..executor.program import Tiles

TASKS_PER_WORKER = 4  # at least this many tiles per worker and operator: claiming balances noise


def _tile(rows_per_task: int | None, rows: int, workers: int, default: int) -> int:
    if not rows_per_task:
        return default
    return max(16, min(int(rows_per_task), rows // (TASKS_PER_WORKER * max(1, workers)) or 16))


def domains_from_plan(plan, config=None) -> Domains:
    """The plan's cores as executor domains: 'weights'/'attention' domains become the
    weight/attention workers, a 'shared' domain the weight workers with no attention
    domain.  Layer-group pipelines (``plan.what_if``) are not run by this executor and are
    refused.  Tiles follow the planner's rows per task, capped so every worker can claim
    several tiles of an operator."""
    if plan.what_if:
        raise ValueError(f"the executor does not run layer-group plans ({plan.label})")
    weight = tuple(c for d in plan.domains if d.role in ("weights", "shared") for c in d.cores)
    attention = tuple(c for d in plan.domains if d.role == "attention" for c in d.cores)
    src = next(d for d in plan.domains if d.role in ("weights", "shared"))
    mb = max(1, int(getattr(plan.prediction, "micro_batches", 1) or 1))
    t = src.tiles or {}
    n = len(weight)
    tiles = Tiles()
    if config is not None:
        tiles = Tiles(wo=_tile(t.get("wo"), config.d_model, n, tiles.wo),
                      gate_up=_tile(t.get("gate_up_swiglu"), config.d_ff, n, tiles.gate_up),
                      down=_tile(t.get("down"), config.d_model, n, tiles.down),
                      lm_head=_tile(t.get("lm_head"), config.vocab_size, n, tiles.lm_head))
    return Domains(weight=weight, attention=attention, micro_batches=mb, tiles=tiles)


def plan_for_model(model, ctx: int, concurrency: int, threads: int, machine=None, calibration=None):
    """(the planner's plan for ``model``, its workload) on ``machine`` (default: this one,
    with the cached bandwidth curve or an estimate) with ``calibration`` (default: the
    cached one)."""
    from ..planner import detect_machine, make_plan, workload_from_model

    machine = machine or detect_machine(probe=False)
    work = workload_from_model(model, ctx=ctx, concurrency=concurrency)
    return make_plan(machine, work, threads=threads, calibration=calibration), work
