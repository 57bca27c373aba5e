"""Reductions, shape ops and indexing against PyTorch: values, dtypes and gradients."""
import numpy as np
import pytest

from torch_compare import DTYPES, check, sample as _sample


def sample(dtype, shape=(2, 3, 4), seed=0):
    return _sample(dtype, shape, seed)


REDUCTIONS = {
    "sum": lambda m, x: x.sum(), "sum(1)": lambda m, x: x.sum(1), "sum((0, 2), keepdim)": lambda m, x: x.sum((0, 2), keepdim=True),
    "mean(-1)": lambda m, x: x.mean(-1), "max(1)": lambda m, x: x.amax(1) if hasattr(x, "amax") else x.max(1),
    "max": lambda m, x: x.max(), "min": lambda m, x: x.min(),
    "var(1)": lambda m, x: x.var(1), "std(-1, correction=0)": lambda m, x: x.std(-1, correction=0),
    "var(keepdim)": lambda m, x: x.var((0, 1), keepdim=True),
    "logsumexp(1)": lambda m, x: x.logsumexp(1), "argmax(1)": lambda m, x: x.argmax(1),
    "argmin": lambda m, x: x.argmin(),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", REDUCTIONS)
def test_reductions(op, dtype):
    check(REDUCTIONS[op], [sample(dtype)], grad=not op.startswith("arg"))


@pytest.mark.parametrize("op", ["sum", "mean(-1)", "var(1)", "std(-1, correction=0)", "max", "sum(1)"])
@pytest.mark.parametrize("shape", [(), (1,), (3, 0), (0, 3)])
def test_reductions_on_0d_and_empty(op, shape):
    if op in ("var(1)", "sum(1)") and len(shape) < 2:
        pytest.skip("no dim 1")
    check(REDUCTIONS[op], [np.ones(shape) * 0.5])


def test_ties_share_the_gradient():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
    check(lambda m, t: t.amax(1) if hasattr(t, "amax") else t.max(1), [x])
    check(lambda m, t: t.amin(1) if hasattr(t, "amin") else t.min(1), [x])
    check(lambda m, t: t.max(), [x])


def test_var_with_no_degrees_of_freedom():
    """Values only: the gradients of a division by 0 differ (a README difference, test_differences.py)."""
    check(lambda m, t: t.var(), [np.array([1.5])], grad=False)
    check(lambda m, t: t.var(correction=2), [np.array([1.0, 3.0])], grad=False)
    check(lambda m, t: t.std(0), [np.ones((1, 3))], grad=False)


SHAPES = {
    "reshape": lambda m, x: x.reshape(4, 6), "view(-1)": lambda m, x: x.view(-1),
    "transpose": lambda m, x: x.transpose(0, 2), "permute": lambda m, x: x.permute(2, 0, 1),
    "mT": lambda m, x: x.mT, "unsqueeze": lambda m, x: x.unsqueeze(1), "squeeze": lambda m, x: x[:, :1].squeeze(1),
    "flatten(1)": lambda m, x: x.flatten(1), "expand": lambda m, x: x[:, :1].expand(2, 5, 4),
    "split": lambda m, x: x.split([1, 3], 2), "chunk": lambda m, x: x.chunk(2, 1),
    "tril": lambda m, x: x.tril(), "triu(1)": lambda m, x: x.triu(1),
    "cat": lambda m, x: m.cat([x, x * 2], 1), "stack": lambda m, x: m.stack([x, x], -1),
    "contiguous view": lambda m, x: x.transpose(0, 1).contiguous().view(3, 8),
    "clone": lambda m, x: x.clone(), "detach": lambda m, x: x.detach() * x,
}


@pytest.mark.parametrize("op", SHAPES)
def test_shape_ops(op):
    check(SHAPES[op], [sample("float64", (2, 3, 4))])


INDICES = {
    "int": (1,), "negative int": (-1,), "slice": (slice(1, None),), "step": (slice(None, None, 2),),
    "None and ...": (None, Ellipsis, 1), "int, slice": (0, slice(1, 3)),
    "int array": (np.array([2, 0, 2]),), "two int arrays": (np.array([0, 1]), np.array([2, 2])),
    "slice, int array": (slice(None), np.array([1, 1, 0])),
    "int array, slice, int array": (np.array([0, 1]), slice(None), np.array([3, 0])),
    "int, slice, int array": (1, slice(None), np.array([3, 0, 3])),
    "int array, int": (np.array([1, 0]), 2),
    "bool mask": (np.array([True, False]),), "2-d bool mask": (np.array([[True, False, True], [False, True, True]]),),
}


@pytest.mark.parametrize("name", INDICES)
def test_indexing(name):
    index = INDICES[name]
    arrays = [i for i in index if isinstance(i, np.ndarray)]

    def fn(m, x, *tensors):
        it = iter(tensors)
        return x[tuple(next(it) if isinstance(i, np.ndarray) else i for i in index)]
    check(fn, [sample("float64", (2, 3, 4))] + arrays)


def test_mixed_integer_and_tensor_indexing_as_in_the_issue():
    d = np.array([0, 2, 1])
    check(lambda m, x, i: x[1, :, 3:11:2, i, 0:2], [sample("float64", (2, 3, 12, 5, 4)), d])


def test_indexing_a_non_contiguous_tensor():
    check(lambda m, x, i: x.transpose(0, 2)[i, 1:], [sample("float64", (2, 3, 4)), np.array([3, 3, 1])])
