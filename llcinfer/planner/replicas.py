"""Replicas: a machine's cores split into core sets, one model replica each, and the plan
and predicted throughput of every replica.

    sets = replica_core_sets(machine, "auto")      # one set per LLC instance (or NUMA node)
    rp = plan_replicas(machine, workload, "auto")  # each set planned as a machine of its own
    print(rp.explain())

``auto`` gives one replica per last-level-cache instance when the machine has several
(CCDs, sockets with one LLC each), else one per NUMA node, else one replica on the whole
machine.  ``N`` replicas take contiguous runs of LLC instances when there are at least N
of them, else contiguous runs of physical cores.  Each replica is predicted alone on its
own cores (``Machine.restricted``); what they read from DRAM together is then held to the
machine's DRAM rate, which scales every replica's step time up when they exceed it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import UsageError
from ..hw.machine import Machine
from ..hw.sysfs import format_cpulist
from .bandwidth import Rates
from .choose import make_plan
from .cost import _dram_bytes
from .plan import Plan
from .workload import Workload


def parse_replicas(value) -> int | str:
    """``"auto"`` or a positive integer (from a command line or a caller)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UsageError(f"replicas must be 'auto' or a positive integer (got {value!r})")
    return value


def _contiguous(items: list, n: int) -> list[list]:
    k = len(items)
    return [items[i * k // n:(i + 1) * k // n] for i in range(n)]


def replica_core_sets(machine: Machine, replicas="auto") -> list[list[int]]:
    """The physical cores of ``machine`` as one sorted core set per replica."""
    replicas = parse_replicas(replicas)
    phys = machine.physical_cores()
    groups = machine.llc_groups(phys)
    if replicas == "auto":
        if len(groups) > 1:
            return groups
        nodes = [sorted(c for c in cpus if c in phys) for _, cpus in sorted(machine.numa.items())]
        nodes = [n for n in nodes if n]
        return nodes if len(nodes) > 1 else [phys]
    if replicas > len(phys):
        raise UsageError(f"{replicas} replicas need at least {replicas} cores (this machine has {len(phys)})")
    if replicas <= len(groups):
        return [sorted(c for g in part for c in g) for part in _contiguous(groups, replicas)]
    return [sorted(part) for part in _contiguous(phys, replicas)]


@dataclass
class ReplicaPlan:
    """Every replica's core set and plan; ``slowdown`` >= 1 is what shared DRAM adds to each
    replica's step time; throughputs in generated tokens per second."""

    core_sets: list[list[int]]
    plans: list[Plan]
    concurrency: int  # sequences each replica decodes together
    slowdown: float = 1.0
    dram_gbs_demand: float = 0.0  # what the replicas would read together at their own TPOT
    dram_gbs: float = 0.0  # the machine's rate
    single: Plan | None = None  # one replica on all cores at the same total concurrency
    per: str = "core set"  # what each core set is: 'LLC instance', 'NUMA node', 'machine'

    def tpot_s(self, i: int) -> float:
        return self.plans[i].prediction.tpot_s * self.slowdown

    @property
    def throughput(self) -> float:
        return sum(self.concurrency / self.tpot_s(i) for i in range(len(self.plans)))

    def to_dict(self) -> dict:
        return {"replicas": len(self.core_sets), "concurrency_per_replica": self.concurrency,
                "core_sets": [format_cpulist(c) for c in self.core_sets],
                "tpot_s": [self.tpot_s(i) for i in range(len(self.plans))],
                "plans": [p.label for p in self.plans], "dram_slowdown": self.slowdown,
                "dram_gbs_demand": self.dram_gbs_demand, "dram_gbs": self.dram_gbs,
                "throughput_tok_s": self.throughput,
                "single_tpot_s": self.single.prediction.tpot_s if self.single else None,
                "single_throughput_tok_s": self._single_throughput()}

    def _single_throughput(self) -> float | None:
        if self.single is None:
            return None
        return self.single.concurrency / self.single.prediction.tpot_s

    def explain(self) -> str:
        n = len(self.core_sets)
        lines = [f"replicas: {n} x {self._sizes()} (one per {self.per}), {self.concurrency} sequence"
                 f"{'s' if self.concurrency > 1 else ''} each"]
        for i, (cores, plan) in enumerate(zip(self.core_sets, self.plans)):
            if i >= 3 and i < n - 1 and all(len(c) == len(cores) for c in self.core_sets):
                if i == 3:
                    lines.append(f"  ... {n - 4} more alike")
                continue
            lines.append(f"  replica {i}: cores {format_cpulist(cores)}: {plan.label}; "
                         f"TPOT {self.tpot_s(i) * 1e3:.2f} ms")
        if self.slowdown > 1.0:
            lines.append(f"  shared DRAM: the replicas would read {self.dram_gbs_demand:.0f} GB/s of "
                         f"{self.dram_gbs:.0f}: every step {self.slowdown:.2f}x longer")
        lines.append(f"  predicted throughput: {self.throughput:.0f} tok/s in all")
        single = self._single_throughput()
        if single is not None and n > 1:
            lines.append(f"  vs one replica on all {len(self.single.cores)} cores at concurrency "
                         f"{self.single.concurrency}: TPOT {self.single.prediction.tpot_s * 1e3:.2f} ms, "
                         f"{single:.0f} tok/s")
        return "\n".join(lines)

    def _sizes(self) -> str:
        sizes = sorted({len(c) for c in self.core_sets})
        return "/".join(str(s) for s in sizes) + (" core" if sizes == [1] else " cores")


def plan_replicas(machine: Machine, workload: Workload, replicas="auto", sync: str = "handoff") -> ReplicaPlan:
    """Plan each replica of ``replica_core_sets`` on its own cores at ``workload``'s
    concurrency, and one replica on all cores at the replicas' total concurrency."""
    sets = replica_core_sets(machine, replicas)
    plans = [make_plan(machine.restricted(cores), workload, sync=sync) for cores in sets]
    rp = ReplicaPlan(sets, plans, workload.concurrency, per=_domain_kind(machine, sets))
    demand = sum(_dram_bytes(p, p.prediction.micro_batches) / p.prediction.tpot_s for p in plans) / 1e9
    rp.dram_gbs, rp.dram_gbs_demand = Rates(machine).dram_total, demand
    if rp.dram_gbs > 0 and demand > rp.dram_gbs:
        rp.slowdown = demand / rp.dram_gbs
    if len(sets) > 1:
        rp.single = make_plan(machine, replace(workload, concurrency=workload.concurrency * len(sets)), sync=sync)
    return rp


def _domain_kind(machine: Machine, sets: list[list[int]]) -> str:
    groups = machine.llc_groups(machine.physical_cores())
    if len(sets) == 1:
        return "machine"
    if all(s in groups for s in sets):
        return "LLC instance"
    nodes = [sorted(v) for v in machine.numa.values()]
    return "NUMA node" if all(s in nodes for s in sets) else "core set"
