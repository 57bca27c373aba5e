"""Array backends: the only place that imports numpy or cupy by name.

A backend holds the array namespace ``xp`` for one device and the few things
that differ between devices: moving data to and from the host, scatter-add,
random numbers, ``erf``, synchronisation. ``Backend`` is the portable base,
written with the array API alone; ``NumpyBackend``, ``CupyBackend`` and
``StrictBackend`` fill in what differs. What differs is told by capability
flags (``on_host``, ``setitem_basic``), never by comparing device names. The
fast layer (``tinyattn/fast``) adds its fast ops and fused kernels to each
backend through ``on_every_backend``. Everything above this module
writes ``xp.exp(...)`` with the array-API names that numpy 2, CuPy 14 and
array_api_strict share (``concat``, ``permute_dims``, ``astype``, ...).

Devices:
    "cpu"     numpy
    "cuda"    CuPy (pip install "tinyattn[gpu]")
    "strict"  array_api_strict on a non-CPU device: a test stand-in for a GPU
              that refuses implicit conversion to host arrays, as CuPy does.
"""
import math
import operator
import os
import time

import numpy as np


DTYPES = ("float16", "float32", "float64", "int32", "int64", "bool")
float16, float32, float64 = np.dtype("float16"), np.dtype("float32"), np.dtype("float64")
int32, int64, bool_ = np.dtype("int32"), np.dtype("int64"), np.dtype("bool")


def dtype_of_host(dtype):
    """A dtype from a name ("float32"), a numpy dtype or a numpy scalar type."""
    try:
        return np.dtype(dtype)
    except TypeError:
        raise TypeError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}") from None


_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2}     # PyTorch's categories: bool < integer < float


def category(dtype):
    """0 for bool, 1 for integers, 2 for floats: PyTorch's promotion categories."""
    return _CATEGORY[np.dtype(dtype).kind]


def promote_types(a, b):
    """PyTorch's promotion of two dtypes: a higher category wins whole (int64 with float32 is
    float32, not numpy's float64); within one category the wider wins (float32 with float64)."""
    a, b = np.dtype(a), np.dtype(b)
    ca, cb = _CATEGORY[a.kind], _CATEGORY[b.kind]
    if ca != cb:
        return a if ca > cb else b
    return np.promote_types(a, b)


