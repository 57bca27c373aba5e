"""tinyattn's own threads on the CPU: one op's rows split over the cores (the fast layer).

numpy runs every pass on the calling thread, except BLAS: OpenBLAS splits a
large product over its own threads, which then spin for about 0.1 s waiting
for more work. So in a numpy training step the matmuls use every core, the
other passes (GELU, softmax, layer norm, the stacked attention products) use
one, and whatever runs on the other cores right after a product competes
with OpenBLAS's spinning threads. PyTorch does it the other way round: each
op splits its own work over one thread pool, and runs BLAS on one thread
inside it. That is what ``split`` does here:

    split(lambda start, stop: work(rows start:stop), n_rows, work=...)

runs ``work`` on ``get_num_threads()`` parts of the rows at once: the calling
thread takes the first part, the pool's threads the others (numpy and the
compiled kernels release the GIL, so they run in parallel). From the first
op of ``FLOOR`` or more on, BLAS stays at one thread (threadpoolctl; ``hold_blas``), so no
OpenBLAS thread spins beside the pool: numpy products of your own then run
on one thread too. (The fused block's whole-batch products get every thread
for their call: ``blas_threads``.) ``ta.set_num_threads(1)`` gives BLAS back
its own setting. (Changing BLAS's thread count around every op instead made
the pool's products slower: docs/benchmarks.md.)

Off (every op on the calling thread, BLAS as it is) with one core, without
threadpoolctl (the ``fast`` extra), after ``set_num_threads(1)``, or with
``TINYATTN_NUM_THREADS=1``. Small ops never split: handing a part to a pool
thread and getting it back costs from a few microseconds (bare metal) to
about 50 (some VMs), so the first split measures that and the time a unit
of work takes, and ops run on the pool from ``MIN_WORK`` on (measure_min_work).

The same numbers on every run. A measurement differs from one process to the
next, so it may decide who computes an op, never what is computed. Some ops
compute other numbers when their rows are cut in parts: a matrix product (BLAS
picks its kernel, and so the order of its sums, by the number of rows it is
given) and an op that sums over rows part by part (layer norm's weight
gradient, the loss, the fused block's weight gradients). These ask for
``same_parts``: from ``FLOOR`` on, a fixed number that no measurement moves,
they always run in the same ``get_num_threads()`` parts, on the pool's threads
from MIN_WORK on, else one after another on the calling thread; below FLOOR,
whole. The other ops (row by row, element by element) give the same numbers
whole or in parts, and run whole below MIN_WORK. So a run's numbers depend on
its inputs and the thread count alone: ``TINYATTN_NUM_THREADS`` may change them,
how busy the machine is may not.
"""
import contextlib
import math
import os
import queue
import statistics
import threading
import time
import warnings

import numpy as np

from . import denormals, layouts

NUM_THREADS_ENV = "TINYATTN_NUM_THREADS"
# Work is counted in elements an op touches, or a product's n*k*m / 32. Below FLOOR an op runs whole
# on the calling thread, on every machine; from FLOOR on, an op whose numbers depend on its parts
# runs in get_num_threads() parts (see above). An op runs on the pool's threads from MIN_WORK on:
# measured on this machine at the first split (measure_min_work), never below FLOOR.
MIN_WORK = None
FLOOR = 1 << 14


def cpu_count():
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                                         # not on Linux
        return os.cpu_count() or 1


