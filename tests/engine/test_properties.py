"""Property tests: hypothesis draws random shapes, axes, slices and attention sizes, and
each case is checked against numpy (forward) and a float64 gradcheck (backward).

Example counts are small (the suite stays fast); hypothesis shrinks any failure to a
smallest case, and ``derandomize`` makes every run draw the same cases.
"""
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import assume, given, settings, strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

import tinyattn as ta  # noqa: E402
import tinyattn.nn.functional as F  # noqa: E402

FEW = settings(max_examples=25, deadline=None, derandomize=True, database=None)


def leaf(a):
    return ta.tensor(a, dtype="float64", requires_grad=True)


def values(shape, seed, low=-2.0, high=2.0):
    return np.random.default_rng(seed).uniform(low, high, shape)


# ---------------------------------------------------------------- binary ops over broadcastable shapes
BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "div": (lambda a, b: a / b, lambda a, b: a / b),
    "pow": (lambda a, b: a ** b, lambda a, b: a ** b),
    "where": (lambda a, b: ta.where(a > 0.5, a, b), lambda a, b: np.where(a > 0.5, a, b)),
}


@pytest.mark.parametrize("name", sorted(BINARY))
@FEW
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4),
       seed=st.integers(0, 2 ** 16))
def test_binary_ops_broadcast_and_gradcheck(name, shapes, seed):
    sa, sb = shapes.input_shapes
    a = values(sa, seed, 0.5, 2.0)                              # positive: pow and div are smooth there
    b = values(sb, seed + 1, 0.5, 2.0)
    if name == "where":                                         # keep a away from the switch at 0.5
        a = np.where(np.abs(a - 0.5) < 0.05, a + 0.1, a)
    fn, ref = BINARY[name]
    out = fn(leaf(a), leaf(b))
    assert out.shape == shapes.result_shape
    np.testing.assert_allclose(out.numpy(), ref(a, b), rtol=1e-12, atol=1e-12)
    assert ta.gradcheck(fn, (leaf(a), leaf(b)))


@FEW
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=1, max_dims=3, max_side=4),
       seed=st.integers(0, 2 ** 16))
def test_numpy_and_tinyattn_agree_on_what_broadcasts(shapes, seed):
    """Shapes that numpy rejects are rejected with the library's own message."""
    sa, sb = shapes.input_shapes
    bad = tuple(n + 1 for n in sb) if sb else (2,)
    try:
        np.broadcast_shapes(sa, bad)
        fits = True
    except ValueError:
        fits = False
    x, y = ta.tensor(values(sa, seed)), ta.tensor(values(bad, seed))
    if fits:
        assert (x * y).shape == np.broadcast_shapes(sa, bad)
    else:
        with pytest.raises(ValueError, match=r"^mul: shapes .* do not broadcast"):
            x * y


# ---------------------------------------------------------------- reductions over random axes
@st.composite
def shape_and_axes(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4))
    axes = draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1),
                          st.lists(st.integers(0, len(shape) - 1), min_size=1, unique=True).map(tuple)))
    return shape, axes, draw(st.booleans())


REDUCTIONS = {
    "sum": (lambda x, d, k: x.sum(d, keepdim=k), lambda a, d, k: a.sum(axis=d, keepdims=k)),
    "mean": (lambda x, d, k: x.mean(d, keepdim=k), lambda a, d, k: a.mean(axis=d, keepdims=k)),
    "max": (lambda x, d, k: x.max(d, keepdim=k), lambda a, d, k: a.max(axis=d, keepdims=k)),
    "min": (lambda x, d, k: x.min(d, keepdim=k), lambda a, d, k: a.min(axis=d, keepdims=k)),
    "var": (lambda x, d, k: x.var(d, keepdim=k), lambda a, d, k: a.var(axis=d, keepdims=k, ddof=1)),
    "logsumexp": (lambda x, d, k: x.logsumexp(d, keepdim=k),
                  lambda a, d, k: np.log(np.exp(a).sum(axis=d, keepdims=k))),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@FEW
@given(case=shape_and_axes(), seed=st.integers(0, 2 ** 16))
def test_reductions_over_random_axes(name, case, seed):
    shape, axes, keep = case
    if name == "logsumexp" and not isinstance(axes, int):
        axes = -1                                              # logsumexp takes one dim, as in PyTorch
    n = int(np.prod([shape[a] for a in (range(len(shape)) if axes is None else np.atleast_1d(axes))]))
    assume(name != "var" or n >= 2)                            # one value has no sample variance
    rng = np.random.default_rng(seed)
    a = (rng.permutation(int(np.prod(shape))) * 0.1 + rng.uniform(0, 0.02)).reshape(shape)   # no ties for max
    fn, ref = REDUCTIONS[name]
    out = fn(leaf(a), axes, keep)
    np.testing.assert_allclose(out.numpy(), ref(a, axes, keep), rtol=1e-10, atol=1e-12)
    assert ta.gradcheck(lambda x: fn(x, axes, keep), (leaf(a),))


# ---------------------------------------------------------------- indexing with random slices
@st.composite
def shape_and_index(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5))
    index = draw(hnp.basic_indices(shape, min_dims=0, allow_newaxis=True, allow_ellipsis=True))
    return shape, index


