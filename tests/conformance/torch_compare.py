"""Run one expression on tinyattn and on PyTorch, from the same numpy inputs, and compare.

``check(fn, arrays)`` calls ``fn(lib, *tensors)`` twice: with lib = tinyattn's namespace
and with lib = torch's (each has ``F``, ``where``, ``cat``, ``stack``, ...), so one lambda
such as ``lambda m, x: m.F.softmax(x * 2, -1)`` states the case for both. It compares
what PyTorch's users see: that both succeed or both refuse, then the output's shape,
dtype and values (NaN equal to NaN, infinities by sign), and then, for every float input,
the gradient of <u, out> for one random cotangent u.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tinyattn as ta  # noqa: E402

class Library:
    """A library's namespace for the cases: its module's names (m.exp, m.cat, m.where, m.float32,
    ...), plus ``m.F`` for its nn.functional and ``m.name``."""

    def __init__(self, name, module, functional):
        self.name, self.module, self.F = name, module, functional

    def __getattr__(self, attr):
        return getattr(self.module, attr)


TA = Library("tinyattn", ta, ta.nn.functional)
TORCH = Library("torch", torch, torch.nn.functional)

TOLERANCE = {"float16": (2e-3, 1e-3), "float32": (2e-5, 1e-6), "float64": (1e-10, 1e-12)}
REFUSALS = (TypeError, ValueError, RuntimeError, IndexError, NotImplementedError)


DTYPES = ["bool", "int32", "int64", "float16", "float32", "float64"]


def sample(dtype, shape=(2, 3), seed=0):
    """Random host data of ``dtype``: booleans, small integers (negative too) or normal floats."""
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) > 0.5
    if dtype.startswith("int"):
        return rng.integers(-4, 5, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def dtype_name(t):
    return str(t.dtype).replace("torch.", "")


def to_ta(a, grad):
    return ta.tensor(a, dtype=str(a.dtype), requires_grad=grad and a.dtype.kind == "f")


def to_torch(a, grad):
    return torch.tensor(a, requires_grad=grad and a.dtype.kind == "f")


def outputs(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def host(t):
    return t.detach().numpy() if isinstance(t, torch.Tensor) else t.detach().numpy()


def close(got, want, dtype, what):
    rtol, atol = TOLERANCE.get(dtype, (0, 0))
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, PyTorch {want.shape}"
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
                                   equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def check(fn, arrays, grad=True, rtol=None):
    """fn(lib, *tensors) on both libraries, compared. Returns tinyattn's outputs."""
    arrays = [np.asarray(a) for a in arrays]
    results = {}
    for lib, convert in ((TORCH, to_torch), (TA, to_ta)):
        inputs = [convert(a, grad) for a in arrays]
        try:
            with np.errstate(all="ignore"):
                out = fn(lib, *inputs)
        except REFUSALS as e:
            results[lib.name] = e
            continue
        results[lib.name] = (inputs, outputs(out))
    want, got = results["torch"], results["tinyattn"]
    if isinstance(want, Exception):
        assert isinstance(got, Exception), f"PyTorch refuses ({type(want).__name__}: {want}), tinyattn does not"
        return got
    if isinstance(got, Exception):
        raise AssertionError(f"tinyattn refuses ({type(got).__name__}: {got}), PyTorch does not") from got
    (t_in, t_out), (a_in, a_out) = want, got
    assert len(a_out) == len(t_out)
    for i, (a, t) in enumerate(zip(a_out, t_out)):
        assert dtype_name(a) == dtype_name(t), f"output {i}: dtype {dtype_name(a)}, PyTorch {dtype_name(t)}"
        close(host(a), host(t), dtype_name(t), f"output {i}")
    if grad:
        compare_grads(t_in, t_out, a_in, a_out)
    return a_out


def compare_grads(t_in, t_out, a_in, a_out):
    needs = [i for i, t in enumerate(t_in) if t.requires_grad]
    float_outs = [j for j, t in enumerate(t_out) if t.requires_grad]
    if not needs or not float_outs:
        for j, a in enumerate(a_out):
            assert a.requires_grad == t_out[j].requires_grad, f"output {j}: requires_grad differs"
        return
    rng = np.random.default_rng(5)
    us = {j: rng.standard_normal(t_out[j].shape) for j in float_outs}
    t_grads = torch.autograd.grad([t_out[j] for j in float_outs],
                                  [t_in[i] for i in needs],
                                  [torch.tensor(us[j], dtype=t_out[j].dtype) for j in float_outs],
                                  allow_unused=True)
    a_grads = ta.grad([a_out[j] for j in float_outs], [a_in[i] for i in needs],
                      [ta.tensor(us[j], dtype=dtype_name(a_out[j])) for j in float_outs], allow_unused=True)
    for i, tg, ag in zip(needs, t_grads, a_grads):
        if tg is None:
            assert ag is None or not np.any(host(ag)), f"input {i}: PyTorch gives no gradient"
            continue
        assert ag is not None, f"input {i}: no gradient, PyTorch gives one"
        assert dtype_name(ag) == dtype_name(tg), f"gradient of input {i}: dtype {dtype_name(ag)}, PyTorch {dtype_name(tg)}"
        close(host(ag), host(tg), least_precise(dtype_name(tg), *(dtype_name(t_out[j]) for j in float_outs)),
              f"gradient of input {i}")


def least_precise(*dtypes):
    """The dtype whose tolerance is widest: a float64 gradient that flows from a float32 output
    is only as exact as float32."""
    return max(dtypes, key=lambda d: TOLERANCE.get(d, (0, 0))[0])


def refusals(fn, arrays):
    """fn(lib, *tensors) on both libraries, which must both refuse: (tinyattn's error, PyTorch's)."""
    errors = {}
    for lib, convert in ((TORCH, to_torch), (TA, to_ta)):
        try:
            fn(lib, *[convert(np.asarray(a), True) for a in arrays])
            errors[lib.name] = None
        except REFUSALS as e:
            errors[lib.name] = e
    assert errors["torch"] is not None, f"PyTorch accepts it (tinyattn: {errors['tinyattn']!r})"
    assert errors["tinyattn"] is not None, f"PyTorch refuses ({errors['torch']!r}), tinyattn does not"
    return errors["tinyattn"], errors["torch"]


def same_kind_of_refusal(ours, theirs):
    """tinyattn's error is an instance of the class PyTorch raises, so that PyTorch code's
    ``except`` catches it. Where PyTorch raises its catch-all RuntimeError, tinyattn's error also
    names the kind of mistake, as Python does: ta.TensorError is a ValueError (a bad value or
    shape), ta.DtypeError a TypeError, ta.IndexRangeError an IndexError, and each a RuntimeError.
    One exception: for a dtype it has no kernel for PyTorch raises NotImplementedError, a
    RuntimeError; tinyattn raises a DtypeError, a RuntimeError too but not a NotImplementedError,
    which in Python means "not written yet" (the exercises' stubs raise it)."""
    if type(theirs) is NotImplementedError:
        return isinstance(ours, RuntimeError) and not isinstance(ours, NotImplementedError)
    return isinstance(ours, type(theirs))
