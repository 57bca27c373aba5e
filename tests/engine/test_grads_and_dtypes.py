"""What the engine guarantees about gradients and dtypes, where a slip would give a wrong answer silently:
a leaf owns its .grad, gradients keep their input's dtype, Python numbers follow PyTorch's promotion,
and a learner's forward cannot write into the caller's tensors."""
import numpy as np
import pytest

import tinyattn as ta
import tinyattn.nn as nn
import tinyattn.nn.functional as F


# ------------------------------------------------------------------ a leaf owns its .grad
def shared(a, b):
    return np.shares_memory(a.grad.numpy(), b.grad.numpy())


def test_add_gives_each_input_its_own_gradient():
    a, b = ta.randn(3, requires_grad=True), ta.randn(3, requires_grad=True)
    (a + b).sum().backward()
    assert a.grad is not b.grad and not shared(a, b)
    with ta.no_grad():
        a.grad *= 10
    np.testing.assert_array_equal(b.grad.numpy(), np.ones(3, np.float32))


def test_clip_grad_norm_scales_shared_gradients_once():
    """PyTorch: 0.1 / sqrt(6) = 0.0408 each; with one array shared, it was scaled twice (0.00167)."""
    a, b = ta.randn(3, requires_grad=True), ta.randn(3, requires_grad=True)
    (a + b).sum().backward()
    nn.utils.clip_grad_norm_([a, b], 0.1)
    np.testing.assert_allclose(a.grad.numpy(), 0.1 / np.sqrt(6), rtol=1e-5)
    np.testing.assert_allclose(b.grad.numpy(), 0.1 / np.sqrt(6), rtol=1e-5)


def test_backward_does_not_keep_the_callers_gradient():
    x = ta.randn(3, requires_grad=True)
    g = ta.ones(3)
    x.backward(g)
    assert not np.shares_memory(x.grad.data, g.data)
    x.grad.data *= 5
    np.testing.assert_array_equal(g.numpy(), np.ones(3, np.float32))


@pytest.mark.parametrize("graph", ["expand", "view", "split", "getitem", "cat"])
def test_gradients_through_views_are_not_shared(graph):
    a, b = ta.randn(2, 3, requires_grad=True), ta.randn(2, 3, requires_grad=True)
    if graph == "expand":
        y = a + b.sum(0, keepdim=True).expand(2, 3) * 0 + b
    elif graph == "view":
        y = a + b.view(3, 2).view(2, 3)
    elif graph == "split":
        y = ta.cat(list(ta.cat([a, b], 0).split(2, 0)), 1)
    elif graph == "getitem":
        y = a[:, :] + b[:, :]
    else:
        y = ta.cat([a + b, a + b], 0)
    y.backward(ta.ones_like(y))
    assert not shared(a, b)


def test_ta_grad_returns_arrays_of_their_own():
    a, b = ta.randn(3, requires_grad=True), ta.randn(3, requires_grad=True)
    u = ta.ones(3)
    ga, gb = ta.grad(a + b, [a, b], grad_outputs=u)
    assert not np.shares_memory(ga.data, gb.data) and not np.shares_memory(ga.data, u.data)


def test_accumulation_over_two_backwards_leaves_the_first_gradient_alone():
    a, b = ta.randn(3, requires_grad=True), ta.randn(3, requires_grad=True)
    (a + b).sum().backward()
    first = b.grad
    (a * 2).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), np.full(3, 3, np.float32))
    np.testing.assert_array_equal(first.numpy(), np.ones(3, np.float32))


def test_clone_is_a_differentiable_copy():
    x = ta.randn(3, requires_grad=True)
    y = x.clone()
    assert not np.shares_memory(x.data, y.data)
    (y * 2).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full(3, 2, np.float32))


# ------------------------------------------------------------------ gradients keep their dtype
class Float64Grad(ta.Function):
    """Returns a float64 gradient whatever its input's dtype: a learner's mistake."""

    def forward(self, x):
        return x * 2

    def backward(self, g):
        return ta.tensor(g.numpy() * 2, dtype="float64")


def test_a_gradient_of_the_wrong_dtype_is_refused():
    x = ta.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"Float64Grad.backward returned a float64 gradient for input 0, which is float32"):
        Float64Grad.apply(x).sum().backward()


def test_backward_refuses_a_gradient_of_another_dtype():
    x = ta.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="gradient has dtype float64 but the output has dtype float32"):
        (x * 2).backward(ta.ones(3, dtype="float64"))


def test_gradcheck_names_a_backward_that_returns_the_wrong_dtype():
    class Float32Grad(ta.Function):
        def forward(self, x):
            return x * 2

        def backward(self, g):
            return ta.tensor(g.numpy() * 2)                   # ta.tensor makes float32 by default

    x = ta.randn(3, dtype="float64", requires_grad=True)
    with pytest.raises(RuntimeError, match="Float32Grad.backward returned a float32 gradient for input 0, which is float64"):
        ta.gradcheck(Float32Grad.apply, (x,))


