"""tinyattn/fast/layouts.py: a Linear's W^T copied contiguous once per ta.inference_mode block,
on every machine alike (never by a measurement, which would change the numbers from run to run)."""
import numpy as np
import pytest

import tinyattn as ta
from tinyattn.fast import layouts


@pytest.fixture
def fresh_layouts(monkeypatch):
    """layouts.py's kept copies empty for the test, and put back after it."""
    monkeypatch.setattr(layouts, "_block", None)
    monkeypatch.setattr(layouts, "_copies", {})
    monkeypatch.setattr(layouts, "_chosen", {})
    monkeypatch.setattr(layouts, "_kept_bytes", 0)


def weight(out=6, inp=5, seed=0):
    return np.random.default_rng(seed).standard_normal((out, inp)).astype(np.float32)


def test_outside_inference_mode_it_is_the_plain_view(fresh_layouts):
    w = weight()
    for context in (ta.enable_grad, ta.no_grad):
        with context():
            wt = layouts.transposed(w, 4)
        assert wt.base is w and wt.shape == (5, 6) and not wt.flags.c_contiguous
    assert layouts._copies == {}


def test_inside_inference_mode_a_copy_is_made_once_per_block(fresh_layouts):
    w = weight()
    with ta.inference_mode():
        first = layouts.transposed(w, 4)
        assert first.flags.c_contiguous and not np.shares_memory(first, w)
        np.testing.assert_array_equal(first, w.T)
        assert layouts.transposed(w, 4) is first                 # kept for the block
        assert layouts.transposed(w, 7) is first                 # whatever the rows
    w *= 2                                                       # changed between blocks (an optimizer step)
    with ta.inference_mode():
        second = layouts.transposed(w, 4)
        assert second is not first
        np.testing.assert_array_equal(second, w.T)                # the changed weight


def test_a_weight_is_not_copied_beyond_the_budget_or_for_many_rows(fresh_layouts, monkeypatch):
    w = weight()
    with ta.inference_mode():
        assert layouts.transposed(w, layouts.MAX_ROWS + 1).base is w
    monkeypatch.setattr(layouts, "BUDGET_BYTES", w.nbytes)
    with ta.inference_mode():
        assert layouts.transposed(w, 4).flags.c_contiguous      # fits: copied
        other = weight(seed=1)
        assert layouts.transposed(other, 4).base is other       # the budget is spent: the view
    monkeypatch.setattr(layouts, "BUDGET_BYTES", 0)
    with ta.inference_mode():
        assert layouts.transposed(w, 4).base is w


def test_the_layout_is_not_timed(fresh_layouts, monkeypatch):
    """Every product of up to MAX_ROWS rows gets the copy, however long anything takes: BLAS sums in
    another order with the copy than with the view, so a timed choice would change the numbers."""
    def no_clock():
        raise AssertionError("layouts.py read a clock")
    monkeypatch.setattr("time.perf_counter", no_clock)
    monkeypatch.setattr("time.time", no_clock)
    monkeypatch.setattr("time.monotonic", no_clock)
    weights = [weight(seed=i) for i in range(4)]
    with ta.inference_mode():
        for w, rows in zip(weights, (1, 8, 100, layouts.MAX_ROWS)):
            got = layouts.transposed(w, rows)
            assert got.flags.c_contiguous and not np.shares_memory(got, w)


def test_a_linear_layer_gives_the_same_output_with_the_copy(fresh_layouts):
    ta.manual_seed(0)
    lin = ta.nn.Linear(64, 48)
    x = ta.randn(3, 5, 64)
    with ta.no_grad():
        plain = lin(x).numpy()
    with ta.inference_mode():
        laid_out = ta.compile(lin)(x).numpy()                   # (the fast Linear: compiled)
        assert id(lin.weight.data) in layouts._copies            # the copy was used
    np.testing.assert_allclose(laid_out, plain, rtol=1e-5, atol=1e-6)