def _default_threads():
    """TINYATTN_NUM_THREADS, else OMP_NUM_THREADS (as PyTorch reads it; ``mpiexec`` runs of
    ``python -m train`` set it to cores / processes), else the cores. A bad value is warned
    about and passed over."""
    for name in (NUM_THREADS_ENV, "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value:
            try:
                return max(1, int(value))
            except ValueError:
                warnings.warn(f"{name} must be a whole number, got {value!r}: ignored", RuntimeWarning, stacklevel=2)
    return cpu_count()


_num_threads = _default_threads()


def get_num_threads():
    """How many threads tinyattn's CPU ops use (``set_num_threads``; see _default_threads)."""
    return _num_threads


def _split_threads():
    """The threads an op splits over: get_num_threads(), or 1 without threadpoolctl (BLAS could
    not be held at one thread, and its threads would fight the pool's)."""
    return _num_threads if blas_controllers() else 1


def set_num_threads(n):
    """Split the CPU ops' work over ``n`` threads (the calling one and n - 1 of the pool); 1 turns it off
    and gives BLAS back its own threads."""
    global _num_threads
    if int(n) < 1:
        raise ValueError(f"set_num_threads: n must be at least 1, got {n}")
    _num_threads = int(n)
    if _num_threads == 1:
        release_blas()


# ---------------------------------------------------------------- BLAS at one thread
_blas = None                # threadpoolctl's controllers of the loaded BLAS libraries; () without threadpoolctl
_hold = threading.Lock()
_saved = []                 # (controller, its thread count before hold_blas), while BLAS is held


def blas_controllers():
    global _blas
    if _blas is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            _blas = ()
        else:
            _blas = tuple(ThreadpoolController().select(user_api="blas").lib_controllers)
    return _blas


def hold_blas():
    """BLAS on one thread from now on (tinyattn's threads split the work), once; release_blas undoes it."""
    if _saved or not blas_controllers():
        return
    with _hold:
        if not _saved:
            for lib in blas_controllers():
                _saved.append((lib, lib.get_num_threads()))
                lib.set_num_threads(1)


def release_blas():
    """BLAS back to the thread count it had before hold_blas."""
    with _hold:
        while _saved:
            lib, before = _saved.pop()
            lib.set_num_threads(before)


def blas_held():
    return bool(_saved)


@contextlib.contextmanager
def blas_threads():
    """BLAS on get_num_threads() threads inside, for one large product on the calling thread while
    the pool waits (the fused block's whole-batch products, cpu_block.py); back to one thread after.
    Nothing changes where BLAS is not held at one thread."""
    if not _saved:
        yield
        return
    libs = [lib for lib, _ in _saved]
    for lib in libs:
        lib.set_num_threads(_num_threads)
    try:
        yield
    finally:
        for lib in libs:
            lib.set_num_threads(1)


_warned = False                      # the warning below is given once per process


def warn_without_threadpoolctl(n_items, n_threads):
    """Say once that heads that would be shared over ``n_threads`` threads run in order, for want
    of threadpoolctl."""
    global _warned
    if not _warned and not blas_controllers() and n_threads > 1:
        _warned = True
        warnings.warn(f"tinyattn: tiled attention runs its {n_items} heads one after another, because "
                      "threadpoolctl is not installed (it holds BLAS at one thread while the heads share "
                      "the cores), which can be many times slower. "
                      "pip install threadpoolctl (or tinyattn[fast])", RuntimeWarning, stacklevel=4)


_woken = threading.local()


def wake_blas():
    """Run one (512, 64) x (64, 512) float32 product, once in each thread that uses BLAS here.

    Some OpenBLAS builds run smaller one-thread products ((256, 256) x (256, 64))
    several times slower in a thread that has not yet run one product of about
    this size, however many it runs (docs/benchmarks.md, "What the fast layer's
    choices rest on"). The pool's threads, and tiled attention's, would only ever
    run such products. It costs about a millisecond per thread, once.
    """
    if not getattr(_woken, "done", False):
        _woken.done = True
        np.ones((512, 64), np.float32) @ np.ones((64, 512), np.float32)


# ---------------------------------------------------------------- the pool
class _Pool:
    """n - 1 threads, each waiting on its own queue for one (fn, start, stop) at a time."""

    def __init__(self, n):
        self.size = n
        self.lock = threading.Lock()               # one split at a time; another (or a nested one) runs inline
        self.done = queue.SimpleQueue()
        self.tasks = [queue.SimpleQueue() for _ in range(n - 1)]
        for i, tasks in enumerate(self.tasks):
            threading.Thread(target=self._serve, args=(tasks,), name=f"tinyattn-cpu-{i + 1}", daemon=True).start()

    def _serve(self, tasks):
        while True:
            idle = time.perf_counter()
            fn, start, stop = tasks.get()
            clock = timers                         # (None unless a breakdown is measuring)
            if clock is not None:
                clock.add("idle", time.perf_counter() - idle)
            try:
                denormals.follow()                 # ta.set_flush_denormal's mode, if it changed
                wake_blas()
                work = time.perf_counter()
                fn(start, stop)
                if clock is not None:
                    clock.add("work", time.perf_counter() - work)
                self.done.put(None)
            except BaseException as e:             # handed to the caller, which raises it
                self.done.put(e)

    def run(self, fn, bounds):
        """fn(start, stop) for each pair in ``bounds``: the first here, the others on the pool."""
        for tasks, (start, stop) in zip(self.tasks, bounds[1:]):
            tasks.put((fn, start, stop))
        error = None
        try:
            wake_blas()
            fn(*bounds[0])
        except BaseException as e:
            error = e
        waiting, clock = time.perf_counter(), timers
        for _ in bounds[1:]:                       # wait for every part, even after an error
            e = self.done.get()
            error = error or e
        if clock is not None:
            clock.add("waiting", time.perf_counter() - waiting)
        if error is not None:
            raise error


_pool = None


def _forget_pool():
    global _pool, _hold
    _pool, _hold = None, threading.Lock()
    _saved.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)      # a forked child has none of the parent's threads


