"""The CPU kernels (numba, the optional `fast` extra): switched on and off, NaN in, NaN out, the float32 exp.

Every kernel is also checked against its op's formula, in float64 and float32, by
tests/engine/test_optable.py (test_every_registered_kernel_matches_the_formula*), and the
op table's gradient checks run with the kernels on and off (the cpu_kernels fixture).
"""
import os
import subprocess
import sys

import numpy as np

from exercises.checking import formulas
import pytest

import tinyattn as ta
import tinyattn.nn.functional as F
from tinyattn import ops
from tinyattn.backend import get_backend
from conftest import count_kernel_calls



def kernel_count(env=None, prelude=""):
    """How many CPU kernels a fresh process registers, with ``env`` added to its environment."""
    code = prelude + "from tinyattn.backend import get_backend; print(len(get_backend('cpu').kernels))"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **(env or {})},
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def test_switched_off_by_the_environment_and_absent_without_numba():
    pytest.importorskip("numba")
    assert kernel_count({"TINYATTN_CPU_KERNELS": "1"}) >= 9
    assert kernel_count({"TINYATTN_CPU_KERNELS": "0"}) == 0
    assert kernel_count(prelude="import sys; sys.modules['numba'] = None; ") == 0    # as if not installed


def test_the_strict_device_never_gets_the_cpu_kernels():
    pytest.importorskip("array_api_strict")
    assert get_backend("strict").kernels == {}


def needs_kernels(test):
    """A test of the CPU kernels: skipped without them, and run as inside a compiled model's call
    (the fast ops are what asks for them)."""
    test = pytest.mark.skipif(not get_backend("cpu").kernels, reason="no CPU kernels (numba not installed)")(test)
    return pytest.mark.usefixtures("fast_layer_on")(test)


@needs_kernels
def test_float32_exp_is_within_a_float32_rounding():
    from numba import njit
    from tinyattn.fast.cpu_kernels import _exp

    @njit
    def exp_all(x, out):
        for i in range(x.size):
            out[i] = _exp(x[i])

    x = np.concatenate([np.linspace(-87, 88, 200001), np.random.default_rng(0).standard_normal(10000)]).astype(np.float32)
    out = np.empty_like(x)
    exp_all(x, out)
    exact = np.exp(x.astype(np.float64))
    assert np.max(np.abs(out / exact - 1)) < 2.5e-7
    special = np.array([np.nan, -np.inf, 0.0], np.float32)
    exp_all(special, out[:3])
    assert np.isnan(out[0]) and out[1] < 1e-37 and out[2] == 1.0


@needs_kernels
def test_float32_erf_is_within_a_few_float32_roundings():
    import math
    from tinyattn.fast.cpu_kernels import erf
    x = np.concatenate([np.linspace(-6, 6, 120001), np.geomspace(1e-30, 1, 2001), -np.geomspace(1e-30, 1, 2001),
                        np.random.default_rng(0).standard_normal(10000)]).astype(np.float32)
    out = erf(x)
    exact = np.array([math.erf(v) for v in x.astype(np.float64)])
    assert out.dtype == np.float32
    assert np.max(np.abs(out - exact) / np.maximum(np.abs(exact), 1e-38)) < 3e-7   # relative, down to 1e-30
    special = erf(np.array([np.nan, np.inf, -np.inf, 0.0, 30.0, -30.0], np.float32))
    assert np.isnan(special[0]) and list(special[1:]) == [1.0, -1.0, 0.0, 1.0, -1.0]


