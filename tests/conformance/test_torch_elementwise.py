"""Elementwise ops against PyTorch: values, dtypes and gradients over dtypes, shapes and edge values,
and the promotion table."""
import itertools

import numpy as np
import pytest

from torch_compare import DTYPES, check, sample

EDGES = np.array([0.0, -0.0, 1.0, -1.5, 2.0, np.inf, -np.inf, np.nan, 1e-8, 30.0])

UNARY = {
    "exp": lambda m, x: x.exp(), "log": lambda m, x: x.abs().log() if x.dtype != m.tensor(True).dtype else x.log(),
    "sqrt": lambda m, x: x.abs().sqrt() if x.dtype != m.tensor(True).dtype else x.sqrt(),
    "tanh": lambda m, x: x.tanh(), "sigmoid": lambda m, x: x.sigmoid(),
    "abs": lambda m, x: x.abs(), "abs(x)": lambda m, x: abs(x), "neg": lambda m, x: x.neg(), "-x": lambda m, x: -x,
    "relu": lambda m, x: x.relu(), "sign": lambda m, x: x.sign(), "erf": lambda m, x: x.erf(),
    "gelu": lambda m, x: m.F.gelu(x), "gelu(tanh)": lambda m, x: m.F.gelu(x, approximate="tanh"),
    "silu": lambda m, x: m.F.silu(x),
    "clamp": lambda m, x: x.clamp(-1, 1), "clamp(min)": lambda m, x: x.clamp(min=0),
    "x ** 2": lambda m, x: x ** 2, "x ** 3": lambda m, x: x ** 3, "x ** 0.5": lambda m, x: x.abs() ** 0.5,
    "x ** 0": lambda m, x: x ** 0, "2 ** x": lambda m, x: 2 ** x.abs() if x.dtype != m.tensor(True).dtype else 2 ** x, "1 / x": lambda m, x: 1 / x,
    "x * 0.5": lambda m, x: x * 0.5, "x + 1": lambda m, x: x + 1, "x - True": lambda m, x: x - True,
    "x / 2": lambda m, x: x / 2, "x // 2": lambda m, x: x // 2,
    "softmax": lambda m, x: m.F.softmax(x, -1), "log_softmax": lambda m, x: m.F.log_softmax(x, 0),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", UNARY)
def test_unary(op, dtype):
    check(UNARY[op], [sample(dtype)], grad=op != "x // 2")


SIGN_OF_NAN = ("sign", "abs", "abs(x)")     # sign(NaN): NaN here, 0 in PyTorch (a README difference, test_differences.py)


@pytest.mark.parametrize("op", [o for o in UNARY if o not in ("x // 2",) + SIGN_OF_NAN])
def test_unary_at_edge_values(op):
    check(UNARY[op], [EDGES.reshape(2, 5)])


@pytest.mark.parametrize("op", SIGN_OF_NAN)
def test_unary_at_edge_values_but_nan(op):
    check(UNARY[op], [EDGES[~np.isnan(EDGES)]])


@pytest.mark.parametrize("op", ["exp", "abs", "relu", "x ** 2", "softmax", "sign", "clamp"])
@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (1,)])
def test_unary_on_0d_and_empty(op, shape):
    check(UNARY[op], [np.ones(shape) * 0.5])


def test_unary_on_a_non_contiguous_tensor():
    check(lambda m, x: x.transpose(0, 1).exp() * x.mT.tanh(), [sample("float64", (3, 4))])
    check(lambda m, x: x[:, ::2].sigmoid(), [sample("float64", (3, 5))])


BINARY = {"+": lambda m, a, b: a + b, "-": lambda m, a, b: a - b, "*": lambda m, a, b: a * b,
          "/": lambda m, a, b: a / b, "**": lambda m, a, b: a.abs() ** b,
          "where": lambda m, a, b: m.where(a > b, a, b), "cat": lambda m, a, b: m.cat([a, b], 0)}


@pytest.mark.parametrize("a, b", list(itertools.product(DTYPES, DTYPES)))
@pytest.mark.parametrize("op", ["+", "*", "/", "where", "cat"])
def test_promotion_table(op, a, b):
    """Two tensors with dims: every pair of dtypes."""
    check(BINARY[op], [sample(a, seed=1), np.abs(sample(b, seed=2)) + (b != "bool")])


@pytest.mark.parametrize("a, b", list(itertools.product(DTYPES, DTYPES)))
def test_promotion_with_a_0d_tensor(a, b):
    check(lambda m, x, s: x * s, [sample(a, seed=1), sample(b, (), seed=2)])
    check(lambda m, x, s: s + x, [sample(a, seed=1), sample(b, (), seed=2)])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("number", [2, 0.5, True])
def test_promotion_with_a_python_number(dtype, number):
    if dtype == "bool" and number is True:
        check(lambda m, x: x * number, [sample(dtype)])
        return
    for fn in (lambda m, x: x + number, lambda m, x: number * x, lambda m, x: x / number):
        check(fn, [sample(dtype)])


@pytest.mark.parametrize("op", ["+", "-", "*", "/", "**"])
@pytest.mark.parametrize("shapes", [((2, 3), (3,)), ((2, 1, 4), (3, 1)), ((), (2, 2)), ((0, 3), (1, 3)),
                                    ((1,), ())])
def test_binary_broadcasting_and_gradients(op, shapes):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(shapes[0]), rng.uniform(0.5, 2, shapes[1])
    check(BINARY[op], [a, b])


@pytest.mark.parametrize("op", ["+", "*", "/", "**"])
def test_binary_float32_with_float64_gradients(op):
    check(BINARY[op], [sample("float32"), np.abs(sample("float64", seed=4)) + 0.5])


def test_powers_at_a_zero_base():
    check(lambda m, x, y: x ** y, [np.zeros(4), np.array([0.0, 1.0, 2.5, -1.0])])
    check(lambda m, x: x ** 0, [np.array([0.0, 2.0])])
    check(lambda m, x: x ** 0.0, [np.array([0.0, 2.0])])


def test_kinks_at_their_documented_conventions():
    x = np.array([-1.0, 0.0, 0.0, 1.0, 2.0])
    check(lambda m, t: t.relu(), [x])
    check(lambda m, t: t.abs(), [x])
    check(lambda m, t: t.clamp(0.0, 1.0), [x])
    check(lambda m, t: t.clamp(min=0.0), [x])
    check(lambda m, t: t.amax() if hasattr(t, "amax") else t.max(), [np.array([1.0, 3.0, 3.0, 0.0])])


def test_comparisons_and_logic():
    a, b = sample("float32"), sample("int64", seed=2)
    for fn in (lambda m, x, y: x < y, lambda m, x, y: x >= y, lambda m, x, y: x == y,
               lambda m, x, y: (x > 0) & (y > 0), lambda m, x, y: (x > 0) | (y > 0), lambda m, x, y: ~(x > 0)):
        check(fn, [a, b], grad=False)


def test_masked_fill_and_where_with_numbers():
    x, mask = sample("float64"), sample("bool", seed=3)
    check(lambda m, t, k: t.masked_fill(k, -1.5), [x, mask])
    check(lambda m, t, k: m.where(k, t, 0.0), [x, mask])
    check(lambda m, k: m.where(k, 4, 2), [mask])
    check(lambda m, k: m.where(k, 4, 2.5), [mask])
    check(lambda m, t, k: t.masked_fill(k, 7), [sample("int64"), mask])
