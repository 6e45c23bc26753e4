"""Anonymous memory on 2 MiB pages, for the two big streams a decode step reads: the
repacked weights (kernels/repack_cache.py) and the paged KV pool (kv/pool.py).

With 4 KiB pages every 4 KiB of a stream is a new TLB entry (and on this machine the
hardware prefetchers restart there); with transparent huge pages in the kernel's
``madvise`` mode (the common default) a mapping only gets 2 MiB pages after
``madvise(MADV_HUGEPAGE)``.  Measured here (Zen 4 guest, 1 thread, every matrix of the
model once, perf/hugepages_bench.py): 24.0 -> 26.5 GB/s for Qwen2.5-Coder-0.5B's
374 MiB, 24.9 -> 25.9 GB/s for the 1.5B.

``LLCINFER_HUGEPAGES=0`` turns the advice off (and makes the repack cache map its file
read-only instead of reading it into anonymous memory).
"""

from __future__ import annotations

import mmap
import os
import sys

from .. import settings

_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)


def enabled() -> bool:
    """LLCINFER_HUGEPAGES: on unless 0/off/no/false; anything else is a UsageError."""
    return settings.hugepages_enabled()


def advise(mm: mmap.mmap) -> bool:
    """Ask for 2 MiB pages on an anonymous mapping; False where that is off or refused."""
    if not enabled() or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        mm.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # THP compiled out or 'never': 4 KiB pages, same results
        return False
    return True


def anonymous(nbytes: int, noreserve: bool = False) -> mmap.mmap:
    """A private anonymous read-write mapping of ``nbytes`` (zero-filled on first touch),
    advised onto huge pages.  Raises OSError / OverflowError as mmap does."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (_MAP_NORESERVE if noreserve else 0)
    mm = mmap.mmap(-1, max(1, int(nbytes)), flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    advise(mm)
    return mm
