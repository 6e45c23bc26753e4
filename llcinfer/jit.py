"""The one place that sets numba options for every kernel.

Kernels import ``kernel`` (serial, nogil) and ``parallel_kernel`` (prange) from here and
never pass numba options themselves.  ``LLCINFER_NUMBA_CACHE=0`` turns the on-disk cache
off (useful when editing kernels).

The on-disk cache lives in ``$LLCINFER_HOME/numba/<hash of the kernel sources>``: numba
keys a cached function by its own file only, and a kernel's cached machine code includes
the callees it inlined from other modules, so after an edit or an upgrade of any of them
it would run the old callee (a changed KV layout read by stale attention code, say).  A
new hash starts an empty directory; directories of other hashes unused for a day are
removed.  ``NUMBA_CACHE_DIR`` set by the user is left alone.
"""

import functools
import hashlib
import os
import re
import shutil
import time
from pathlib import Path

import numba

from . import paths, settings

_CACHE = settings.numba_cache_enabled()
_STALE_SECONDS = 86400


_KERNEL_IMPORT = re.compile(rb"^from \.+jit import [^\n]*kernel", re.M)  # kernel, parallel_kernel, ...


def compiles_kernels(text: bytes) -> bool:
    """Whether a module's source text compiles kernels: it names numba or imports a kernel
    decorator from this module (one that takes only ``set_threads`` or ``child_env`` from
    here compiles nothing, and editing it must not invalidate the compiled kernels)."""
    return b"numba" in text or _KERNEL_IMPORT.search(text) is not None


@functools.lru_cache(maxsize=1)
def _sources_hash() -> str:
    """Hash of numba's version and every module of the package that compiles kernels."""
    root = Path(__file__).resolve().parent  # the llcinfer package
    h = hashlib.sha256(numba.__version__.encode())
    for p in sorted(root.rglob("*.py")):
        text = p.read_bytes()
        if compiles_kernels(text):
            h.update(p.relative_to(root).as_posix().encode())
            h.update(text)
    return h.hexdigest()[:16]


def kernel_version() -> str:
    """The kernel version measured facts are keyed by (the hash of the kernel sources)."""
    return _sources_hash()


def _versioned_cache_dir() -> None:
    """Point numba's cache at a directory of this exact source tree (see module doc)."""
    if not _CACHE or settings.numba_cache_dir_set_by_user():
        return
    base = paths.numba_dir()
    here = base / _sources_hash()
    try:
        here.mkdir(parents=True, exist_ok=True)
        os.utime(here)
        for other in base.iterdir():
            if other != here and other.is_dir() and time.time() - other.stat().st_mtime > _STALE_SECONDS:
                shutil.rmtree(other, ignore_errors=True)
    except OSError:  # read-only home: numba's default (next to the sources) or no cache
        return
    numba.config.CACHE_DIR = str(here)


_versioned_cache_dir()

# Thread pool: OpenMP (numba's first choice when TBB is absent) with passive waiting
# after a short spin.  Measured on a busy 2-core host, per parallel-region launch:
# OpenMP spinning 2.4 us median but 12 ms p90 (spinning threads lose their core), OpenMP
# passive 8.8 us median / 11.6 us p90 back to back, numba's workqueue 53 us.  Between the
# regions of a batched forward (tens of us of Python apart) purely passive workers fall
# asleep and each launch paid ~100 us to wake them (a 1-row SmolLM2 forward on 2 threads:
# 25 ms, 12 ms on 1 thread); a spin of 10000 rounds (GOMP_SPINCOUNT, libgomp: some tens of
# us) keeps them awake within a forward: 8.5-10.6 ms.  Passive waiting after it keeps
# idle cores idle.  Set before the OpenMP runtime loads; the user's own values win;
# LLCINFER_THREADING_LAYER overrides the layer.
_OMP_SET_HERE = settings.set_omp_waiting({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000"})


def child_env() -> dict[str, str]:
    """The environment for programs we start (llama.cpp in comparisons): without the
    OpenMP waiting variables set above (an inherited passive policy made llama.cpp's decode
    ~3x slower)."""
    return settings.child_environment(_OMP_SET_HERE)

if settings.threading_layer():
    numba.config.THREADING_LAYER = settings.threading_layer()

# fastmath lets LLVM reassociate float sums (vectorised reductions) and contract into FMA;
# the NumPy oracles are compared with a tolerance for that reason.
_FASTMATH = {"nnan", "ninf", "nsz", "arcp", "contract", "afn", "reassoc"}

_COMMON = dict(cache=_CACHE, nogil=True, fastmath=_FASTMATH, error_model="numpy", boundscheck=False)


def kernel(fn):
    """Compile ``fn`` as a serial, GIL-free numba kernel."""
    return numba.njit(**_COMMON)(fn)


def ordered_kernel(fn):
    """As ``kernel``, but its float sums keep the order the source gives them (no
    reassociation, no FMA contraction).  With reassociation a reduction's order depends on
    where LLVM compiles it: inlined into the executor's step kernel when numba compiles
    both afresh, called as the cached object code otherwise, so the same row normed
    the same way gave other bits in a second process (SmolLM2 greedy tokens on the
    executor diverged from the batched pass's after 3 steps on an AVX2 host)."""
    return numba.njit(**(_COMMON | {"fastmath": _FASTMATH - {"reassoc", "contract"}}))(fn)


def inline_kernel(fn):
    """As ``kernel``, inlined into every caller by numba itself (``inline='always'``): for
    the per-block helpers of the hot loops, which LLVM's inliner otherwise leaves as calls
    when they are large (a call per block passes the vectors through the stack)."""
    return numba.njit(inline="always", **_COMMON)(fn)


def parallel_kernel(fn):
    """Compile ``fn`` as a numba kernel whose ``prange`` loops run on the thread pool."""
    return numba.njit(parallel=True, **_COMMON)(fn)


def set_threads(n: int | None) -> int:
    """Set the number of kernel threads (None: all physical cores); returns the count used."""
    n_max = numba.config.NUMBA_NUM_THREADS
    if n is None:
        n = default_threads()
    n = max(1, min(int(n), n_max))
    numba.set_num_threads(n)
    return n


def default_threads() -> int:
    """Physical cores available to this process (llama.cpp's habit), at least 1."""
    try:
        import psutil

        phys = psutil.cpu_count(logical=False) or 1
    except Exception:  # pragma: no cover - psutil missing
        phys = os.cpu_count() or 1
    try:
        avail = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        avail = os.cpu_count() or 1
    return max(1, min(phys, avail, numba.config.NUMBA_NUM_THREADS))
