"""The fast layer: all of tinyattn's speed code, in one place, behind one switch.

The teaching files (autograd.py, ops.py, nn/, optim/) hold one formula per op,
the arithmetic that defines it. This package holds what makes them fast:

    ops.py           fast versions of ops, each a subclass of the teaching op
    modules.py       layers run fast (nn.fuse): a forward on arrays where no graph is recorded
    models.py        the same for the GPT's layers; in training, a whole block as one op
    optim.py         AdamW's step on flat buffers (AdamW(..., fused=True))
    checked.py       what each of these stands in for, and whether it is still the library's code
    layouts.py       weights laid out for their products, inside ta.inference_mode
    threads.py       tinyattn's own CPU threads, and BLAS held at one thread beside them
    cpu_kernels.py   fused CPU kernels, compiled with numba (the ``fast`` extra)
    cpu_block.py     the GPT's block as one CPU kernel, each thread on its share of the batch
    cuda_kernels.py  fused CuPy kernels, for the GPU
    allocator.py     glibc's malloc thresholds, for steady step times (the training program's)
    denormals.py     subnormal floats flushed to zero in every CPU thread (ta.set_flush_denormal)

While the layer is on, each backend's ``fast_ops`` table maps a teaching op
to its fast subclass, and ``Function.apply`` runs that instead. A fast op runs
the teaching op's formula whenever a graph of its backward is recorded or its
kernel declines (ops.FastOp), so the numbers agree either way (to float32 rounding). Layers run fast only in a model given to
``nn.fuse`` (the training program and ``GPT.generate`` do), and AdamW's flat step
only for ``AdamW(..., fused=True)``. Every one of them runs only while the code
it stands in for is the library's own (checked.py): edit a formula, or replace a
forward at run time, and yours runs.

    ta.set_fast(False)        # every op runs its teaching formula, for this process
    TINYATTN_FAST=0 python -m train ...      # the same, from the environment
    TINYATTN_CPU_KERNELS=0    # the fast layer without numba's kernels
"""
import os

from ..optim import AdamW
from ..backend import CupyBackend, NumpyBackend, made_backends, on_every_backend
from . import checked, threads
from .allocator import tune_host_allocator  # noqa: F401
from .denormals import set_flush_denormal  # noqa: F401
from .ops import FAST_OPS
from .optim import fused_step
from .threads import get_num_threads, set_num_threads  # noqa: F401

FAST_ENV = "TINYATTN_FAST"
CPU_KERNELS_ENV = "TINYATTN_CPU_KERNELS"
_OFF = ("0", "off", "false", "no")
_on = os.environ.get(FAST_ENV, "1").strip().lower() not in _OFF


def set_fast(on=True):
    """Turn the fast layer on or off for this process (off: every op runs its teaching formula)."""
    global _on
    _on = bool(on)
    _install_everywhere()           # (fused layers and AdamW's flat step check backend.fast_ops, which goes empty)
    if not _on:
        threads.release_blas()


def _install_everywhere():
    for backend in made_backends():
        _install(backend)


def is_fast():
    """True while the fast layer is on."""
    return _on


def _cpu_kernels():
    """The kernels of cpu_kernels.py and cpu_block.py, or {} without numba or with TINYATTN_CPU_KERNELS=0."""
    if os.environ.get(CPU_KERNELS_ENV, "1").strip().lower() in _OFF:
        return {}
    try:
        from .cpu_kernels import KERNELS
        from .cpu_block import KERNELS as BLOCK_KERNELS
    except ImportError:                          # no numba: the fast ops run without kernels
        return {}
    return {**KERNELS, **BLOCK_KERNELS}


def _cuda_kernels():
    from .cuda_kernels import KERNELS
    return KERNELS


def _install(backend):
    """Give a backend the fast ops (while the layer is on, each while the code it stands in for is
    the library's) and its kernels (loaded on first use)."""
    backend.fast_ops = {teaching: fast for teaching, fast in FAST_OPS.items()
                        if checked.runs(fast.__name__)} if _on else {}     # (off: nothing to check, or say)
    if not hasattr(backend, "products"):            # the CPU's variant splits its products over the threads
        backend.products = (threads.CpuProducts if isinstance(backend, NumpyBackend) else threads.Products)(backend.xp)
    if isinstance(backend, NumpyBackend):
        backend.load_kernels = _cpu_kernels
    elif isinstance(backend, CupyBackend):
        backend.load_kernels = _cuda_kernels


AdamW.fused_step = fused_step
checked.on_change.append(_install_everywhere)
on_every_backend(_install)