@pytest.mark.parametrize("op", ["+", "-", "*", "/", "**", "where", "cat"])
def test_mixed_float_inputs_promote_and_each_gradient_keeps_its_dtype(op):
    a = ta.rand(2, 3, requires_grad=True) + 0.5
    a.retain_grad()
    b = ta.rand(3, dtype="float64", requires_grad=True)
    fns = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / (b + 1),
           "**": lambda: a ** b, "where": lambda: ta.where(ta.tensor([True, False, True]), a, b),
           "cat": lambda: ta.cat([a, b.reshape(1, 3)], 0)}
    y = fns[op]()
    assert y.dtype == ta.float64
    y.sum().backward()
    assert a.grad.dtype == ta.float32 and b.grad.dtype == ta.float64


@pytest.mark.parametrize("make", [
    lambda x: F.linear(x, ta.randn(4, 3)),
    lambda x: nn.Linear(3, 4)(x),
    lambda x: x @ ta.randn(3, 4),
    lambda x: F.layer_norm(x, 3, ta.ones(3), ta.zeros(3)),
    lambda x: F.scaled_dot_product_attention(x.reshape(1, 1, 2, 3), ta.randn(1, 1, 2, 3), ta.randn(1, 1, 2, 3)),
], ids=["F.linear", "nn.Linear", "matmul", "layer_norm", "attention"])
def test_layers_refuse_mixed_float_dtypes(make):
    """As in PyTorch (mat1 and mat2 must have the same dtype): a float64 input to float32 weights."""
    with pytest.raises(TypeError, match="got float64 and float32 tensors; convert one so both match"):
        make(ta.randn(2, 3, dtype="float64"))


# ------------------------------------------------------------------ Python numbers: PyTorch's rule
@pytest.mark.parametrize("expr, dtype", [
    (lambda: ta.tensor([1, 2, 3]) * 0.5, "float32"),
    (lambda: 0.5 * ta.tensor([1, 2, 3]), "float32"),
    (lambda: ta.tensor([1, 2, 3]) / 2, "float32"),
    (lambda: ta.tensor([1, 2, 3]) / ta.tensor([2, 2, 2]), "float32"),
    (lambda: ta.tensor([1, 2, 3]) ** 0.5, "float32"),
    (lambda: 2.0 ** ta.tensor([1, 2]), "float32"),
    (lambda: ta.tensor([True, False]) * 1.5, "float32"),
    (lambda: ta.tensor([1, 2, 3]) * 2, "int64"),
    (lambda: ta.tensor([1, 2], dtype="int32") + 2, "int32"),
    (lambda: ta.tensor([1.0, 2.0]) * np.float64(2.0), "float32"),
    (lambda: ta.tensor([1.0, 2.0], dtype="float64") * 0.5, "float64"),
    (lambda: ta.tensor([1.0, 2.0], dtype="float16") + 1, "float16"),
], ids=["int*float", "float*int", "int/int", "int/int tensors", "int**float", "float**int", "bool*float",
        "int*int", "int32+int", "float32*np.float64", "float64*float", "float16+int"])
def test_python_numbers_follow_pytorchs_promotion(expr, dtype):
    assert expr().dtype == dtype


# ------------------------------------------------------------------ a forward that writes into its input
class SoftmaxInPlace(ta.Function):
    def forward(self, x):
        x -= x.max(-1, keepdims=True)                         # writes into the caller's array
        e = self.xp.exp(x)
        return e / e.sum(-1, keepdims=True)

    def backward(self, g):
        y = self.output
        return y * (g - (g * y).sum(-1, keepdim=True))


def test_a_forward_that_writes_into_its_input_is_stopped_and_named():
    x = ta.randn(2, 3, requires_grad=True)
    before = x.numpy().copy()
    with pytest.raises(RuntimeError, match=r"SoftmaxInPlace.forward wrote into one of its input arrays"):
        SoftmaxInPlace.apply(x)
    np.testing.assert_array_equal(x.numpy(), before)


def test_an_integer_tensor_cannot_be_made_to_require_grad():
    with pytest.raises(RuntimeError, match="only floating point tensors can require gradients, not int64"):
        ta.tensor([1, 2, 3]).requires_grad_()


def test_optimizer_state_of_another_shape_is_refused():
    """A (3,) moment loaded for a (1,) parameter would broadcast into it silently."""
    small, big = ta.randn(1, requires_grad=True), ta.randn(3, requires_grad=True)
    source = ta.optim.AdamW([big])
    big.grad = ta.ones(3)
    source.step()
    target = ta.optim.AdamW([small])
    with pytest.raises(ValueError, match=r"'exp_avg' of parameter 0 has shape \(3,\), the parameter has shape \(1,\)"):
        target.load_state_dict(source.state_dict())


def test_optimizer_state_keeps_the_parameters_dtype():
    p = ta.randn(3, requires_grad=True)
    opt = ta.optim.AdamW([p])
    p.grad = ta.ones(3)
    opt.step()
    saved = opt.state_dict()
    saved["state"][0]["exp_avg"] = saved["state"][0]["exp_avg"].astype("float64")
    opt.load_state_dict(saved)
    assert all(v.dtype == np.float32 for k, v in opt.state[id(p)].items() if k != "step")
    opt.step()
    assert p.dtype == ta.float32 and all(v.dtype == np.float32 for k, v in opt.state[id(p)].items() if k != "step")
