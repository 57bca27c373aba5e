"""The fast layer: all of tinyattn's speed code, in one place, behind one switch.

The teaching files (autograd.py, ops.py, nn/, optim/) hold one formula per op,
the arithmetic that defines it. This package holds what makes them fast:

    ops.py           fast versions of ops, each a subclass of the teaching op
    modules.py       fast versions of layers: a forward on arrays where no graph is recorded
    models.py        the same for the GPT's layers; in training, a whole block as one op
    layouts.py       weights laid out for their products, inside ta.inference_mode
    optim.py         AdamW on flat buffers (the same arithmetic, fewer passes)
    threads.py       tinyattn's own CPU threads, and BLAS held at one thread beside them
    cpu_kernels.py   fused CPU kernels, compiled with numba (the ``fast`` extra)
    cpu_block.py     the GPT's block as one CPU kernel, each thread on its share of the batch
    cuda_kernels.py  fused CuPy kernels, for the GPU
    allocator.py     glibc's malloc thresholds, for steady step times (the training program's)

While the layer is on, each backend's ``fast_ops`` table maps a teaching op
to its fast subclass, and ``Function.apply`` runs that instead; ``AdamW(...)``
makes the fast AdamW. A fast op calls the teaching op's ``super()`` whenever
a graph of its backward is recorded, and falls back to the formula whenever
its kernel declines, so the numbers agree either way (to float32 rounding).

    ta.set_fast(False)        # every op runs its teaching formula, for this process
    TINYATTN_FAST=0 python -m train ...      # the same, from the environment
    TINYATTN_CPU_KERNELS=0    # the fast layer without numba's kernels
"""
import os

from ..optim import AdamW as TeachingAdamW, Optimizer
from ..backend import CupyBackend, NumpyBackend, made_backends, on_every_backend
from . import threads
from .allocator import tune_host_allocator  # noqa: F401
from .ops import FAST_OPS
from .modules import FAST_MODULES
from ..nn.modules import Module
from .optim import AdamW as FastAdamW
from .threads import get_num_threads, set_num_threads  # noqa: F401

FAST_ENV = "TINYATTN_FAST"
CPU_KERNELS_ENV = "TINYATTN_CPU_KERNELS"
_OFF = ("0", "off", "false", "no")
_on = os.environ.get(FAST_ENV, "1").strip().lower() not in _OFF


def set_fast(on=True):
    """Turn the fast layer on or off for this process (off: every op runs its teaching formula)."""
    global _on
    _on = bool(on)
    Optimizer.fast_variants = {TeachingAdamW: FastAdamW} if _on else {}
    Module.fast_variants = FAST_MODULES if _on else {}          # (layers made before keep their class: they
                                                                # check backend.fast_ops, which goes empty)
    for backend in made_backends():
        _install(backend)
    if not _on:
        threads.release_blas()


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
    """Give a backend the fast ops (while the layer is on) and its kernels (loaded on first use)."""
    backend.fast_ops = FAST_OPS if _on else {}
    if isinstance(backend, NumpyBackend):
        backend.load_kernels = _cpu_kernels
    elif isinstance(backend, CupyBackend):
        backend.load_kernels = _cuda_kernels


Optimizer.fast_variants = {TeachingAdamW: FastAdamW} if _on else {}
Module.fast_variants = FAST_MODULES if _on else {}
on_every_backend(_install)