class Backend:
    """What every device does the same way, through its array namespace ``xp`` (the array API).

    The devices below (numpy, CuPy, the stand-in) fill in what differs: making
    and copying arrays, scatter-add, random numbers. Capability flags say what
    a device can do (``on_host``, ``ufunc_out``, ``setitem_basic``, ``has_nccl``),
    so nothing above this module compares device names.

    The fused kernels (``kernels``) belong to the fast layer (``tinyattn/fast``),
    which loads them on first use; its fast ops ask for them, in a compiled call.
    """

    name = None
    on_host = False         # arrays live in host memory: reading a value back costs nothing
    ufunc_out = False       # elementwise functions take out= (write into an existing array)
    setitem_basic = False   # a[index] = v works for basic indices (ints, slices, None, Ellipsis)
    has_nccl = False        # its arrays can go through NCCL's collectives (tinyattn.distributed)
    clock = "host clock"    # what ta.profile times ops with (time_mark, seconds_between)
    use_kernels = True      # False: the fast ops decline every kernel (to compare them with the formulas)
    load_kernels = None     # () -> {name: kernel}: set by the fast layer, called on first use
    array_type = None       # the class of this device's arrays (is_array says yes to its subclasses too)
    _kernels = None

    # --- data in and out -------------------------------------------------
    def native_dtype(self, dtype):
        return np.dtype(dtype)

    # The numpy dtype that describes this backend's array ``a``: numpy's and CuPy's arrays carry
    # one already, ``a.dtype`` (read by C code: Tensor.dtype asks for it on every op).
    dtype_of = staticmethod(operator.attrgetter("dtype"))

    def zeros(self, shape, dtype):
        return self.full(shape, 0, dtype)

    def full(self, shape, value, dtype):
        return self.xp.full(shape, value, dtype=self.native_dtype(dtype))

    def arange(self, n):
        return self.xp.arange(n)

    def copy(self, a):
        """A new array with ``a``'s values, on this device."""
        return self.xp.asarray(a, copy=True)

    def read_only(self, a):
        """A view of ``a`` that refuses writes, where the device has one; else ``a`` itself."""
        return a

    def write(self, a, values):
        """``a[...] = values``, in place, so that every view of ``a`` (and the array it views) sees
        them. A ValueError where that cannot be done: ``a`` is read-only, or a broadcast view
        whose elements share one place in memory (a stride of 0 over a dim longer than 1)."""
        strides = getattr(a, "strides", None) or ()
        if any(s == 0 and n > 1 for s, n in zip(strides, a.shape)):
            raise ValueError("several elements share one place in memory")
        a[...] = values

    def strides(self, a):
        """How many elements apart the neighbours along each dim lie in memory (numpy's and CuPy's
        ``strides`` are in bytes); None where the device does not say (array_api_strict)."""
        steps = getattr(a, "strides", None)
        return None if steps is None else tuple(s // a.itemsize for s in steps)

    def is_view(self, a):
        """Whether ``a`` looks into another array's memory (a slice, a reshape, a transpose)."""
        return getattr(a, "base", None) is not None

    # --- indexing --------------------------------------------------------
    def getitem(self, a, index):
        return a[index]

    def index_add_rows(self, n_rows, idx, values):
        """(n_rows, C) zeros with out[idx[i]] += values[i] for 1-d int ``idx`` and (N, C) ``values``:
        a scatter-add (repeated ids add up)."""
        out = self.zeros((n_rows,) + tuple(values.shape[1:]), self.dtype_of(values))
        return self.index_add(out, idx, values)

    def argsort(self, a, axis):
        """The indices that sort ``a`` along ``axis``, ascending (NaN last); equal values keep
        their order (a stable sort)."""
        return self.xp.argsort(a, axis=axis, stable=True)

    # --- special functions, reductions and sync -----------------------------
    def erf(self, x):
        return _erf(self.xp, x)

    def sum_of_squares(self, a):
        """sum(a * a), as a 0-d array."""
        return self.xp.sum(a * a)

    def synchronize(self):
        pass

    # timing for ta.profile: a mark now, and the seconds between two marks. The host
    # clock here; CUDA events on the GPU, so kernels that run later are timed right.
    def time_mark(self):
        return time.perf_counter()

    def seconds_between(self, start, end):
        return end - start

    # --- the fast layer's fused kernels ------------------------------------
    def kernel(self, name):
        """The fused kernel ``name`` on this device, or None (none here, or use_kernels is off)."""
        return self.kernels.get(name) if self.use_kernels else None

    def run_kernel(self, name, *args):
        """``kernel(name)(*args)``, or None when there is no such kernel or it declines these inputs."""
        fn = (self._kernels or self.kernels).get(name) if self.use_kernels else None    # (kernel(name), inlined)
        return None if fn is None else fn(*args)

    @property
    def kernels(self):
        """{name: kernel}, loaded on first use by the fast layer's loader (empty without one)."""
        if self._kernels is None:
            self._kernels = self.load_kernels() if self.load_kernels is not None else {}
        return self._kernels


class NumpyBackend(Backend):
    """numpy on the CPU."""

    name = "cpu"
    on_host = True
    ufunc_out = True
    setitem_basic = True

    array_type = np.ndarray

    def __init__(self):
        self.xp = np
        self.seed(0)

    def asarray(self, data, dtype=None):
        """Host data (lists, numpy arrays, scalars) -> a new array on this device (a copy)."""
        return np.array(data, dtype=None if dtype is None else np.dtype(dtype))

    def to_numpy(self, a):
        """An explicit copy to the host: the only way data leaves a device."""
        return a

    def copy(self, a):
        return a.copy()

    def read_only(self, a):
        if not isinstance(a, np.ndarray):                       # a numpy scalar: it cannot be written
            return a
        view = a.view()
        view.flags.writeable = False
        return view

    def is_array(self, a):
        return isinstance(a, np.ndarray)   # (np.memmap too)

    def index_add(self, target, index, values):
        """target[index] += values, counting repeated indices (never ``x[idx] += v``)."""
        np.add.at(target, index, values)
        return target

    def sum_of_squares(self, a):
        """BLAS's dot product of ``a`` with itself for float32 and float64: no a * a temporary."""
        if a.dtype in (float32, float64):
            flat = a.reshape(-1)
            return np.asarray(np.vdot(flat, flat))
        return np.sum(a * a)

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
    """CuPy on an NVIDIA GPU."""

    name = "cuda"
    ufunc_out = True
    setitem_basic = True
    has_nccl = True
    clock = "CUDA events"

    def __init__(self):
        import cupy
        import cupyx.scipy.special
        self.xp = cupy
        self.array_type = cupy.ndarray
        self._erf = cupyx.scipy.special.erf
        self.seed(0)

    def asarray(self, data, dtype=None):
        return self.xp.asarray(data, dtype=None if dtype is None else np.dtype(dtype))

    def to_numpy(self, a):
        return self.xp.asnumpy(a)

    def copy(self, a):
        return a.copy()

    def is_array(self, a):
        return isinstance(a, self.xp.ndarray)

    def index_add(self, target, index, values):
        self.xp.add.at(target, index, values)
        return target

    def argsort(self, a, axis):
        return self.xp.argsort(a, axis=axis)            # (CuPy's sort is always stable; it takes no stable=)

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


class StrictBackend(Backend):
    """array_api_strict on ``Device("device1")``: behaves like a GPU library.

    Implicit conversion to numpy raises, arrays from two devices do not mix,
    and only array-API names exist. Fancy indexing beyond the standard is
    emulated with linear indices, computed on the host from explicit copies.
    """

    name = "strict"

    def __init__(self):
        import array_api_strict
        self.xp = array_api_strict
        self.device = array_api_strict.Device("device1")
        self.array_type = type(array_api_strict.asarray(0))
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
        return isinstance(a, self.array_type)

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

    def index_add_rows(self, n_rows, idx, values):
        """The scatter-add as a one-hot product (V, N) @ (N, C): the array API has no add.at."""
        onehot = idx[None, :] == self.arange(n_rows)[:, None]               # (V, N)
        return self.xp.astype(onehot, values.dtype) @ values                # (V, C)

    # --- random numbers: from a host generator, copied to the device ------
    def seed(self, seed):
        self.rng = np.random.default_rng(seed)

    def uniform(self, shape, dtype):
        return self.asarray(self.rng.random(shape, dtype=np.dtype(dtype)))

    def normal(self, shape, dtype):
        return self.asarray(self.rng.standard_normal(shape, dtype=np.dtype(dtype)))

    def get_rng_state(self):
        return self.rng.bit_generator.state

    def set_rng_state(self, state):
        self.rng.bit_generator.state = state


_BACKENDS = {}
_setups = []          # functions called on every backend, made or to be made (the fast layer's)


def made_backends():
    """The backends made so far."""
    return list(_BACKENDS.values())


def on_every_backend(setup):
    """Call ``setup(backend)`` on each backend made so far, and on each one made later."""
    _setups.append(setup)
    for backend in _BACKENDS.values():
        setup(backend)


def get_backend(device="cpu"):
    """The backend for a device name: "cpu", "cuda" (or "cuda:0") or "strict"."""
    device = str(device)
    if device.startswith("cuda"):
        device = "cuda"
    if device not in _BACKENDS:
        if device == "cpu":
            backend = NumpyBackend()
        elif device == "cuda":
            backend = _make_cuda()
        elif device == "strict":
            try:
                backend = StrictBackend()
            except ImportError:
                raise RuntimeError('device "strict" needs array_api_strict: pip install array-api-strict') from None
        else:
            raise ValueError(f'unknown device {device!r}: use "cpu" or "cuda"')
        for setup in _setups:
            setup(backend)
        _BACKENDS[device] = backend
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