@needs_kernels
@pytest.mark.parametrize("op", ["gelu", "softmax", "attention", "layer_norm", "cross_entropy", "flash_attention"])
def test_nan_in_nan_out(op, monkeypatch):
    """A NaN input must not be swallowed (detect_anomaly and the training loop look for it)."""
    calls = count_kernel_calls(get_backend("cpu"), monkeypatch)
    monkeypatch.setattr(get_backend("cpu"), "use_kernels", True)
    x = ta.tensor([[0.5, float("nan"), -1.0, 2.0]], requires_grad=True)
    fn = {"gelu": lambda: F.gelu(x, approximate="tanh"),
          "softmax": lambda: ops.MaskedSoftmax.apply(x, ta.tensor(np.tril(np.ones((1, 4), bool), k=2), dtype="bool")),
          "attention": lambda: F.scaled_dot_product_attention(x[None, None].mT, x[None, None].mT, x[None, None].mT,
                                                             is_causal=True),
          "layer_norm": lambda: F.layer_norm(x, 4),
          "cross_entropy": lambda: F.cross_entropy(x, ta.tensor([0])),
          "flash_attention": lambda: F.flash_attention(x[None, None].mT, x[None, None].mT, x[None, None].mT,
                                                       is_causal=True, block_size=2)}[op]
    out = fn()
    assert np.isnan(out.numpy()).any()
    out.backward(ta.ones_like(out))
    assert np.isnan(x.grad.numpy()).any()
    kernel = {"gelu": "gelu_tanh", "softmax": "masked_softmax", "attention": "attention", "layer_norm": "layer_norm",
              "cross_entropy": "cross_entropy", "flash_attention": "attention_tile_softmax_"}[op]
    assert calls.get(kernel), f"the {kernel} kernel did not run: {calls}"


@needs_kernels
@pytest.mark.parametrize("mask", ["causal", "band", "random"])
def test_masked_softmax_finds_each_rows_max_at_its_first_or_last_allowed_key(mask, monkeypatch):
    """The kernels look for a row's max only between its first and last allowed key: a max just
    inside either end must still be found, or exp overflows (softmax does not depend on which
    max is subtracted, so only scores large enough to overflow float64's exp can tell)."""
    calls = count_kernel_calls(get_backend("cpu"), monkeypatch)
    r = np.random.default_rng(5)
    t = 9
    allowed = {"causal": np.tril(np.ones((t, t), bool)),
               "band": np.tril(np.ones((t, t), bool)) & np.triu(np.ones((t, t), bool), k=-2),
               "random": r.random((t, t)) < 0.5}[mask]
    allowed[0] = False                                             # and a row with nothing allowed
    scores = r.standard_normal((2, t, t))
    for i in range(1, t):
        keys = np.flatnonzero(allowed[i])
        if len(keys):
            scores[0, i, keys[0]] = scores[1, i, keys[-1]] = 1000.0   # exp(1000) is inf in float64
    exact = np.where(allowed, np.exp(scores - np.where(allowed, scores, -np.inf).max(-1, keepdims=True)), 0)
    exact /= np.maximum(exact.sum(-1, keepdims=True), 1e-300)
    x = ta.tensor(scores, dtype="float64")
    got = ops.MaskedSoftmax.apply(x, ta.tensor(allowed, dtype="bool")).numpy()
    np.testing.assert_allclose(got, exact, atol=1e-12)
    ones = ta.tensor(np.eye(t)[None], dtype="float64")             # k = I, v = I: the output is the weights
    q = ta.tensor(scores * 2.0, dtype="float64").reshape(1, 2, t, t)
    got = F.scaled_dot_product_attention(q, ones.expand(1, 2, t, t), ones.expand(1, 2, t, t),
                                         attn_mask=ta.tensor(allowed, dtype="bool"), scale=0.5).numpy()
    np.testing.assert_allclose(got[0], exact, atol=1e-12)
    assert calls.get("masked_softmax") and calls.get("attention"), calls


def _split_then_view(xt, B, T, H, D):
    """q, k, v as (B, T, C) pieces of the qkv product, each seen as (B, H, T, D)."""
    return [t.view(B, T, H, D).transpose(1, 2) for t in xt.split(H * D, dim=2)]


def _view_then_split(xt, B, T, H, D):
    """As nn.MultiHeadAttention cuts them: (B, T, 3H, D) seen as (B, 3H, T, D), split along the heads."""
    return xt.view(B, T, 3 * H, D).transpose(1, 2).split(H, dim=1)


