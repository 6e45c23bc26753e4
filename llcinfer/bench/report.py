"""Benchmark records and their maths (mean ± std, TPOT, ratio, roofline), the text table
and the JSON document.

One ``Record`` is one engine (``llcinfer`` or ``llama.cpp`` + build) on one test of one
model at one thread count; its samples are tokens/s of each repetition.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ..engine.sparse_setup import NEVER

OURS = "llcinfer"
LLAMA = "llama.cpp"


def test_name(kind: str, n_tokens: int, depth: int) -> str:
    """llama-bench's names: ``pp512``, ``tg128``, ``tg128 @ d4096``."""
    name = f"{kind}{n_tokens}"
    return f"{name} @ d{depth}" if depth else name


def mean_std(samples: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n-1, as llama-bench); std 0 for one sample."""
    if not samples:
        return math.nan, math.nan
    mean = statistics.fmean(samples)
    return mean, (statistics.stdev(samples) if len(samples) > 1 else 0.0)


def tpot_ratio(ours_tps: float | None, llama_tps: float | None) -> float | None:
    """TPOT ours / TPOT llama.cpp = llama.cpp t/s / ours t/s (below 1: we are faster)."""
    if not ours_tps or not llama_tps or math.isnan(ours_tps) or math.isnan(llama_tps):
        return None
    return llama_tps / ours_tps


def kv_bytes_read(n_layer: int, n_kv_head: int, head_dim: int, context: float, elem_bytes: int = 4) -> float:
    """K and V bytes one decode step reads at ``context`` cached tokens of ``elem_bytes`` each."""
    return 2.0 * n_layer * context * n_kv_head * head_dim * elem_bytes


def roofline_fraction(bytes_per_token: float, tpot_s: float, bandwidth: float) -> float | None:
    """Achieved bytes/s (bytes_per_token / TPOT) as a fraction of the probed bandwidth."""
    if not bytes_per_token or not tpot_s or not bandwidth or tpot_s <= 0 or bandwidth <= 0:
        return None
    return bytes_per_token / tpot_s / bandwidth


@dataclass
class Record:
    engine: str  # OURS or LLAMA
    build: str | None  # llama.cpp configuration (native, portable, user) or None
    model: str
    kind: str  # "pp" or "tg"
    threads: int
    depth: int
    n_tokens: int
    samples_tps: list[float] = field(default_factory=list)  # one per repetition
    status: str = "ok"  # ok, crashed, failed
    error: str | None = None
    bytes_per_token: float | None = None  # ours, tg: weights + KV read per decode step
    bandwidth: float | None = None  # bytes/s the probe read at that working-set size (median)
    samples_bw: list[float] = field(default_factory=list)  # ours, tg: probe bytes/s after each repetition
    fill: str | None = None  # ours at depth > 0: how the KV depth was filled
    anchor: bool = False  # llama.cpp: the best build that ran this test
    plan: str | None = None  # ours: the plan the decode rows ran (its label)
    n_ctx: int | None = None  # ours: the context the model was loaded with (the plan's)
    sparse_top_k: int | None = None  # ours: the sparse indexer's top-k; None: dense attention
    sparse_min_context: int | None = None  # ours, sparse: keys from which rows ran sparse (the planner's)

    @property
    def test(self) -> str:
        return test_name(self.kind, self.n_tokens, self.depth)

    @property
    def tps_mean(self) -> float | None:
        return mean_std(self.samples_tps)[0] if self.samples_tps and self.status == "ok" else None

    @property
    def tps_std(self) -> float | None:
        return mean_std(self.samples_tps)[1] if self.samples_tps and self.status == "ok" else None

    @property
    def tpot_ms(self) -> float | None:
        tps = self.tps_mean
        return 1000.0 / tps if tps else None

    @property
    def roofline_fraction(self) -> float | None:
        if self.engine != OURS or self.kind != "tg" or self.tpot_ms is None:
            return None
        if self.bytes_per_token and len(self.samples_bw) == len(self.samples_tps):
            # each repetition against the probe read next to it, then the median
            per_rep = [self.bytes_per_token * tps / bw for tps, bw in zip(self.samples_tps, self.samples_bw) if bw > 0]
            return float(statistics.median(per_rep)) if per_rep else None
        return roofline_fraction(self.bytes_per_token or 0.0, self.tpot_ms / 1000.0, self.bandwidth or 0.0)

    def to_json(self) -> dict:
        r = lambda x, d=4: None if x is None else round(x, d)  # noqa: E731
        return {
            "engine": self.engine, "build": self.build, "model": self.model, "test": self.test,
            "threads": self.threads, "depth": self.depth, "n_tokens": self.n_tokens,
            "tps_mean": r(self.tps_mean), "tps_std": r(self.tps_std), "tpot_ms": r(self.tpot_ms),
            "roofline_fraction": r(self.roofline_fraction), "status": self.status,
            "samples_tps": [round(s, 4) for s in self.samples_tps], "error": self.error,
            "bytes_per_token": None if self.bytes_per_token is None else int(self.bytes_per_token),
            "bandwidth_gbs": r(None if self.bandwidth is None else self.bandwidth / 1e9, 2),
            "samples_bw_gbs": [round(b / 1e9, 2) for b in self.samples_bw],
            "fill": self.fill, "anchor": self.anchor, "plan": self.plan, "n_ctx": self.n_ctx,
            "sparse": self.sparse_top_k is not None, "sparse_top_k": self.sparse_top_k,
            "sparse_min_context": self.sparse_min_context,
        }

    @classmethod
    def from_json(cls, d: dict) -> "Record":
        """Inverse of ``to_json`` (for merging the JSON of several runs)."""
        bw = d.get("bandwidth_gbs")
        return cls(engine=d["engine"], build=d.get("build"), model=d["model"], kind=d["test"][:2],
                   threads=int(d["threads"]), depth=int(d["depth"]), n_tokens=int(d["n_tokens"]),
                   samples_tps=list(d.get("samples_tps") or []), status=d.get("status", "ok"), error=d.get("error"),
                   bytes_per_token=d.get("bytes_per_token"), bandwidth=None if bw is None else bw * 1e9,
                   samples_bw=[b * 1e9 for b in d.get("samples_bw_gbs") or []],
                   fill=d.get("fill"), anchor=bool(d.get("anchor")), plan=d.get("plan"), n_ctx=d.get("n_ctx"),
                   sparse_top_k=d.get("sparse_top_k"), sparse_min_context=d.get("sparse_min_context"))


def read_json(path: str | Path) -> tuple[dict, list[Record]]:
    """(the document without its results, the records) of a ``--json`` file."""
    doc = json.loads(Path(path).read_text())
    return {k: v for k, v in doc.items() if k != "results"}, [Record.from_json(r) for r in doc["results"]]


def mark_anchors(records: list[Record]) -> None:
    """Per (model, test, threads): flag the llama.cpp build with the highest mean t/s."""
    groups: dict[tuple, list[Record]] = {}
    for rec in records:
        if rec.engine == LLAMA:
            rec.anchor = False
            groups.setdefault((rec.model, rec.test, rec.threads), []).append(rec)
    for recs in groups.values():
        ok = [r for r in recs if r.tps_mean]
        if ok:
            max(ok, key=lambda r: r.tps_mean).anchor = True


def _fmt_tps(rec: Record | None) -> str:
    if rec is None:
        return "-"
    if rec.status != "ok" or rec.tps_mean is None:
        return rec.status
    return f"{rec.tps_mean:.2f} ± {rec.tps_std:.2f}"


def table_rows(records: list[Record]) -> list[list[str]]:
    """One row per (model, test, threads) in run order: ours vs the anchor build."""
    rows, seen = [], set()
    for rec in records:
        key = (rec.model, rec.test, rec.threads)
        if key in seen:
            continue
        seen.add(key)
        same = [r for r in records if (r.model, r.test, r.threads) == key]
        ours = next((r for r in same if r.engine == OURS), None)
        llamas = [r for r in same if r.engine == LLAMA]
        anchor = next((r for r in llamas if r.anchor), None)
        if anchor is not None:
            others = ", ".join(f"{r.build} {r.status if r.status != 'ok' else f'{r.tps_mean:.1f}'}"
                               for r in llamas if r is not anchor)
            llama_cell = f"{_fmt_tps(anchor)} ({anchor.build}{'; ' + others if others else ''})"
        elif llamas:
            llama_cell = "; ".join(f"{r.build} {r.status}" for r in llamas)
        else:
            llama_cell = "-"
        ratio = tpot_ratio(ours.tps_mean if ours else None, anchor.tps_mean if anchor else None)
        roof = ours.roofline_fraction if ours else None
        test = rec.test + (" (synthetic fill)" if ours and ours.fill and ours.fill.startswith("synthetic") else "")
        rows.append([rec.model, test, str(rec.threads), _fmt_tps(ours), llama_cell,
                     "-" if ratio is None else f"{ratio:.2f}", "-" if roof is None else f"{roof:.0%}"])
    return rows


HEADER = ["model", "test", "threads", "ours t/s", "llama.cpp t/s (build)", "TPOT ours/llama.cpp", "ours roofline"]


def _sparse_said(r: Record) -> str:
    if r.sparse_top_k is None:
        return ""
    if r.sparse_min_context is None:
        return f", sparse top-k {r.sparse_top_k}"
    if r.sparse_min_context >= NEVER:
        return f", sparse top-k {r.sparse_top_k} predicted never to pay: every row dense"
    return f", sparse top-k {r.sparse_top_k} from {r.sparse_min_context} keys"


def markdown_table(records: list[Record]) -> str:
    """The table, then the plan our decode ran for each model (and the context it was planned for)."""
    rows = table_rows(records)
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    plans = {(r.model, r.threads): (r.plan, r.n_ctx, _sparse_said(r)) for r in records if r.engine == OURS and r.plan}
    if plans:
        lines.append("")
    lines += [f"plan ({m}, {t} threads, n_ctx {c}{k}): {p}" for (m, t), (p, c, k) in plans.items()]
    return "\n".join(lines)


def write_json(path: str | Path, machine: dict, versions: dict, settings: dict, records: list[Record],
               interrupted: bool = False) -> None:
    doc = {"machine": machine, "versions": versions, "settings": settings,
           "results": [r.to_json() for r in records]}
    if interrupted:
        doc["interrupted"] = True
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")
