"""Where a process's freed memory goes between training steps.

glibc's ``malloc`` hands every large block back to the kernel when it is freed: a block above
its mmap threshold (128 KiB at start, rising with the blocks freed to at most 32 MiB) is
mapped for that one allocation and unmapped on ``free``, and free memory at the top of the
heap beyond the trim threshold is released. A training step allocates the same hundreds of
megabytes every step (activations, logits, gradients), so each step takes them from the
kernel again, one page fault per 4 KiB page touched (``gatedattn bench --real-model --heap
kept`` measures what that costs a model's steps; ``docs/benchmarks/real-model.md``).

:func:`keep_freed_memory` fixes both thresholds so that freed blocks stay in the heap for the
next step, as jemalloc and tcmalloc keep them by default. The price: the process's resident
memory stays at its peak. It changes the whole process (every library in it) from the call
on, and cannot be undone; a library does not call it by itself, a program's entry point may.
"""

from __future__ import annotations

import ctypes
import functools

M_TRIM_THRESHOLD = -1  # mallopt parameters (glibc's malloc.h)
M_MMAP_THRESHOLD = -3
KEPT_MMAP_THRESHOLD = 1 << 30  # blocks under 1 GiB come from the heap
KEPT_TRIM_THRESHOLD = 1 << 31  # and the heap is not trimmed under 2 GiB free at its top

HEAPS = ("default", "kept")  # the allocator states a bench can run under


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """This process's C library when it is glibc with ``mallopt`` and ``mallinfo2`` (2.33+),
    else None."""
    try:
        libc = ctypes.CDLL(None)  # the symbols the process already has
        libc.gnu_get_libc_version  # glibc's own (musl and macOS have none)
        libc.mallopt.argtypes, libc.mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
        libc.mallinfo2.restype = _Mallinfo2
    except (OSError, AttributeError):  # musl, macOS, or a glibc older than mallinfo2
        return None
    return libc


def can_keep_freed_memory() -> bool:
    """Whether this process's allocator is glibc's, whose thresholds :func:`keep_freed_memory` sets."""
    return _glibc() is not None


def keep_freed_memory() -> bool:
    """Keep blocks freed by this process in its heap instead of returning them to the kernel
    (see the module's docstring); True when set, False where the allocator is not glibc's."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, KEPT_MMAP_THRESHOLD)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, KEPT_TRIM_THRESHOLD))


def heap_free_bytes() -> int | None:
    """Bytes free in the heap, kept for the next allocations (``mallinfo2().fordblks``);
    None where the allocator is not glibc's."""
    libc = _glibc()
    return None if libc is None else int(libc.mallinfo2().fordblks)
