"""Subnormal floats read and written as zero on the CPU: ``ta.set_flush_denormal`` (as PyTorch's).

A float32 below 2**-126 (about 1.2e-38) in size is subnormal: it has fewer
bits of precision than the others, and an x86 CPU takes a slow path for every
operation that reads or makes one. Fine-tuning makes them, as probabilities,
weights and gradients shrink towards zero, and a matrix product with subnormal
entries can take a hundred times as long (docs/benchmarks.md).

Two bits of each thread's SSE control register (MXCSR) make the CPU treat them
as zero: FTZ (flush to zero: a result too small to be normal becomes 0) and DAZ
(denormals are zero: a subnormal input reads as 0). They belong to a thread, so
``set_flush_denormal`` sets them in every thread that computes for tinyattn:

    the thread that calls it (numba's kernels run in the thread that calls them);
    tinyattn's own CPU threads (threads.py), each before its next piece of work;
    OpenBLAS's threads, which start with the bits of the thread that starts them:
        it stops them, and the next product starts new ones.

It does this whether the fast layer is on or off. The training program turns it
on (train/command.py); ``import tinyattn`` does not, as ``import torch`` does not.

The register is read and written with the C library's fegetenv and fesetenv
(through ctypes: no compiler needed), where the layout of their fenv_t is known:
x86-64 Linux (glibc's and musl's fenv_t: 32 bytes, MXCSR in the last 4) and
x86-64 macOS (Darwin's: 16 bytes, MXCSR in bytes 4 to 8). After each change a
subnormal is multiplied by 1 to check that the CPU now does what was asked;
where it does not, the register is put back. Elsewhere (ARM, Windows) it
changes nothing and returns False.
"""
import ctypes
import ctypes.util
import platform
import sys
import threading

import numpy as np

FTZ, DAZ = 0x8000, 0x0040       # MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6)
SUBNORMAL_BITS = 1 << 20        # read as a float32: 2**-129, a subnormal (the normal float32s start at 2**-126)

_mode = None                    # what set_flush_denormal last asked of every thread (None: never called)
_asked = 0                      # how many times it was called: a thread that saw fewer calls follows _mode
_seen = threading.local()       # .asked: the calls this thread has followed
restarted_blas = []             # the BLAS libraries whose threads the last call stopped (file paths)


def subnormals(shape):
    """A float32 array of ``shape`` full of 2**-129, made from its bits (converting 1e-39 to float32
    would itself give 0 while subnormals are flushed)."""
    return np.full(shape, SUBNORMAL_BITS, np.uint32).view(np.float32)


def flushes_here():
    """True when this thread's float32 arithmetic turns a subnormal into 0 (tried, not looked up).
    The product is read as bits: comparing it with 0 would itself read a subnormal as 0."""
    return int((subnormals(1) * np.float32(1.0)).view(np.uint32)[0]) == 0


class _Mxcsr:
    """This thread's MXCSR, read and written through fenv_t: ``words`` 32-bit words, MXCSR at ``at``."""

    def __init__(self, lib, words, at):
        self.lib, self.words, self.at = lib, words, at

    def read(self):
        env = (ctypes.c_uint32 * self.words)()
        if self.lib.fegetenv(env) != 0:
            raise OSError("fegetenv failed")
        return env

    def write(self, env):
        if self.lib.fesetenv(env) != 0:
            raise OSError("fesetenv failed")

    def set_flush(self, mode):
        env = self.read()
        env[self.at] = env[self.at] | (FTZ | DAZ) if mode else env[self.at] & ~(FTZ | DAZ)
        self.write(env)


def _fenv_layout():
    """(words in fenv_t, the word that holds MXCSR) on this platform, or None where it is not known."""
    if platform.machine().lower() not in ("x86_64", "amd64") or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None                                   # (a 32-bit Python on a 64-bit CPU: no MXCSR in fenv_t)
    if sys.platform.startswith("linux"):
        return 8, 7
    if sys.platform == "darwin":
        return 4, 1
    return None


def _fenv_library():
    """The loaded library that has fegetenv and fesetenv: the process itself (Python loads the C
    math library), else libm by name. None where neither has them."""
    lib = ctypes.CDLL(None)
    if hasattr(lib, "fegetenv") and hasattr(lib, "fesetenv"):
        return lib
    name = ctypes.util.find_library("m")
    try:
        lib = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return lib if lib is not None and hasattr(lib, "fegetenv") and hasattr(lib, "fesetenv") else None


_register = None                # this platform's _Mxcsr, or False where there is none (found on first use)


def _mxcsr():
    global _register
    if _register is None:
        layout, lib = _fenv_layout(), None
        if layout is not None:
            lib = _fenv_library()
        _register = _Mxcsr(lib, *layout) if lib is not None else False
    return _register or None


def _set_here(mode):
    """FTZ and DAZ on (True) or off (False) in this thread. False where that cannot be done here."""
    register = _mxcsr()
    if register is None:
        return False
    try:
        before = register.read()
        register.set_flush(mode)
        if flushes_here() != mode:                    # the CPU does not do what the bits should ask
            register.write(before)
            return False
    except OSError:                                   # the C library refused to read or set it
        return False
    return True


def follow():
    """Give this thread the mode that set_flush_denormal last set, if this thread has not taken it yet
    (tinyattn's CPU threads call it before each piece of work: a few attribute reads)."""
    if getattr(_seen, "asked", 0) != _asked:
        _seen.asked = _asked
        _set_here(_mode)


def restart_blas_threads():
    """Stop OpenBLAS's threads (its exported ``blas_thread_shutdown_``), in each OpenBLAS library
    loaded (found with threadpoolctl) that runs its own threads. The next product that needs them
    starts new ones from the thread that runs it, with that thread's MXCSR. Returns those libraries.

    Without threadpoolctl, and for other BLAS libraries (MKL, BLIS, Accelerate, or an OpenBLAS
    built on OpenMP), threads that BLAS has already started keep the mode they started with:
    set it before the first large product, or keep BLAS at one thread (tinyattn's CPU threads
    hold it there from their first split on)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return []
    stopped = []
    for lib in ThreadpoolController().select(internal_api="openblas").lib_controllers:
        shutdown = getattr(lib.dynlib, "blas_thread_shutdown_", None)
        if shutdown is not None and getattr(lib, "threading_layer", None) == "pthreads":
            shutdown()
            stopped.append(lib.filepath)
    return stopped


def set_flush_denormal(mode):
    """Flush subnormal floats to zero on the CPU (``mode=True``), or stop (``False``), as PyTorch's
    ``torch.set_flush_denormal``: in the calling thread, in tinyattn's CPU threads (now and later
    ones) and in OpenBLAS's threads (restart_blas_threads says which BLAS libraries it reaches).

    Returns True where it is supported (x86-64 Linux and macOS); elsewhere it changes nothing and
    returns False. Call it while no other thread computes, as at the start of a program: OpenBLAS's
    threads are stopped and restarted. Other threads of your own that compute call it themselves.

        ta.set_flush_denormal(True)
        ta.tensor([1e-39]) * 1.0          # tensor([0.], dtype=float32)
    """
    global _mode, _asked, restarted_blas
    mode = bool(mode)
    if not _set_here(mode):
        return False
    _mode, _asked = mode, _asked + 1
    _seen.asked = _asked                              # (this thread has it already)
    restarted_blas = restart_blas_threads()
    return True
