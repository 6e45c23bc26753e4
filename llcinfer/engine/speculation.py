"""Speculative decoding in the step loop.

    extend(batch)          before the step: the decoding requests' drafts, cut to one
                           verification budget (speculative/budget.py); each kept tree
                           becomes its request's chunk: [last token] + nodes, with parents
    accept(req, chunk, rows, sample)
                           after it: the acceptance walk over the verified rows, the
                           accepted path's K/V kept (seq.commit_path), the rest dropped

Where the runner has an executor, each sequence drafts a chain (its tree's most
confident path, DraftTree.best_chain), and the chains are verified in one executor step
beside the plain decode rows; without one, every tree chunk is verified in one batched
forward (tree rows attend to their prefix and ancestors only).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ..errors import OutOfMemoryError
from ..planner.verify import VerifyCost
from ..speculative import Acceptance, DraftTree, Gates, Pacer, acceptance_walk, select_per_sequence, select_super_tree
from .verify_timing import measure_verify_cost, verification_seconds  # noqa: F401 - perf/ab_trees.py reads it here

_MAX_NODES_PER_SEQ = 64  # candidate nodes a drafter may propose for one sequence
DECODE_EMA = 0.3  # weight of the newest one-sequence plain step in the decode time followed
DECODE_STEP = 1.02  # ... which the cost follows in steps of this ratio (current_cost)


@dataclass
class SpecStats:
    verifications: int = 0  # verification steps (one per step with a tree)
    trees: int = 0  # sequence trees verified
    verified: int = 0  # draft nodes verified
    accepted: int = 0  # draft nodes accepted
    plain_steps: int = 0  # steps where no sequence speculated
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0

    @property
    def accepted_per_verification(self) -> float:
        """Draft tokens accepted per sequence tree verified."""
        return self.accepted / self.trees if self.trees else 0.0

    @property
    def wasted_share(self) -> float:
        return 1.0 - self.accepted / self.verified if self.verified else 0.0

    def summary(self) -> str:
        total = self.draft_seconds + self.verify_seconds
        share = self.draft_seconds / total if total > 0 else 0.0
        return (f"spec: {self.accepted_per_verification:.2f} accepted/verification, "
                f"{100 * self.wasted_share:.0f}% of {self.verified} verified wasted, "
                f"{self.verifications} verifications, {self.plain_steps} plain steps, draft {100 * share:.0f}% of "
                f"draft+verify time")


class Speculator:
    """``drafter``: NgramDrafter | SuffixDrafter | DraftModelDrafter; ``policy``
    "super-tree" (ECHO, one budget for the batch) | "per-sequence"; ``budget`` rows per
    verification (None: the measured knee)."""

    def __init__(self, drafter, policy: str = "super-tree", budget: int | None = None):
        if policy not in ("super-tree", "per-sequence"):
            raise ValueError(f"unknown speculation policy {policy!r}")
        self.drafter, self.policy, self.budget = drafter, policy, budget
        self.cost: VerifyCost | None = None
        self.gates = Gates() if policy == "super-tree" else None
        self.stats = SpecStats()
        self.acceptance = Acceptance()  # the drafts' measured worth: their confidences are scaled by it
        self.own_drafts = Acceptance()  # ... of a draft model's own verified chains, not its copies (gain_s)
        self._ratio = 1.0  # the scale of this step's trees
        self.pacer = Pacer()  # drafting paused while speculation has cost more than it gained
        self._drafted = False  # whether this step's extend ran the drafter ...
        self._copying = False  # ... only where the text repeats, the pacer overdrawn (Pacer.copies)
        self._draft_step_s = 0.0  # seconds this step's extend spent drafting
        self._prompt_read_s = 0.0  # of which reading a prompt the draft had not read (record_step)
        self.executor = None  # the runner's DecodeExecutor (set by measure_cost): drafts are chains
        self._decode_s: float | None = None  # plain one-sequence decode steps as decoding goes (EMA)
        self._costs: tuple = (None, {})  # (cost they came from, {decode step: VerifyCost}) (current_cost)
        self._can_pay: tuple = (None, {})  # (draft step judged on, {(id of a cost in _costs, sequences): can_pay})
        self._decoding: set = set()  # ids of the requests decoding at the last step (Pacer.fresh)

    # ------------------------------------------------------------------ start-up
    def measure_cost(self, model, runner, new_sequence) -> VerifyCost:
        """Time verifications of T rows (T in VERIFY_ROWS, one sequence after a 64-token
        prefix) against plain decode steps, in rounds (engine/verify_timing.py), and fit
        the knee and slope.  Verification runs where the runner will run it: on its
        executor when it has one."""
        self.executor = runner.executor
        if self.executor is not None and hasattr(self.drafter, "use_executor"):
            self.drafter.use_executor(self.executor)
        seq = new_sequence("verify-cost")
        try:
            model.forward_chunks([(seq, list(range(1, 65)))])
            rows, times, decode_s = measure_verify_cost(model, runner, [seq], self.executor)
        finally:
            seq.free()
        cost = VerifyCost.fit(rows, times, decode_s)
        if self.budget is not None:
            cost.k_max = int(self.budget)
        self.cost = cost
        if hasattr(self.drafter, "price"):
            self.drafter.price(cost.decode_s, cost.slope_s, model.weights.nbytes)
        return cost

    def current_cost(self) -> VerifyCost:
        """``cost`` as the host runs now: the start-up curve with the plain decode steps
        measured since (VerifyCost.with_decode): verifying rows is compute-bound from a
        few rows on, a decode step is not, so speculation pays more while the weight
        stream is slow, and is judged to pay less while the plain steps run faster than
        at start-up.  The decode time is taken in steps of ``DECODE_STEP`` (the nearest),
        and each step's cost is fitted once and kept: the plain steps move back and forth
        over a few of them."""
        if self._decode_s is None:
            return self.cost
        if self._costs[0] is not self.cost:
            self._costs = (self.cost, {})
            self._can_pay = (None, {})
        k = round(math.log(self._decode_s / self.cost.decode_s) / math.log(DECODE_STEP))
        now = self._costs[1].get(k)
        if now is None:
            now = self.cost.with_decode(self.cost.decode_s * DECODE_STEP ** k)
            if now is not self.cost and self.budget is not None:
                now.k_max = int(self.budget)
            self._costs[1][k] = now
        return now

    # ------------------------------------------------------------------ per step
    def extend(self, batch, n_ctx: int, max_step_tokens: int, n_concurrent: int = 1) -> None:
        """Give the decoding chunks of ``batch`` their verification trees (module doc).
        A catch-up, and a fresh account for a new workload, are priced with as many
        sequences decoding as the decoding chunks or ``n_concurrent`` (the requests running
        and waiting), whichever is more: a request that decodes while the others' prompts
        run will share its steps with them."""
        decoding = [c for c in batch.chunks
                    if len(c.tokens) == 1 and c.start >= c.request.n_prompt and c.start == len(c.request.tokens) - 1]
        if not decoding or self.cost is None:
            return
        n = max(len(decoding), n_concurrent)
        ids = {c.request.id for c in decoding}
        if not ids & self._decoding and self.gain_s(n, 1) > 0:
            self.pacer.fresh()  # a new workload, where drafts of the measured worth could pay for it
        self._decoding = ids
        catch_up_s = getattr(self.drafter, "catch_up_s", None)
        guessed = None  # overdrawn: the requests whose text repeats, the only ones drafted for (Pacer.copies)
        if self.pacer.paused(self._resume_s(decoding) if catch_up_s is not None else 0.0):
            if hasattr(self.drafter, "guesses") and self.pacer.copies():
                guessed = {c.request.id for c in decoding if self.drafter.guesses(c.request.id, c.request.tokens)}
            if not guessed:
                self.stats.plain_steps += 1
                return  # most steps of text that does not repeat end here, first
        if not self.can_pay(len(decoding)):
            self.stats.plain_steps += 1
            return
        t0 = time.perf_counter()
        asks = []
        copies_only = guessed is not None  # a draft model copies these, with no draft step
        if catch_up_s is not None and not copies_only:
            gain_per_step = self.gain_s(n, 1)
        for c in decoding:
            req = c.request
            self.acceptance.resolve(req.id, req.tokens)
            left = min(n_ctx - c.start - 1, req.params.max_tokens - req.stats.n_generated - 1)
            if copies_only:
                left = left if req.id in guessed else 0
            elif (catch_up_s is not None and catch_up_s(req.id, req.tokens) > left * gain_per_step
                  and not self.drafter.guesses(req.id, req.tokens)):
                left = 0  # catching the draft up costs more than its drafts could save (copying needs none)
            asks.append((req.id, req.tokens, max(0, min(left, _MAX_NODES_PER_SEQ))))
        if not any(max_nodes for _, _, max_nodes in asks):
            self.stats.plain_steps += 1
            return  # no request has room to draft for: a plain step
        self._drafted, self._copying = True, copies_only
        late = catch_up_s is not None and any(max_nodes and catch_up_s(c.request.id, c.request.tokens[:c.request.n_prompt])
                                              for c, (_, _, max_nodes) in zip(decoding, asks))
        chains = self.executor is not None  # the executor verifies chains: each tree's best one
        if hasattr(self.drafter, "propose_many"):
            trees = self.drafter.propose_many(asks, chains)
        else:
            trees = [self.drafter.propose(*a, chain=chains) for a in asks]
        if chains:
            trees = [t.best_chain() for t in trees]
        proposed = trees
        self._ratio = self.acceptance.ratio
        trees = [self.acceptance.scale(t, self._ratio) for t in trees]
        max_rows = max_step_tokens - batch.n_tokens + len(decoding)
        cost = self.current_cost()
        if not _may_pay(trees, cost):
            trees = [DraftTree.empty() for _ in trees]  # what the budget and _pays would keep of them
        elif self.policy == "super-tree":
            trees = self._pays(select_super_tree(trees, cost, self.gates if self.gates.calibrated else None, max_rows), cost)
        else:
            trees = self._pays(select_per_sequence(trees, cost, max_rows), cost)
        for c, kept, tree in zip(decoding, trees, proposed):
            if not len(kept) and len(tree):  # not verified: checked against what plain decoding produces
                self.acceptance.shadow(c.request.id, c.start, tree.best_chain())
        self._draft_step_s = time.perf_counter() - t0
        self._prompt_read_s = min(getattr(self.drafter, "read_s", 0.0), self._draft_step_s) if late else 0.0
        self.stats.draft_seconds += self._draft_step_s
        if not any(len(t) for t in trees):
            self.stats.plain_steps += 1
            return
        for c, tree in zip(decoding, trees):
            if not len(tree):
                continue
            tokens = c.tokens + tree.tokens.tolist()
            seq = c.request.seq
            scratch = (len(tree) + 1) * (2 + int(tree.depth.max()) // seq.block_size)  # TreeRows' blocks, at most
            if seq.pool.available_blocks < scratch + len(tokens) // seq.block_size + 1:
                continue  # no room for the tree: this one decodes plainly
            try:
                seq.prepare(tokens)
            except OutOfMemoryError:
                continue
            c.tokens, c.tree = tokens, tree

    def _resume_s(self, decoding) -> float:
        """What resuming drafting after an overdraft would cost beyond a usual draft step:
        catching the cheapest request's draft up on the tokens it missed, nothing where a
        request's text repeats (the draft model copies there without reading).  Asked only
        while the pacer is overdrawn and its credit has recovered."""
        if not self.pacer.overdrawn or self.pacer.credit < 0:
            return 0.0
        lags = []
        for c in decoding:
            req = c.request
            if self.drafter.guesses(req.id, req.tokens):
                return 0.0
            lags.append(self.drafter.catch_up_s(req.id, req.tokens))
        return min(lags)

    def can_pay(self, n: int) -> bool:
        """``VerifyCost.can_pay`` for n sequences with this drafter's draft step (``step_s``
        of a draft model, 0 for lookups), on the current cost.  Where it is False, drafting
        and the drafter's prefill of the prompts are skipped."""
        cost, step_s = self.current_cost(), getattr(self.drafter, "step_s", 0.0)
        if self._can_pay[0] != step_s:  # a draft model's step is timed as it drafts
            self._can_pay = (step_s, {})
        known, key = self._can_pay[1], (id(cost), n)  # the costs are kept in _costs
        if key not in known:
            known[key] = cost.can_pay(n, step_s, _MAX_NODES_PER_SEQ)
        return known[key]

    def gain_s(self, n: int, steps: int) -> float:
        """Seconds that drafting could save one of n sequences decoding over its next
        ``steps`` tokens, each node accepted with the drafts' measured acceptance per
        node: its share of as many plain steps of n rows less the same at
        ``VerifyCost.speedup``; what reading tokens into its draft sequence (a prompt, a
        catch-up) may cost at most.  A draft model's copies of repeating text need no
        reading and are not counted (``own_drafts``): accepted whole while the answer
        copies, they would price a read of the prompt by what the draft model does not
        do."""
        cost = self.current_cost()
        worth = self.own_drafts if hasattr(self.drafter, "copied") else self.acceptance
        speedup = cost.speedup(n, getattr(self.drafter, "step_s", 0.0), worth.node_rate, _MAX_NODES_PER_SEQ)
        return max(0, steps) * cost.plain_s(n) / n * max(0.0, 1.0 - 1.0 / speedup)

    def _pays(self, trees: list[DraftTree], cost: VerifyCost) -> list[DraftTree]:
        """Keep the number r of the best nodes (by confidence, across the trees) that
        maximises the step's expected tokens per second, (n + sum of their confidences) /
        t(n + r); no node at all when even that falls below plain decoding's: n tokens in
        a plain step of n rows (``VerifyCost.plain_s``), not in the one-row step.  Every r
        is evaluated at once (the first r of the highest rate is kept)."""
        n = len(trees)
        conf = np.concatenate([t.conf for t in trees] + [np.zeros(0)])  # [nodes]
        seq = np.concatenate([np.full(len(t), s) for s, t in enumerate(trees)] + [np.zeros(0, np.int64)])  # [nodes]
        node = np.concatenate([np.arange(len(t)) for t in trees] + [np.zeros(0, np.int64)])  # [nodes]
        order = np.lexsort((node, seq, -conf))  # most confident first; ties by sequence, then node
        rate = (n + np.cumsum(conf[order])) / cost.seconds_upto(n + len(order))[n + 1:n + len(order) + 1]  # [r - 1]
        best_r = int(np.argmax(rate)) + 1 if len(order) and rate.max() > n / cost.plain_s(n) else 0
        keep = [np.zeros(len(t), bool) for t in trees]
        for k in order[:best_r]:
            keep[seq[k]][node[k]] = True
        return [t.subset(k) for t, k in zip(trees, keep)]

    def record_step(self, batch, n_before: list[int], seconds: float) -> None:
        """After a step of decoding rows only: how long each sequence took per token it
        gained, speculating or not (``Pacer``).  A prompt the draft model read in this
        step's proposal, not having read it with the target's prefill, is prefill: its
        batched forward is left out of the step and of its drafting."""
        drafted, copying, self._drafted, self._copying = self._drafted, self._copying, False, False
        prompt_read, self._prompt_read_s = (self._prompt_read_s if drafted else 0.0), 0.0
        if any(c.start < c.request.n_prompt for c in batch.chunks):
            return  # a prompt chunk ran too: not a decode step's time
        gained = sum(len(c.request.tokens) - n for c, n in zip(batch.chunks, n_before))
        if gained > 0:
            kind = "verified" if any(c.tree is not None for c in batch.chunks) else "drafted" if drafted else "plain"
            drafting = self._draft_step_s - prompt_read if drafted else 0.0
            seconds -= prompt_read
            self.pacer.record(kind, seconds, gained / len(batch.chunks), drafting, copying)
            if kind != "verified" and len(batch.chunks) == 1:  # a plain decode step of one sequence
                step = seconds - drafting
                self._decode_s = step if self._decode_s is None else (1 - DECODE_EMA) * self._decode_s + DECODE_EMA * step

    def prefilled(self, batch, n_concurrent: int) -> None:
        """After a step: a drafter with its own model reads the prompt chunks that just ran,
        so its prompt is prefilled with the target's (before the first token), not at the
        request's first proposal; only for a request whose prompt, what the draft has not
        read of it, costs less to read than drafting could save it with ``n_concurrent``
        requests decoding (``gain_s``; nothing where even perfect drafts could not pay)."""
        if not hasattr(self.drafter, "prefill") or self.cost is None or not self.can_pay(n_concurrent):
            return
        chunks = [c for c in batch.chunks if c.tree is None and c.start < c.request.n_prompt]
        if chunks:
            gain_per_step = self.gain_s(n_concurrent, 1)
            chunks = [c for c in chunks if self.drafter.catch_up_s(c.request.id, c.request.tokens[:c.request.n_prompt])
                      <= c.request.params.max_tokens * gain_per_step]
        if chunks:
            t0 = time.perf_counter()
            self.drafter.prefill([(c.request.id, c.request.tokens[:c.start + len(c.tokens)]) for c in chunks])
            self.stats.draft_seconds += time.perf_counter() - t0

    def accept(self, req, chunk, rows: np.ndarray, sample) -> None:
        """The walk over ``rows``  # [n + 1, vocab] (``sample(row)``: the engine's draw of the
        next token from a row, None once the request ended), then the path's K/V kept."""
        tree: DraftTree = chunk.tree
        drawn, path = acceptance_walk(tree, lambda r: sample(rows[r]))
        accepted = np.zeros(len(tree), bool)
        accepted[path] = True
        st = self.stats
        st.trees += 1
        st.verified += len(tree)
        st.accepted += len(path)
        last = path[-1] if path else -1
        rejected = len(drawn) > len(path) and bool(np.any(tree.parents == last))
        self.acceptance.observe(tree.conf / self._ratio, accepted, rejected)
        if req.id not in getattr(self.drafter, "copied", ()):
            self.own_drafts.observe(tree.conf / self._ratio, accepted, rejected)
        req.stats.spec_verified += len(tree)
        req.stats.spec_accepted += len(path)
        if self.gates is not None:
            self.gates.record(tree.depth, tree.conf, accepted, self.current_cost().break_even)
        if hasattr(self.drafter, "observe"):
            self.drafter.observe(req.id, len(path), int(tree.depth.max()))
        if req.seq is not None:
            req.seq.commit_path(chunk.start, [i + 1 for i in path])
            req.n_computed = req.seq.n_tokens

    def finish(self, req) -> None:
        self.acceptance.forget(req.id)
        self.drafter.finish(req.id, req.tokens)


def _may_pay(trees: list[DraftTree], cost: VerifyCost) -> bool:
    """False where ``Speculator._pays`` would keep no node of ``trees`` whatever the budget
    kept: even all their confidence, n + sum(conf), over the cheapest verification of n +
    r rows (r >= 1) is no faster than plain decoding.  Most steps of text the drafter
    finds little in end here, before the budget's work."""
    n, nodes = len(trees), sum(len(t) for t in trees)
    if not nodes:
        return False
    fastest = float(cost.seconds_upto(n + nodes)[n + 1:n + nodes + 1].min())
    return (n + sum(float(t.conf.sum()) for t in trees)) * (1 + 1e-9) / fastest > n / cost.plain_s(n)
