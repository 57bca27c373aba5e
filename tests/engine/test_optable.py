"""Every op in the table: forward against numpy, gradcheck, gradgradcheck, the stand-in device."""
import weakref

import numpy as np
import pytest

import tinyattn as ta
import tinyattn.nn.functional as F
from tinyattn.autograd import Function
from tinyattn.backend import get_backend
from conftest import make_tensors, forward_and_backward, kernel_and_formula, record_applied_ops, all_subclasses
from optable import OPS, KERNEL_CASES, KernelCase

IDS = [spec.name for spec in OPS]


def strict_available():
    try:
        import array_api_strict  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.mark.parametrize("spec", OPS, ids=IDS)
def test_forward_matches_numpy(spec, cpu_kernels):
    arrays = spec.inputs(np.random.default_rng(0))
    out = spec.fn(*make_tensors(arrays))
    np.testing.assert_allclose(out.numpy(), spec.reference(*arrays), atol=spec.atol, rtol=1e-7)


@pytest.mark.parametrize("spec", OPS, ids=IDS)
def test_gradcheck(spec, cpu_kernels):
    inputs = make_tensors(spec.inputs(np.random.default_rng(1)))
    assert ta.gradcheck(spec.fn, inputs, eps=spec.eps)


@pytest.mark.parametrize("spec", [s for s in OPS if s.gradgrad], ids=[s.name for s in OPS if s.gradgrad])
def test_gradgradcheck(spec, cpu_kernels):
    inputs = make_tensors(spec.inputs(np.random.default_rng(2)))
    assert ta.gradgradcheck(spec.fn, inputs, eps=spec.eps)


@pytest.mark.parametrize("spec", [s for s in OPS if s.keeps_dtype], ids=[s.name for s in OPS if s.keeps_dtype])
def test_float32_stays_float32(spec, cpu_kernels):
    inputs = make_tensors(spec.inputs(np.random.default_rng(3)), dtype="float32")
    out = spec.fn(*inputs)
    assert out.dtype == ta.float32
    out.backward(ta.ones_like(out))
    for t in inputs:
        if t.requires_grad:
            assert t.grad.dtype == ta.float32, spec.name


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("spec", OPS, ids=IDS)
def test_no_op_writes_into_its_inputs(spec, dtype, cpu_kernels):
    """Every op, forward and backward, with its input arrays read-only (as a learner's own ops
    get them): an op that wrote into an input would change the caller's tensor."""
    inputs = make_tensors(spec.inputs(np.random.default_rng(6)), dtype=dtype)
    for t in inputs:
        t.data.flags.writeable = False
    out = spec.fn(*inputs)
    out.backward(ta.ones_like(out))


@pytest.mark.skipif(not strict_available(), reason="needs array_api_strict")
@pytest.mark.parametrize("spec", OPS, ids=IDS)
def test_stand_in_device_matches_numpy(spec, cpu_kernels):
    """The op on array_api_strict's non-CPU device: no implicit host conversion, same numbers."""
    arrays = spec.inputs(np.random.default_rng(4))
    on_cpu = forward_and_backward(spec, arrays, "cpu")
    on_device = forward_and_backward(spec, arrays, "strict")
    for a, b in zip(on_cpu, on_device):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ coverage
TENSOR_OPS = ["__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__truediv__", "__rtruediv__",
              "__pow__", "__rpow__", "__neg__", "neg", "__matmul__", "exp", "log", "sqrt", "abs", "tanh", "sigmoid",
              "relu", "sign", "erf", "clamp", "clone", "float", "sum", "mean", "max", "min", "var", "std", "reshape", "view",
              "transpose", "permute", "T", "expand", "broadcast_to", "squeeze", "unsqueeze", "flatten",
              "__getitem__", "gather", "split", "chunk", "masked_fill", "tril", "triu", "dot", "clip", "topk",
              "masked_fill_"]


def test_every_function_is_exercised_by_the_table(monkeypatch):
    """Each Function subclass in tinyattn runs (forward or backward) in some table entry."""
    ran = record_applied_ops(monkeypatch)
    for spec in OPS:
        inputs = make_tensors(spec.inputs(np.random.default_rng(0)))
        if spec.gradgrad:
            ta.gradgradcheck(spec.fn, inputs, eps=spec.eps, raise_exception=False)
        else:
            out = spec.fn(*inputs)
            out.backward(ta.ones_like(out))
    ours = {cls for cls in all_subclasses(Function) if cls.__module__.startswith("tinyattn.")
            and not cls.__module__.startswith("tinyattn.fast")}              # (the fast ops: below)
    ours.discard(__import__("tinyattn.ops", fromlist=["ToDevice"]).ToDevice)  # needs two devices: tested below
    ours.discard(__import__("tinyattn.ops", fromlist=["FloorDiv"]).FloorDiv)  # no gradient, as in PyTorch
    missing = sorted(cls.__name__ for cls in ours - ran)
    assert not missing, f"ops with no entry in tests/support/optable.py: {missing}"


