"""Topology files: machines the planner can plan for without running on them.

A topology file is JSON with ``Machine.to_dict()``'s fields, plus shorthands for writing
one by hand:

- a cache level may give ``"size": "96M"`` and ``"cpus_per_instance": 8`` (consecutive CPUs
  share an instance) instead of ``size_bytes`` and an ``instances`` list;
- ``"sockets": {"0": "0-95", ...}`` instead of ``package_of``; ``core_of`` defaults to one
  core per CPU (no SMT);
- ``"bandwidth_model"`` (per-level GB/s, see ``hw.bandwidth.DEFAULT_MODEL``, plus optional
  ``threads``) instead of measured ``bandwidth`` points: the curve is synthesised from it
  and marked 'estimated'.

Shipped files live in ``llcinfer/planner/topologies/``; ``load_topology('epyc-9684x')``
finds them by name, anything else is a path.  A file that cannot be read or is malformed
is a ``UsageError`` (one line, exit code 2).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import UsageError
from ..hw.bandwidth import synthetic_curve
from ..hw.machine import Machine
from ..hw.sysfs import format_cpulist, parse_cpulist, parse_size

TOPOLOGY_DIR = Path(__file__).with_name("topologies")


def list_topologies() -> list[str]:
    """Names of the shipped topology files (without .json)."""
    return sorted(p.stem for p in TOPOLOGY_DIR.glob("*.json"))


def _expand(d: dict) -> dict:
    """Shorthands -> Machine.to_dict() fields."""
    d = dict(d)
    cpus = parse_cpulist(d["cpus"]) if isinstance(d["cpus"], str) else sorted(d["cpus"])
    caches = []
    for c in d.get("caches", []):
        c = dict(c)
        if "size" in c and "size_bytes" not in c:
            c["size_bytes"] = parse_size(c.pop("size"))
        if "cpus_per_instance" in c and "instances" not in c:
            k = int(c.pop("cpus_per_instance"))
            if k < 1:
                raise ValueError("cpus_per_instance must be positive")
            c["instances"] = [format_cpulist(cpus[i:i + k]) for i in range(0, len(cpus), k)]
        caches.append(c)
    d["caches"] = caches
    if "sockets" in d and "package_of" not in d:
        d["package_of"] = {str(c): int(s) for s, lst in d.pop("sockets").items() for c in parse_cpulist(lst)}
    return d


def machine_from_topology(d: dict, origin: str = "file") -> Machine:
    """A Machine from a topology document (dict)."""
    m = Machine.from_dict(_expand(d))
    m.source = f"topology {origin}"
    missing = [c for c in m.cpus if m.llc is not None and m.llc.instance_of(c) is None]
    if missing:
        raise ValueError(f"CPUs {format_cpulist(missing)} are in no instance of the L{m.llc.level} cache")
    if not m.bandwidth:
        model = d.get("bandwidth_model") or {}
        m.bandwidth = synthetic_curve(m, {k: v for k, v in model.items() if k != "threads"},
                                      threads=model.get("threads"))
        m.bandwidth_source = "estimated"
    else:
        m.bandwidth_source = d.get("bandwidth_source", "file")
    return m


def load_topology(path_or_name: str | os.PathLike) -> Machine:
    """A shipped topology by name ('epyc-9684x') or a topology file by path."""
    s = os.fspath(path_or_name)
    path = TOPOLOGY_DIR / f"{s}.json" if (TOPOLOGY_DIR / f"{s}.json").is_file() else Path(s).expanduser()
    if not path.is_file():
        raise UsageError(f"topology '{s}' is neither a shipped topology ({', '.join(list_topologies())}) "
                         "nor a file")
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict):
            raise ValueError("the top level must be an object")
        return machine_from_topology(doc, path.name)
    except UsageError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, KeyError):
            msg = f"missing field {exc}"
        raise UsageError(f"bad topology file {path}: {msg}") from None
