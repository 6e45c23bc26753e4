"""Plans: which cores form which resource domain, what stays resident in whose cache, tile
sizes, where the KV lives, and the predicted TPOT; ``make_plan`` picks the best candidate.

Candidates (``candidates.py``): one shared domain on all cores; a weight domain and an
attention/KV domain (k attention cores on one LLC, or whole LLC instances, or a few cores
in every instance); and layer groups (pipeline stages) on groups of LLC instances or
sockets.  Within a weight domain every matrix is split by rows over all its cores, so each
LLC instance (and each core's L2) keeps the row slices its cores compute: weights are
"resident across CCDs" when the domain's share holds them; the groups that do not fit
are streamed from DRAM (read non-temporally so they do not evict resident ones).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from .bandwidth import Rates
from .calibration import Calibration
from .cost import Prediction
from ..hw.machine import Machine
from ..hw.sysfs import format_cpulist
from .explain import describe_groups, explain
from .workload import LAYER_OPS, Workload

TASKS_PER_THREAD = 2  # matmul tasks per core and operator: load balance vs per-task overhead
TILE_ROWS = 16  # repacked weights interleave 16 rows: a task is a multiple of 16 rows


@dataclass
class Domain:
    """Cores that run some operators and keep some tensors resident."""

    name: str  # 'shared', 'weights', 'attention', 'stage1.weights', ...
    role: str  # 'shared' (weights and attention) | 'weights' | 'attention'
    cores: list[int]
    cache_share_bytes: int = 0  # L2 + LLC bytes it may keep resident
    resident: list[tuple[str, int]] = field(default_factory=list)  # (tensor group, bytes)
    ops: list[str] = field(default_factory=list)  # operator names (Workload.operators())
    stage: int = 0  # layer group index (pipeline stage)
    layers: list[int] = field(default_factory=list)  # layers whose operators it runs
    resident_level: dict[str, str] = field(default_factory=dict)  # group -> 'L2' | 'LLC'
    streamed: list[tuple[str, int]] = field(default_factory=list)  # read from DRAM every step
    tiles: dict[str, int] = field(default_factory=dict)  # matmul op -> rows per task

    @property
    def resident_bytes(self) -> int:
        return sum(b for _, b in self.resident)

    @property
    def kv_resident_fraction(self) -> float:
        res = sum(b for g, b in self.resident if g == "kv")
        tot = res + sum(b for g, b in self.streamed if g == "kv")
        return res / tot if tot else 1.0


@dataclass
class Placement:
    """Bytes of ``groups`` a domain keeps in one cache pool (one LLC instance, or the L2s of
    its cores in that instance)."""

    domain: str
    cpus: str  # cpulist of the domain's cores in this instance
    level: str  # 'L2' | 'LLC'
    groups: str  # e.g. 'blk.0-29, output' (row slices of these)
    bytes: int


@dataclass
class Plan:
    kind: str  # 'shared' | 'split'
    label: str  # one-line description
    threads: int
    domains: list[Domain]
    stages: int = 1  # layer groups
    placement: list[Placement] = field(default_factory=list)
    kv: dict = field(default_factory=dict)  # domain, numa_nodes, bytes_per_step, resident_bytes
    prediction: Prediction | None = None
    runners_up: list["Plan"] = field(default_factory=list)
    machine: str = ""  # Machine.summary()
    workload: str = ""  # Workload.summary()
    concurrency: int = 1  # sequences per step
    rates: dict[str, float] = field(default_factory=dict)  # level -> GB/s with all plan cores
    effective_llc_bytes: int = 0  # per instance
    what_if: bool = False  # the executor cannot run it (layer-group stages): shown, never chosen
    observed: dict | None = None  # the last measured TPOT of this plan here (Calibration.observation)

    @property
    def shape(self) -> str:
        """Kind and core count per domain role, e.g. 'split:w1+a1', 'shared:s2' (observed
        TPOTs feed back to plans of the same shape)."""
        doms = "+".join(f"{d.role[0]}{len(d.cores)}" for d in self.domains)
        return f"{self.kind}{'-stages' if self.stages > 1 else ''}:{doms}"

    @property
    def cores(self) -> list[int]:
        return sorted(c for d in self.domains for c in d.cores)

    @property
    def tiles(self) -> dict[str, dict[str, int]]:
        return {d.name: d.tiles for d in self.domains if d.tiles}

    def explain(self) -> str:
        return explain(self)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        d = dict(d)
        d["domains"] = [Domain(**{**x, "resident": [tuple(r) for r in x["resident"]],
                                  "streamed": [tuple(r) for r in x["streamed"]]}) for x in d["domains"]]
        d["placement"] = [Placement(**p) for p in d["placement"]]
        if d.get("prediction"):
            pred = dict(d["prediction"])
            pred["feedback"] = tuple(pred.get("feedback", (1.0, 1.0)))
            d["prediction"] = Prediction(**pred)
        else:
            d["prediction"] = None
        d["runners_up"] = [cls.from_dict(r) for r in d.get("runners_up", [])]
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        return cls.from_dict(json.loads(text))


# ---------------------------------------------------------------------------------------
# Building a plan from a layout


def rows_per_task(rows: int, threads: int) -> int:
    """Rows per matmul task: a multiple of 16, about TASKS_PER_THREAD tasks per core."""
    per = rows / (threads * TASKS_PER_THREAD * TILE_ROWS)
    return TILE_ROWS * max(1, round(per))


def _weight_groups(w: Workload, layers: list[int], last: bool) -> list[tuple[str, int]]:
    out = []
    for i in layers:
        out += [(f"blk.{i}.attn", w.layers[i].group("attn")), (f"blk.{i}.ffn", w.layers[i].group("ffn"))]
    if last:
        out.append(("output", w.lm_head_bytes))
    return out


def _fill(d: Domain, groups, cap_l2: float, cap_llc: float) -> None:
    """Greedy: each group to L2 if it fits, else the LLC, else streamed."""
    for g, nb in groups:
        if nb <= cap_l2:
            cap_l2 -= nb
            d.resident_level[g] = "L2"
        elif nb <= cap_llc:
            cap_llc -= nb
            d.resident_level[g] = "LLC"
        else:
            d.streamed.append((g, nb))
            continue
        d.resident.append((g, nb))


def build(m: Machine, w: Workload, domains: list[Domain], kind: str, label: str, rates: Rates,
          cal: Calibration) -> Plan:
    """Shares, residency, tiles and operator lists for a layout (domains with cores, roles,
    stages and layers set)."""
    plan_cores = [c for d in domains for c in d.cores]
    eff = rates.llc_eff_instance * cal.llc_usable_fraction
    attn = next((d for d in domains if d.role == "attention"), None)
    weight_doms = [d for d in domains if d.role != "attention"]
    last_stage = max(d.stage for d in weight_doms)
    llc_share = {d.name: 0.0 for d in domains}
    pollution = {d.name: 0.0 for d in domains}
    kv_total = w.kv_bytes_per_step
    attn_kv_fits, attn_kv_res = True, 0.0
    if attn is not None:  # attention first: whole instances hold KV; in shared ones, its core share
        colocated, ded_share, kv_ded = [], 0.0, 0.0
        for g in m.llc_groups(plan_cores):
            mine = [c for c in g if c in attn.cores]
            kv_here = kv_total * len(mine) / len(attn.cores)
            if len(mine) == len(g):
                ded_share, kv_ded = ded_share + eff, kv_ded + kv_here
            elif mine:
                colocated.append((eff * len(mine) / len(g), kv_here))
        attn_kv_fits = all(kv <= share for share, kv in colocated)
        llc_share[attn.name] = ded_share + sum(kv if attn_kv_fits else cal.attn_stream_reserve_bytes
                                               for _, kv in colocated)
        attn_kv_res = min(kv_ded, ded_share) + (sum(kv for _, kv in colocated) if attn_kv_fits else 0.0)
    for d in weight_doms:
        for g in m.llc_groups(d.cores):
            inst = next(x for x in m.llc_groups(plan_cores) if g[0] in x)
            others = [c for c in inst if c not in d.cores]
            if not others:
                llc_share[d.name] += eff
            else:  # co-located with attention cores: what they leave
                a_cores = [c for c in inst if attn is not None and c in attn.cores]
                kv_here = kv_total * len(a_cores) / len(attn.cores)
                left = eff - (kv_here if attn_kv_fits else cal.attn_stream_reserve_bytes)
                llc_share[d.name] += max(0.0, left)
                if not attn_kv_fits:
                    pollution[d.name] += cal.kv_pollution * min(max(0.0, left), kv_here)
    for d in domains:
        d.ops = _ops(w, d, last_stage)
        if d.role == "attention":
            _set_kv(d, kv_total, int(attn_kv_res))
            d.cache_share_bytes = int(llc_share[d.name])
            continue
        cap_l2 = len(d.cores) * rates.l2_core * cal.l2_usable_fraction
        groups = _weight_groups(w, d.layers, d.stage == last_stage)
        cap_llc = llc_share[d.name] - pollution[d.name]
        if d.role == "shared":  # the KV of its layers takes what the weights leave of the LLC;
            kv_need = kv_total * len(d.layers) / w.config.n_layer  # what streams pollutes it
            kv_res = min(kv_need, cap_llc - _llc_used(d, groups, cap_l2, cap_llc))
            if kv_res < kv_need:
                cap_llc -= cal.kv_pollution * min(cap_llc, kv_need - kv_res)
                kv_res = max(0.0, min(kv_need, cap_llc - _llc_used(d, groups, cap_l2, cap_llc)))
        _fill(d, groups, cap_l2, cap_llc)
        if d.role == "shared":
            _set_kv(d, int(kv_need), int(kv_res))
        d.cache_share_bytes = int(cap_l2 + max(0.0, cap_llc))
        d.tiles = {op: rows_per_task(w.op_rows(op), len(d.cores))
                   for op in ("qkv", "wo", "gate_up_swiglu", "down", "lm_head")}
    stages = len({d.stage for d in weight_doms})
    kv_doms = [d for d in domains if d.role in ("attention", "shared")]
    kv = {"domains": [d.name for d in kv_doms],
          "numa_nodes": sorted({m.node_of(c) for d in kv_doms for c in d.cores}),
          "bytes_per_step": kv_total,
          "resident_bytes": sum(b for d in kv_doms for g, b in d.resident if g == "kv")}
    plan = Plan(kind=kind, label=label, threads=len(plan_cores), domains=domains, stages=stages, kv=kv,
                machine=m.summary(), workload=w.summary(), concurrency=w.concurrency,
                effective_llc_bytes=int(rates.llc_eff_instance), what_if=stages > 1,
                rates={lvl: round(rates.read_gbs(lvl, plan_cores), 1) for lvl in Rates.LEVELS})
    plan.placement = _placement(m, plan)
    return plan


def _llc_used(d: Domain, groups, cap_l2: float, cap_llc: float) -> int:
    """LLC bytes the weight groups would take in ``d`` with these capacities."""
    trial = Domain(d.name, d.role, d.cores)
    _fill(trial, groups, cap_l2, cap_llc)
    return sum(nb for g, nb in trial.resident if trial.resident_level[g] == "LLC")


def _set_kv(d: Domain, need: int, res: int) -> None:
    res = max(0, min(need, res))
    if res:
        d.resident.append(("kv", res))
        d.resident_level["kv"] = "LLC"
    if need - res:
        d.streamed.append(("kv", need - res))


def _ops(w: Workload, d: Domain, last_stage: int) -> list[str]:
    attn_ops = ("rope_kv_append", "attention")
    if d.role == "attention":
        return [f"blk.{i}.{op}" for i in d.layers for op in attn_ops]
    mine = LAYER_OPS if d.role == "shared" else tuple(op for op in LAYER_OPS if op not in attn_ops)
    ops = ["embed"] if d.stage == 0 else []
    ops += [f"blk.{i}.{op}" for i in d.layers for op in mine]
    return ops + (["lm_head"] if d.stage == last_stage else [])


def _placement(m: Machine, plan: Plan) -> list[Placement]:
    out = []
    for d in plan.domains:
        for g in m.llc_groups(d.cores):
            frac = len(g) / len(d.cores)
            for lvl in ("L2", "LLC"):
                names = [n for n, _ in d.resident if d.resident_level.get(n) == lvl]
                nb = sum(b for n, b in d.resident if d.resident_level.get(n) == lvl)
                if nb:
                    out.append(Placement(d.name, format_cpulist(g), lvl, describe_groups(names), int(nb * frac)))
    return out
