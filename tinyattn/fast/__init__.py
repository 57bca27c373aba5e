"""The fast layer: all of tinyattn's speed code, in one place, asked for by name (``ta.compile``).

The teaching files (autograd.py, ops.py, nn/, optim/) hold one formula per op,
the arithmetic that defines it. This package holds what makes them fast:

    compiled.py      ta.compile: a model (or a function) run on the fast layer
    checked.py       whether the code a fast path stands in for is the library's
    ops.py           fast versions of ops, each a subclass of the teaching op
    modules.py       layers run fast: a forward on arrays where no graph is recorded
    models.py        the same for the GPT's layers; in training, a whole block as one op
    optim.py         AdamW's step on flat buffers (AdamW(..., fused=True))
    layouts.py       weights laid out for their products, inside ta.inference_mode
    threads.py       tinyattn's own CPU threads, and BLAS held at one thread beside them
    cpu_kernels.py   fused CPU kernels, compiled with numba (the ``fast`` extra)
    cpu_block.py     the GPT's block as one CPU kernel: each thread on its share of the batch, or
                     each product on the whole batch
    cuda_kernels.py  fused CuPy kernels, for the GPU
    allocator.py     glibc's malloc thresholds, for steady step times (the training program's)
    denormals.py     subnormal floats flushed to zero in every CPU thread (ta.set_flush_denormal)

Nothing here runs unless asked for: ``ta.compile(model)`` runs the model with its
ops' fast versions and its layers' runners, and ``AdamW(..., fused=True)`` (what a
compiled model's ``configure_optimizer`` makes) runs the flat step. A fast op runs
the teaching op's formula whenever a graph of its backward is recorded or its
kernel declines (ops.FastOp), so the numbers agree either way (to float32 rounding).
Every path runs only while the code it stands in for is the library's own
(checked.py): edit a formula, or replace a function at run time, and yours runs.

    TINYATTN_CPU_KERNELS=0    # compiled, but without numba's kernels (to debug a kernel)
"""
import os

from ..backend import CupyBackend, NumpyBackend, on_every_backend
from ..optim import AdamW
from . import threads
from .allocator import tune_host_allocator  # noqa: F401
from .denormals import set_flush_denormal  # noqa: F401
from .optim import fused_step
from .threads import get_num_threads, set_num_threads  # noqa: F401

CPU_KERNELS_ENV = "TINYATTN_CPU_KERNELS"


def _cpu_kernels():
    """The kernels of cpu_kernels.py and cpu_block.py, or {} without numba or with TINYATTN_CPU_KERNELS=0."""
    if os.environ.get(CPU_KERNELS_ENV, "1").strip().lower() in ("0", "off", "false", "no"):
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
    """Give a backend its products (on the CPU split over the threads) and its kernels (loaded
    on first use). Neither runs until a compiled model or AdamW(fused=True) asks."""
    if not hasattr(backend, "products"):
        backend.products = (threads.CpuProducts if isinstance(backend, NumpyBackend) else threads.Products)(backend.xp)
    if isinstance(backend, NumpyBackend):
        backend.load_kernels = _cpu_kernels
    elif isinstance(backend, CupyBackend):
        backend.load_kernels = _cuda_kernels


AdamW.fused_step = fused_step  # AdamW(..., fused=True) asks for it
on_every_backend(_install)
