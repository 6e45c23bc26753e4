"""Task graphs on the executor's primitives (its counters and worker pool): the stress
test's random DAGs, and the hand-off and barrier timings perf/sync_bench.py reports.

A graph: task t runs on worker ``owner[t]`` in that worker's topological order, waits
until its ready counter reaches its number of predecessors, computes

    value[t] = 1 + sum(value[p] for p in preds[t])   (then ``work[t]`` PAUSEs)

and adds 1 to the ready counter of each successor.  ``sequential_values`` is the oracle.
"""

from __future__ import annotations

import time

import numpy as np

from llcinfer.executor.atomics import COUNTER_STRIDE, atomic_add, atomic_load, cpu_relax
from llcinfer.executor.tiles import ABORT, signal, wait_for
from llcinfer.jit import kernel


@kernel
def run_graph(wid, order, n_preds, pred_ptr, preds, succ_ptr, succs, work, counters, value):
    """Worker ``wid`` runs its tasks; counter 1 + t is task t's ready count.  Returns 0 or
    the abort code."""
    for i in range(order.shape[1]):
        t = order[wid, i]
        if t < 0:
            break
        if not wait_for(counters, 1 + t, n_preds[t]):
            return atomic_load(counters, ABORT)
        v = 1
        for j in range(pred_ptr[t], pred_ptr[t + 1]):
            v += value[preds[j]]
        value[t] = v
        for _ in range(work[t]):
            cpu_relax()
        for j in range(succ_ptr[t], succ_ptr[t + 1]):
            signal(counters, 1 + succs[j])
    return 0


class Graph:
    """A random DAG over ``n`` tasks spread over ``workers`` (each edge goes from a lower
    to a higher task id, so id order is a topological order)."""

    def __init__(self, n: int, workers: int, edge_p: float, rng: np.random.Generator, max_work: int = 50):
        self.n, self.workers = n, workers
        pred_lists = [[p for p in range(max(0, t - 16), t) if rng.random() < edge_p] for t in range(n)]
        self.owner = rng.integers(0, workers, n)  # [n] worker of each task
        self.n_preds = np.array([len(p) for p in pred_lists], np.int64)  # [n]
        self.pred_ptr = np.concatenate([[0], np.cumsum(self.n_preds)]).astype(np.int64)  # [n + 1] CSR
        self.preds = np.array([p for ps in pred_lists for p in ps], np.int64)  # [edges]
        succ_lists = [[] for _ in range(n)]
        for t, ps in enumerate(pred_lists):
            for p in ps:
                succ_lists[p].append(t)
        self.succ_ptr = np.concatenate([[0], np.cumsum([len(s) for s in succ_lists])]).astype(np.int64)
        self.succs = np.array([s for ss in succ_lists for s in ss], np.int64)
        self.work = rng.integers(0, max_work, n).astype(np.int64)  # [n] PAUSEs per task
        width = max(1, max(int((self.owner == w).sum()) for w in range(workers))) + 1
        self.order = np.full((workers, width), -1, np.int64)  # [worker, tasks] in id order
        for w in range(workers):
            mine = np.flatnonzero(self.owner == w)
            self.order[w, :mine.size] = mine

    def sequential_values(self) -> np.ndarray:
        value = np.zeros(self.n, np.int64)
        for t in range(self.n):
            value[t] = 1 + value[self.preds[self.pred_ptr[t]:self.pred_ptr[t + 1]]].sum()
        return value

    def run(self, pool) -> np.ndarray:
        """Run on a WorkerPool of ``workers`` threads; returns the values."""
        counters = np.zeros((self.n + 1) * COUNTER_STRIDE, np.int64)
        value = np.zeros(self.n, np.int64)
        args = (self.order, self.n_preds, self.pred_ptr, self.preds, self.succ_ptr, self.succs, self.work, counters,
                value)
        codes = pool.run(lambda wid: run_graph(wid, *args), counters)
        if any(codes):
            raise RuntimeError(f"graph aborted: codes {codes}")
        return value


def chain(n: int, workers: int) -> Graph:
    """Task t depends on t-1 and runs on worker t % workers: every edge is a hand-off."""
    g = Graph.__new__(Graph)
    g.n, g.workers = n, workers
    g.owner = np.arange(n) % workers
    g.n_preds = np.minimum(np.arange(n), 1).astype(np.int64)
    g.pred_ptr = np.concatenate([[0], np.cumsum(g.n_preds)]).astype(np.int64)
    g.preds = np.arange(0, n - 1, dtype=np.int64)
    g.succ_ptr = np.concatenate([[0], np.arange(1, n), [n - 1]]).astype(np.int64)
    g.succs = np.arange(1, n, dtype=np.int64)
    g.work = np.zeros(n, np.int64)
    width = -(-n // workers) + 1
    g.order = np.full((workers, width), -1, np.int64)
    for w in range(workers):
        mine = np.arange(w, n, workers)
        g.order[w, :mine.size] = mine
    return g


@kernel
def barrier_loop(wid, n_workers, rounds, counters):
    """``rounds`` barriers across n_workers (counter 1 counts arrivals; round r ends when
    it reaches (r + 1) * n_workers).  Returns 0 or the abort code."""
    for r in range(rounds):
        atomic_add(counters, COUNTER_STRIDE, 1)
        if not wait_for(counters, 1, (r + 1) * n_workers):
            return atomic_load(counters, ABORT)
    return 0


def handoff_ns(pool, n: int = 20000, reps: int = 5) -> float:
    """Median time of one dependency hand-off between workers (a chain of n tasks)."""
    g = chain(n, pool.n)
    g.run(pool)  # compile / warm
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        g.run(pool)
        times.append((time.perf_counter() - t0) / max(1, n - 1))
    return float(np.median(times) * 1e9)


def barrier_ns(pool, rounds: int = 20000, reps: int = 5) -> float:
    """Median time of one barrier across all workers of ``pool``."""
    times = []
    for i in range(reps + 1):
        counters = np.zeros(2 * COUNTER_STRIDE, np.int64)
        t0 = time.perf_counter()
        pool.run(lambda wid: barrier_loop(wid, pool.n, rounds, counters), counters)
        if i:
            times.append((time.perf_counter() - t0) / rounds)
    return float(np.median(times) * 1e9)
