"""Keep freed memory in the process instead of handing it back to the OS after every step.

TensorFlow's CPU allocator is glibc malloc. With its defaults, buffers of a few
MB and up are fresh mmap()s freed with munmap() and the heap top is trimmed, so
every training step faults its activations and gradients in again page by page
(9,000-29,000 page faults per BERT-base batch-8 step on CPU) and each munmap
interrupts the other cores for a TLB shootdown. Raising the mmap threshold to
its maximum (32 MiB) and never trimming makes the step's buffers come from
memory the process already holds: 0 page faults per step after the first.
The cost is that the process keeps its peak heap size (as TensorFlow's GPU
allocator does), which a training process reaches every step anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc refuses larger values on 64-bit
_TOP_PAD = 64 << 20
_done = False


def retain_freed_memory() -> bool:
    """Sets glibc's malloc to reuse freed memory (once per process; Linux/glibc only).
    Returns whether the settings took effect."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other C libraries have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = all(mallopt(option, value) == 1 for option, value in (
        (_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX), (_M_TRIM_THRESHOLD, 2**31 - 1), (_M_TOP_PAD, _TOP_PAD)))
    _done = ok
    logger.debug("malloc set to retain freed memory: %s", ok)
    return ok