def parts(n, k):
    """``n`` rows in ``k`` nearly equal (start, stop) parts."""
    return [(i * n // k, (i + 1) * n // k) for i in range(k)]


def too_small(work):
    """True for work that runs whole on the calling thread (below MIN_WORK; before it is measured,
    below FLOOR). Only for ops whose numbers do not depend on their parts: see ``split``."""
    return work < (FLOOR if MIN_WORK is None else MIN_WORK)


def split(fn, n, work, n_threads=None, same_parts=False):
    """``fn(start, stop)`` over rows 0..n, in get_num_threads() (or ``n_threads``) parts on the pool's
    threads when ``work`` is at least MIN_WORK, with BLAS held at one thread; else one call, ``fn(0, n)``.
    ``work=math.inf`` always splits (where there are threads).

    same_parts=True: fn's numbers depend on where the rows are cut (a product, a sum over rows
    added part by part). Then from FLOOR on it always runs in those parts, in order on the calling
    thread where the pool does not take them (below MIN_WORK, or the pool busy), so the numbers
    are the same whatever MIN_WORK was measured to be."""
    global _pool
    if work < FLOOR:
        fn(0, n)
        return
    k = min(_split_threads() if n_threads is None else (n_threads if blas_controllers() else 1), n)
    if k < 2:
        fn(0, n)
        return
    hold_blas()                                    # (from the first op of FLOOR or more: no measurement moves it)
    bounds = parts(n, k)

    def without_the_pool():
        if same_parts:
            for start, stop in bounds:
                fn(start, stop)
        else:
            fn(0, n)

    if MIN_WORK is not None and work < MIN_WORK:
        without_the_pool()
        return
    if _pool is None or _pool.size < k:
        _pool = _Pool(k)
    pool = _pool
    if not pool.lock.acquire(blocking=False):      # in use by another thread, or called from inside a part
        without_the_pool()
        return
    try:
        if MIN_WORK is None:
            measure_min_work(pool)
        if work < MIN_WORK:
            without_the_pool()
        else:
            pool.run(fn, bounds)
    finally:
        pool.lock.release()


def measure_min_work(pool):
    """Set MIN_WORK for this machine: splitting an op saves about half its one-thread time and
    costs a round trip to a pool thread, so an op splits when half its time is more than that:
    work >= 2 * round trip / (time per unit of work). Both are measured here (a few ms, once):
    the round trip as the median of empty splits, a unit as a one-thread float32 product's time
    over its work (n*k*m / 32). Returns the measurements."""
    global MIN_WORK
    trips = []
    for _ in range(21):
        start = time.perf_counter()
        pool.run(lambda i, j: None, parts(pool.size, pool.size))
        trips.append(time.perf_counter() - start)
    a, b = np.ones((64, 256), np.float32), np.ones((256, 256), np.float32)
    times = []
    for _ in range(7):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    trip, unit = statistics.median(trips), min(times) / (64 * 256 * 256 // 32)
    MIN_WORK = max(FLOOR, int(2 * trip / unit))
    return {"round_trip_us": round(trip * 1e6, 1), "ns_per_unit": round(unit * 1e9, 3), "min_work": MIN_WORK}


# ---------------------------------------------------------------- products, per backend
class Products:
    """The matrix products the fast ops ask for, on one backend (``backend.products``, set by the
    fast layer): the backend's own matmul. The CPU's variant, CpuProducts, splits them over
    tinyattn's threads."""

    def __init__(self, xp):
        self.xp = xp

    def matmul(self, a, b, add=None):
        """a @ b, plus ``add`` (broadcast over the rows) when given."""
        out = self.xp.matmul(a, b)
        return out if add is None else out + add

    def matmuls(self, pairs):
        """[a @ b for (a, b) in pairs]."""
        return [self.xp.matmul(a, b) for a, b in pairs]

    def linear(self, x2, weight, bias=None):
        """x2 (N, in) @ weight^T (weight (out, in)) + bias."""
        return self.matmul(x2, self.xp.permute_dims(weight, (1, 0)), add=bias)


class CpuProducts(Products):
    """numpy's products: the rows of (n, k) @ (k, m), or the S products of a stack (S, ..., n, k) @
    (S, ..., k, m), split over the threads, one BLAS thread each; other shapes as numpy's matmul.
    A 2-d product's rows always run in the same parts from FLOOR on (``split``'s same_parts: BLAS
    may sum a row in another order when it is given fewer rows); a stack's products are each one
    BLAS call either way."""

    def matmul(self, a, b, add=None):
        if a.ndim == b.ndim == 2 and a.size * b.shape[1] // 32 < FLOOR:   # one part on every machine:
            out = a.dot(b)                                    # dot skips matmul's dispatch (1 us of 1.4 at 4 x 4)
            if add is not None:
                out += add
            return out
        stacked = a.ndim == b.ndim > 2 and a.shape[:-2] == b.shape[:-2]
        if not (a.ndim == b.ndim == 2 or stacked):
            return super().matmul(a, b, add)
        out = np.empty(a.shape[:-1] + b.shape[-1:], dtype=np.result_type(a, b))

        def rows(start, stop):                                # rows of a, or the stack's first dim
            np.matmul(a[start:stop], b if a.ndim == 2 else b[start:stop], out=out[start:stop])
            if add is not None:
                out[start:stop] += add

        split(rows, a.shape[0], work=a.size * b.shape[-1] // 32, same_parts=a.ndim == 2)
        return out

    def matmuls(self, pairs):
        """2-d products in one split. The threads take the products' rows in order, each row weighted
        by its cost (k * m), so two products of equal cost on two threads run one on each, whole:
        a Linear backward's dx = g @ W beside its dW = g^T @ x."""
        outs = [np.empty((a.shape[0], b.shape[1]), dtype=np.result_type(a, b)) for a, b in pairs]
        costs = [a.shape[1] * b.shape[1] for a, b in pairs]          # of one row of each product
        firsts = np.cumsum([0] + [len(a) * c for (a, _), c in zip(pairs, costs)]).tolist()

        def units(start, stop):                                       # a row goes where its first unit is
            for (a, b), out, cost, first in zip(pairs, outs, costs, firsts):
                i, j = max(0, -((first - start) // cost)), min(len(a), -((first - stop) // cost))
                if i < j:
                    np.matmul(a[i:j], b, out=out[i:j])

        split(units, firsts[-1], work=firsts[-1] // 32, same_parts=True)
        return outs

    def linear(self, x2, weight, bias=None):
        """W^T as layouts.py lays it out (a contiguous copy inside ta.inference_mode)."""
        return self.matmul(x2, layouts.transposed(weight, len(x2)), add=bias)


def joined(arrays, shape, dim):
    """The numpy array of ``shape`` whose consecutive slices along ``dim`` the ``arrays`` are,
    exactly (views of one buffer that they fill, in order, with the same strides): their concat
    without a copy. It may be a strided view (q, k and v cut from a transposed qkv product give
    the transposed product). None when they are anything else."""
    first = arrays[0]
    base = first.base if isinstance(first, np.ndarray) else None
    if not isinstance(base, np.ndarray) or base.size != math.prod(shape) or not base.flags.c_contiguous \
            or any(step == 0 and n > 1 for step, n in zip(first.strides, first.shape)):   # (broadcast: no)
        return None
    try:                                                    # the whole, laid out as the first piece
        whole = np.ndarray(shape, first.dtype, buffer=base, offset=first.ctypes.data - base.ctypes.data,
                           strides=first.strides)
    except (ValueError, TypeError):                         # it would reach outside the buffer
        return None
    start, lead = 0, (slice(None),) * dim
    for a in arrays:
        piece = whole[lead + (slice(start, start + a.shape[dim]),)]
        if a.base is not base or a.dtype != piece.dtype or a.shape != piece.shape \
                or a.strides != piece.strides or a.ctypes.data != piece.ctypes.data:
            return None
        start += a.shape[dim]
    return whole if start == shape[dim] else None


# ---------------------------------------------------------------- timers, for bench/bench_breakdown.py
timers = None
"""A Timers while a breakdown of a step is being measured (bench/bench_breakdown.py); None (nothing
timed, and nothing to pay but a check) otherwise."""


class Timers:
    """Seconds per (thread name, category). The pool adds each thread's "idle" (waiting for a part),
    "work" (running one) and the calling thread's "waiting" (for the pool's parts); the block's
    kernels add their stages through lap clocks (``laps``)."""

    def __init__(self):
        self.seconds = {}
        self._lock = threading.Lock()

    def add(self, category, seconds):
        key = (threading.current_thread().name, category)
        with self._lock:
            self.seconds[key] = self.seconds.get(key, 0.0) + seconds

    def lap_clock(self):
        last = time.perf_counter()

        def lap(category):                         # the time since the last lap goes to ``category``
            nonlocal last
            now = time.perf_counter()
            self.add(category, now - last)
            last = now
        return lap


def _no_lap(category):
    pass


def laps():
    """A lap clock for a piece of work on this thread: ``lap = laps()`` first, then ``lap("products")``
    after each stage adds the stage's time to that category. Does nothing unless ``timers`` is set."""
    return _no_lap if timers is None else timers.lap_clock()
