"""Read-bandwidth probe: how fast this machine streams a working set of a given size.

The roofline of a decode step is ``bytes read per token / bandwidth``; the bandwidth
depends on where the working set lives (L2, L3, DRAM), so the probe reads an array of
the same size, with the same thread count, in the same run as the benchmark.
"""

from __future__ import annotations

import time

import numba
import numpy as np

from ..jit import parallel_kernel, set_threads


LANES = 64  # floats per row: 4 zmm registers of independent accumulators


@parallel_kernel
def _sum_chunks(a2, n_chunks, passes):
    """Sum a2 [R, LANES] f32 ``passes`` times in n_chunks row ranges, one per prange
    iteration (several passes per call amortise the parallel-region launch on small sets).

    The 64 independent lane accumulators let LLVM keep the loop in vector registers, so
    the loop is bound by reads, not by a serial add chain.
    """
    rows = a2.shape[0]
    step = (rows + n_chunks - 1) // n_chunks
    part = np.zeros((n_chunks, LANES), np.float32)  # [chunk, lane]
    for c in numba.prange(n_chunks):
        lo = c * step
        hi = min(rows, lo + step)
        acc = np.zeros(LANES, np.float32)
        for _ in range(passes):
            for r in range(lo, hi):
                for j in range(LANES):
                    acc[j] += a2[r, j]
        part[c] = acc
    return part.sum()


@parallel_kernel
def _fill(a2, value):
    """a2[:] = value, rows split over the thread pool (the page faults run in parallel)."""
    for r in numba.prange(a2.shape[0]):
        for j in range(LANES):
            a2[r, j] = value


def read_bandwidth(n_bytes: int, threads: int, runs: int = 7, min_seconds: float = 0.05) -> float:
    """Median read bandwidth in bytes/s over ``runs`` passes of a ``n_bytes`` working set.

    Each timed run reads the whole array at least once, and repeats it until it has taken
    ``min_seconds`` (small working sets would otherwise be timed in microseconds).
    """
    rows = max(64, int(n_bytes) // (4 * LANES))
    a = np.random.default_rng(0).random((rows, LANES), dtype=np.float32)  # [rows, LANES], committed
    return _timed_rate(a, threads, runs, min_seconds)


class ReadProbe:
    """A read-bandwidth probe that keeps its ``n_bytes`` array between readings, so it
    can be read next to every benchmark repetition at the cost of the reading alone
    (the host's bandwidth moves between repetitions; one probe per row does not see it)."""

    def __init__(self, n_bytes: int, threads: int):
        rows = max(64, int(n_bytes) // (4 * LANES))
        self.threads = threads
        self.array = np.empty((rows, LANES), np.float32)  # [rows, LANES]
        set_threads(threads)
        _fill(self.array, np.float32(1.0))  # committed, pages faulted in parallel

    def read(self, runs: int = 3, min_seconds: float = 0.05) -> float:
        """Median bytes/s of ``runs`` timed passes (about runs x min_seconds)."""
        return _timed_rate(self.array, self.threads, runs, min_seconds)


def _timed_rate(a: np.ndarray, threads: int, runs: int, min_seconds: float, best: bool = False) -> float:
    """Median (``best``: highest) bytes/s of ``_sum_chunks`` over ``a`` [rows, LANES] on
    ``threads`` threads."""
    set_threads(threads)
    chunks = 4 * threads  # several chunks per thread: one slow core does not stall the rest
    inner = max(1, (64 << 20) // a.nbytes)  # passes per call
    _sum_chunks(a, chunks, 1)  # compile + warm the cache / TLB
    rates = []
    for _ in range(runs):
        passes, t0 = 0, time.perf_counter()
        while True:
            _sum_chunks(a, chunks, inner)
            passes += inner
            dt = time.perf_counter() - t0
            if dt >= min_seconds:
                break
        rates.append(passes * a.nbytes / dt)
    return float(np.max(rates) if best else np.median(rates))


def read_bandwidth_curve(sizes, threads, runs: int = 5, min_seconds: float = 0.03) -> list[tuple[int, int, float]]:
    """Best read bandwidth of ``runs`` for every working-set size in ``sizes`` (bytes) and
    thread count in ``threads``: [(working_set_bytes, threads, bytes/s)].  The best, not the
    median: on a shared host it is the closest to what the machine can do.

    One array of the largest size is allocated once (filled in parallel, so committed)
    and each size reads a prefix of it, so a whole curve costs a few seconds.
    """
    sizes = sorted(int(s) for s in sizes)
    rows_max = max(64, sizes[-1] // (4 * LANES))
    big = np.empty((rows_max, LANES), np.float32)  # [rows_max, LANES]
    set_threads(max(threads))
    _fill(big, np.float32(1.0))
    out = []
    for t in threads:
        for n in sizes:
            a = big[: max(64, n // (4 * LANES))]
            out.append((int(a.nbytes), int(t), _timed_rate(a, int(t), runs, min_seconds, best=True)))
    return out
