"""tinyattn's own CPU threads (tinyattn/fast/threads.py): ops split their rows over them."""
import math
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import tinyattn as ta
from tinyattn.backend import get_backend
from tinyattn.fast import threads
from conftest import forward_and_backward, make_tensors
from optable import KERNEL_CASES, OPS

needs_threadpoolctl = pytest.mark.skipif(not threads.blas_controllers(),
                                         reason="threadpoolctl is not installed (the fast extra)")
SPLIT_OPS = [s for s in OPS if s.name.startswith(("F.linear", "Tensor.__matmul__", "F.scaled_dot_product_attention"))]


@pytest.fixture
def split_everything(monkeypatch):
    """Every op splits, however small its work, in 3 parts (so some parts differ in size)."""
    monkeypatch.setattr(threads, "MIN_WORK", 0)
    monkeypatch.setattr(threads, "FLOOR", 0)
    monkeypatch.setattr(threads, "_num_threads", 3)


def test_parts_cover_every_row_once():
    for n in range(12):
        for k in range(1, 5):
            bounds = threads.parts(n, k)
            assert len(bounds) == k and bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))


@needs_threadpoolctl
def test_split_runs_the_parts_on_three_threads(split_everything):
    seen = {}

    def part(i, j):
        seen[(i, j)] = threading.current_thread().name
    threads.split(part, 10, work=1)
    assert sorted(seen) == threads.parts(10, 3)
    assert len(set(seen.values())) == 3


def test_small_work_and_one_thread_run_in_the_caller(monkeypatch):
    seen = []
    monkeypatch.setattr(threads, "MIN_WORK", 1000)
    threads.split(lambda i, j: seen.append((i, j, threading.current_thread())), 10, work=999)
    monkeypatch.setattr(threads, "_num_threads", 1)
    threads.split(lambda i, j: seen.append((i, j, threading.current_thread())), 10, work=10 ** 9)
    assert seen == [(0, 10, threading.current_thread())] * 2


def test_too_small_is_below_the_floor_until_min_work_is_measured_then_below_min_work(monkeypatch):
    monkeypatch.setattr(threads, "MIN_WORK", None)
    assert threads.too_small(threads.FLOOR - 1) and not threads.too_small(threads.FLOOR)
    monkeypatch.setattr(threads, "MIN_WORK", 10 * threads.FLOOR)
    assert threads.too_small(10 * threads.FLOOR - 1) and not threads.too_small(10 * threads.FLOOR)
    monkeypatch.setattr(threads, "MIN_WORK", 1000)                  # measured: MIN_WORK alone counts
    assert threads.too_small(999) and not threads.too_small(1000)


def test_measure_min_work_is_twice_a_round_trip_over_a_unit_of_work(monkeypatch):
    monkeypatch.setattr(threads, "MIN_WORK", None)
    monkeypatch.setattr(threads, "FLOOR", 1)                         # so that the measurement alone decides
    pool = threads._Pool(2)
    got = threads.measure_min_work(pool)
    assert set(got) == {"round_trip_us", "ns_per_unit", "min_work"}
    assert got["round_trip_us"] > 0 and got["ns_per_unit"] > 0 and got["min_work"] == threads.MIN_WORK > 0
    trip, unit = got["round_trip_us"] * 1000, got["ns_per_unit"]     # ns, each rounded as reported
    low = 2 * (trip - 50) / (unit + 0.0005)
    high = 2 * (trip + 50) / (unit - 0.0005) if unit > 0.0005 else math.inf
    assert low - 1 <= got["min_work"] <= high
    monkeypatch.setattr(threads, "FLOOR", 10 ** 12)                  # never below FLOOR
    assert threads.measure_min_work(pool)["min_work"] == threads.MIN_WORK == 10 ** 12


@pytest.fixture
def unmeasured(monkeypatch):
    """MIN_WORK not yet measured, a new pool, two threads; [pool per measurement] comes back."""
    monkeypatch.setattr(threads, "MIN_WORK", None)
    monkeypatch.setattr(threads, "_pool", None)
    monkeypatch.setattr(threads, "_num_threads", 2)
    calls, measure = [], threads.measure_min_work

    def counting(pool):
        calls.append(pool)
        return measure(pool)
    monkeypatch.setattr(threads, "measure_min_work", counting)
    return calls


