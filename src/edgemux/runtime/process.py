"""Process-level settings of edgemux's long-running processes (control plane, admission benchmark).

``tune_allocator``: the admission path works on numpy arrays of a few hundred kilobytes (every Edge TPU
candidate's lattice at once). glibc serves allocations above its mmap threshold (128 kB at start) with
fresh pages and returns them on free, so every such temporary pays its page faults again: measured on the
admission benchmark, a third of a slow decision. Raising the threshold (and the trim threshold with it)
keeps those pages in the heap for reuse, as ``MALLOC_MMAP_THRESHOLD_`` would. Only where the C library
is glibc; elsewhere nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["tune_allocator"]

_M_TRIM_THRESHOLD = -1   # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_MMAP_BYTES = 64 << 20
_TRIM_BYTES = 128 << 20


def tune_allocator() -> bool:
    """Raise glibc's mmap threshold to 64 MiB and its trim threshold to 128 MiB for this process; True when
    applied (glibc found and both calls accepted), False elsewhere."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_BYTES))
