"""The machine model the planner plans for: cores, SMT siblings, caches, NUMA nodes, ISA
flags and a read-bandwidth curve.

``detect_machine()`` reads this machine from sysfs (``/sys/devices/system/cpu/cpu*/topology``,
``cpu*/cache/index*``, ``/sys/devices/system/node``), py-cpuinfo and psutil, restricted to the
CPUs this process may run on (``os.sched_getaffinity``).  Missing sysfs pieces never raise:
the fallback is one cache level from py-cpuinfo and one NUMA node.  Topology files
(``topology.py``) describe other machines with the same fields (``Machine.to_dict``).

Units: sizes in bytes, bandwidth in GB/s (1e9 bytes/s), CPU ids as the kernel numbers them.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from .cpu import INTERESTING_FLAGS, cpu_info, cpu_signature
from .sysfs import (SYS_CPU, SYS_NODE, cpuinfo_dict, detect_caches, fallback_caches, format_cpulist, parse_cpulist,
                    parse_size, read)



# ---------------------------------------------------------------------------------------
# The model


@dataclass
class CacheLevel:
    """One data (or unified) cache level: every instance has ``size_bytes``; ``instances``
    lists the CPUs sharing each instance (one list per instance)."""

    level: int  # 1, 2, 3
    size_bytes: int  # per instance
    instances: list[list[int]]

    @cached_property
    def _index(self) -> dict[int, int]:
        return {c: i for i, cpus in enumerate(self.instances) for c in cpus}

    def instance_of(self, cpu: int) -> int | None:
        """Index of the instance ``cpu`` reads through (None if it is not listed)."""
        return self._index.get(cpu)


@dataclass
class Machine:
    """Everything the planner knows about a machine.

    ``bandwidth`` is a list of ``(working_set_bytes, threads, read_GBps)`` points (see
    bandwidth.py); ``bandwidth_source`` says where they came from ('measured', 'cached',
    'estimated', 'file').
    """

    name: str
    cpu_model: str
    cpus: list[int]  # logical CPU ids available to us
    core_of: dict[int, int]  # cpu -> physical core id (SMT siblings share one)
    package_of: dict[int, int]  # cpu -> socket
    caches: list[CacheLevel]  # data/unified levels, ascending
    numa: dict[int, list[int]]  # node -> cpus
    bandwidth: list[tuple[int, int, float]] = field(default_factory=list)
    isa: list[str] = field(default_factory=list)
    source: str = "detected"
    bandwidth_source: str = "none"
    notes: str = ""
    cpu_id: str = ""  # 'family F model M' (cpu.cpu_signature)

    # -- derived views -------------------------------------------------------------------

    def physical_cores(self) -> list[int]:
        """One CPU per physical core (the lowest-numbered sibling), sorted."""
        first: dict[int, int] = {}
        for c in sorted(self.cpus):
            first.setdefault(self.core_of.get(c, c), c)
        return sorted(first.values())

    @property
    def n_sockets(self) -> int:
        return len({self.package_of.get(c, 0) for c in self.cpus})

    @property
    def llc(self) -> CacheLevel | None:
        """The last-level cache (highest level)."""
        return max(self.caches, key=lambda c: c.level) if self.caches else None

    def llc_total_bytes(self) -> int:
        """Bytes of all last-level cache instances as reported (32 MiB where none is known)."""
        llc = self.llc
        return llc.size_bytes * len(llc.instances) if llc else 32 << 20

    def level(self, n: int) -> CacheLevel | None:
        return next((c for c in self.caches if c.level == n), None)

    @property
    def private_level(self) -> CacheLevel | None:
        """The largest per-core cache below the LLC (L2 on current x86), if any."""
        llc = self.llc
        cands = [c for c in self.caches if c is not llc and c.level >= 2]
        return max(cands, key=lambda c: c.level) if cands else None

    def llc_groups(self, cpus) -> list[list[int]]:
        """``cpus`` grouped by the LLC instance they share (instance order; one group when
        there is no LLC information)."""
        key = tuple(cpus)
        memo = self.__dict__.setdefault("_groups_memo", {})
        if key not in memo:
            llc = self.llc
            groups: dict[int, list[int]] = {}
            for c in sorted(key):
                i = llc.instance_of(c) if llc is not None else 0
                groups.setdefault(-1 if i is None else i, []).append(c)
            memo[key] = [groups[k] for k in sorted(groups)]
        return [list(g) for g in memo[key]]

    def cores_per_llc(self) -> int:
        """Physical cores per LLC instance (the largest instance)."""
        return max(len(g) for g in self.llc_groups(self.physical_cores()))

    @cached_property
    def _node_index(self) -> dict[int, int]:
        return {c: n for n, cpus in self.numa.items() for c in cpus}

    def node_of(self, cpu: int) -> int:
        return self._node_index.get(cpu, 0)

    def restricted(self, cpus) -> "Machine":
        """This machine seen from ``cpus`` alone (a replica's core set): the same caches,
        instances and NUMA nodes cut down to those CPUs, the same bandwidth curve."""
        keep = set(cpus) & set(self.cpus)
        if not keep:
            raise ValueError("restricted(): none of these CPUs belong to the machine")
        caches = [CacheLevel(c.level, c.size_bytes, [[x for x in i if x in keep] for i in c.instances
                                                     if any(x in keep for x in i)]) for c in self.caches]
        numa = {n: [c for c in v if c in keep] for n, v in self.numa.items() if any(c in keep for c in v)}
        return Machine(name=self.name, cpu_model=self.cpu_model, cpus=sorted(keep),
                       core_of={c: k for c, k in self.core_of.items() if c in keep},
                       package_of={c: p for c, p in self.package_of.items() if c in keep}, caches=caches,
                       numa=numa, bandwidth=list(self.bandwidth), isa=list(self.isa), source=self.source,
                       bandwidth_source=self.bandwidth_source, notes=self.notes)

    def key(self) -> str:
        """Cache key of measured facts: CPU model, family / model, ISA flags, core counts and
        cache sizes (not the curve)."""
        sig = "|".join([self.cpu_model, self.cpu_id, " ".join(self.isa), str(len(self.cpus)),
                        str(len(self.physical_cores()))]
                       + [f"L{c.level}:{c.size_bytes}x{len(c.instances)}" for c in self.caches])
        slug = re.sub(r"[^a-z0-9]+", "-", self.cpu_model.lower()).strip("-")[:32] or "cpu"
        return f"{slug}-{len(self.cpus)}c-{hashlib.sha256(sig.encode()).hexdigest()[:10]}"

    def summary(self) -> str:
        """Two lines: model and counts; cache levels."""
        n_phys, n_log = len(self.physical_cores()), len(self.cpus)
        smt = "" if n_log == n_phys else f" ({n_log} logical)"
        head = (f"{self.cpu_model}: {n_phys} cores{smt}, {self.n_sockets} socket"
                f"{'s' if self.n_sockets > 1 else ''}, {len(self.numa)} NUMA node{'s' if len(self.numa) > 1 else ''}")
        levels = ", ".join(f"L{c.level} {len(c.instances)} x {_mib(c.size_bytes)}" for c in self.caches)
        return f"{head}\n  caches: {levels}; ISA: {' '.join(self.isa) or '-'}"

    # -- (de)serialisation: the topology-file format ---------------------------------------

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "cpu_model": self.cpu_model,
            "cpus": format_cpulist(self.cpus),
            "core_of": {str(c): k for c, k in sorted(self.core_of.items())},
            "package_of": {str(c): p for c, p in sorted(self.package_of.items())},
            "caches": [{"level": c.level, "size_bytes": c.size_bytes,
                        "instances": [format_cpulist(i) for i in c.instances]} for c in self.caches],
            "numa": {str(n): format_cpulist(c) for n, c in sorted(self.numa.items())},
            "bandwidth": [[int(w), int(t), float(g)] for w, t, g in self.bandwidth],
            "isa": list(self.isa),
            "source": self.source,
            "bandwidth_source": self.bandwidth_source,
            "notes": self.notes,
            "cpu_id": self.cpu_id,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Machine":
        """Inverse of ``to_dict``; ``core_of`` / ``package_of`` default to one core per CPU
        on socket 0, so a hand-written topology file may leave them out."""
        cpus = parse_cpulist(d["cpus"]) if isinstance(d["cpus"], str) else sorted(int(c) for c in d["cpus"])
        caches = []
        for c in d.get("caches", []):
            inst = [parse_cpulist(i) if isinstance(i, str) else sorted(i) for i in c["instances"]]
            caches.append(CacheLevel(int(c["level"]), parse_size(c.get("size_bytes", c.get("size"))), inst))
        caches.sort(key=lambda c: c.level)
        numa_raw = d.get("numa") or {"0": format_cpulist(cpus)}
        numa = {int(n): (parse_cpulist(v) if isinstance(v, str) else sorted(v)) for n, v in numa_raw.items()}
        return cls(
            name=str(d.get("name", "machine")),
            cpu_model=str(d.get("cpu_model", "unknown")),
            cpus=cpus,
            core_of={int(c): int(k) for c, k in (d.get("core_of") or {}).items()} or {c: c for c in cpus},
            package_of={int(c): int(p) for c, p in (d.get("package_of") or {}).items()} or {c: 0 for c in cpus},
            caches=caches,
            numa=numa,
            bandwidth=[(int(w), int(t), float(g)) for w, t, g in d.get("bandwidth", [])],
            isa=list(d.get("isa", [])),
            source=str(d.get("source", "file")),
            bandwidth_source=str(d.get("bandwidth_source", "file")),
            notes=str(d.get("notes", "")),
            cpu_id=str(d.get("cpu_id", "")),
        )


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.0f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB"


# ---------------------------------------------------------------------------------------
# Detection


def detect_topology(sys_root: str | os.PathLike | None = None) -> Machine:
    """This machine's cores, caches and NUMA nodes, restricted to ``os.sched_getaffinity(0)``,
    with no bandwidth curve (``hw.detect_machine`` adds it).  ``sys_root`` replaces
    ``/sys/devices/system`` (tests point it at a partial copy).
    """
    sys_cpu = Path(sys_root) / "cpu" if sys_root else SYS_CPU
    sys_node = Path(sys_root) / "node" if sys_root else SYS_NODE
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        cpus = list(range(os.cpu_count() or 1))
    core_of, package_of = {}, {}
    for c in cpus:
        topo = sys_cpu / f"cpu{c}" / "topology"
        pkg = read(topo / "physical_package_id")
        package_of[c] = int(pkg) if pkg and pkg.lstrip("-").isdigit() and int(pkg) >= 0 else 0
        sib = read(topo / "thread_siblings_list") or read(topo / "core_cpus_list")
        try:
            core_of[c] = min(parse_cpulist(sib)) if sib else c
        except ValueError:
            core_of[c] = c
    raw = detect_caches(cpus, sys_cpu) or fallback_caches(cpus, cpuinfo_dict())  # py-cpuinfo is slow
    caches = [CacheLevel(level, size, instances) for level, size, instances in raw]
    numa: dict[int, list[int]] = {}
    for node in sorted(sys_node.glob("node[0-9]*")):
        lst = read(node / "cpulist")
        try:
            mine = [c for c in parse_cpulist(lst) if c in cpus] if lst else []
        except ValueError:
            mine = []
        if mine:
            numa[int(node.name[4:])] = mine
    if not numa or sum(len(v) for v in numa.values()) != len(cpus):
        numa = {0: list(cpus)}
    model, flags = cpu_info()  # /proc/cpuinfo; py-cpuinfo only when that says nothing
    m = Machine(name="this machine", cpu_model=model, cpus=cpus, core_of=core_of, package_of=package_of,
                caches=caches, numa=numa, isa=[f for f in INTERESTING_FLAGS if f in flags],
                source="detected", cpu_id=cpu_signature())
    _attach_memory_note(m)
    return m


def _attach_memory_note(m: Machine) -> None:
    try:
        import psutil

        m.notes = f"{psutil.virtual_memory().total / (1 << 30):.0f} GiB RAM"
    except Exception:  # noqa: BLE001 - psutil missing or restricted
        pass