@needs_threadpoolctl
def test_the_first_split_measures_min_work_once_then_splits_from_it(unmeasured):
    seen = []

    def record(i, j):
        seen.append((i, j, threading.current_thread()))
    here = threading.current_thread()
    threads.split(record, 10, work=threads.FLOOR - 1)               # below the floor: no pool, no measurement
    assert seen == [(0, 10, here)] and unmeasured == [] and threads._pool is None
    seen.clear()
    threads.split(record, 10, work=threads.FLOOR)                   # measures (and splits if FLOOR is enough)
    assert unmeasured == [threads._pool] and threads.MIN_WORK >= threads.FLOOR
    assert sorted((i, j) for i, j, _ in seen) in ([(0, 10)], [(0, 5), (5, 10)])
    seen.clear()
    threads.split(record, 10, work=threads.MIN_WORK)
    assert sorted((i, j) for i, j, _ in seen) == [(0, 5), (5, 10)] and len({t for _, _, t in seen}) == 2
    seen.clear()
    threads.split(record, 10, work=threads.MIN_WORK - 1)
    assert seen == [(0, 10, here)]
    assert len(unmeasured) == 1                                      # measured once


@needs_threadpoolctl
@pytest.mark.parametrize("measured", ["more", "equal"])
def test_the_first_split_goes_by_what_it_has_just_measured(measured, unmeasured, monkeypatch):
    min_work = {"more": 10 ** 9, "equal": threads.FLOOR}[measured]

    def measure(pool):
        unmeasured.append(pool)
        threads.MIN_WORK = min_work                                 # (monkeypatch puts MIN_WORK back)
    monkeypatch.setattr(threads, "measure_min_work", measure)
    seen = []
    threads.split(lambda i, j: seen.append((i, j)), 10, work=threads.FLOOR)
    assert len(unmeasured) == 1
    assert sorted(seen) == ([(0, 10)] if measured == "more" else [(0, 5), (5, 10)])


@needs_threadpoolctl
def test_an_error_in_a_part_reaches_the_caller_and_the_pool_still_works(split_everything):
    def part(i, j):
        if i > 0:
            raise ValueError(f"rows {i}:{j} failed")
    with pytest.raises(ValueError, match="rows .* failed"):
        threads.split(part, 9, work=1)
    out = np.zeros(9)
    threads.split(lambda i, j: out.__setitem__(slice(i, j), out[i:j] + 1), 9, work=1)
    assert (out == 1).all()


@needs_threadpoolctl
def test_a_split_inside_a_part_runs_in_that_part(split_everything):
    out = np.zeros(12)

    def outer(i, j):
        def inner(a, b):
            out[i + a:i + b] += 1
        threads.split(inner, j - i, work=1)
    threads.split(outer, 12, work=1)
    assert (out == 1).all()


@needs_threadpoolctl
def test_two_user_threads_can_split_at_once(split_everything):
    results = {}

    def user(name):
        a = np.arange(60.0).reshape(12, 5)
        results[name] = [threads.CpuProducts(np).matmul(a, a.T) for _ in range(50)]
    workers = [threading.Thread(target=user, args=(n,)) for n in "ab"]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    a = np.arange(60.0).reshape(12, 5)
    assert all(np.array_equal(r, a @ a.T) for rs in results.values() for r in rs)


@needs_threadpoolctl
def test_blas_stays_at_one_thread_from_the_first_split_until_given_back(split_everything, monkeypatch):
    libs = threads.blas_controllers()
    threads.release_blas()
    before = [lib.get_num_threads() for lib in libs]
    threads.split(lambda i, j: None, 10, work=1)
    assert [lib.get_num_threads() for lib in libs] == [1] * len(libs) and threads.blas_held()
    threads.split(lambda i, j: None, 10, work=1)                     # held once, not again
    ta.set_num_threads(1)                                            # gives BLAS its threads back
    assert [lib.get_num_threads() for lib in libs] == before and not threads.blas_held()


def test_one_thread_leaves_blas_alone(monkeypatch):
    monkeypatch.setattr(threads, "_num_threads", 1)
    threads.release_blas()
    libs = threads.blas_controllers()
    before = [lib.get_num_threads() for lib in libs]
    threads.split(lambda i, j: None, 10, work=10 ** 9)
    assert [lib.get_num_threads() for lib in libs] == before


def test_off_without_threadpoolctl(monkeypatch):
    monkeypatch.setattr(threads, "_blas", ())
    monkeypatch.setattr(threads, "MIN_WORK", 0)
    monkeypatch.setattr(threads, "_num_threads", 3)
    seen = []
    threads.split(lambda i, j: seen.append((i, j, threading.current_thread())), 10, work=10 ** 9)
    assert seen == [(0, 10, threading.current_thread())]


