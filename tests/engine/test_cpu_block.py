"""The fused GPT block on the CPU (tinyattn/fast/cpu_block.py): its schedules (rows, whole, pool)
on the threads, against the formula; the choice between them; the breakdown's timers."""
import numpy as np
import pytest

from tinyattn.fast import threads
from conftest import kernel_and_formula
from optable import KERNEL_CASES, gpt_block_inputs

cpu_block = pytest.importorskip("tinyattn.fast.cpu_block", reason="numba is not installed: no block kernel")
needs_threadpoolctl = pytest.mark.skipif(not threads.blas_controllers(),
                                         reason="threadpoolctl is not installed (the fast extra)")
BLOCK_CASES = [case for case in KERNEL_CASES if "block" in case.kernels]


@pytest.fixture
def split_everything(monkeypatch):
    """Every split runs on the pool in 3 parts (some of unequal size), however small its work."""
    monkeypatch.setattr(threads, "MIN_WORK", 0)
    monkeypatch.setattr(threads, "FLOOR", 0)
    monkeypatch.setattr(threads, "_num_threads", 3)


@pytest.mark.parametrize("shape, n_threads", [((4, 256, 384), 2), ((64, 256, 384), 2), ((1, 1024, 384), 2),
                                              ((12, 64, 128), 2), ((64, 20, 64), 2), ((4, 256, 384), 16)])
def test_unless_asked_every_block_runs_the_rows_schedule(shape, n_threads, monkeypatch):
    monkeypatch.delenv(cpu_block.SCHEDULE_ENV, raising=False)
    assert cpu_block.schedule(shape, n_threads) == "rows"


def test_the_environment_forces_a_schedule_and_a_bad_value_is_one_clear_error(monkeypatch):
    monkeypatch.setenv(cpu_block.SCHEDULE_ENV, "whole")
    assert cpu_block.schedule((12, 64, 128), 2) == "whole"
    monkeypatch.setenv(cpu_block.SCHEDULE_ENV, " Rows ")
    assert cpu_block.schedule((4, 256, 384), 2) == "rows"
    monkeypatch.setenv(cpu_block.SCHEDULE_ENV, "Pool")
    assert cpu_block.schedule((4, 256, 384), 2) == "pool"
    monkeypatch.setenv(cpu_block.SCHEDULE_ENV, "diagonal")
    with pytest.raises(ValueError, match="TINYATTN_BLOCK_SCHEDULE must be rows, whole or pool, got 'diagonal'"):
        cpu_block.schedule((4, 256, 384), 2)


def test_the_pairs_cover_every_sequence_and_head_once():
    for n_head in (1, 3, 4):
        for B in (1, 2, 5):
            for k in (1, 2, 3, 7):
                seen = [(b, h) for i, j in threads.parts(B * n_head, k) for b, hs in cpu_block._pairs(i, j, n_head)
                        for h in range(n_head)[hs]]
                assert seen == [(b, h) for b in range(B) for h in range(n_head)]


@needs_threadpoolctl
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("schedule", cpu_block.SCHEDULES)
def test_each_schedule_on_the_threads_matches_the_formula(schedule, dtype, split_everything, monkeypatch):
    """The op-table's block cases with every part on the pool: the output, dx and every dparam
    within float64's (float32's) rounding of the layers op by op. (rows needs a batch that
    shares evenly over the 3 threads: the block of one sequence runs op by op there.)"""
    monkeypatch.setenv(cpu_block.SCHEDULE_ENV, schedule)
    rtol, atol = (1e-10, 1e-12) if dtype == "float64" else (1e-5, 1e-6)
    cases = [c for c in BLOCK_CASES if schedule != "rows" or c.inputs(np.random.default_rng(0))[0].shape[0] % 3 == 0]
    assert len(cases) >= 2
    for case in cases:
        fused, formula = kernel_and_formula(case, "cpu", dtype, monkeypatch)
        for i, (a, b) in enumerate(zip(fused, formula)):
            assert a.dtype == b.dtype == np.dtype(dtype)
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol * (np.abs(b).max() + 1e-30),
                                       err_msg=f"{schedule}, {case.name}: output {i}")


def _block_and_backward(arrays, n_head, head_keep=None):
    x, *params = arrays
    y, *saved = cpu_block.block(x, params, n_head, 1e-5, 1e-5, head_keep)
    g = np.random.default_rng(5).standard_normal(y.shape).astype(y.dtype)
    return [y, *cpu_block.block_backward(g, saved, params, n_head, head_keep)]