@FEW
@given(case=shape_and_index(), seed=st.integers(0, 2 ** 16))
def test_indexing_with_random_slices(case, seed):
    shape, index = case
    a = values(shape, seed)
    out = leaf(a)[index]
    np.testing.assert_array_equal(out.numpy(), a[index])
    if out.numel():
        assert ta.gradcheck(lambda x: x[index], (leaf(a),))


@FEW
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5), seed=st.integers(0, 2 ** 16),
       data=st.data())
def test_indexing_with_random_integer_arrays_sums_repeats(shape, seed, data):
    a = values(shape, seed)
    idx = data.draw(st.lists(st.integers(-shape[0], shape[0] - 1), min_size=1, max_size=6))
    x = leaf(a)
    out = x[ta.tensor(idx)]
    np.testing.assert_array_equal(out.numpy(), a[idx])
    out.sum().backward()
    expected = np.zeros(shape)
    np.add.at(expected, idx, 1.0)                                # a row picked twice gets 2
    np.testing.assert_array_equal(x.grad.numpy(), expected)


# ---------------------------------------------------------------- attention against the naive formula
def naive_attention(q, k, v, causal):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])     # (B, H, Tq, Tk)
    if causal:
        Tq, Tk = scores.shape[-2:]
        scores = np.where(np.tril(np.ones((Tq, Tk), bool)), scores, -np.inf)
    w = np.exp(scores - scores.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(B=st.integers(1, 3), H=st.integers(1, 3), T=st.integers(1, 9), D=st.integers(1, 8),
       causal=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_attention_matches_the_naive_formula(B, H, T, D, causal, seed):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((B, H, T, D)) for _ in range(3))
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)   # noqa: E731
    out = fn(leaf(q), leaf(k), leaf(v))
    assert out.shape == (B, H, T, D)
    np.testing.assert_allclose(out.numpy(), naive_attention(q, k, v, causal), rtol=1e-10, atol=1e-12)
    assert ta.gradcheck(fn, (leaf(q), leaf(k), leaf(v)))


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(B=st.integers(1, 2), T=st.integers(1, 8), H=st.integers(1, 4), D=st.integers(1, 4),
       seed=st.integers(0, 2 ** 16))
def test_multi_head_attention_is_per_head_attention(B, T, H, D, seed):
    """nn.MultiHeadAttention = the naive formula on each head's slice of the projections."""
    import tinyattn.nn as nn
    ta.manual_seed(seed)
    C = H * D
    mha = nn.MultiHeadAttention(C, H)
    x = np.random.default_rng(seed).standard_normal((B, T, C)).astype(np.float32)
    out = mha(ta.tensor(x), is_causal=True).numpy()
    qkv = x @ mha.c_attn.weight.numpy().T + mha.c_attn.bias.numpy()                   # (B, T, 3C)
    q, k, v = (qkv[..., i * C:(i + 1) * C].reshape(B, T, H, D).transpose(0, 2, 1, 3) for i in range(3))
    y = naive_attention(q, k, v, True).transpose(0, 2, 1, 3).reshape(B, T, C)
    ref = y @ mha.c_proj.weight.numpy().T + mha.c_proj.bias.numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
