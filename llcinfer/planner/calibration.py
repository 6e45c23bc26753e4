"""The per-machine calibration of the TPOT model: rates and costs measured on this machine
with this kernel version, and the TPOTs observed for the plans that ran, which feed back
into the predictions (``feedback``).

Where it lives: ``$LLCINFER_HOME/machine/calibration-<cache_key>.json``; ``cache_key``
joins the machine's identity (``Machine.key()``: CPU model, family / model, ISA flags,
core count, caches), the kernel version (``jit.kernel_version()``, the hash of every
kernel source) and ``METHOD_VERSION``, so a new CPU, an edited kernel or a new way of
measuring starts from defaults and is measured again.  The planner only reads these
numbers; engine/calibrate.py measures the rates and engine/plan_check.py the plans' TPOTs.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, fields

from .. import jit, paths
from ..hw.machine import Machine

OBSERVED_MAX = 256  # observations kept, the latest
FEEDBACK_RIDGE = 0.1  # pull of the fitted per-part factors towards 1 (``Calibration.feedback``)
METHOD_VERSION = 3  # what is measured and how (engine/calibrate.py): part of the cache key

@dataclass
class Calibration:
    """Rates and costs of the TPOT model.  Scalar defaults are estimates for a current x86
    core; the measured ones (engine/calibrate.py at first use) replace them, and the
    per-thread-count and per-weight-type tables below take precedence where they have an
    entry.  ``save(key)`` / ``load(key)`` keep one per ``cache_key(machine)``."""

    unpack_weights_per_core: float = 90e9
    """weights per second one core unpacks to int8 lanes in the repacked matmul, once per
    weight per micro-batch (fitted with ``matmul_macs_per_core`` to Q5_0/Q6_K 4864x896 and
    896x4864 matrices on one core of the development machine: 60 GMAC/s at 1 row, 110-120 at
    4 rows, 2026-11-30)."""
    matmul_macs_per_core: float = 180e9
    """int8 multiply-accumulates per second one core adds per sequence of the micro-batch."""
    attention_flops_per_core: float = 10e9
    """flops per second per core for decode attention over f16 K/V (q.k, softmax, p.v;
    the paged kernel measured 9.3e9 on one core, ctx 8192, 12/2 heads x 128, 2026-11-30);
    ``attention_flops`` replaces it for a measured head shape."""
    small_op_ns: float = 300.0
    """one small operator (rms norm, rope + KV append, embedding row, swiglu tail) per
    micro-batch, in ns."""
    task_ns: float = 100.0
    """claiming and finishing one matmul task (tile), in ns per task."""
    handoff_ns: float = 200.0
    """one data-dependency hand-off whose producers and consumers share one LLC, in ns."""
    handoff_cross_llc_ns: float = 600.0
    """one hand-off spanning several LLC instances (CCDs, dies) of one socket, in ns."""
    handoff_cross_socket_ns: float = 1500.0
    """one hand-off spanning sockets, in ns."""
    handoff_producer_ns: float = 15.0
    """added per producer core of the largest LLC group plus per LLC group (hierarchical
    counters: the increments to one cache line serialise), in ns."""
    barrier_ns: float = 9000.0
    """one barrier (a thread-pool parallel region, OpenMP) within one LLC, in ns (measured 8.8 us
    median on the 2-core development machine, kernels/jit.py)."""
    barrier_cross_llc_ns: float = 12000.0
    """one barrier spanning several LLC instances, in ns."""
    barrier_cross_socket_ns: float = 20000.0
    """one barrier spanning sockets, in ns."""
    l2_usable_fraction: float = 0.5
    """share of each core's L2 that can hold resident weight tiles (the rest: activations,
    KV tiles, code)."""
    llc_usable_fraction: float = 0.9
    """share of the effective LLC that can hold resident tensors."""
    kv_pollution: float = 0.5
    """fraction of the KV bytes streamed through an LLC per step that displaces resident
    weights in it (0: non-temporal KV reads; 1: plain LRU)."""
    head_overlap: float = 0.8
    """with one sequence, the fraction of the attention of all KV heads but the last that
    overlaps the QKV projection of later heads (split plans)."""
    matmul_read_efficiency: float = 1.0
    """fraction of the machine's read bandwidth (its curve) a matmul reaches when it streams
    weights: perf/calibrate.py measures it by streaming every layer's ffn_gate of
    Qwen2.5-0.5B through the kernel (decode, one row) on all threads."""
    step_overhead_ns: float = 0.0
    """fixed host-side cost of one decode step outside the workers (embedding row, block
    tables, job hand-out, logits copy), in ns."""
    step_overhead_seq_ns: float = 0.0
    """host-side cost per sequence of a step (KV block bookkeeping), in ns."""
    attn_stream_reserve_bytes: int = 4 << 20
    """LLC bytes an attention domain keeps for streaming KV tiles in an LLC instance it
    shares with a weight domain, when its KV does not fit (the rest goes to weights)."""

    matmul_stream_gbs: dict = field(default_factory=dict)
    """{weight type: {threads: GB/s}}: the matmul kernel (one activation row) streaming
    matrices of that type from DRAM on that many cores (engine/calibrate.py); it replaces
    the curve's DRAM rate x ``matmul_read_efficiency`` for those weights.  '<type>@4': the
    same with four rows (their loop does not prefetch), for micro-batches of 4 or more."""
    matmul_compute: dict = field(default_factory=dict)
    """{weight type: [unpack weights/s, int8 MACs/s]} per core, from L2-resident matrices at
    1 and 4 activation rows; replaces ``unpack_weights_per_core`` / ``matmul_macs_per_core``."""
    attention_flops: dict = field(default_factory=dict)
    """{head shape 'H/KVHxD': flops/s per core}: the paged attention kernel over an f16 KV in
    cache on one core; replaces ``attention_flops_per_core`` for that shape."""
    attention_stream_gbs: dict = field(default_factory=dict)
    """{head shape 'H/KVHxD': {cores: GB/s}}: KV bytes per second the executor's attention
    reads when the KV is several times the LLC, one row per sequence, on a shared domain of
    that many cores (measured in the decode step: the step's time at a long context less
    its time at 16 tokens, so what streaming KV costs the rest of the step counts too);
    '<shape>@4': the same with four sequences.  Replaces the curve's DRAM rate for
    streamed KV."""
    work_factor: dict = field(default_factory=dict)
    """{workload name: {'<cores>x<rows>': factor}}: the executor's decode step at 16 tokens of
    context on a shared domain of that many cores with that many sequences, measured, over
    the model's prediction of it; scales the weight-side work (matmuls, small operators,
    hand-offs inside a domain) of that model's plans.  Rows 1 and 4 are measured, the
    rest interpolated."""
    sparse_select_ns: dict = field(default_factory=dict)
    """{planner/sparse_policy.select_key: {'part_ns', 'token_ns'}}: what sparse attention adds
    to the decode step per full layer and row, measured in the step (engine/calibrate_sparse.py):
    a fixed cost, and a cost per candidate key on one core.  Replaces ``SPARSE_SELECT_NS``
    (planner/sparse_policy.py) for that model shape and sparse configuration."""
    measured: dict = field(default_factory=dict)
    """what was measured: {item: {'seconds': cost, 'when': ISO time}}."""
    observed: list = field(default_factory=list)
    """TPOTs measured for plans (engine/plan_check.py): dicts with workload, shape,
    label, kind, predicted_s (the model's, before feedback), attention_s (its attention
    part), measured_s, when; the latest ``OBSERVED_MAX``."""

    def handoff_s(self, m: Machine, producers, consumers, mode: str = "handoff") -> float:
        """Seconds for one hand-off (or barrier) from ``producers`` to ``consumers``."""
        key = (id(m), tuple(producers), tuple(consumers), mode)
        memo = self.__dict__.setdefault("_memo", {})
        if key not in memo:
            memo[key] = self._handoff_s(m, producers, consumers, mode)
        return memo[key]

    def _handoff_s(self, m: Machine, producers, consumers, mode: str) -> float:
        span = set(producers) | set(consumers)
        n_llc = len(m.llc_groups(span))
        n_sock = len({m.package_of.get(c, 0) for c in span})
        if mode == "barrier":
            ns = (self.barrier_cross_socket_ns if n_sock > 1 else
                  self.barrier_cross_llc_ns if n_llc > 1 else self.barrier_ns)
        else:
            groups = m.llc_groups(producers)
            base = (self.handoff_cross_socket_ns if n_sock > 1 else
                    self.handoff_cross_llc_ns if n_llc > 1 else self.handoff_ns)
            ns = base + self.handoff_producer_ns * (max(len(g) for g in groups) + len(groups))
        return ns * 1e-9

    # -- lookups ---------------------------------------------------------------------------

    def matmul_gbs(self, qtype: str, threads: int) -> float | None:
        """Measured GB/s of the matmul streaming ``qtype`` weights on ``threads`` cores
        (linear between measured core counts, flat beyond the last); None if not measured."""
        return _interp(self.matmul_stream_gbs.get(qtype), threads)

    def attention_gbs(self, shape: str, threads: int, rows: int = 1) -> float | None:
        """Measured GB/s of attention of head shape ``shape`` ('H/KVHxD') over a streamed
        KV on ``threads`` cores with ``rows`` sequences per step (1 and 4 measured, linear
        between); None if not measured."""
        one = _interp(self.attention_stream_gbs.get(shape), threads)
        four = _interp(self.attention_stream_gbs.get(f"{shape}@4"), threads)
        return _rows_interp(one, four, rows)

    def attention_flops_rate(self, shape: str) -> float:
        """flops/s per core of attention of head shape ``shape`` over a KV in cache."""
        return float(self.attention_flops.get(shape, self.attention_flops_per_core))

    def work_scale(self, workload: str, cores: int, rows: int) -> float:
        """The measured factor on the weight-side work of ``workload`` on a domain of
        ``cores`` cores with ``rows`` sequences per micro-batch (1 when not measured)."""
        table = self.work_factor.get(workload)
        if not table:
            return 1.0
        by_rows = {}
        for k, v in table.items():
            c, r = k.split("x")
            by_rows.setdefault(int(r), {})[c] = v
        got = _rows_interp(_interp(by_rows.get(1), cores, proportional=False),
                           _interp(by_rows.get(4), cores, proportional=False), rows)
        return 1.0 if got is None else got

    def unpack_macs(self, qtype: str) -> tuple[float, float]:
        """(unpack weights/s, MACs/s) per core for ``qtype`` (the scalar defaults if not measured)."""
        got = self.matmul_compute.get(qtype)
        return (float(got[0]), float(got[1])) if got else (self.unpack_weights_per_core, self.matmul_macs_per_core)

    def feedback(self, workload: str, shape: str) -> tuple[float, float]:
        """(factor on the weight-side part, factor on the attention part) of the model's TPOT
        that the observations feed back for a plan of ``shape`` on ``workload`` (a
        ``workload_key``):

        - this workload observed with plans of this shape: their measured / predicted
          (median) on both parts, so the prediction is what was measured;
        - else observations of this shape on the same model, KV type, threads and number of
          sequences that carry their attention part: the ridge fit of measured = a * weight
          part + b * attention part in relative error, pulled towards 1 by
          ``FEEDBACK_RIDGE``;
        - else none (1, 1): another number of sequences or another model errs differently
          (measured: carrying a 1-sequence error over to 4 sequences made it worse)."""
        same = [o for o in self.observed if o.get("shape") == shape and o.get("predicted_s", 0) > 0
                and o.get("measured_s", 0) > 0]
        exact = [o["measured_s"] / o["predicted_s"] for o in same if o.get("workload") == workload]
        if exact:
            r = _median(exact)
            return r, r
        name, ctx, conc, rest = _split_key(workload)
        kin = [o for o in same if "attention_s" in o and _split_key(o.get("workload", ""))[::3] == (name, rest)]
        kin = [o for o in kin if _split_key(o["workload"])[2] == conc]
        return _ridge_fit(kin) if kin else (1.0, 1.0)

    # -- persistence ---------------------------------------------------------------------

    @staticmethod
    def path(key: str) -> str:
        return os.fspath(paths.machine_dir() / f"calibration-{key}.json")

    @classmethod
    def load(cls, key: str | None) -> "Calibration":
        """The calibration saved under ``key``; defaults for missing fields or file."""
        if not key:
            return cls()
        try:
            with open(cls.path(key)) as fh:
                d = json.load(fh)
        except (OSError, ValueError):
            return cls()
        if not isinstance(d, dict):
            return cls()
        kw = {}
        for f in fields(cls):
            v = d.get(f.name)
            if f.type in ("int", "float") and isinstance(v, (int, float)) and not isinstance(v, bool):
                kw[f.name] = int(v) if f.type == "int" else float(v)
            elif f.type == "dict" and isinstance(v, dict):
                kw[f.name] = v
            elif f.type == "list" and isinstance(v, list):
                kw[f.name] = [x for x in v if isinstance(x, dict)]
        return cls(**kw)

    def save(self, key: str) -> str:
        path = self.path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        d = {k: v for k, v in asdict(self).items()}
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            json.dump(d, fh, indent=1)
        os.replace(tmp, path)
        return path

    # -- feedback ------------------------------------------------------------------------

    def record(self, workload: str, shape: str, label: str, kind: str, predicted_s: float,
               measured_s: float, attention_s: float | None = None) -> dict:
        """Add one observation (``predicted_s``: the model's TPOT before feedback,
        ``attention_s`` its attention part); returns the observation."""
        obs = {"workload": workload, "shape": shape, "label": label, "kind": kind,
               "predicted_s": float(predicted_s), "measured_s": float(measured_s),
               "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
        if attention_s is not None:
            obs["attention_s"] = float(min(max(attention_s, 0.0), predicted_s))
        self.observed = [o for o in self.observed if (o.get("workload"), o.get("label")) != (workload, label)]
        self.observed = (self.observed + [obs])[-OBSERVED_MAX:]
        return obs

    def observation(self, workload: str, label: str) -> dict | None:
        """The last observation of plan ``label`` on ``workload`` (None if never measured)."""
        return next((o for o in reversed(self.observed)
                     if o.get("workload") == workload and o.get("label") == label), None)

    def note_measured(self, item: str, seconds: float) -> None:
        self.measured[item] = {"seconds": round(float(seconds), 3), "when": time.strftime("%Y-%m-%dT%H:%M:%S")}


def cache_key(m: Machine) -> str:
    """The calibration's cache key: machine identity, kernel version and the version of the
    measuring method."""
    return f"{m.key()}-k{jit.kernel_version()}-m{METHOD_VERSION}"


def _split_key(key: str) -> tuple[str, str, str, str]:
    """(model, 'ctxN', 'xN', the rest) of a ``workload_key`` 'model|ctxN|xN|kvN|tN'."""
    parts = key.split("|")
    return (parts[0], parts[1] if len(parts) > 1 else "", parts[2] if len(parts) > 2 else "",
            "|".join(parts[3:]))


def _ridge_fit(obs: list[dict]) -> tuple[float, float]:
    """(a, b) minimising sum ((M - a W - b A) / M)^2 + FEEDBACK_RIDGE ((a - 1)^2 + (b - 1)^2)
    over observations (M measured, A the attention part, W the rest of the prediction),
    each clamped to [0.25, 4]."""
    lam = FEEDBACK_RIDGE
    sxx = sxy = syy = sx = sy = 0.0
    for o in obs:
        m = o["measured_s"]
        x, y = (o["predicted_s"] - o["attention_s"]) / m, o["attention_s"] / m
        sxx, sxy, syy, sx, sy = sxx + x * x, sxy + x * y, syy + y * y, sx + x, sy + y
    # normal equations: [sxx + lam, sxy; sxy, syy + lam] [a; b] = [sx + lam; sy + lam]
    det = (sxx + lam) * (syy + lam) - sxy * sxy
    a = ((sx + lam) * (syy + lam) - sxy * (sy + lam)) / det
    b = ((sxx + lam) * (sy + lam) - sxy * (sx + lam)) / det
    return min(4.0, max(0.25, a)), min(4.0, max(0.25, b))


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    k = len(xs)
    return xs[k // 2] if k % 2 else 0.5 * (xs[k // 2 - 1] + xs[k // 2])


def _interp(table: dict | None, threads: int, proportional: bool = True) -> float | None:
    """Linear in the core count between measured points, flat beyond the last; below the
    first, in proportion to the cores (a rate) or flat (``proportional=False``: a factor)."""
    if not table:
        return None
    pts = sorted((int(t), float(g)) for t, g in table.items())
    if threads <= pts[0][0]:
        return pts[0][1] * (threads / pts[0][0] if threads < pts[0][0] and proportional else 1.0)
    for (t0, g0), (t1, g1) in zip(pts, pts[1:]):
        if threads <= t1:
            return g0 + (g1 - g0) * (threads - t0) / (t1 - t0)
    return pts[-1][1]


def _rows_interp(one: float | None, four: float | None, rows: int) -> float | None:
    """A value measured at 1 and 4 rows at ``rows`` rows: linear between, the 4-row value
    beyond; whichever exists when only one does."""
    if one is None or four is None:
        return four if one is None else one
    return one + (four - one) * (min(max(rows, 1), 4) - 1) / 3
