"""The CPU kernels (numba, the optional `fast` extra): switched on and off, NaN in, NaN out, the float32 exp.

Every kernel is also checked against its op's formula, in float64 and float32, by
tests/engine/test_optable.py (test_every_registered_kernel_matches_the_formula*), and the
op table's gradient checks run with the kernels on and off (the cpu_kernels fixture).
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import tinyattn as ta
import tinyattn.nn.functional as F
from tinyattn import ops
from tinyattn.backend import get_backend
from conftest import count_kernel_calls

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def kernel_count(env=None, prelude=""):
    """How many CPU kernels a fresh process registers, with ``env`` added to its environment."""
    code = prelude + "from tinyattn.backend import get_backend; print(len(get_backend('cpu').kernels))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **(env or {})},
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


needs_kernels = pytest.mark.skipif(not get_backend("cpu").kernels, reason="no CPU kernels (numba not installed)")


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


@needs_kernels
def test_q_k_v_gradients_from_one_qkv_buffer_join_without_a_copy(monkeypatch):
    """The attention kernel writes dq, dk, dv where q, k, v sit in the qkv buffer, so the
    split's backward has nothing to concatenate; the gradient is the same either way."""
    r = np.random.default_rng(8)
    x, g = r.standard_normal((2, 16, 3 * 12)), r.standard_normal((2, 3, 16, 4))
    results, concats, cat_forward = {}, [], ops.Cat.forward

    def counting_cat(self, *arrays, dim):
        concats.append(dim)
        return cat_forward(self, *arrays, dim=dim)
    monkeypatch.setattr(ops.Cat, "forward", counting_cat)
    for use_kernels in (True, False):
        monkeypatch.setattr(get_backend("cpu"), "use_kernels", use_kernels)
        concats.clear()
        xt = ta.tensor(x, dtype="float64", requires_grad=True)
        q, k, v = (t.view(2, 16, 3, 4).transpose(1, 2) for t in xt.split(12, dim=2))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(ta.tensor(g, dtype="float64"))
        results[use_kernels] = (xt.grad.numpy(), len(concats))
    np.testing.assert_allclose(results[True][0], results[False][0], rtol=1e-12, atol=1e-14)
    assert results[True][1] == 0 and results[False][1] == 1


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
