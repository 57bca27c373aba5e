"""In-place ops on views against PyTorch: a write through a view reaches the tensor it views
(basic indexing, view, transpose, slices, detach), and where PyTorch refuses (an expanded
tensor), tinyattn refuses."""
import numpy as np
import pytest

from torch_compare import TA, TORCH, check, sample, torch

import tinyattn as ta

VIEWS = {
    "w[0]": lambda w: w[0], "w[:, 1:3]": lambda w: w[:, 1:3], "w[::2]": lambda w: w[::2],
    "w[1, 2]": lambda w: w[1, 2], "w[None, 1]": lambda w: w[None, 1], "w.view(-1)": lambda w: w.view(-1),
    "w.reshape(4, 3)": lambda w: w.reshape(4, 3), "w.transpose(0, 1)": lambda w: w.transpose(0, 1),
    "w.T": lambda w: w.T, "w.detach()": lambda w: w.detach(), "w.unsqueeze(0)": lambda w: w.unsqueeze(0),
    "w.split(1)[1]": lambda w: w.split(1)[1], "w[..., -1]": lambda w: w[..., -1],
}
OPS = {"-= 1": lambda v: v.__isub__(1.0), "*= 2": lambda v: v.__imul__(2.0),
       "+= tensor": lambda v: v.__iadd__(v * 0 + 0.5), "/= 4": lambda v: v.__itruediv__(4.0),
       "zero_()": lambda v: v.zero_(), "masked_fill_": lambda v: v.masked_fill_(v > 5, -1.0)}


def both(make_view, op, requires_grad):
    start = np.arange(12.0).reshape(3, 4)
    results = []
    for lib in (TORCH, TA):
        w = lib.tensor(start.copy(), requires_grad=requires_grad)
        no_grad = torch.no_grad() if lib is TORCH else ta.no_grad()
        with no_grad:
            view = make_view(w)
            op(view)
        results.append((w.detach().numpy(), view.detach().numpy()))
    return results


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("view", VIEWS)
def test_a_write_through_a_view_reaches_its_base(view, op):
    (tw, tv), (aw, av) = both(VIEWS[view], OPS[op], requires_grad=True)
    np.testing.assert_array_equal(aw, tw)
    np.testing.assert_array_equal(av, tv)


def test_an_advanced_index_is_a_copy_in_both():
    (tw, _), (aw, _) = both(lambda w: w[[0, 2]], OPS["-= 1"], requires_grad=False)
    np.testing.assert_array_equal(aw, tw)
    np.testing.assert_array_equal(aw, np.arange(12.0).reshape(3, 4))


def test_an_expanded_tensor_refuses_a_write_in_both():
    with pytest.raises(RuntimeError):
        t = torch.ones(3, 1).expand(3, 4)
        t += 1
    with pytest.raises(RuntimeError, match=r"in-place \+=: this tensor \(shape \(3, 4\)\) is an expanded"):
        a = ta.ones(3, 1).expand(3, 4)
        a += 1


def test_a_leaf_that_requires_grad_refuses_in_both():
    with pytest.raises(RuntimeError):
        t = torch.ones(3, requires_grad=True)
        t += 1
    with pytest.raises(RuntimeError, match=r"in-place \+= on a leaf tensor that requires grad"):
        a = ta.ones(3, requires_grad=True)
        a += 1


def test_an_update_under_no_grad_reaches_the_optimizer_views():
    """SGD written by hand: w -= lr * w.grad under no_grad, then a view taken before still agrees."""
    for lib in (TORCH, TA):
        w = lib.tensor(np.ones((2, 2)), requires_grad=True)
        first_row = w.detach()[0]
        (w * w).sum().backward()
        with (torch.no_grad() if lib is TORCH else ta.no_grad()):
            w -= 0.25 * w.grad
        np.testing.assert_array_equal(first_row.numpy(), [0.5, 0.5])


def test_masked_fill_in_place():
    """Without a graph: written into the tensor, its dtype kept (1.5 in an int64 tensor is 1). While
    one is recorded, tinyattn's result is a new tensor (as for +=), with PyTorch's values and gradient."""
    mask = sample("bool", (2, 3), seed=1)
    check(lambda m, t, k: t.masked_fill_(k, 1.5), [sample("int64"), mask], grad=False)
    check(lambda m, t, k: t.masked_fill_(k, m.tensor(0.25, dtype=m.float64)), [sample("float64"), mask], grad=False)
    check(lambda m, t, k: (t * 2).masked_fill_(k, -3.0), [sample("float64"), mask])
    for lib in (TORCH, TA):
        x = lib.zeros(2, 3)
        assert x.masked_fill_(lib.tensor(mask), 7.0) is x and x.numpy().tolist() == np.where(mask, 7.0, 0.0).tolist()
