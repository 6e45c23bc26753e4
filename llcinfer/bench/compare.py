"""The comparison loop: for each model and thread count, each test, repetitions of ours
and llama.cpp's alternate.

Alternation (``alternate="rep"``, the default): repetition i of ours, then one
``llama-bench -r 1`` run of each llama.cpp build, then repetition i+1 ... (A B A B), so
drift on a shared machine hits both alike.  Every llama-bench run does its own warm-up
and, for a depth, refills its KV cache untimed (fast in llama.cpp).  ``alternate="block"``
runs our repetitions, then ``llama-bench -r R`` once per build (one depth fill each):
cheaper at large depths, less robust to drift.

Tests: ``pp<P>`` at depth 0, and ``tg<N>`` at every depth (``tg<N> @ d<D>``).

Roofline: after each of our ``tg`` repetitions, a read-bandwidth probe of the same
working-set size and thread count is read (about 0.2 s); each repetition's fraction is its
bytes/s over the probe next to it, and the row reports their median.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..model import catalog
from . import llama_bench
from .ours import OursBench, default_ctx
from ..hw.probe import ReadProbe
from .report import LLAMA, OURS, Record, mark_anchors

N_CTX_MARGIN = 16


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class BenchSettings:
    models: list[str]
    threads: list[int]
    n_prompt: int = 512
    n_gen: int = 128
    depths: list[int] = field(default_factory=lambda: [0])
    reps: int = 5
    alternate: str = "rep"  # rep or block
    fill: str = "auto"  # auto, real, synthetic
    fill_limit_s: float = 1200.0
    llama_timeout_s: float = 3600.0
    n_ctx: int | None = None  # our context (None: LLM's default, the model's training context)
    sparse: bool = False  # ours with sparse attention (LLM's sparse, sparse_top_k)
    sparse_top_k: int | None = None
    sparse_indexers: int | None = None  # LLM's sparse_indexers

    def ctx_needed(self) -> int:
        """Tokens the deepest test holds (plus a margin)."""
        return max(self.depths) + max(self.n_prompt, self.n_gen) + N_CTX_MARGIN

    def tests(self) -> list[tuple[str, int, int]]:
        """[(kind, n_tokens, depth)] in run order, depth ascending (each depth filled once)."""
        out = [("pp", self.n_prompt, 0)] if self.n_prompt > 0 else []
        if self.n_gen > 0:
            out += [("tg", self.n_gen, d) for d in sorted(set(self.depths))]
        return out


def _llama_step(rec: Record, exe: Path, path: Path, s: BenchSettings, kind: str, n: int, depth: int,
                threads: int, reps: int) -> None:
    """Run llama-bench once (``reps`` repetitions) and fold the outcome into ``rec``."""
    if rec.status != "ok":
        return  # a crashed/failed build is not retried within a test
    run = llama_bench.run(exe, path, threads, n if kind == "pp" else 0, n if kind == "tg" else 0, depth, reps,
                          timeout=s.llama_timeout_s)
    if run.status == "ok":
        rec.samples_tps += run.samples_tps
        log(f"    llama.cpp {rec.build}: {', '.join(f'{x:.2f}' for x in run.samples_tps)} t/s")
    else:
        rec.status, rec.error = run.status, run.message
        log(f"    llama.cpp {rec.build}: {run.status} ({run.message}); the comparison goes on")


def run_bench(s: BenchSettings, builds: dict[str, Path], records: list[Record]) -> list[Record]:
    """Append records to ``records`` as tests finish (so an interrupt keeps what is done)."""
    for model in s.models:
        path = catalog.resolve_model(model, progress=True)
        name = Path(path).stem if Path(str(model)).suffix == ".gguf" else str(model)
        for threads in s.threads:
            n_ctx = s.n_ctx or max(default_ctx(path), s.ctx_needed())
            log(f"== {name}, {threads} threads: loading (n_ctx {n_ctx}) ...")
            ours = OursBench(str(path), threads, n_ctx, sparse=s.sparse, sparse_top_k=s.sparse_top_k,
                             sparse_indexers=s.sparse_indexers)
            log(f"   plan: {ours.plan}")
            ours.warmup()
            for kind, n, depth in s.tests():
                mine = Record(OURS, None, name, kind, threads, depth, n, plan=ours.plan, n_ctx=n_ctx,
                              sparse_top_k=ours.sparse_top_k, sparse_min_context=ours.sparse_min_context)
                theirs = {b: Record(LLAMA, b, name, kind, threads, depth, n) for b in builds}
                log(f"-- {name} {mine.test}, {threads} threads")
                probe = None  # tg: read next to each repetition
                try:
                    mine.fill = ours.set_depth(depth, s.fill, s.fill_limit_s) if depth else None
                    run = ours.pp if kind == "pp" else ours.tg
                    run(min(n, 8))  # warm-up at this depth
                    if kind == "tg":
                        mine.bytes_per_token = ours.bytes_per_token(depth, n)
                        probe = ReadProbe(int(mine.bytes_per_token), threads)
                except Exception as exc:  # noqa: BLE001 - report, keep comparing
                    mine.status, mine.error = "failed", f"{type(exc).__name__}: {exc}"
                    log(f"    llcinfer: failed ({mine.error})")
                for i in range(s.reps):
                    if mine.status == "ok":
                        try:
                            tps = n / run(n)
                            mine.samples_tps.append(tps)
                            if probe is not None:
                                mine.samples_bw.append(probe.read())
                            bw = f", probe {mine.samples_bw[-1] / 1e9:.1f} GB/s" if probe is not None else ""
                            log(f"    llcinfer rep {i + 1}/{s.reps}: {tps:.2f} t/s{bw}")
                        except Exception as exc:  # noqa: BLE001
                            mine.status, mine.error = "failed", f"{type(exc).__name__}: {exc}"
                            log(f"    llcinfer: failed ({mine.error})")
                    if s.alternate == "rep":
                        for b, exe in builds.items():
                            _llama_step(theirs[b], exe, path, s, kind, n, depth, threads, 1)
                if s.alternate == "block":
                    for b, exe in builds.items():
                        _llama_step(theirs[b], exe, path, s, kind, n, depth, threads, s.reps)
                for rec in theirs.values():
                    if rec.status == "ok" and not rec.samples_tps:
                        rec.status, rec.error = "failed", "no samples"
                probe = None  # frees the probe's working set before the next test
                if mine.samples_bw:
                    mine.bandwidth = float(statistics.median(mine.samples_bw))
                records.append(mine)
                records.extend(theirs.values())
                mark_anchors(records)
            del ours
    return records
