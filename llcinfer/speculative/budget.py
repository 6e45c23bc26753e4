"""How many draft nodes of which sequences one verification step takes.

The cost of verifying T rows in one batched forward is about flat up to a knee K_max and
grows by ``slope`` per row beyond it (``VerifyCost``, measured at start-up).  Per step:

``SuperTree`` (ECHO, arXiv 2604.09603): the candidate nodes of every sequence compete
for one budget.  Confidence gates at a few depths first cut branches whose path
confidence is below the break-even there; the remaining nodes of all sequences are
ranked by path confidence and taken while the step has rows below the knee, and past it
only while a node's confidence beats the marginal cost of its row.  Budget a gate frees
goes to the next-best nodes wherever they are: deeper into confident sequences when many
run (their chains hold the best remaining nodes), siblings at the cut when few run.

``PerSequence``: the baseline, every sequence's own best nodes up to an equal share.

A sequence left with no node decodes plainly this step.  The gates are calibrated once,
after a warm-up of ``warmup_steps`` verifications with no gates: the depths whose
confidence best separates accepted from rejected nodes (rank AUC) get one, the root's
children always, with the threshold maximising accepted minus break-even times verified.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..planner.verify import VerifyCost
from .tree import DraftTree


@dataclass
class Gates:
    """Path-confidence thresholds at a few depths (module doc)."""

    warmup_steps: int = 24
    max_gates: int = 3
    thresholds: dict[int, float] = field(default_factory=dict)  # depth -> minimum path confidence
    samples: list[tuple[int, float, bool]] = field(default_factory=list)  # (depth, conf, accepted)
    steps: int = 0

    @property
    def calibrated(self) -> bool:
        return self.steps >= self.warmup_steps

    def record(self, depth: np.ndarray, conf: np.ndarray, accepted: np.ndarray, break_even: float) -> None:
        if self.calibrated:
            return
        self.samples.extend(zip(depth.tolist(), conf.tolist(), accepted.tolist()))
        self.steps += 1
        if self.calibrated:
            self._calibrate(break_even)

    def _calibrate(self, break_even: float) -> None:
        by_depth: dict[int, list[tuple[float, bool]]] = {}
        for d, c, a in self.samples:
            by_depth.setdefault(d, []).append((c, a))
        scored = []
        for d, obs in by_depth.items():
            c = np.array([o[0] for o in obs])
            a = np.array([o[1] for o in obs], bool)
            if a.all() or not a.any() or len(obs) < 8:
                continue
            ranks = np.argsort(np.argsort(c)) + 1.0
            auc = (ranks[a].sum() - a.sum() * (a.sum() + 1) / 2) / (a.sum() * (~a).sum())
            scored.append((d == 1, auc, d, c, a))
        scored.sort(key=lambda s: (not s[0], -s[1]))
        for _, _, d, c, a in scored[:self.max_gates]:
            cand = np.unique(c)
            gain = [a[c >= t].sum() - break_even * (c >= t).sum() for t in cand]
            self.thresholds[d] = float(cand[int(np.argmax(gain))])
        self.samples = []

    def cut(self, tree: DraftTree) -> DraftTree:
        """The tree without the branches below a gate's threshold."""
        if not self.thresholds or not len(tree):
            return tree
        depth = tree.depth
        keep = np.ones(len(tree), bool)
        for i in range(len(tree)):
            t = self.thresholds.get(int(depth[i]))
            p = tree.parents[i]
            keep[i] = (p < 0 or keep[p]) and (t is None or tree.conf[i] >= t)
        return tree.subset(keep)


def select_super_tree(trees: list[DraftTree], cost: VerifyCost, gates: Gates | None, max_rows: int) -> list[DraftTree]:
    """Cut ``trees`` (one per decoding sequence) to one step's verification (module doc).
    ``max_rows``: the most rows the step may verify (roots included)."""
    if gates is not None:
        trees = [gates.cut(t) for t in trees]
    n_roots = len(trees)
    cand = [(-float(t.conf[i]), i, s) for s, t in enumerate(trees) for i in range(len(t))]
    cand.sort()  # highest confidence first; a parent (same or higher confidence, lower index) before its child
    keep = [np.zeros(len(t), bool) for t in trees]
    rows = n_roots
    for neg_conf, i, s in cand:
        if rows >= max_rows:
            break
        if rows >= cost.k_max and -neg_conf < cost.break_even:
            break
        p = trees[s].parents[i]
        if p >= 0 and not keep[s][p]:
            continue
        keep[s][i] = True
        rows += 1
    return [t.subset(k) for t, k in zip(trees, keep)]


def select_per_sequence(trees: list[DraftTree], cost: VerifyCost, max_rows: int) -> list[DraftTree]:
    """Each sequence's best nodes up to an equal share of the knee (module doc)."""
    share = max(0, min(max_rows, cost.k_max) // max(len(trees), 1) - 1)
    out = []
    for t in trees:
        order = np.lexsort((np.arange(len(t)), -t.conf))[:share]
        keep = np.zeros(len(t), bool)
        keep[order] = True
        out.append(t.subset(_close_under_ancestors(t, keep)))
    return out


def _close_under_ancestors(t: DraftTree, keep: np.ndarray) -> np.ndarray:
    keep = keep.copy()
    for i in range(len(t)):
        if keep[i] and t.parents[i] >= 0 and not keep[t.parents[i]]:
            keep[i] = False
    return keep
