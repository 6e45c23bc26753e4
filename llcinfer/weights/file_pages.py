"""A file mapped read-only now, moved onto 2 MiB anonymous pages later, at the same address.

The repacked weights (kernels/repack_cache.py) stream about 5-10 % faster from 2 MiB
pages than from the page cache's 4 KiB pages (hugepages.py), but filling fresh anonymous
memory costs system time on a virtual machine that backs guest memory on first touch:
1.1-2.7 s for the 1.5B's 951 MB here, which used to sit between start and first token.

So a start maps the file (its pages are usually in the page cache already) and returns
views of that mapping at once; a background thread reads the file into a second, 2 MiB
aligned anonymous region advised onto huge pages, then ``mremap`` moves that region over
the file mapping.  Both hold the same bytes, and the move happens under the kernel's
mmap lock, so a kernel reading the views during the move sees the file's bytes before and
the copy's after, never a hole.  The views' addresses do not change.

    reservation  # [size + 2 MiB] anonymous, PROT_NONE-like; owns the address range
    base         # 2 MiB aligned inside it: the file, then the huge-page copy, [size] uint8

Linux only (``mremap``); where it is missing the file mapping simply stays.
"""

from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np

from .hugepages import _MAP_NORESERVE

HUGE_PAGE = 2 << 20
_MAP_FIXED = getattr(mmap, "MAP_FIXED", 0x10)
_MREMAP_MAYMOVE, _MREMAP_FIXED = 1, 2  # linux/mman.h; Python's mmap has no mremap
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", 14)
_READ_CHUNK = 8 << 20


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if hasattr(libc, "mremap"):
        libc.mremap.restype = ctypes.c_void_p
        libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    return libc


_LIBC = _libc()
_FAILED = ctypes.c_void_p(-1).value


def _span(size: int) -> int:
    return -(-max(1, size) // HUGE_PAGE) * HUGE_PAGE


def supported() -> bool:
    """mremap exists and transparent huge pages are not off ('never': a copy would only be
    4 KiB pages again)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as fh:
            thp_on = "[never]" not in fh.read()
    except OSError:
        thp_on = False
    return thp_on and hasattr(_LIBC, "mremap") and hasattr(mmap, "MAP_ANONYMOUS")


def map_file(fd: int, size: int) -> np.ndarray:
    """The first ``size`` bytes of the open file ``fd`` as a read-only uint8 array whose
    start is 2 MiB aligned, ready for ``promote``.  Raises OSError when it cannot map."""
    n = _span(size)
    reservation = mmap.mmap(-1, n + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE,
                            prot=mmap.PROT_READ)
    whole = np.frombuffer(reservation, np.uint8)  # keeps the reservation (and its munmap) alive
    start = whole.ctypes.data
    skip = -start % HUGE_PAGE
    got = _LIBC.mmap(start + skip, n, mmap.PROT_READ, mmap.MAP_PRIVATE | _MAP_FIXED, fd, 0)
    if got != start + skip:
        raise OSError(ctypes.get_errno(), f"cannot map the file: {os.strerror(ctypes.get_errno())}")
    view = whole[skip:skip + size]
    view.setflags(write=False)
    return view


def _aligned_anonymous(n: int) -> int | None:
    """The address of ``n`` bytes of fresh read-write anonymous memory, 2 MiB aligned and
    advised onto huge pages; None when that is refused."""
    raw = _LIBC.mmap(None, n + HUGE_PAGE, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
    if raw in (None, _FAILED):
        return None
    start = raw + (-raw % HUGE_PAGE)
    if start > raw:
        _LIBC.munmap(raw, start - raw)
    if raw + n + HUGE_PAGE > start + n:
        _LIBC.munmap(start + n, raw + n + HUGE_PAGE - start - n)
    if _LIBC.madvise(start, n, _MADV_HUGEPAGE) != 0:  # THP off: 4 KiB copies gain nothing
        _LIBC.munmap(start, n)
        return None
    return start


def promote(view: np.ndarray, fd: int) -> bool:
    """Read the file ``fd`` (the one ``view`` maps, from offset 0) into 2 MiB pages and move
    them over ``view``'s mapping.  False when the platform or the kernel refuses (the file
    mapping stays; same bytes); OSError when the file cannot be read to ``view.size``."""
    if not supported():
        return False
    n = _span(view.size)
    copy = _aligned_anonymous(n)
    if copy is None:
        return False
    moved = False
    try:
        target = memoryview((ctypes.c_uint8 * view.size).from_address(copy)).cast("B")
        a = 0
        while a < view.size:
            k = os.preadv(fd, [target[a:a + _READ_CHUNK]], a)
            if not k:
                raise OSError(f"file ends at byte {a} of {view.size}")
            a += k
        moved = _LIBC.mremap(copy, n, n, _MREMAP_MAYMOVE | _MREMAP_FIXED, view.ctypes.data) == view.ctypes.data
        return moved
    finally:
        if not moved:
            _LIBC.munmap(copy, n)