@needs_threadpoolctl
@pytest.mark.parametrize("n_threads", [1, 2, 3, 5])
def test_matmuls_runs_every_row_of_every_product_once(n_threads, monkeypatch):
    monkeypatch.setattr(threads, "MIN_WORK", 0)
    monkeypatch.setattr(threads, "FLOOR", 0)
    monkeypatch.setattr(threads, "_num_threads", n_threads)
    r = np.random.default_rng(0)
    g, w, x = r.standard_normal((37, 5)), r.standard_normal((5, 3)), r.standard_normal((37, 3))
    pairs = [(g, w), (g.T, x), (x[:1], w.T)]                     # rows of cost 15, 111 and 15
    for out, (a, b) in zip(threads.CpuProducts(np).matmuls(pairs), pairs):
        np.testing.assert_allclose(out, a @ b, rtol=1e-13)


@needs_threadpoolctl
def test_matmuls_on_two_threads_runs_two_products_of_equal_cost_whole_one_on_each(monkeypatch):
    monkeypatch.setattr(threads, "MIN_WORK", 0)
    monkeypatch.setattr(threads, "FLOOR", 0)
    monkeypatch.setattr(threads, "_num_threads", 2)
    seen = []
    monkeypatch.setattr(np, "matmul", lambda a, b, out: seen.append((a.shape, threading.current_thread())))
    g, w, x = np.ones((12, 4)), np.ones((4, 6)), np.ones((12, 6))   # both products: 12 * 4 * 6 multiply-adds
    threads.CpuProducts(np).matmuls([(g, w), (g.T, x)])
    assert sorted(shape for shape, _ in seen) == [(4, 12), (12, 4)]
    assert len({thread for _, thread in seen}) == 2


@pytest.mark.parametrize("spec", SPLIT_OPS, ids=[s.name for s in SPLIT_OPS])
def test_split_ops_give_the_numbers_of_one_thread(spec, split_everything, cpu_kernels, monkeypatch):
    arrays = spec.inputs(np.random.default_rng(3))
    split = forward_and_backward(spec, arrays, "cpu")
    monkeypatch.setattr(threads, "_num_threads", 1)
    one = forward_and_backward(spec, arrays, "cpu")
    for a, b in zip(split, one):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("spec", SPLIT_OPS, ids=[s.name for s in SPLIT_OPS])
def test_gradcheck_with_every_op_split(spec, split_everything, cpu_kernels):
    assert ta.gradcheck(spec.fn, make_tensors(spec.inputs(np.random.default_rng(4))))


@pytest.mark.parametrize("case", KERNEL_CASES, ids=[c.name for c in KERNEL_CASES])
def test_split_kernels_give_the_numbers_of_one_thread(case, split_everything, monkeypatch):
    cpu = get_backend("cpu")
    if not cpu.kernels or not case.kernels <= set(cpu.kernels):
        pytest.skip("not a CPU kernel here (numba is not installed, or TINYATTN_CPU_KERNELS=0)")
    arrays = case.inputs(np.random.default_rng(6))
    for dtype, rtol in (("float64", 1e-13), ("float32", 1e-6)):
        split = case.run(arrays, "cpu", dtype)
        monkeypatch.setattr(threads, "_num_threads", 1)
        one = case.run(arrays, "cpu", dtype)
        monkeypatch.setattr(threads, "_num_threads", 3)
        for a, b in zip(split, one):
            np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * (np.abs(b).max() + 1e-30))


def test_the_environment_sets_the_thread_count():
    code = "import tinyattn as ta; print(ta.get_num_threads())"

    def run(**env):
        clean = {k: v for k, v in os.environ.items() if k not in (threads.NUM_THREADS_ENV, "OMP_NUM_THREADS")}
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**clean, **env})
    assert run().stdout.strip() == str(threads.cpu_count())
    assert run(TINYATTN_NUM_THREADS="3").stdout.strip() == "3"
    assert run(OMP_NUM_THREADS="1").stdout.strip() == "1"                   # as PyTorch reads it
    assert run(TINYATTN_NUM_THREADS="3", OMP_NUM_THREADS="1").stdout.strip() == "3"
    bad = run(TINYATTN_NUM_THREADS="two")
    assert bad.returncode == 0 and bad.stdout.strip() == str(threads.cpu_count())
    assert "TINYATTN_NUM_THREADS must be a whole number, got 'two': ignored" in bad.stderr


