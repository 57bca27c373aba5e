"""tinyattn's own threads on the CPU: one op's rows split over the cores.

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
compiled kernels release the GIL, so they run in parallel). While it runs,
BLAS is held at one thread (threadpoolctl; ``hold_blas``). A Module's forward
and the engine's backward pass hold it from start to end, so no OpenBLAS
thread spins beside the pool. BLAS goes back to its own setting afterwards:
numpy code of yours outside tinyattn's ops runs as it did.

Off (every op on the calling thread, BLAS as it is) with one core, without
threadpoolctl (the ``fast`` extra), after ``set_num_threads(1)``, or with
``TINYATTN_NUM_THREADS=1``; small ops never split (``MIN_WORK``): waking a
thread costs about 20 us.
"""
import os
import queue
import threading
import warnings

import numpy as np

NUM_THREADS_ENV = "TINYATTN_NUM_THREADS"
MIN_WORK = 1 << 16      # split an op only from this much work (elements it touches, or products' n*k*m / 32)


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
    """Split the CPU ops' work over ``n`` threads (the calling one and n - 1 of the pool); 1 turns it off."""
    global _num_threads
    if int(n) < 1:
        raise ValueError(f"set_num_threads: n must be at least 1, got {n}")
    _num_threads = int(n)


# ---------------------------------------------------------------- BLAS at one thread
_blas = None                # threadpoolctl's controllers of the loaded BLAS libraries; () without threadpoolctl
_hold = threading.Lock()
_held = 0                   # how many hold_blas blocks are open, in any thread
_saved = []                 # (controller, its thread count before the first open block)


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


class hold_blas:
    """``with hold_blas():`` BLAS runs on one thread inside the block (and blocks nested in it),
    while tinyattn's threads are on; the first block to open sets that, the last to close puts
    back what was there. Hold it around a whole forward or backward pass, not op by op:
    measured with OpenBLAS 0.3.31, a thread count changed before every product made the
    pool's products up to 2x slower."""

    def __enter__(self):
        global _held
        if _split_threads() < 2:
            self.on = False
            return
        self.on = True
        with _hold:
            if _held == 0:
                for lib in blas_controllers():
                    before = lib.get_num_threads()
                    if before != 1:
                        lib.set_num_threads(1)
                        _saved.append((lib, before))
            _held += 1

    def __exit__(self, *exc):
        global _held
        if not self.on:
            return
        with _hold:
            _held -= 1
            if _held == 0:
                while _saved:
                    lib, before = _saved.pop()
                    lib.set_num_threads(before)


_woken = threading.local()


def wake_blas():
    """Run one (512, 64) x (64, 512) float32 product, once in each thread that uses BLAS here.

    Measured with numpy 2.4's OpenBLAS 0.3.31 on an AMD Zen CPU: until a thread
    has run one product of about this size, OpenBLAS runs smaller one-thread
    products in it ((256, 256) x (256, 64)) about 3x slower (860 against 290 us),
    however many it runs. The pool's threads, and tiled attention's, would only
    ever run such products. It costs about a millisecond per thread, once.
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
            fn, start, stop = tasks.get()
            try:
                wake_blas()
                fn(start, stop)
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
        for _ in bounds[1:]:                       # wait for every part, even after an error
            e = self.done.get()
            error = error or e
        if error is not None:
            raise error


_pool = None


def _forget_pool():
    global _pool, _held, _hold
    _pool, _held, _hold = None, 0, threading.Lock()
    _saved.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)      # a forked child has none of the parent's threads


def parts(n, k):
    """``n`` rows in ``k`` nearly equal (start, stop) parts."""
    return [(i * n // k, (i + 1) * n // k) for i in range(k)]


def split(fn, n, work):
    """``fn(start, stop)`` over rows 0..n, split in get_num_threads() parts when ``work`` is at least
    MIN_WORK, with BLAS held at one thread; else one call, ``fn(0, n)``."""
    global _pool
    k = min(_split_threads(), n)
    if k < 2 or work < MIN_WORK:
        fn(0, n)
        return
    if _pool is None or _pool.size < k:
        _pool = _Pool(k)
    pool = _pool
    if not pool.lock.acquire(blocking=False):      # in use by another thread, or called from inside a part
        fn(0, n)
        return
    try:
        with hold_blas():
            pool.run(fn, parts(n, k))
    finally:
        pool.lock.release()