def test_every_public_op_has_an_entry():
    names = {spec.name.split("(")[0] for spec in OPS}
    public = {f"F.{n}" for n in F.__all__} | {f"Tensor.{n}" for n in TENSOR_OPS} | {"ta.cat", "ta.stack", "ta.where", "ta.gather",
                                                                                   "ta.dot", "ta.topk"}
    missing = sorted(public - names)
    assert not missing, f"public ops with no entry in tests/support/optable.py: {missing}"
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
            self.save(3 * a * a)
            return a * a * a

        def backward(self, g):
            return g * self.constant(self.saved[0])

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
    q = ta.randn(1, 1, 4, 2, dtype="float64", requires_grad=True)
    y = F.flash_attention(q, q, q)                              # its backward works on raw arrays
    with pytest.raises(RuntimeError, match="fused backward"):
        ta.grad(y.sum(), q, create_graph=True)


# ---------------------------------------------------------------- saved state is freed by backward
def _graph_functions(out):
    """Every Function in the graph that made ``out``."""
    seen, stack, found = set(), [out], []
    while stack:
        ctx = stack.pop().grad_fn
        if ctx is None or id(ctx) in seen:
            continue
        seen.add(id(ctx))
        found.append(ctx)
        stack.extend(ctx.parents)
    return found


def _holds_array(value, backend):
    if isinstance(value, (tuple, list)):
        return any(_holds_array(v, backend) for v in value)
    return backend.is_array(value)


@pytest.mark.parametrize("spec", OPS, ids=IDS)
def test_backward_frees_every_saved_array(spec):
    """One convention: arrays that backward needs go through self.save, and the engine drops them."""
    inputs = make_tensors(spec.inputs(np.random.default_rng(3)))
    out = spec.fn(*inputs)
    functions = _graph_functions(out)
    assert functions or any(out is t for t in inputs), f"{spec.name} recorded no graph"
    out.backward(ta.tensor(np.random.default_rng(4).standard_normal(out.shape), dtype="float64"))
    for ctx in functions:
        kept = [k for k, v in vars(ctx).items() if k not in ("backend", "xp") and _holds_array(v, out.backend)]
        assert not kept, f"{type(ctx).__name__} keeps arrays after backward in {kept}: use self.save(...)"


def test_saved_arrays_are_released_after_backward():
    x = ta.randn(8, 16, requires_grad=True)
    y = x.relu()                                      # saves its mask, an (8, 16) array
    saved = weakref.ref(y.grad_fn.saved[0])
    y.sum().backward(retain_graph=True)
    assert saved() is not None                        # retain_graph keeps it for a second backward
    y.sum().backward()
    assert saved() is None, "the saved array outlived backward"
    assert y.shape == (8, 16)                         # while the output itself is still alive


# ---------------------------------------------------------------- every registered kernel against the formula
def registered_kernels():
    """(device, kernel name) for every kernel that a backend on this machine registers."""
    found = []
    for device in ("cpu", "strict", "cuda"):
        try:
            backend = get_backend(device)
        except RuntimeError:                                   # no CuPy or GPU here
            continue
        found += [(device, name) for name in sorted(backend.kernels)]
    return found


@pytest.mark.parametrize("device, name", registered_kernels())
def test_every_registered_kernel_matches_the_formula(device, name, monkeypatch):
    cases = [case for case in KERNEL_CASES if name in case.kernels]
    assert cases, f"kernel {name!r} on {device} has no KernelCase in tests/support/optable.py"
    for case in cases:
        fused, formula = kernel_and_formula(case, device, "float64", monkeypatch)
        for i, (a, b) in enumerate(zip(fused, formula)):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=f"{case.name}: output {i}")


def _gelu_tanh_numpy(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


@pytest.mark.parametrize("wrong", [False, True], ids=["right kernel", "wrong kernel"])
def test_a_cpu_kernel_is_used_and_checked(wrong, monkeypatch):
    """The lookup works on the CPU too: a kernel registered there runs, and the check catches a wrong one."""
    cpu = get_backend("cpu")
    monkeypatch.setitem(cpu.kernels, "gelu_tanh", lambda a: _gelu_tanh_numpy(a) * (1.01 if wrong else 1.0))
    case = KernelCase("gelu_tanh on the CPU", {"gelu_tanh"}, lambda r: [r.standard_normal((6, 9))],
                      fn=lambda a: F.gelu(a, approximate="tanh"))
    fused, formula = kernel_and_formula(case, "cpu", "float64", monkeypatch)
    close = np.allclose(fused[0], formula[0], rtol=1e-10, atol=1e-12)
    assert close != wrong
    np.testing.assert_allclose(fused[1], formula[1], rtol=1e-10)    # no backward kernel: the formula's gradient


@pytest.mark.parametrize("device, name", registered_kernels())
def test_every_registered_kernel_matches_the_formula_in_float32(device, name, monkeypatch):
    """The same in float32, where kernels take their own float32 paths (the CPU's polynomial exp):
    within a few float32 roundings of the formula."""
    for case in [case for case in KERNEL_CASES if name in case.kernels]:
        fused, formula = kernel_and_formula(case, device, "float32", monkeypatch)
        for i, (a, b) in enumerate(zip(fused, formula)):
            assert a.dtype == b.dtype == np.float32, f"{case.name}: output {i} is {a.dtype} and {b.dtype}"
            scale = np.abs(b).max() + 1e-30
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * scale, err_msg=f"{case.name}: output {i}")
