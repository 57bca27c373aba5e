"""Flash attention: the same numbers as plain attention, in far less memory."""
import tracemalloc

import numpy as np
import pytest

import tinyattn as ta
import tinyattn.nn.functional as F
from tinyattn.nn.flash import FlashAttention


def _qkvu(rng, B, H, Tq, Tk, D, Dv, dtype="float64"):
    """q, k, v that require grad, and a cotangent u for the output."""
    shapes = [(B, H, Tq, D), (B, H, Tk, D), (B, H, Tk, Dv)]
    q, k, v = (ta.tensor(rng.standard_normal(s), dtype=dtype, requires_grad=True) for s in shapes)
    u = ta.tensor(rng.standard_normal((B, H, Tq, Dv)), dtype=dtype)
    return q, k, v, u


def _forward_backward(fn, q, k, v, u):
    """fn's output and the gradients of <u, out> for q, k, v, as numpy arrays."""
    for t in (q, k, v):
        t.grad = None
    out = fn(q, k, v)
    out.backward(u)
    return [out.numpy()] + [t.grad.numpy() for t in (q, k, v)]


# (B, H, Tq, Tk, D, Dv), block sizes: small blocks only for short sequences (Python loops)
CASES = [
    ((1, 1, 1, 1, 4, 4), (1, 3, 64)),
    ((2, 3, 17, 17, 8, 8), (1, 3, 16, 64)),
    ((1, 2, 40, 40, 8, 4), (1, 3, 16)),
    ((1, 2, 33, 50, 16, 8), (3, 16, 64)),       # fewer queries than keys
    ((2, 1, 50, 20, 8, 8), (3, 16, 64)),        # more queries than keys: late rows see every key
    ((1, 2, 200, 200, 32, 32), (16, 64)),
    ((1, 1, 130, 190, 16, 16), (64,)),
]
PARAMS = [(shape, bs, causal) for shape, sizes in CASES for bs in sizes for causal in (False, True)]


@pytest.mark.parametrize("shape,block_size,causal", PARAMS,
                         ids=[f"{'x'.join(map(str, s))}-bs{b}-{'causal' if c else 'full'}" for s, b, c in PARAMS])
def test_matches_scaled_dot_product_attention(shape, block_size, causal, cpu_kernels):
    q, k, v, u = _qkvu(np.random.default_rng(sum(shape) + block_size), *shape)
    flash = _forward_backward(lambda a, b, c: F.flash_attention(a, b, c, is_causal=causal, block_size=block_size),
                              q, k, v, u)
    plain = _forward_backward(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal, impl="naive"),
                              q, k, v, u)
    for name, a, b in zip(("out", "dq", "dk", "dv"), flash, plain):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=name)


def test_custom_scale(rng):
    q, k, v, u = _qkvu(rng, 1, 2, 20, 30, 8, 8)
    flash = _forward_backward(lambda a, b, c: F.flash_attention(a, b, c, scale=0.3, block_size=7), q, k, v, u)
    plain = _forward_backward(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, scale=0.3, impl="naive"), q, k, v, u)
    for a, b in zip(flash, plain):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_float32_close_to_float64(rng, cpu_kernels):
    arrays = _qkvu(rng, 1, 2, 70, 70, 16, 16)
    exact = _forward_backward(lambda a, b, c: F.flash_attention(a, b, c, is_causal=True), *arrays)
    single = [ta.tensor(t.numpy(), dtype="float32", requires_grad=t.requires_grad) for t in arrays]
    approx = _forward_backward(lambda a, b, c: F.flash_attention(a, b, c, is_causal=True), *single)
    for a, b in zip(approx, exact):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def _count_tiles(monkeypatch):
    """[first, ...]: one entry per tile whose softmax runs (first = j0 - i0, key block start minus
    query block start), forward and backward, in the teaching loops and in the fast layer's."""
    from tinyattn.fast.ops import FlashAttention as Fast
    calls = []
    for cls in (FlashAttention, Fast):
        for name in ("_softmax_tile", "_softmax_grad_tile"):
            def counting(self, *args, _cls=cls, _original=cls.__dict__[name]):
                if type(self) is _cls:                            # (not again when the fast op calls super())
                    calls.append(args[-1])
                return _original(self, *args)
            monkeypatch.setattr(cls, name, counting)
    return calls


