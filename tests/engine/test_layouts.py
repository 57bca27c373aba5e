"""tinyattn/fast/layouts.py: a Linear's W^T copied contiguous once per ta.inference_mode block,
where that is measured to be faster."""
import numpy as np
import pytest

import tinyattn as ta
from tinyattn.fast import layouts


@pytest.fixture
def fresh_layouts(monkeypatch):
    """layouts.py's kept copies and measurements empty for the test, and put back after it."""
    monkeypatch.setattr(layouts, "_block", None)
    monkeypatch.setattr(layouts, "_copies", {})
    monkeypatch.setattr(layouts, "_kept_bytes", 0)
    monkeypatch.setattr(layouts, "_copy_is_faster", {})


@pytest.fixture
def copy_is_faster(fresh_layouts, monkeypatch):
    """As on a machine where the contiguous W^T was measured to be faster, for every shape."""
    monkeypatch.setattr(layouts, "_faster_as_copy", lambda rows, view: True)


def weight(out=6, inp=5, seed=0):
    return np.random.default_rng(seed).standard_normal((out, inp)).astype(np.float32)


def test_outside_inference_mode_it_is_the_plain_view(copy_is_faster):
    w = weight()
    for context in (ta.enable_grad, ta.no_grad):
        with context():
            wt = layouts.transposed(w, 4)
        assert wt.base is w and wt.shape == (5, 6) and not wt.flags.c_contiguous
    assert layouts._copies == {}


def test_inside_inference_mode_a_copy_is_made_once_per_block(copy_is_faster):
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


def test_a_weight_is_not_copied_beyond_the_budget_or_for_many_rows(copy_is_faster, monkeypatch):
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


def test_where_the_view_measures_faster_it_stays_the_view(fresh_layouts, monkeypatch):
    monkeypatch.setattr(layouts, "_faster_as_copy", lambda rows, view: False)
    w = weight()
    with ta.inference_mode():
        assert layouts.transposed(w, 4).base is w
    assert layouts._copies == {}


def test_the_choice_is_measured_once_per_power_of_two_of_rows(fresh_layouts):
    view = weight(48, 32).T                                      # (in 32, out 48)
    choice = layouts._faster_as_copy(5, view)
    assert isinstance(choice, bool)
    assert layouts._copy_is_faster == {(8, 32, 48, view.dtype.str): choice}
    layouts._faster_as_copy(8, view)                             # the same bucket: not measured again
    layouts._faster_as_copy(9, view)
    assert set(layouts._copy_is_faster) == {(8, 32, 48, view.dtype.str), (16, 32, 48, view.dtype.str)}


@pytest.mark.skipif(not ta.is_fast(), reason="the fast layer is off: Linear runs its teaching formula")
def test_a_linear_layer_gives_the_same_output_with_the_copy(copy_is_faster):
    ta.manual_seed(0)
    lin = ta.nn.Linear(64, 48)
    x = ta.randn(3, 5, 64)
    with ta.no_grad():
        plain = lin(x).numpy()
    with ta.inference_mode():
        laid_out = lin(x).numpy()
        assert id(lin.weight.data) in layouts._copies            # the copy was used
    np.testing.assert_allclose(laid_out, plain, rtol=1e-5, atol=1e-6)
