"""Persistent worker threads pinned to cores: post a job, every worker runs it, wait.

Worker 0 is the calling thread (pinned for the duration of the job, its affinity restored
after), workers 1.. are daemon threads pinned once at start (to their domain's cores by
default, see PIN).  Between
jobs a worker spins briefly on the job counter (``wait_job``: a token step follows the
previous one within microseconds when decoding) and then blocks on an Event, so idle
workers burn no core between requests.

A job is ``fn(wid) -> int`` (0 on success, else an abort code).  If a worker raises, the
step's abort counter is set so the others leave their waits, and ``run`` raises
ExecutorError naming the worker; the pool stays usable for the next job.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from ..errors import LLCInferError, UsageError
from .atomics import COUNTER_STRIDE
from .step_kernel import ABORT, signal, wait_job

# LLCINFER_PIN: 'domain' (default) pins each worker to its domain's cores, 'core' to one core
# each, '0'/'none' leaves placement to the OS.  Per-core pinning is best on a dedicated
# machine; on a shared host a pinned worker cannot leave a core another process is using
# (measured here with one busy core: 13-15 ms vs 7.4-8.2 ms per SmolLM2 token), while a
# domain's core set keeps it in its domain's caches and still lets the OS balance.
PIN = os.environ.get("LLCINFER_PIN", "domain").lower()
SPINS = 20_000  # PAUSEs a worker spins for the next job before it blocks (~0.1-1 ms)


class ExecutorError(LLCInferError):
    """A worker of the executor failed; the step's results are invalid."""


def _pin(cpus: set[int] | None) -> set[int] | None:
    """Pin the calling thread to ``cpus``; returns its previous affinity (None: not pinned)."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return None
    try:
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, cpus)
        return before
    except OSError:
        return None


def placement(cores: list[int | None], domain_of: list[int] | None = None, mode: str | None = None) -> list:
    """The CPU set each worker is pinned to under LLCINFER_PIN ``mode`` (see PIN):
    worker w's core, the cores of its domain (workers with equal ``domain_of``), or None."""
    mode = PIN if mode is None else mode
    if mode not in ("domain", "core", "0", "none", "off"):
        raise UsageError(f"LLCINFER_PIN must be domain, core or none (got {mode!r})")
    if mode in ("0", "none", "off") or any(c is None for c in cores):
        return [None] * len(cores)
    if mode == "core":
        return [{c} for c in cores]
    dom = domain_of or [0] * len(cores)
    return [{c for c, d in zip(cores, dom) if d == dom[w]} for w in range(len(cores))]


class WorkerPool:
    """``len(cores)`` workers; ``cores[w]`` is worker w's core (None: not pinned) and
    ``domain_of[w]`` its domain (pinning, see ``placement``)."""

    def __init__(self, cores: list[int | None], domain_of: list[int] | None = None):
        if not cores:
            raise ValueError("a worker pool needs at least one worker")
        self.cores = list(cores)
        self.cpus = placement(self.cores, domain_of)  # [worker] CPU set it is pinned to
        self.n = len(cores)
        self._gen = np.zeros(COUNTER_STRIDE, np.int64)  # [8] job generation, slot 0
        self._fin = np.zeros(COUNTER_STRIDE, np.int64)  # [8] jobs finished by workers 1.., slot 0
        self._events = [threading.Event() for _ in range(self.n)]
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._remaining = 0
        self._job = None
        self._abort = None  # the current job's counters (to set the abort flag)
        self._errors: list[tuple[int, BaseException]] = []
        self._results = [0] * self.n
        self._stop = False
        self._threads = [threading.Thread(target=self._loop, args=(w,), name=f"llcinfer-worker-{w}", daemon=True)
                         for w in range(1, self.n)]
        for t in self._threads:
            t.start()

    def _execute(self, wid: int) -> None:
        try:
            self._results[wid] = int(self._job(wid))
        except BaseException as e:  # noqa: BLE001 - reported to the caller of run()
            self._errors.append((wid, e))
            if self._abort is not None:
                self._abort[ABORT] = 1

    def _loop(self, wid: int) -> None:
        _pin(self.cpus[wid])
        seen = 0
        ev = self._events[wid]
        while True:
            target = seen + 1
            if not wait_job(self._gen, 0, target, SPINS):
                while self._gen[0] < target and not self._stop:
                    ev.wait()
                    ev.clear()
            if self._stop:
                return
            seen = target
            self._execute(wid)
            signal(self._fin, 0)  # the caller spins on this first (no sleep / wake-up)
            with self._lock:
                self._remaining -= 1
                last = self._remaining == 0
            if last:
                self._done.set()

    def run(self, job, counters: np.ndarray | None = None) -> list[int]:
        """Run ``job(wid)`` on every worker; returns their codes.  ``counters``: the step's
        counter array, whose abort flag is raised if a worker throws."""
        if self._stop:
            raise ExecutorError("the worker pool was shut down")
        self._job, self._abort, self._errors = job, counters, []
        self._results = [0] * self.n
        self._remaining = self.n - 1
        self._done.clear()
        finished = int(self._fin[0]) + self.n - 1  # _fin once every other worker is done
        self._gen[0] += 1
        for ev in self._events[1:]:
            ev.set()
        before = _pin(self.cpus[0])
        try:
            self._execute(0)
        finally:
            if before is not None:
                os.sched_setaffinity(0, before)
        if self.n > 1 and not wait_job(self._fin, 0, finished, SPINS):
            self._done.wait()
        self._job = self._abort = None  # drop the step's arrays
        if self._errors:
            wid, err = self._errors[0]
            raise ExecutorError(f"executor worker {wid} failed: {type(err).__name__}: {err}") from err
        return list(self._results)

    def close(self) -> None:
        self._stop = True
        self._gen[0] += 1 << 40
        for ev in self._events:
            ev.set()
        for t in self._threads:
            t.join(timeout=5)

    def __del__(self):
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass
