"""The resource-domain planner: machine facts in (hw/), plans out.  Per-level read rates of
the machine (bandwidth.py), the work of one decode step (workload.py), an analytical TPOT
model (cost.py), and the plans it chooses between (plan.py, candidates.py, choose.py),
explained (explain.py).

    m = detect_machine()                      # or load_topology("epyc-9684x")
    w = workload_from_gguf(path, ctx=8192, concurrency=4)
    plan = make_plan(m, w)
    print(plan.explain())
"""

from ..hw import CacheLevel, Machine, detect_machine, probe_curve, synthetic_curve
from .bandwidth import Rates, effective_llc_bytes
from .calibration import Calibration, cache_key
from .cost import Prediction, predict
from .choose import make_plan, workload_key
from .plan import Domain, Placement, Plan
from .topology import list_topologies, load_topology
from .workload import LAYER_OPS, Workload, workload_from_gguf, workload_from_model

__all__ = ["CacheLevel", "Calibration", "Domain", "LAYER_OPS", "Machine", "Placement", "Plan", "Prediction",
           "Rates", "Workload", "cache_key", "detect_machine", "effective_llc_bytes", "list_topologies", "load_topology",
           "make_plan", "predict", "probe_curve", "synthetic_curve", "workload_from_gguf", "workload_from_model",
           "workload_key"]
