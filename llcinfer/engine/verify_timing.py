"""What a verification step costs on this host, timed where the step loop runs it.

    measure_verify_cost   t(T) for T in VERIFY_ROWS and the plain one-row decode step:
                          the speculator's start-up curve (one sequence), perf/verify_cost.py's
                          (the rows spread over one or several)
    verification_seconds  one step of one size

The curve is timed in rounds.  A round is one plain decode step, one verification of
every size, and another decode step; a size's time is the median over the rounds of its
ratio to the mean of its round's two decode steps, times the median decode step:

    t(T) = median_r( v_r(T) / ((d_r + d'_r) / 2) ) * median(d, d')

On shared 2-vCPU guests the host's speed drifts within seconds by more than the
differences between the small sizes that decide the budget (2 or 3 rows against one);
a ratio within a round cancels the drift, where sizes timed one after another, each a
few times, against decode steps timed at the end did not.  Sizes from ``LONG_ROWS`` on
are timed in the first ``LONG_ROUNDS`` rounds only: compute-bound, they vary less, and
they take most of the time (a 64-row step of Qwen2.5-Coder-1.5B on 2 cores: 1 s).
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import OutOfMemoryError
from ..planner.verify import VERIFY_ROWS

ROUNDS = 5  # start-up rounds (module doc)
LONG_ROWS, LONG_ROUNDS = 16, 3  # sizes from LONG_ROWS on are timed in the first LONG_ROUNDS rounds


def measure_verify_cost(model, runner, seqs: list, executor=None, rows=VERIFY_ROWS,
                        rounds: int = ROUNDS) -> tuple[list[int], list[float], float]:
    """(rows, seconds, decode seconds): the curve of verifications spread over ``seqs``
    (module doc; ``rounds`` rounds), each placed after its sequences' tokens as the step
    loop would (``verification_seconds``), and the plain step of ``seqs[0]`` through
    ``runner.decode_rows``.  The curve ends before the first size the KV pool has no room
    for; the sequences are left as they were."""
    seq = seqs[0]
    n0 = seq.n_tokens

    def decode_step() -> float:
        t0 = time.perf_counter()
        runner.decode_rows([seq], [1])
        seconds = time.perf_counter() - t0
        seq.truncate(n0)
        return seconds

    sizes = list(rows)
    ratios: dict[int, list[float]] = {t: [] for t in sizes}  # size -> its step over its round's decode step
    decode: list[float] = []
    for r in range(rounds):
        before = decode_step()
        took = {}
        for t in sizes:
            if t >= LONG_ROWS and r >= LONG_ROUNDS:
                continue
            try:
                took[t] = verification_seconds(model, seqs, t, reps=1, executor=executor)
            except OutOfMemoryError:  # a small pool: the curve ends where its trees stop fitting
                sizes = [s for s in sizes if s < t]
                break
        after = decode_step()
        decode += [before, after]
        for t, seconds in took.items():
            ratios[t].append(seconds / (0.5 * (before + after)))
    decode_s = float(np.median(decode))
    return sizes, [float(np.median(ratios[t])) * decode_s for t in sizes], decode_s


def verification_seconds(model, seqs: list, rows: int, reps: int = 3, executor=None) -> float:
    """Median seconds of one verification of ``rows`` rows spread evenly over ``seqs`` as
    the step loop runs it, the logits of every row: with ``executor``, one executor step
    of a chain per sequence; else one batched forward with tree attention, each
    sequence's rows a root and chains of up to 8 drafted tokens under it
    (``chain_tree``).  The sequences are left as they were; raises OutOfMemoryError when
    the pool has no room for the rows."""
    sizes = [len(part) for part in np.array_split(np.arange(rows), len(seqs)) if len(part)]
    chunks = [(seq, [1] * n) for seq, n in zip(seqs, sizes)]
    trees = [chain_tree(n) for n in sizes]
    n0 = [seq.n_tokens for seq, _ in chunks]
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        if executor is not None:
            executor.step_rows([seq for seq, _ in chunks], [t for _, t in chunks], [False] * len(chunks))
        else:
            model.forward_chunks(chunks, np.arange(rows), trees)
        times.append(time.perf_counter() - t0)
        for (seq, _), n in zip(chunks, n0):
            seq.truncate(n)
    return float(np.median(times))


def chain_tree(n: int, depth: int = 8) -> np.ndarray:
    """parents  # [n] of a root (row 0) with chains of ``depth`` rows under it."""
    i = np.arange(n, dtype=np.int64)
    return np.where(i % depth == 1, 0, i - 1) if depth > 1 else np.where(i == 0, -1, 0)