def test_causal_skips_tiles_above_the_diagonal(monkeypatch, rng, cpu_kernels):
    """T=256 in blocks of 64 is 4 x 4 tiles: causal computes only the 10 on or below the diagonal."""
    calls = _count_tiles(monkeypatch)
    q, k, v, u = _qkvu(rng, 1, 1, 256, 256, 8, 8)
    F.flash_attention(q, k, v, is_causal=True, block_size=64).backward(u)
    assert len(calls) == 2 * 10                                   # forward and backward
    assert all(first <= 0 for first in calls)                     # no key block starts after its query block
    calls.clear()
    F.flash_attention(q, k, v, block_size=64)
    assert len(calls) == 16


def test_no_keys_gives_zeros_not_nan(rng):
    """With nothing to attend to (the only way to mask a whole row here) the output is 0, not NaN."""
    q, k, v, u = _qkvu(rng, 1, 2, 5, 0, 4, 3)
    out = F.flash_attention(q, k, v, block_size=2)
    out.backward(u)
    assert out.shape == (1, 2, 5, 3)
    assert np.all(out.numpy() == 0) and np.all(q.grad.numpy() == 0)


def test_only_some_inputs_need_grad(rng):
    q, k, v, u = _qkvu(rng, 1, 1, 9, 9, 4, 4)
    k.requires_grad = False
    F.flash_attention(q, k, v, block_size=4).backward(u)
    assert k.grad is None and q.grad is not None and v.grad is not None


def test_no_grad_records_nothing(rng):
    q, k, v, _ = _qkvu(rng, 1, 1, 9, 9, 4, 4)
    with ta.no_grad():
        out = F.flash_attention(q, k, v)
    assert not out.requires_grad and out.grad_fn is None


def test_shape_errors_name_the_shapes():
    q, k, v = ta.randn(1, 2, 5, 4), ta.randn(1, 2, 6, 4), ta.randn(1, 2, 7, 4)
    with pytest.raises(ValueError, match=r"q \(1, 2, 5, 4\), k \(1, 2, 6, 4\) and v \(1, 2, 7, 4\)"):
        F.flash_attention(q, k, v)
    with pytest.raises(ValueError, match="flash_attention"):
        F.flash_attention(ta.randn(2, 5, 4), ta.randn(2, 5, 4), ta.randn(2, 5, 4))
    with pytest.raises(ValueError, match="block_size"):
        F.flash_attention(q, q, q, block_size=0)


def test_mixed_dtypes_are_an_error_as_in_scaled_dot_product_attention():
    q, k = ta.randn(1, 2, 5, 4), ta.randn(1, 2, 5, 4)
    with pytest.raises(TypeError, match="flash_attention: got float32 and float64 tensors"):
        F.flash_attention(q, k.double(), k.double())


def test_backward_cannot_be_differentiated_again(rng):
    q, k, v, _ = _qkvu(rng, 1, 1, 4, 4, 4, 4)
    with pytest.raises(RuntimeError, match="FlashAttention"):
        ta.grad(F.flash_attention(q, k, v).sum(), q, create_graph=True)


# ------------------------------------------------------------------ memory
def _peak_mib(fn, T, dtype="float32"):
    """Peak traced allocation (MiB) of fn's forward and backward, inputs made beforehand."""
    q, k, v, u = _qkvu(np.random.default_rng(0), 1, 1, T, T, 32, 32, dtype)
    tracemalloc.start()
    try:
        fn(q, k, v).backward(u)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / 2 ** 20


def test_flash_uses_far_less_memory_than_naive():
    """At T=1024 plain attention holds (T, T) scores and weights (4 MiB each in float32);
    flash holds (64, 64) tiles. The ratio measured here was about 35; 8 leaves a wide margin."""
    T = 1024
    naive = _peak_mib(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, impl="naive"), T)
    flash = _peak_mib(lambda q, k, v: F.flash_attention(q, k, v, is_causal=True, block_size=64), T)
    assert naive >= 2 * T * T * 4 / 2 ** 20, f"naive peak {naive:.2f} MiB: it should hold two T x T arrays"
    assert naive > 8 * flash, f"naive peak {naive:.2f} MiB, flash peak {flash:.2f} MiB"


def test_flash_memory_grows_linearly():
    """Doubling T about doubles flash's peak (O(T)); naive's about quadruples (O(T^2))."""
    flash = [_peak_mib(lambda q, k, v: F.flash_attention(q, k, v), T) for T in (512, 1024)]
    naive = [_peak_mib(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, impl="naive"), T) for T in (512, 1024)]
    assert flash[1] / flash[0] < 2.5, flash
    assert naive[1] / naive[0] > 3.5, naive
