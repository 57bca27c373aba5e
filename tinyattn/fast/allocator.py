"""The host allocator: glibc's malloc thresholds, fixed so that a training step's temporaries
are reused instead of page-faulting anew (the fast layer; the training program calls it)."""
import ctypes
import os
import sys

HOST_ALLOCATOR_ENV = "TINYATTN_HOST_ALLOCATOR"    # set it to 0 to leave the C allocator alone
host_allocator = "not set up yet"                 # what tune_host_allocator did, in words


def tune_host_allocator(mmap_threshold=64 << 20, trim_threshold=256 << 20):
    """Let glibc keep freed memory for reuse, so numpy's temporaries stop page-faulting.

    A training step frees and reallocates the same few-MiB arrays every step.
    glibc serves a large request from fresh mmap pages (and gives them back on
    free) or from its heap, depending on a threshold it moves as the process
    runs; it also returns the top of its heap to the system once more than a
    second threshold is free. So whether every step page-faults on its
    temporaries depends on what ran before (another library, PyTorch, a
    notebook's history): the same step measured up to 2x slower. Fixing
    both thresholds (mmap 64 MiB, trim 256 MiB) makes the step time steady.

    What it costs: up to ``trim_threshold`` bytes of freed memory may stay in
    the process (for the next step to reuse) instead of going back to the
    system; requests of ``mmap_threshold`` and more still get their own pages.

    The training program calls it (``python -m train``, the benchmarks);
    ``import tinyattn`` leaves the allocator alone. It does nothing where the
    C library is not glibc, when the environment already sets glibc's malloc
    thresholds (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or
    ``glibc.malloc`` tunables: the user's choice wins), or when ``TINYATTN_HOST_ALLOCATOR=0``. Returns what it did,
    in words (also kept in ``tinyattn.fast.allocator.host_allocator``).
    """
    global host_allocator
    env = os.environ
    if env.get(HOST_ALLOCATOR_ENV, "1").strip().lower() in ("0", "off", "false", "no"):
        host_allocator = f"default ({HOST_ALLOCATOR_ENV}=0)"
    elif any(k in env for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")) or \
            "glibc.malloc" in env.get("GLIBC_TUNABLES", ""):
        host_allocator = "left to the environment (it sets glibc's malloc thresholds)"
    else:
        host_allocator = _glibc_mallopt(mmap_threshold, trim_threshold)
    return host_allocator


def _glibc_mallopt(mmap_threshold, trim_threshold):
    if not sys.platform.startswith("linux"):
        return "default (not glibc)"
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version                     # glibc only (musl has no such function)
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        ok = libc.mallopt(M_MMAP_THRESHOLD, int(mmap_threshold)) and libc.mallopt(M_TRIM_THRESHOLD, int(trim_threshold))
    except (OSError, AttributeError):
        return "default (not glibc)"
    if not ok:
        return "default (mallopt refused)"
    return f"glibc mallopt: mmap threshold {mmap_threshold >> 20} MiB, trim threshold {trim_threshold >> 20} MiB"