@needs_kernels
@pytest.mark.parametrize("cut", [_split_then_view, _view_then_split])
def test_q_k_v_gradients_from_one_qkv_buffer_join_without_a_copy(monkeypatch, cut):
    """The attention kernel writes dq, dk, dv where q, k, v sit in the qkv buffer, so the
    split's backward has nothing to concatenate (the buffer, or its transposed view, is the
    gradient); the gradient is the same either way."""
    r = np.random.default_rng(8)
    B, T, H, D = 2, 16, 3, 4
    x, g = r.standard_normal((B, T, 3 * H * D)), r.standard_normal((B, H, T, D))
    results, concats, xp = {}, [], get_backend("cpu").xp
    concat = xp.concat

    def counting_concat(arrays, axis=0):                     # (Cat.forward's: the library's Cat stays as it is)
        concats.append(axis)
        return concat(arrays, axis=axis)
    monkeypatch.setattr(xp, "concat", counting_concat)
    for use_kernels in (True, False):
        monkeypatch.setattr(get_backend("cpu"), "use_kernels", use_kernels)
        concats.clear()
        xt = ta.tensor(x, dtype="float64", requires_grad=True)
        q, k, v = cut(xt, B, T, H, D)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(ta.tensor(g, dtype="float64"))
        results[use_kernels] = (xt.grad.numpy(), len(concats))
    np.testing.assert_allclose(results[True][0], results[False][0], rtol=1e-12, atol=1e-14)
    assert results[True][1] == 0 and results[False][1] == 1


def test_joined_finds_the_strided_whole_of_heads_cut_from_a_transposed_buffer():
    from tinyattn.fast import threads as cpu
    B, T, H, D = 2, 5, 3, 4
    qkv = np.arange(B * T * 3 * H * D, dtype=np.float32).reshape(B, T, 3 * H, D)
    heads = qkv.transpose(0, 2, 1, 3)                                               # (B, 3H, T, D)
    q, k, v = heads[:, :H], heads[:, H:2 * H], heads[:, 2 * H:]
    shape = (B, 3 * H, T, D)
    whole = cpu.joined([q, k, v], shape, 1)
    assert whole is not None and np.shares_memory(whole, qkv)                       # no copy
    assert whole.shape == shape and whole.strides == heads.strides
    np.testing.assert_array_equal(whole, heads)
    assert cpu.joined([k, q, v], shape, 1) is None                                  # out of order
    assert cpu.joined([q, v, k], shape, 1) is None
    assert cpu.joined([q, k], (B, 2 * H, T, D), 1) is None                          # part of the buffer
    wide = np.zeros((B, T, 4 * H, D), np.float32).transpose(0, 2, 1, 3)             # a buffer they do not fill
    assert cpu.joined([wide[:, :H], wide[:, H:2 * H], wide[:, 2 * H:3 * H]], shape, 1) is None
    other = qkv.copy().transpose(0, 2, 1, 3)                                         # two buffers
    assert cpu.joined([q, k, other[:, 2 * H:]], shape, 1) is None
    assert cpu.joined([q, k, v.astype(np.float64)], shape, 1) is None
    square = np.arange(16.0).reshape(2, 4, 2)                                       # in place, in another order
    assert cpu.joined([square[:, :2], square[:, 2:].transpose(0, 2, 1)], (2, 4, 2), 1) is None
    flat = np.arange(24.0)                                                           # broadcast pieces (stride 0)
    repeated = np.broadcast_to(flat[:12].reshape(1, 3, 4), (2, 3, 4))               # over a buffer of 2 * 3 * 4
    assert repeated.base is flat and repeated.strides[0] == 0
    assert cpu.joined([repeated[:, i:i + 1] for i in range(3)], (2, 3, 4), 1) is None


