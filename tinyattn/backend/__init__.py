"""Array backends: the only place that imports numpy or cupy by name.

A backend holds the array namespace ``xp`` for one device and the few things
that differ between devices: moving data to and from the host, scatter-add,
random numbers, ``erf``, synchronisation, and a table of fused kernels
(``kernel(name)``: None where a backend has none). What differs is told by
capability flags (``on_host``, ``setitem_basic``), never by comparing
device names. Everything above this module
writes ``xp.exp(...)`` with the array-API names that numpy 2, CuPy 14 and
array_api_strict share (``concat``, ``permute_dims``, ``astype``, ...).

Devices:
    "cpu"     numpy
    "cuda"    CuPy (pip install "tinyattn[gpu]")
    "strict"  array_api_strict on a non-CPU device: a test stand-in for a GPU
              that refuses implicit conversion to host arrays, as CuPy does.
"""
import contextlib
import ctypes
import math
import os
import sys
import time

import numpy as np

from . import threads

DTYPES = ("float16", "float32", "float64", "int32", "int64", "bool")
float16, float32, float64 = np.dtype("float16"), np.dtype("float32"), np.dtype("float64")
int32, int64, bool_ = np.dtype("int32"), np.dtype("int64"), np.dtype("bool")


CPU_KERNELS_ENV = "TINYATTN_CPU_KERNELS"          # set it to 0 to run the CPU ops without numba's kernels


def dtype_of_host(dtype):
    """A dtype from a name ("float32"), a numpy dtype or a numpy scalar type."""
    try:
        return np.dtype(dtype)
    except TypeError:
        raise TypeError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}") from None


