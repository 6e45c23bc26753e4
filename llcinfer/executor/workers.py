"""Persistent worker threads pinned to cores: post a job, every worker runs it, wait.

Worker 0 is the calling thread (pinned for the duration of the job, its affinity restored
after), workers 1.. are daemon threads pinned once at start (to their domain's cores by
default, see PIN).  Between jobs a worker spins briefly on the job counter (``wait_job``)
and then blocks on an Event, so idle workers burn no core between requests.

Decode steps (``run_step``) go further: workers 1.. run them from the numba ``serve`` loop
(step_kernel.py), which waits for the next step itself (up to IDLE_CYCLES), so that from
one token to the next they neither take the GIL nor wait on an Event.  With a Python job
per step, each step paid two GIL hand-offs and often an Event wake-up: 0.15-0.2 ms of a
4 ms SmolLM2 token on the 2-vCPU host.

A job is ``fn(wid) -> int`` (0 on success, else an abort code).  If a worker raises, the
step's abort counter is set so the others leave their waits, and ``run`` raises
ExecutorError naming the worker; the pool stays usable for the next job.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from .. import settings
from ..errors import LLCInferError, UsageError
from .atomics import COUNTER_STRIDE
from .step_kernel import C_CURRENT, C_FIN, C_GEN, C_RESULT, C_VERSION, run_worker, serve, wait_job
from .tiles import ABORT, signal

# LLCINFER_PIN (settings.pin_mode): 'domain' (default) pins each worker to its domain's cores, 'core' to one core
# each, '0'/'none' leaves placement to the OS.  Per-core pinning is best on a dedicated
# machine; on a shared host a pinned worker cannot leave a core another process is using
# (measured here with one busy core: 13-15 ms vs 7.4-8.2 ms per SmolLM2 token), while a
# domain's core set keeps it in its domain's caches and still lets the OS balance.
SPINS = 20_000  # PAUSEs a worker spins for the next job before it blocks (~0.1-1 ms)
IDLE_CYCLES = 10_000_000  # cycle-counter ticks (~4 ms here) a serving worker waits for the next step


class ExecutorError(LLCInferError):
    """A worker of the executor failed; the step's results are invalid."""


def _pinned_to(cpus: set[int] | None) -> bool:
    """Whether the calling thread's affinity is exactly ``cpus``."""
    return bool(cpus) and hasattr(os, "sched_getaffinity") and os.sched_getaffinity(0) == cpus