def test_joined_finds_the_array_whose_slices_the_pieces_are():
    from tinyattn.fast import threads as cpu
    whole = np.arange(2 * 3 * 9.0).reshape(2, 3, 9)
    pieces = [whole[:, :, 0:2], whole[:, :, 2:6], whole[:, :, 6:9]]
    assert cpu.joined(pieces, (2, 3, 9), 2) is not None
    np.testing.assert_array_equal(cpu.joined(pieces, (2, 3, 9), 2), whole)
    assert cpu.joined([p.copy() for p in pieces], (2, 3, 9), 2) is None               # not views
    assert cpu.joined(pieces[::-1], (2, 3, 9), 2) is None                             # out of order
    assert cpu.joined(pieces[:2], (2, 3, 9), 2) is None                               # not all of it
    assert cpu.joined([whole[:, :, 0:2], whole[:, :, 3:7], whole[:, :, 7:9]], (2, 3, 9), 2) is None   # a gap
    assert cpu.joined([whole[:1], whole[1:]], (2, 3, 9), 0) is not None


@needs_kernels
@pytest.mark.parametrize("layout", ["transposed", "every other row", "reversed rows", "broadcast"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_softmax_kernel_on_inputs_laid_out_otherwise(layout, dtype):
    """The op table hands the softmax kernel contiguous arrays; views (a transpose, a step, a
    broadcast) must give the formula's numbers too, in the input's shape."""
    from tinyattn.fast.cpu_kernels import softmax
    x = (4 * np.random.default_rng(10).standard_normal((3, 7, 5))).astype(dtype)
    view = {"transposed": x.transpose(0, 2, 1), "every other row": x[:, ::2], "reversed rows": x[:, :, ::-1],
            "broadcast": np.broadcast_to(x[:1], x.shape)}[layout]
    assert not view.flags.c_contiguous
    y = softmax(view)
    assert y.dtype == dtype and y.shape == view.shape
    want = formulas.softmax(view.astype(np.float64))
    np.testing.assert_allclose(y, want, rtol=1e-13 if dtype == np.float64 else 1e-5,
                               atol=1e-15 if dtype == np.float64 else 1e-6)


@needs_kernels
def test_softmax_of_a_transposed_tensor_runs_the_kernel_and_matches_the_formula(monkeypatch):
    cpu = get_backend("cpu")
    calls = count_kernel_calls(cpu, monkeypatch)
    monkeypatch.setattr(cpu, "use_kernels", True)
    r = np.random.default_rng(11)
    x, g = 4 * r.standard_normal((2, 6, 9)), r.standard_normal((2, 6, 9))
    xt = ta.tensor(x, dtype="float64", requires_grad=True)
    y = F.softmax(xt.transpose(1, 2), -1)                          # (2, 9, 6), rows strided in memory
    (y.transpose(1, 2) * ta.tensor(g, dtype="float64")).sum().backward()   # a strided gradient back
    assert calls.get("softmax") and calls.get("softmax_backward"), calls
    want = formulas.softmax(x.transpose(0, 2, 1))
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-13, atol=1e-15)
    gy = g.transpose(0, 2, 1)
    dx = want * (gy - (gy * want).sum(-1, keepdims=True))
    np.testing.assert_allclose(xt.grad.numpy(), dx.transpose(0, 2, 1), rtol=1e-12, atol=1e-14)


@needs_kernels
def test_every_kernel_returns_arrays_or_none():
    """One convention for every kernel: its result (an array, or a tuple of arrays), or None when it declines."""
    from optable import KERNEL_CASES
    cpu = get_backend("cpu")
    results = {}

    def recording(name, fn):
        def wrapper(*args):
            results.setdefault(name, []).append(fn(*args))
            return results[name][-1]
        return wrapper

    import pytest as _pytest
    with _pytest.MonkeyPatch.context() as mp:
        for name, fn in list(cpu.kernels.items()):
            mp.setitem(cpu.kernels, name, recording(name, fn))
        for case in KERNEL_CASES:
            case.run(case.inputs(np.random.default_rng(0)), "cpu", "float32")
    assert set(results) == set(cpu.kernels)
    for name, outs in results.items():
        for out in outs:
            parts = out if isinstance(out, tuple) else (out,)
            assert out is None or all(isinstance(a, np.ndarray) for a in parts), (name, type(out))


@needs_kernels
@pytest.mark.parametrize("shape", [(1, 128), (3, 5, 8), (700, 96)], ids=["one row", "3-d", "split over threads"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_layer_norm_without_keeping_xhat_gives_the_same_output(shape, dtype):
    """keep=False (no backward to come) skips xhat and rstd: y must not change for it, to the bit
    (inference and training give the same outputs)."""
    from tinyattn.fast.cpu_kernels import layer_norm
    r = np.random.default_rng(12)
    x = (3 * r.standard_normal(shape) + 1).astype(dtype)
    w, b = r.standard_normal(shape[-1:]).astype(dtype), r.standard_normal(shape[-1:]).astype(dtype)
    y, xhat, rstd = layer_norm(x, w, b, 1e-5)
    y_only, none1, none2 = layer_norm(x, w, b, 1e-5, keep=False)
    assert none1 is None and none2 is None and y_only.shape == x.shape
    np.testing.assert_array_equal(y_only, y)
    mean, var = x.astype(np.float64).mean(-1, keepdims=True), x.astype(np.float64).var(-1, keepdims=True)
    want = (x - mean) / np.sqrt(var + 1e-5) * w + b
    np.testing.assert_allclose(y_only, want, rtol=1e-12 if dtype == np.float64 else 1e-4,
                               atol=1e-12 if dtype == np.float64 else 1e-4)


@needs_kernels
def test_layer_norm_saves_xhat_with_grad_mode_on_and_not_under_no_grad(monkeypatch):
    cpu = get_backend("cpu")
    monkeypatch.setattr(cpu, "use_kernels", True)
    x = ta.tensor(np.random.default_rng(13).standard_normal((4, 16)), dtype="float32")
    w, b = ta.ones(16, requires_grad=True), ta.zeros(16, requires_grad=True)
    with ta.no_grad():
        y0 = F.layer_norm(x, 16, w, b)
    y1 = F.layer_norm(x, 16, w, b)
    assert y0.grad_fn is None and len(y1.grad_fn.saved) == 2          # (xhat, rstd) for backward
    np.testing.assert_array_equal(y0.numpy(), y1.numpy())


@needs_kernels
@pytest.mark.parametrize("eps", [1e-5, np.float32(1e-5), np.array(1e-5), 1])
def test_layer_norm_takes_eps_of_any_number_type(eps):
    x = ta.tensor(np.random.default_rng(14).standard_normal((3, 4)), dtype="float32")
    w, b = ta.ones(4), ta.zeros(4)
    with ta.no_grad():
        y = F.layer_norm(x, 4, w, b, eps=eps).numpy()
    xd = x.numpy().astype(np.float64)
    want = (xd - xd.mean(-1, keepdims=True)) / np.sqrt(xd.var(-1, keepdims=True) + float(eps))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_every_kernel_is_named_by_the_fast_code_that_asks_for_it():
    """Each fast op names its kernels (kernels = ...), as do the fused block, the attention runner
    and AdamW's flat step: every kernel of the CPU's table is named, and every name is a kernel."""
    pytest.importorskip("numba")
    from tinyattn.fast import cpu_block, cpu_kernels, models, modules, ops as fast_ops, optim as fast_optim
    named = {name for op in fast_ops.FAST_OPS.values() for name in op.kernels}
    named |= set(models.BlockOp.kernels) | set(modules.MultiHeadAttention.kernels) | set(fast_optim.KERNELS)
    assert named == set(cpu_kernels.KERNELS) | set(cpu_block.KERNELS)
    assert all(op.kernels for op in fast_ops.FAST_OPS.values() if op.__name__ not in ("MatMul", "Sum", "Split", "Linear"))
