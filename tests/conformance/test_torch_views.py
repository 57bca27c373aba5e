"""Views as PyTorch has them: ``view`` shares memory or is refused (never a silent copy),
``reshape`` is a view exactly where PyTorch's is and a copy elsewhere, and ``contiguous``
copies exactly when PyTorch's does. Each case runs on both libraries from the same layout:
a transposed, permuted, stepped, sliced or expanded tensor."""
import math

import numpy as np
import pytest

from torch_compare import check, refusals, same_kind_of_refusal, torch

import tinyattn as ta

BASE = np.arange(24.0).reshape(2, 3, 4)

LAYOUTS = {                                          # a tensor of either library -> a view of it
    "contiguous": lambda t: t,
    "transposed": lambda t: t.transpose(0, 1),
    "last two dims transposed": lambda t: t.mT,
    "permuted": lambda t: t.permute(2, 0, 1),
    "permuted, two dims kept together": lambda t: t.permute(1, 2, 0),
    "a slice of the first dim": lambda t: t[1:],
    "a slice of the last dim": lambda t: t[:, :, 1:3],
    "a slice with a step": lambda t: t[:, ::2],
    "one row": lambda t: t[:, 1],
    "expanded": lambda t: t[:, :1].expand(2, 3, 4),
    "expanded with a new dim": lambda t: t[0].expand(2, 3, 4),
    "unsqueezed, then transposed": lambda t: t.unsqueeze(1).transpose(0, 3),
    "a 0-d element": lambda t: t[1, 2, 3],
}