def _pin(cpus: set[int] | None) -> set[int] | None:
    """Pin the calling thread to ``cpus``; returns its previous affinity (None: not pinned,
    or already pinned there: the caller pays one system call a step, not three)."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return None
    try:
        before = os.sched_getaffinity(0)
        if before == cpus:
            return None
        os.sched_setaffinity(0, cpus)
        return before
    except OSError:
        return None


def placement(cores: list[int | None], domain_of: list[int] | None = None, mode: str | None = None) -> list:
    """The CPU set each worker is pinned to under LLCINFER_PIN ``mode`` (see PIN):
    worker w's core, the cores of its domain (workers with equal ``domain_of``), or None."""
    mode = settings.pin_mode() if mode is None else mode
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
    ``domain_of[w]`` its domain (pinning, see ``placement``).

    Two kinds of job: ``run(job)`` runs a Python callable on every worker (the task-graph
    tests and benchmarks); ``run_step(args, counters)`` runs the decode step kernel
    ``run_worker(wid, *args)``, where workers 1.. stay inside the numba ``serve`` loop from
    one step to the next as long as ``args`` is the same tuple: no Python, no GIL and no
    Event between steps (measured on the 2-vCPU host: 0.15-0.2 ms a step with them)."""

    def __init__(self, cores: list[int | None], domain_of: list[int] | None = None):
        if not cores:
            raise ValueError("a worker pool needs at least one worker")
        self.cores = list(cores)
        self.cpus = placement(self.cores, domain_of)  # [worker] CPU set it is pinned to
        self.n = len(cores)
        self._control = np.zeros((C_RESULT + 2 * self.n) * COUNTER_STRIDE, np.int64)  # slots C_*, one line each
        self._events = [threading.Event() for _ in range(self.n)]
        self._lock = threading.Lock()
        self._job = None  # ("py", fn) or ("step", version, args) of the current generation
        self._abort = None  # the current job's counters (to set the abort flag)
        self._errors: list[tuple[int, BaseException]] = []
        self._results = [0] * self.n
        self._pinned_caller = None  # thread id of a caller that was already on worker 0's cores
        self._step_args = None  # args tuple of the serve version below
        self._version = 0
        self._stop = False
        self._threads = [threading.Thread(target=self._loop, args=(w,), name=f"llcinfer-worker-{w}", daemon=True)
                         for w in range(1, self.n)]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------ worker threads
    def _fail(self, wid: int, e: BaseException) -> None:
        self._errors.append((wid, e))
        if self._abort is not None:
            self._abort[ABORT] = 1

    def _loop(self, wid: int) -> None:
        _pin(self.cpus[wid])
        seen = 0
        ev = self._events[wid]
        c = self._control
        while True:
            target = seen + 1
            if not wait_job(c, C_GEN, target, SPINS):
                while c[C_GEN * COUNTER_STRIDE] < target and not self._stop:
                    ev.wait()
                    ev.clear()
            if self._stop:
                return
            job = self._job
            if job[0] == "step":
                try:
                    seen = serve(wid, c, job[1], seen, IDLE_CYCLES, *job[2])
                except BaseException as e:  # noqa: BLE001 - reported to the caller of run_step()
                    seen = int(c[(C_CURRENT + 2 * wid) * COUNTER_STRIDE])
                    self._fail(wid, e)
                    signal(c, C_FIN)
                job = None  # do not keep the step's arrays alive while blocked
                continue
            seen = target
            try:
                self._results[wid] = int(job[1](wid))
            except BaseException as e:  # noqa: BLE001 - reported to the caller of run()
                self._fail(wid, e)
            signal(c, C_FIN)

    # ------------------------------------------------------------------ the caller
    def _post(self, job, counters) -> int:
        """Publish ``job`` as the next generation; returns the C_FIN value that means done."""
        if self._stop:
            raise ExecutorError("the worker pool was shut down")
        c = self._control
        self._job, self._abort, self._errors = job, counters, []
        c[C_VERSION * COUNTER_STRIDE] = job[1] if job[0] == "step" else -1
        finished = int(c[C_FIN * COUNTER_STRIDE]) + self.n - 1
        signal(c, C_GEN)  # atomic: the stores above are visible to a worker that sees it
        for ev in self._events[1:]:  # only a worker blocked in ev.wait() needs it
            ev.set()
        return finished

    def _finish(self, finished: int) -> None:
        c = self._control
        while self.n > 1 and not wait_job(c, C_FIN, finished, SPINS):
            time.sleep(20e-6)  # a worker was preempted: stop spinning on its core
        self._job = self._abort = None  # drop the step's arrays
        if self._errors:
            wid, err = self._errors[0]
            raise ExecutorError(f"executor worker {wid} failed: {type(err).__name__}: {err}") from err

    def _as_caller(self, fn):
        me = threading.get_ident()
        before = None
        if me != self._pinned_caller:  # a caller found on worker 0's cores stays there: no system call a step
            before = _pin(self.cpus[0])
            if before is None and _pinned_to(self.cpus[0]):
                self._pinned_caller = me
        try:
            return int(fn(0))
        except BaseException as e:  # noqa: BLE001 - reported below, after the others stop
            self._fail(0, e)
            return 0
        finally:
            if before is not None:
                os.sched_setaffinity(0, before)

    def run(self, job, counters: np.ndarray | None = None) -> list[int]:
        """Run ``job(wid)`` on every worker; returns their codes.  ``counters``: the job's
        counter array, whose abort flag is raised if a worker throws."""
        self._results = [0] * self.n
        finished = self._post(("py", job), counters)
        self._results[0] = self._as_caller(job)
        self._finish(finished)
        return list(self._results)

    def run_step(self, args: tuple, counters: np.ndarray) -> list[int]:
        """``run_worker(wid, *args)`` on every worker (``counters`` is args' counter array);
        returns their codes.  Pass the same tuple object step after step: a new tuple is a
        new args version, which the serving workers leave their loop to pick up."""
        if args is not self._step_args:
            self._step_args = args
            self._version += 1
        finished = self._post(("step", self._version, args), counters)
        code0 = self._as_caller(lambda wid: run_worker(wid, *args))
        self._finish(finished)
        c = self._control
        return [code0] + [int(c[(C_RESULT + 2 * w) * COUNTER_STRIDE]) for w in range(1, self.n)]

    def close(self) -> None:
        self._stop = True
        c = self._control
        c[C_VERSION * COUNTER_STRIDE] = -2  # serving workers leave their loop
        c[C_GEN * COUNTER_STRIDE] += 1 << 40
        for ev in self._events:
            ev.set()
        for t in self._threads:
            t.join(timeout=5)

    def __del__(self):
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass
