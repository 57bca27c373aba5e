"""Every op in the table: forward against numpy, gradcheck, gradgradcheck, the stand-in device."""
import numpy as np
import pytest

import tinyattn as ta
import tinyattn.nn.functional as F
from tinyattn.tensor import Function
from conftest import make_tensors, forward_and_backward
from optable import OPS

IDS = [spec.name for spec in OPS]


def strict_available():
    try:
        import array_api_strict  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.mark.parametrize("spec", OPS, ids=IDS)
def test_forward_matches_numpy(spec):
    arrays = spec.inputs(np.random.default_rng(0))
    out = spec.fn(*make_tensors(arrays))
    np.testing.assert_allclose(out.numpy(), spec.reference(*arrays), atol=spec.atol, rtol=1e-7)


@pytest.mark.parametrize("spec", OPS, ids=IDS)
def test_gradcheck(spec):
    inputs = make_tensors(spec.inputs(np.random.default_rng(1)))
    assert ta.gradcheck(spec.fn, inputs, eps=spec.eps)


@pytest.mark.parametrize("spec", [s for s in OPS if s.gradgrad], ids=[s.name for s in OPS if s.gradgrad])
def test_gradgradcheck(spec):
    inputs = make_tensors(spec.inputs(np.random.default_rng(2)))
    assert ta.gradgradcheck(spec.fn, inputs, eps=spec.eps)


@pytest.mark.parametrize("spec", [s for s in OPS if s.keeps_dtype], ids=[s.name for s in OPS if s.keeps_dtype])
def test_float32_stays_float32(spec):
    inputs = make_tensors(spec.inputs(np.random.default_rng(3)), dtype="float32")
    out = spec.fn(*inputs)
    assert out.dtype == ta.float32
    out.backward(ta.ones_like(out))
    for t in inputs:
        if t.requires_grad:
            assert t.grad.dtype == ta.float32, spec.name


@pytest.mark.skipif(not strict_available(), reason="needs array_api_strict")
@pytest.mark.parametrize("spec", OPS, ids=IDS)
def test_stand_in_device_matches_numpy(spec):
    """The op on array_api_strict's non-CPU device: no implicit host conversion, same numbers."""
    arrays = spec.inputs(np.random.default_rng(4))
    on_cpu = forward_and_backward(spec, arrays, "cpu")
    on_device = forward_and_backward(spec, arrays, "strict")
    for a, b in zip(on_cpu, on_device):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ coverage
TENSOR_OPS = ["__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__truediv__", "__rtruediv__",
              "__pow__", "__rpow__", "__neg__", "__matmul__", "exp", "log", "sqrt", "abs", "tanh", "sigmoid",
              "relu", "erf", "clamp", "float", "sum", "mean", "max", "min", "var", "std", "reshape", "view",
              "transpose", "permute", "T", "expand", "broadcast_to", "squeeze", "unsqueeze", "flatten",
              "__getitem__", "split", "chunk", "masked_fill", "tril", "triu"]


def test_every_function_is_exercised_by_the_table():
    """Each Function subclass in tinyattn runs (forward or backward) in some table entry."""
    Function.trace = set()
    try:
        for spec in OPS:
            inputs = make_tensors(spec.inputs(np.random.default_rng(0)))
            if spec.gradgrad:
                ta.gradgradcheck(spec.fn, inputs, eps=spec.eps, raise_exception=False)
            else:
                out = spec.fn(*inputs)
                out.backward(ta.ones_like(out))
        ran = Function.trace
    finally:
        Function.trace = None
    ours = {cls for cls in Function.registry if cls.__module__.startswith("tinyattn.")}
    ours.discard(__import__("tinyattn.ops", fromlist=["ToDevice"]).ToDevice)  # needs two devices: tested below
    missing = sorted(cls.__name__ for cls in ours - ran)
    assert not missing, f"ops with no entry in tests/optable.py: {missing}"