@needs_threadpoolctl
@pytest.mark.parametrize("schedule", cpu_block.SCHEDULES)
def test_the_same_bits_whether_the_pool_takes_the_parts_or_not(schedule, monkeypatch):
    """A run's numbers depend on its command and thread count, never on MIN_WORK (measured)."""
    monkeypatch.setenv(cpu_block.SCHEDULE_ENV, schedule)
    monkeypatch.setattr(threads, "_num_threads", 3)
    monkeypatch.setattr(threads, "FLOOR", 0)
    arrays = [a.astype(np.float32) for a in gpt_block_inputs(6, 9, 24)(np.random.default_rng(1))]
    keep = (np.random.default_rng(2).random((6, 4)) < 0.5).astype(np.float32) * 2
    runs = []
    for min_work in (0, 10 ** 15):
        monkeypatch.setattr(threads, "MIN_WORK", min_work)
        runs.append(_block_and_backward(arrays, 4, keep))
    for i, (a, b) in enumerate(zip(*runs)):
        np.testing.assert_array_equal(a, b, err_msg=f"output {i}")


@needs_threadpoolctl
def test_the_two_schedules_agree_on_a_larger_block(split_everything, monkeypatch):
    arrays = [a.astype(np.float32) for a in gpt_block_inputs(3, 33, 48)(np.random.default_rng(3))]
    runs = {}
    for schedule in cpu_block.SCHEDULES:
        monkeypatch.setenv(cpu_block.SCHEDULE_ENV, schedule)
        runs[schedule] = _block_and_backward(arrays, 6)
    for schedule in ("whole", "pool"):
        for i, (a, b) in enumerate(zip(runs[schedule], runs["rows"])):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * np.abs(b).max(), err_msg=f"{schedule}: output {i}")


@needs_threadpoolctl
@pytest.mark.parametrize("n_threads", [2, 3])
@pytest.mark.parametrize("costs", [(1, 1), (3, 1), (1,)])
def test_products_on_the_pool_give_each_column_once(n_threads, costs, split_everything, monkeypatch):
    """The pool schedule's products, cut by columns weighted by cost, are the products."""
    monkeypatch.setattr(threads, "_num_threads", n_threads)
    rng = np.random.default_rng(6)
    products = [(rng.standard_normal((5, 4 * c)), rng.standard_normal((4 * c, 7 + c))) for c in costs]
    outs = [np.full((5, b.shape[1]), np.nan) for _, b in products]
    cpu_block._products([(a, b, out) for (a, b), out in zip(products, outs)], on_pool=True)
    for (a, b), out in zip(products, outs):
        np.testing.assert_allclose(out, a @ b, rtol=1e-12)


@needs_threadpoolctl
def test_blas_gets_every_thread_for_a_whole_product_and_one_after(monkeypatch):
    monkeypatch.setattr(threads, "_num_threads", 2)
    threads.hold_blas()
    counts = lambda: {lib.get_num_threads() for lib in threads.blas_controllers()}   # noqa: E731
    assert counts() == {1}
    with threads.blas_threads():
        assert counts() == {2}
    assert counts() == {1}


@needs_threadpoolctl
@pytest.mark.parametrize("schedule", cpu_block.SCHEDULES)
def test_the_timers_see_each_threads_stages_and_cost_nothing_when_off(schedule, split_everything, monkeypatch):
    monkeypatch.setenv(cpu_block.SCHEDULE_ENV, schedule)
    arrays = [a.astype(np.float32) for a in gpt_block_inputs(3, 8, 16)(np.random.default_rng(4))]
    monkeypatch.setattr(threads, "timers", threads.Timers())
    _block_and_backward(arrays, 4)
    seconds = threads.timers.seconds
    names = {name for name, _ in seconds}
    assert len(names) == 3                                               # the caller and two pool threads
    for name in names:
        stages = {category for who, category in seconds if who == name}
        assert {"elementwise", "attention"} <= stages
        assert ("products" in stages) == (schedule != "whole" or name == "MainThread")
        assert ("waiting" in stages) == (name == "MainThread")          # the caller waits, the pool idles
        assert ("idle" in stages and "work" in stages) == (name != "MainThread")
    assert all(s >= 0 for s in seconds.values())
    monkeypatch.setattr(threads, "timers", None)
    assert threads.laps() is threads._no_lap


@needs_threadpoolctl
def test_each_schedule_at_the_mid_configs_size_is_within_float32_rounding_of_float64(monkeypatch):
    """B4 T256 C384 H6 on 2 threads, where BLAS really splits the whole-batch products over its
    threads: every schedule's float32 outputs against the float64 block's, as close as rows' are."""
    monkeypatch.setattr(threads, "_num_threads", 2)
    arrays = gpt_block_inputs(4, 256, 384)(np.random.default_rng(8))
    monkeypatch.setenv(cpu_block.SCHEDULE_ENV, "rows")
    want = _block_and_backward(arrays, 6)                                  # float64
    errors = {}
    for schedule in cpu_block.SCHEDULES:
        monkeypatch.setenv(cpu_block.SCHEDULE_ENV, schedule)
        got = _block_and_backward([a.astype(np.float32) for a in arrays], 6)
        errors[schedule] = [np.abs(a - b).max() / np.abs(b).max() for a, b in zip(got, want)]
    for schedule, errs in errors.items():
        assert max(errs) < 1e-5, (schedule, errs)
        assert all(e < 4 * r + 1e-7 for e, r in zip(errs, errors["rows"])), (schedule, errs, errors["rows"])