def test_set_num_threads_checks_its_argument(monkeypatch):
    monkeypatch.setattr(threads, "_num_threads", threads._num_threads)
    ta.set_num_threads(5)
    assert ta.get_num_threads() == 5
    with pytest.raises(ValueError, match="at least 1"):
        ta.set_num_threads(0)


# ---------------------------------------------------------------- the same numbers, measured either way
def test_an_op_whose_parts_matter_runs_them_in_the_caller_below_min_work(monkeypatch):
    """From FLOOR on, a same_parts op runs in get_num_threads() parts whatever MIN_WORK is: in order,
    on the calling thread, when MIN_WORK (measured) says the pool would not pay."""
    monkeypatch.setattr(threads, "MIN_WORK", 10 ** 12)
    monkeypatch.setattr(threads, "_num_threads", 3)
    monkeypatch.setattr(threads, "_blas", ("a BLAS",))                 # (as with threadpoolctl: 3 threads)
    monkeypatch.setattr(threads, "hold_blas", lambda: None)
    here, seen = threading.current_thread(), []
    record = lambda i, j: seen.append((i, j, threading.current_thread()))   # noqa: E731
    threads.split(record, 10, work=threads.FLOOR, same_parts=True)
    assert seen == [(0, 3, here), (3, 6, here), (6, 10, here)]
    seen.clear()
    threads.split(record, 10, work=threads.FLOOR)                    # rows on their own: whole
    threads.split(record, 10, work=threads.FLOOR - 1, same_parts=True)   # below FLOOR: whole on every machine
    assert seen == [(0, 10, here)] * 2


@needs_threadpoolctl
def test_an_op_whose_parts_matter_runs_them_in_the_caller_when_the_pool_is_busy(split_everything):
    seen = []

    def outer(i, j):
        if i == 0:                                                   # the pool is running this split
            threads.split(lambda a, b: seen.append((a, b, threading.current_thread())), 6, work=1, same_parts=True)
    threads.split(outer, 3, work=1)
    assert seen == [(0, 2, threading.current_thread()), (2, 4, threading.current_thread()),
                    (4, 6, threading.current_thread())]


@needs_threadpoolctl
def test_blas_is_held_from_the_first_op_of_floor_whatever_min_work_is(monkeypatch):
    monkeypatch.setattr(threads, "MIN_WORK", 10 ** 12)                # no op goes to the pool
    monkeypatch.setattr(threads, "_num_threads", 2)
    threads.release_blas()
    threads.split(lambda i, j: None, 10, work=threads.FLOOR - 1)
    assert not threads.blas_held()
    threads.split(lambda i, j: None, 10, work=threads.FLOOR)
    assert threads.blas_held()                                       # (BLAS's dot sums otherwise change with it)
    threads.release_blas()


def run_on_the_pool_or_not(monkeypatch, run):
    """run() with every op on the pool's threads (MIN_WORK 0), then with every op on the caller."""
    monkeypatch.setattr(threads, "FLOOR", 0)
    monkeypatch.setattr(threads, "_num_threads", 3)
    results = []
    for min_work in (0, 10 ** 15):
        monkeypatch.setattr(threads, "MIN_WORK", min_work)
        results.append(run())
    return results


@needs_threadpoolctl
@pytest.mark.parametrize("spec", SPLIT_OPS, ids=[s.name for s in SPLIT_OPS])
def test_split_ops_give_the_same_bits_on_the_pool_or_in_the_caller(spec, cpu_kernels, monkeypatch):
    arrays = [a.astype(np.float32) if a.dtype.kind == "f" else a for a in spec.inputs(np.random.default_rng(3))]
    pool, caller = run_on_the_pool_or_not(monkeypatch, lambda: forward_and_backward(spec, arrays, "cpu"))
    for a, b in zip(pool, caller):
        np.testing.assert_array_equal(a, b)


@needs_threadpoolctl
@pytest.mark.parametrize("case", KERNEL_CASES, ids=[c.name for c in KERNEL_CASES])
def test_kernels_give_the_same_bits_on_the_pool_or_in_the_caller(case, monkeypatch):
    cpu = get_backend("cpu")
    if not cpu.kernels or not case.kernels <= set(cpu.kernels):
        pytest.skip("not a CPU kernel here (numba is not installed, or TINYATTN_CPU_KERNELS=0)")
    arrays = case.inputs(np.random.default_rng(6))
    for dtype in ("float32", "float64"):
        pool, caller = run_on_the_pool_or_not(monkeypatch, lambda: case.run(arrays, "cpu", dtype))
        for a, b in zip(pool, caller):
            np.testing.assert_array_equal(a, b)