def shapes_of(n):
    """Shapes of ``n`` elements to view a tensor as: up to 4 dims, with dims of 1 among them, and -1."""
    found = {(n,), (-1,), (1, n), (n, 1), (-1, 1)}

    def grow(left, dims):
        if left == 1:
            for i in range(len(dims) + 1):
                found.add(tuple(dims[:i] + [1] + dims[i:]))
            found.add(tuple(dims))
            return
        for d in range(2, left + 1):
            if left % d == 0 and len(dims) < 3:
                grow(left // d, dims + [d])
    grow(n, [])
    return sorted(s for s in found if s and math.prod(s) in (n, -n))


def both(layout):
    """(the base tensor and the layout) of torch, then of tinyattn, from the same numbers."""
    t = torch.tensor(BASE)
    a = ta.tensor(BASE, dtype="float64")
    return (t, LAYOUTS[layout](t)), (a, LAYOUTS[layout](a))


def shares_memory(base, result, lib):
    """Whether a write into ``base`` shows in ``result`` (under no_grad, as a user would write)."""
    before = result.detach().clone()
    with lib.no_grad():
        base += 1000.0
    moved = (result - before).detach().numpy()
    assert np.all(moved == 0) or np.all(moved == 1000), "a part of the result moved with the base"
    return bool(np.all(moved == 1000)) and moved.size > 0


CASES = [(layout, shape) for layout in LAYOUTS
         for shape in shapes_of(LAYOUTS[layout](torch.zeros(2, 3, 4)).numel())]


@pytest.mark.parametrize("layout, shape", CASES, ids=[f"{lay}-{s}" for lay, s in CASES])
def test_view_shares_memory_or_is_refused_as_in_pytorch(layout, shape):
    (t_base, t), (a_base, a) = both(layout)
    try:
        t_view = t.view(shape)
    except RuntimeError as e:
        assert "view size is not compatible" in str(e)                       # (what torch says, for the record)
        with pytest.raises(RuntimeError, match=r"Use \.reshape\(\.\.\.\) instead") as refused:
            a.view(shape)
        assert isinstance(refused.value, ValueError) and len(str(refused.value).splitlines()) == 1
        return
    a_view = a.view(shape)
    assert a_view.shape == tuple(t_view.shape)
    np.testing.assert_array_equal(a_view.numpy(), t_view.numpy())
    assert shares_memory(t_base, t_view, torch) and shares_memory(a_base, a_view, ta), \
        "a view must see its base's writes"


@pytest.mark.parametrize("layout, shape", CASES, ids=[f"{lay}-{s}" for lay, s in CASES])
def test_reshape_is_a_view_exactly_where_pytorchs_is(layout, shape):
    (t_base, t), (a_base, a) = both(layout)
    t_out, a_out = t.reshape(shape), a.reshape(shape)
    np.testing.assert_array_equal(a_out.numpy(), t_out.numpy())
    torch_view = shares_memory(t_base, t_out, torch)
    assert shares_memory(a_base, a_out, ta) == torch_view, \
        f"reshape: PyTorch's is {'a view' if torch_view else 'a copy'}, tinyattn's is not"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_contiguous_copies_exactly_where_pytorchs_does(layout):
    (t_base, t), (a_base, a) = both(layout)
    assert a.is_contiguous() == t.is_contiguous()
    t_out, a_out = t.contiguous(), a.contiguous()
    assert a_out.is_contiguous() and t_out.is_contiguous()
    np.testing.assert_array_equal(a_out.numpy(), t_out.numpy())
    assert shares_memory(a_base, a_out, ta) == shares_memory(t_base, t_out, torch)
    assert (a_out.view(-1).shape == tuple(t_out.view(-1).shape))         # what contiguous() is for


def test_writes_into_a_view_reach_the_base():
    for lib in (ta, torch):
        t = lib.arange(6.0).reshape(2, 3)
        v = t[:, 1:].view(2, 2, 1)                                            # non-contiguous, and a view
        with lib.no_grad():
            v += 100
        assert t.numpy().tolist() == [[0.0, 101.0, 102.0], [3.0, 104.0, 105.0]], lib.__name__


def test_the_views_of_the_issue_are_refused_by_both():
    cases = {"a permuted tensor": lambda m: m.arange(6.0).reshape(2, 3).permute(1, 0).view(6),
             "an expanded tensor": lambda m: m.arange(3.0).expand(2, 3).view(6),
             "a transposed tensor": lambda m: m.arange(6.0).reshape(2, 3).T.view(-1),
             "a slice with a step": lambda m: m.arange(6.0).reshape(2, 3)[:, ::2].view(-1)}
    for case, fn in cases.items():
        ours, theirs = refusals(fn, [])
        assert same_kind_of_refusal(ours, theirs), f"{case}: {type(ours).__name__}, PyTorch {type(theirs).__name__}"
        assert ".reshape(...)" in str(ours), case


@pytest.mark.parametrize("layout", ["transposed", "permuted", "a slice with a step", "expanded"])
def test_gradients_through_reshape_and_view_of_views(layout):
    """The gradient of reshape (a copy here) and of contiguous().view(), as PyTorch's."""
    fn = LAYOUTS[layout]
    check(lambda m, x: fn(x * 1.0).reshape(-1, 2) * 3.0, [BASE])
    check(lambda m, x: fn(x * 1.0).contiguous().view(2, -1).sum(0), [BASE])


VIEWS = {                                            # every op that README calls a view
    "an index": lambda t: t[0], "a slice": lambda t: t[:, 1:], "None and an ellipsis": lambda t: t[None, ..., 1],
    "view": lambda t: t.view(6, 4), "reshape of a contiguous tensor": lambda t: t.reshape(4, 6),
    "transpose": lambda t: t.transpose(0, 2), "permute": lambda t: t.permute(1, 2, 0), ".T": lambda t: t[0].T,
    ".mT": lambda t: t.mT, "expand": lambda t: t[:, :1].expand(2, 5, 4), "expand_as": lambda t: t[:1].expand_as(t),
    "broadcast_to": lambda t: t[:1].broadcast_to((3, 3, 4)), "squeeze": lambda t: t[:1].squeeze(0),
    "unsqueeze": lambda t: t.unsqueeze(1), "flatten of a contiguous tensor": lambda t: t.flatten(1),
    "split": lambda t: t.split(1, 1)[1], "chunk": lambda t: t.chunk(2, 2)[1], "detach": lambda t: t.detach(),
    "contiguous of a contiguous tensor": lambda t: t.contiguous(),
}


@pytest.mark.parametrize("op", VIEWS)
def test_every_view_readme_names_shares_memory(op):
    for lib in (ta, torch):
        base = lib.zeros(2, 3, 4, dtype=lib.float64)
        assert shares_memory(base, VIEWS[op](base), lib), f"{op}: {lib.__name__}'s is not a view"