def test_every_public_op_has_an_entry():
    names = {spec.name.split("(")[0] for spec in OPS}
    public = {f"F.{n}" for n in F.__all__} | {f"Tensor.{n}" for n in TENSOR_OPS} | {"ta.cat", "ta.stack", "ta.where"}
    missing = sorted(public - names)
    assert not missing, f"public ops with no entry in tests/optable.py: {missing}"
    for name in TENSOR_OPS:
        assert hasattr(ta.Tensor, name)


def test_to_device_gradient():
    pytest.importorskip("array_api_strict")
    x = ta.randn(3, 2, dtype="float64", requires_grad=True)
    y = x.to("strict")
    assert y.device == "strict"
    (y * y).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.numpy())
    assert x.grad.device == "cpu"


# ------------------------------------------------------------------ gradcheck catches errors
class WrongSquare(ta.Function):
    """x**2 with a backward that forgets the factor 2."""

    def forward(self, a):
        return a * a

    def backward(self, g):
        return g * self.parents[0]


class ZeroSoftmax(ta.Function):
    """softmax with a zero backward: a summed-output check would pass it."""

    def forward(self, a):
        e = self.xp.exp(a - self.xp.max(a, axis=-1, keepdims=True))
        return e / self.xp.sum(e, axis=-1, keepdims=True)

    def backward(self, g):
        return g * 0.0


def test_gradcheck_rejects_a_wrong_backward():
    x = ta.randn(3, 4, dtype="float64", requires_grad=True)
    with pytest.raises(ta.GradcheckError) as err:
        ta.gradcheck(lambda a: WrongSquare.apply(a), (x,))
    message = str(err.value)
    assert "input 0" in message and "index" in message and "analytic" in message and "numeric" in message
    assert not ta.gradcheck(lambda a: WrongSquare.apply(a), (x,), mode="full", raise_exception=False)


def test_gradcheck_rejects_a_zero_softmax_backward():
    x = ta.randn(2, 5, dtype="float64", requires_grad=True)
    assert not ta.gradcheck(lambda a: ZeroSoftmax.apply(a), (x,), raise_exception=False)
    # the sum of a softmax is constant, so the sum-of-outputs check would have passed it
    assert abs(ZeroSoftmax.apply(x).sum().item() - 2.0) < 1e-12


def test_gradgradcheck_rejects_a_wrong_second_derivative():
    class Cube(ta.Function):       # first derivative right, written with a constant: second is 0
        def forward(self, a):
            self.d = 3 * a * a
            return a * a * a

        def backward(self, g):
            return g * ta.Tensor._make(self.d, g._backend)

    x = ta.randn(4, dtype="float64", requires_grad=True)
    assert ta.gradcheck(lambda a: Cube.apply(a), (x,))
    assert not ta.gradgradcheck(lambda a: Cube.apply(a), (x,), raise_exception=False)


def test_gradcheck_needs_float64():
    x = ta.randn(3, requires_grad=True)
    with pytest.raises(ValueError, match="float64"):
        ta.gradcheck(lambda a: a * 2, (x,))


def test_fused_layer_norm_backward_matches_composite(rng):
    x, w, b = (ta.tensor(a, dtype="float64", requires_grad=True)
               for a in (rng.standard_normal((4, 5, 8)), rng.standard_normal(8), rng.standard_normal(8)))
    u = ta.tensor(rng.standard_normal((4, 5, 8)), dtype="float64")
    grads = []
    for fused in (True, False):
        for t in (x, w, b):
            t.grad = None
        F.layer_norm(x, 8, w, b, fused=fused).backward(u)
        grads.append([t.grad.numpy() for t in (x, w, b)])
    for a, c in zip(*grads):
        np.testing.assert_allclose(a, c, rtol=1e-10, atol=1e-12)


def test_fused_backward_refuses_create_graph():
    x = ta.randn(2, 4, dtype="float64", requires_grad=True)
    y = F.layer_norm(x, 4)
    with pytest.raises(RuntimeError, match="fused backward"):
        ta.grad(y.sum(), x, create_graph=True)
