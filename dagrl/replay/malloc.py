"""Keep freed memory in the process for reuse (glibc), where a replay store samples large batches.

A sample call returns a fresh batch: 256 Atari rows are 14 MB. With glibc's defaults the freed
batch goes back to the kernel (above the mmap threshold, or trimmed off the heap top), so the next
call page-faults 14 MB of zeroed pages again. Measured on Pong rows (84x84x4 uint8, 6,000 in RAM,
batches of 256, fresh processes on the 2-core machine): 61-64k rows/s with the defaults, 149-152k
with the settings below; 100k rows 94 % spilled: 30-38k -> 77-87k rows/s (BENCHMARKS.md).

The settings hold for the whole process (a replay host's worker, or the driver under ``single``):
blocks up to 32 MiB come from the heap, and up to 256 MiB of free heap top is kept. Other C
libraries (musl, macOS) are left as they are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
"""glibc's largest allowed mmap threshold on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``)."""
TRIM_THRESHOLD = 256 << 20


@functools.cache
def keep_freed_memory() -> bool:
    """Set this process's malloc to reuse freed blocks (once); whether it took effect."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