class Backend:
    """numpy on the CPU. Subclasses override what differs."""

    name = "cpu"
    on_host = True          # arrays live in host memory: reading a value back costs nothing
    ufunc_out = True        # elementwise functions take out= (write into an existing array)
    setitem_basic = True    # a[index] = v works for basic indices (ints, slices, None, Ellipsis)
    use_kernels = True      # False: every op runs its own formula (to compare against the kernels)
    has_nccl = False        # its arrays can go through NCCL's collectives (tinyattn.distributed)
    clock = "host clock"    # what ta.profile times ops with (time_mark, seconds_between)
    _kernels = None

    def __init__(self):
        self.xp = np
        self.seed(0)

    # --- data in and out -------------------------------------------------
    def asarray(self, data, dtype=None):
        """Host data (lists, numpy arrays, scalars) -> a new array on this device (a copy)."""
        return np.array(data, dtype=None if dtype is None else np.dtype(dtype))

    def to_numpy(self, a):
        """An explicit copy to the host: the only way data leaves a device."""
        return a

    def copy(self, a):
        """A new array with ``a``'s values, on this device."""
        return a.copy()

    def read_only(self, a):
        """A view of ``a`` that refuses writes (numpy); ``a`` itself where the device has no such view."""
        if not isinstance(a, np.ndarray):
            return a
        view = a.view()
        view.flags.writeable = False
        return view

    def native_dtype(self, dtype):
        return np.dtype(dtype)

    def dtype_of(self, a):
        """The numpy dtype that describes this backend's array ``a``."""
        return a.dtype

    def zeros(self, shape, dtype):
        return self.full(shape, 0, dtype)

    def full(self, shape, value, dtype):
        return self.xp.full(shape, value, dtype=self.native_dtype(dtype))

    def arange(self, n):
        return self.xp.arange(n)

    def is_array(self, a):
        return isinstance(a, np.ndarray)

    # --- indexing --------------------------------------------------------
    def getitem(self, a, index):
        return a[index]

    def index_add(self, target, index, values):
        """target[index] += values, counting repeated indices (never ``x[idx] += v``)."""
        np.add.at(target, index, values)
        return target

    def index_add_rows(self, n_rows, idx, values):
        """out[idx[i]] += values[i] for 1-d int ``idx`` and (N, C) ``values``: (n_rows, C).

        A one-hot matmul is exact and, for the small vocabularies used here,
        several times faster than np.add.at on a CPU.
        """
        if n_rows * idx.shape[0] <= 1 << 24:
            onehot = (idx[None, :] == self.arange(n_rows)[:, None])     # (V, N)
            return self.xp.astype(onehot, values.dtype) @ values         # (V, C)
        out = self.zeros((n_rows,) + tuple(values.shape[1:]), self.dtype_of(values))
        return self.index_add(out, idx, values)

    def joined(self, arrays, shape, dim):
        """The array of ``shape`` whose consecutive slices along ``dim`` the ``arrays`` are,
        exactly (views of it, in order, covering it): their concat without a copy. None
        when they are anything else, and off the CPU."""
        base = arrays[0].base if self.xp is np else None
        if base is None or base.size != math.prod(shape) or not base.flags.c_contiguous:
            return None
        whole, start, lead = base.reshape(shape), 0, (slice(None),) * dim
        for a in arrays:
            piece = whole[lead + (slice(start, start + a.shape[dim]),)]
            if a.base is not base or a.dtype != piece.dtype or a.shape != piece.shape \
                    or a.strides != piece.strides or a.ctypes.data != piece.ctypes.data:
                return None
            start += a.shape[dim]
        return whole if start == shape[dim] else None

    # --- random numbers --------------------------------------------------
    def seed(self, seed):
        self.rng = np.random.default_rng(seed)

    def uniform(self, shape, dtype):
        return self.rng.random(shape, dtype=np.dtype(dtype))

    def normal(self, shape, dtype):
        return self.rng.standard_normal(shape, dtype=np.dtype(dtype))

    def get_rng_state(self):
        return self.rng.bit_generator.state

    def set_rng_state(self, state):
        self.rng.bit_generator.state = state

    # --- special functions and sync --------------------------------------
    def erf(self, x):
        return _erf(self.xp, x)

    def synchronize(self):
        pass

    # timing for ta.profile: a mark now, and the seconds between two marks. The host
    # clock here; CUDA events on the GPU, so kernels that run later are timed right.
    def time_mark(self):
        return time.perf_counter()

    def seconds_between(self, start, end):
        return end - start

    # --- products, split over tinyattn's threads (backend/threads.py) ------
    def matmul(self, a, b, add=None):
        """a @ b, plus ``add`` (broadcast over the rows) when given: (n, k) @ (k, m), or stacked
        (S, ..., n, k) @ (S, ..., k, m). On the CPU the rows, or the S stacked products, are
        split over tinyattn's threads (one BLAS thread each); other shapes run as numpy's matmul."""
        stacked = a.ndim == b.ndim > 2 and a.shape[:-2] == b.shape[:-2]
        if self.xp is not np or not (a.ndim == b.ndim == 2 or stacked):
            out = self.xp.matmul(a, b)
            return out if add is None else out + add
        n = a.shape[0]                                            # rows of a, or the stack's first dim
        out = np.empty(a.shape[:-1] + b.shape[-1:], dtype=np.result_type(a, b))

        def rows(start, stop):
            np.matmul(a[start:stop], b if a.ndim == 2 else b[start:stop], out=out[start:stop])
            if add is not None:
                out[start:stop] += add

        threads.split(rows, n, work=a.size * b.shape[-1] // 32)
        return out

    def matmuls(self, pairs):
        """[a @ b for (a, b) in pairs], 2-d products, in one split over tinyattn's threads.

        The threads take the products' rows in order, each row weighted by its cost
        (k * m), so two products of equal cost on two threads run one on each, whole:
        a Linear backward's dx = g @ W beside its dW = g^T @ x. Off the CPU, one by one."""
        if self.xp is not np:
            return [self.xp.matmul(a, b) for a, b in pairs]
        outs = [np.empty((a.shape[0], b.shape[1]), dtype=np.result_type(a, b)) for a, b in pairs]
        costs = [a.shape[1] * b.shape[1] for a, b in pairs]          # of one row of each product
        firsts = np.cumsum([0] + [len(a) * c for (a, _), c in zip(pairs, costs)]).tolist()

        def units(start, stop):                                       # a row goes where its first unit is
            for (a, b), out, cost, first in zip(pairs, outs, costs, firsts):
                i, j = max(0, -((first - start) // cost)), min(len(a), -((first - stop) // cost))
                if i < j:
                    np.matmul(a[i:j], b, out=out[i:j])

        threads.split(units, firsts[-1], work=firsts[-1] // 32)
        return outs

    def sum_of_squares(self, a):
        """sum(a * a) as a 0-d array: on the CPU, BLAS's dot product of ``a`` with itself for
        float32 and float64 (no temporary; four times faster). Inside ``hold_blas``, one BLAS thread."""
        if self.xp is np and a.dtype in (float32, float64):
            flat = a.reshape(-1)
            return np.asarray(np.vdot(flat, flat))
        return self.xp.sum(a * a)

    def hold_blas(self):
        """A context in which BLAS runs on one thread, while tinyattn's threads split the work
        (the engine holds it for a whole backward pass); a no-op off the CPU."""
        return threads.hold_blas() if self.xp is np else contextlib.nullcontext()

    # --- fused kernels ---------------------------------------------------
    # An op asks its backend for a fused kernel by name, in one line:
    # ``self.backend.run_kernel("gelu_tanh", a)``. None means "no kernel here"
    # (or "not for these inputs"): the op runs its own formula. Each backend
    # registers its kernels in one table, ``kernels`` (name -> function);
    # tests/test_optable.py checks every registered kernel against the formula.
    def kernel(self, name):
        """The fused implementation of ``name`` on this device, or None."""
        return self.kernels.get(name) if self.use_kernels else None

    def run_kernel(self, name, *args):
        """``kernel(name)(*args)``, or None when there is no such kernel or it declines these inputs."""
        fn = self.kernel(name)
        return None if fn is None else fn(*args)

    @property
    def kernels(self):
        """The CPU's kernels: backend/cpu_kernels.py, compiled with numba (the ``fast`` extra).

        Imported on first use; empty without numba or with TINYATTN_CPU_KERNELS=0
        (each kernel compiles on its first call; numba caches the machine code on disk)."""
        if self._kernels is None:
            kernels = {}                            # set once, whole: threads never see a half-made table
            if os.environ.get(CPU_KERNELS_ENV, "1").strip().lower() not in ("0", "off", "false", "no"):
                try:
                    from .cpu_kernels import KERNELS
                    kernels = KERNELS
                except ImportError:                 # no numba: the ops' numpy formulas
                    pass
            self._kernels = kernels
        return self._kernels


def _erf(xp, x):
    """erf to float64 precision from array ops alone (numpy has no erf).

    |x| < 2.5: the Maclaurin series; otherwise 1 - erfc(|x|) with erfc from
    its continued fraction. Both branches are computed on clipped inputs.
    """
    ax = xp.abs(x)
    small = xp.clip(ax, 0.0, 2.5)
    term = small
    total = small
    sq = small * small
    for n in range(1, 60):                       # series: sum (-1)^n x^(2n+1) / (n! (2n+1))
        term = term * (-sq) / n
        total = total + term / (2 * n + 1)
    series = total * (2.0 / math.sqrt(math.pi))
    big = xp.clip(ax, 2.5, 30.0)
    frac = big                                   # erfc(x) = exp(-x^2)/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))
    for k in range(60, 0, -1):
        frac = big + (k / 2.0) / frac
    tail = 1.0 - xp.exp(-big * big) / (math.sqrt(math.pi) * frac)
    mag = xp.where(ax < 2.5, series, tail)
    return xp.where(x < 0, -mag, mag)


class CupyBackend(Backend):
    name = "cuda"
    on_host = False
    has_nccl = True
    clock = "CUDA events"

    def __init__(self):
        import cupy
        import cupyx.scipy.special
        self.xp = cupy
        self._erf = cupyx.scipy.special.erf
        self.use_kernels = os.environ.get("TINYATTN_FUSED", "1") != "0"
        self._kernels = None
        self.seed(0)

    def asarray(self, data, dtype=None):
        return self.xp.asarray(data, dtype=None if dtype is None else np.dtype(dtype))

    def to_numpy(self, a):
        return self.xp.asnumpy(a)

    def is_array(self, a):
        return isinstance(a, self.xp.ndarray)

    def index_add(self, target, index, values):
        self.xp.add.at(target, index, values)
        return target

    def seed(self, seed):
        self.rng = self.xp.random.default_rng(seed)

    def uniform(self, shape, dtype):
        return self.rng.random(shape, dtype=np.dtype(dtype))

    def normal(self, shape, dtype):
        return self.rng.standard_normal(shape, dtype=np.dtype(dtype))

    def get_rng_state(self):
        return None   # CuPy's generator state is not exported; resume re-seeds it

    def set_rng_state(self, state):
        pass

    def erf(self, x):
        return self._erf(x)

    def synchronize(self):
        self.xp.cuda.get_current_stream().synchronize()

    def time_mark(self):
        event = self.xp.cuda.Event()
        event.record()
        return event

    def seconds_between(self, start, end):
        end.synchronize()
        return self.xp.cuda.get_elapsed_time(start, end) / 1e3

    # --- for tinyattn.distributed: NCCL on the stream the ops run on ---
    def nccl(self):
        """CuPy's binding of NCCL (``cupy.cuda.nccl``)."""
        try:
            from cupy.cuda import nccl
        except ImportError as e:
            raise RuntimeError(f"CuPy found no NCCL library, which --device cuda needs over several "
                               f"processes: see CuPy's installation guide on NCCL ({e})") from None
        return nccl

    def stream_ptr(self):
        """The current CUDA stream, as NCCL takes it: collectives queue behind the ops before them."""
        return self.xp.cuda.get_current_stream().ptr

    # --- fused kernels (backend/cuda_kernels.py), on unless TINYATTN_FUSED=0 ---
    @property
    def kernels(self):
        """cuda_kernels.KERNELS, imported on first use (compiling happens per kernel, on first call)."""
        if self._kernels is None:
            from .cuda_kernels import KERNELS
            self._kernels = KERNELS
        return self._kernels


class StrictBackend(Backend):
    """array_api_strict on ``Device("device1")``: behaves like a GPU library.

    Implicit conversion to numpy raises, arrays from two devices do not mix,
    and only array-API names exist. Fancy indexing beyond the standard is
    emulated with linear indices, computed on the host from explicit copies.
    """

    name = "strict"
    on_host = False
    ufunc_out = False
    setitem_basic = False
    kernels = {}            # its own table (none yet), not the CPU's

    def __init__(self):
        import array_api_strict
        self.xp = array_api_strict
        self.device = array_api_strict.Device("device1")
        self._array_type = type(array_api_strict.asarray(0))
        self._to_np = {getattr(array_api_strict, n): np.dtype(n) for n in DTYPES if hasattr(array_api_strict, n)}
        self._from_np = {v: k for k, v in self._to_np.items()}
        self.seed(0)

    def asarray(self, data, dtype=None):
        data = np.asarray(data, dtype=None if dtype is None else np.dtype(dtype))
        return self.xp.asarray(data, device=self.device)

    def to_numpy(self, a):
        return np.asarray(a.to_device(self.xp.Device("CPU_DEVICE")))

    def copy(self, a):
        return self.xp.asarray(a, copy=True)

    def native_dtype(self, dtype):
        return self._from_np[np.dtype(dtype)]

    def dtype_of(self, a):
        return self._to_np[a.dtype]

    def full(self, shape, value, dtype):
        return self.xp.full(shape, value, dtype=self.native_dtype(dtype), device=self.device)

    def arange(self, n):
        return self.xp.arange(n, device=self.device)

    def is_array(self, a):
        return isinstance(a, self._array_type)

    def _linear_index(self, shape, index):
        """Where ``a[index]`` reads, as flat positions (a host computation)."""
        if not isinstance(index, tuple):
            index = (index,)
        host = tuple(self.to_numpy(i) if self.is_array(i) else i for i in index)
        lin = np.arange(math.prod(shape)).reshape(shape)[host]
        return self.xp.asarray(lin, device=self.device)

    def getitem(self, a, index):
        lin = self._linear_index(a.shape, index)
        flat = self.xp.take(self.xp.reshape(a, (-1,)), self.xp.reshape(lin, (-1,)))
        return self.xp.reshape(flat, lin.shape)

    def index_add(self, target, index, values):
        lin = self._linear_index(target.shape, index)
        vals = self.xp.reshape(self.xp.broadcast_to(values, lin.shape), (-1, 1))
        total = self.index_add_rows(math.prod(target.shape), self.xp.reshape(lin, (-1,)), vals)
        return target + self.xp.reshape(total, target.shape)

    def uniform(self, shape, dtype):
        return self.asarray(self.rng.random(shape, dtype=np.dtype(dtype)))

    def normal(self, shape, dtype):
        return self.asarray(self.rng.standard_normal(shape, dtype=np.dtype(dtype)))


# --------------------------------------------------------------------------
# the host allocator
# --------------------------------------------------------------------------
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

    Called once, when this module is imported (``import tinyattn`` does). It
    does nothing where the C library is not glibc, when the environment
    already sets glibc's malloc thresholds (``MALLOC_MMAP_THRESHOLD_``,
    ``MALLOC_TRIM_THRESHOLD_`` or ``glibc.malloc`` tunables: the user's
    choice wins), or when ``TINYATTN_HOST_ALLOCATOR=0``. Returns what it did,
    in words (also kept in ``tinyattn.backend.host_allocator``).
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


_BACKENDS = {}


def get_backend(device="cpu"):
    """The backend for a device name: "cpu", "cuda" (or "cuda:0") or "strict"."""
    device = str(device)
    if device.startswith("cuda"):
        device = "cuda"
    if device not in _BACKENDS:
        if device == "cpu":
            _BACKENDS[device] = Backend()
        elif device == "cuda":
            _BACKENDS[device] = _make_cuda()
        elif device == "strict":
            try:
                _BACKENDS[device] = StrictBackend()
            except ImportError:
                raise RuntimeError('device "strict" needs array_api_strict: pip install array-api-strict') from None
        else:
            raise ValueError(f'unknown device {device!r}: use "cpu" or "cuda"')
    return _BACKENDS[device]


CUDA_HINT = ('device "cuda" needs CuPy and an NVIDIA GPU: pip install "tinyattn[gpu]" '
             '(CUDA 12), or pip install cupy-cuda13x for CUDA 13')


def _make_cuda():
    try:
        backend = CupyBackend()
        backend.xp.cuda.runtime.getDeviceCount()
    except Exception as e:  # ImportError, or CUDA present in name only
        raise RuntimeError(f"{CUDA_HINT} ({type(e).__name__}: {e})") from None
    return backend


def use_cuda_device(index):
    """Make GPU ``index`` this process's device (one GPU per process, as under mpiexec).

    It must come before the first CUDA array: the "cuda" backend stays on the GPU it was made on."""
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        raise RuntimeError(f"{CUDA_HINT} ({type(e).__name__}: {e})") from None
    if index >= count:
        raise RuntimeError(f"GPU {index} was asked for, but this machine has {count}: "
                           f"start at most {count} processes per machine with --device cuda")
    if "cuda" in _BACKENDS and cupy.cuda.runtime.getDevice() != index:
        raise RuntimeError("the GPU of a process is chosen before its first CUDA tensor: "
                           "call tinyattn.distributed.init(device=\"cuda\") first")
    cupy.cuda.Device(index).use()


def uses_nccl(device):
    """True for a device whose processes talk through NCCL (each takes a GPU of its own)."""
    return str(device).startswith("cuda")


def is_device(name):
    """True for a device name that ``get_backend`` knows: "cpu", "cuda", "cuda:N" or "strict"."""
    return name in ("cpu", "strict") or name.startswith("cuda")


def seed_all(seed):
    """Seed the host generator and every device's generator made so far."""
    get_backend("cpu")
    for backend in _BACKENDS.values():
        backend.seed(seed)


def host_rng(seed=None):
    """The host's numpy Generator (seeded by ``ta.manual_seed``): for sampling and init on the host.
    With ``seed`` (an int or a tuple of ints), a new Generator of its own, seeded by it."""
    return get_backend("cpu").rng if seed is None else np.random.default_rng(seed)


def cuda_is_available():
    try:
        get_backend("cuda")
        return True
    except RuntimeError:
        return False


tune_host_allocator()
