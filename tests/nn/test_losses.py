"""Losses and log-probabilities for the steps after pretraining (fine-tuning, preferences, RL):
cross_entropy's reductions with the fast layer on and off, token_logprobs, logsigmoid, softplus."""
import numpy as np
import pytest

import tinyattn as ta
import tinyattn.nn.functional as F
from tinyattn.fast import ops as fast_ops
from conftest import compiled_ops


def log_softmax(x):
    """The plain formula, in float64."""
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def per_row_loss(logits, targets, ignore_index):
    """-log p[target] per row, 0 where ignored, and the softmax - onehot gradient of each row."""
    valid = targets != ignore_index
    logp = log_softmax(logits)
    safe = np.where(valid, targets, 0)
    loss = -logp[np.arange(len(targets)), safe] * valid
    grad = (np.exp(logp) - np.eye(logits.shape[1])[safe]) * valid[:, None]
    return loss, grad


def sample(rng, n=40, classes=65):
    logits = (3 * rng.standard_normal((n, classes))).astype(np.float32)
    targets = rng.integers(0, classes, n)
    targets[::4] = -1                                   # some ignored rows
    return logits, targets


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_each_reduction_gives_the_formulas_loss_and_gradient_compiled_or_not(fast, reduction, rng):
    logits, targets = sample(rng)
    x = ta.tensor(logits, requires_grad=True)
    with compiled_ops(fast):
        loss = F.cross_entropy(x, ta.tensor(targets), ignore_index=-1, reduction=reduction)
    u = rng.standard_normal(loss.shape).astype(np.float32)     # a random cotangent
    loss.backward(ta.tensor(u))
    rows, grad = per_row_loss(logits, targets, -1)
    count = (targets != -1).sum()
    want = {"mean": rows.sum() / count, "sum": rows.sum(), "none": rows}[reduction]
    scale = u[:, None] if reduction == "none" else u / count if reduction == "mean" else u
    assert loss.shape == np.shape(want) and loss.dtype == ta.float32
    np.testing.assert_allclose(loss.numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), grad * scale, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fast", [True, False])
def test_only_the_default_reduction_runs_the_fast_cross_entropy(fast, rng):
    """The fast op stands in for the CrossEntropy op (the mean); the other reductions are composed."""
    logits, targets = sample(rng)
    x = ta.tensor(logits, requires_grad=True)
    with compiled_ops(fast):
        mean = F.cross_entropy(x, ta.tensor(targets), ignore_index=-1)
        assert isinstance(mean.grad_fn, F.CrossEntropy)
        assert isinstance(mean.grad_fn, fast_ops.CrossEntropy) == fast
        for kw in ({"reduction": "sum"}, {"reduction": "none"}, {"weight": ta.ones(65)}, {"label_smoothing": 0.1}):
            out = F.cross_entropy(x, ta.tensor(targets), ignore_index=-1, **kw)
            assert not isinstance(out.grad_fn, F.CrossEntropy)
        same = F.cross_entropy(x, ta.tensor(targets), ignore_index=-1, weight=ta.ones(65))   # the composed mean
    np.testing.assert_allclose(same.item(), mean.item(), rtol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_classes_along_dim_1_give_the_flattened_rows_losses(reduction, rng):
    logits = rng.standard_normal((2, 5, 3, 4))          # (N, C, d1, d2)
    targets = rng.integers(0, 5, (2, 3, 4))
    targets[0, 1] = -100
    loss = F.cross_entropy(ta.tensor(logits, dtype="float64"), ta.tensor(targets), reduction=reduction)
    rows = F.cross_entropy(ta.tensor(np.moveaxis(logits, 1, -1).reshape(-1, 5), dtype="float64"),
                           ta.tensor(targets.reshape(-1)), reduction=reduction)
    want = rows.numpy().reshape(targets.shape) if reduction == "none" else rows.numpy()
    assert loss.shape == want.shape
    np.testing.assert_allclose(loss.numpy(), want, rtol=1e-12)


def test_a_language_models_logits_unflattened_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"classes along dim 1.*view\(-1, C\)"):
        F.cross_entropy(ta.randn(2, 3, 4), ta.tensor(np.zeros((2, 3), dtype=np.int64)))


def test_token_logprobs_summed_over_a_sequence_match_the_formula(rng):
    logits = (2 * rng.standard_normal((3, 8, 11))).astype(np.float32)     # (B, T, V)
    targets = rng.integers(0, 11, (3, 8))
    targets[:, :3] = -1                                                    # a prompt that is not scored
    x = ta.tensor(logits, requires_grad=True)
    picked = F.token_logprobs(x, ta.tensor(targets), ignore_index=-1)      # (B, T)
    want = np.take_along_axis(log_softmax(logits), np.maximum(targets, 0)[..., None], -1)[..., 0] * (targets >= 0)
    assert picked.shape == (3, 8) and picked.dtype == ta.float32
    np.testing.assert_allclose(picked.numpy(), want, atol=1e-6)
    np.testing.assert_allclose(picked.sum(-1).numpy(), want.sum(-1), atol=1e-5)
    picked.sum().backward()                             # d/dx of sum log p[target] = onehot - softmax, where scored
    onehot = np.eye(11)[np.maximum(targets, 0)]
    np.testing.assert_allclose(x.grad.numpy(), (onehot - np.exp(log_softmax(logits))) * (targets >= 0)[..., None],
                               atol=1e-6)


def test_token_logprobs_is_minus_cross_entropy_per_row(rng):
    logits = rng.standard_normal((4, 6, 9))
    targets = rng.integers(0, 9, (4, 6))
    picked = F.token_logprobs(ta.tensor(logits, dtype="float64"), ta.tensor(targets))
    ce = F.cross_entropy(ta.tensor(logits.reshape(-1, 9), dtype="float64"), ta.tensor(targets.reshape(-1)),
                         reduction="none")
    np.testing.assert_allclose(picked.numpy().reshape(-1), -ce.numpy(), rtol=1e-12)


def test_token_logprobs_refuses_targets_that_do_not_fit():
    with pytest.raises(ValueError, match="token_logprobs"):
        F.token_logprobs(ta.randn(2, 3, 5), ta.tensor(np.zeros((2, 4), dtype=np.int64)))
    with pytest.raises(IndexError, match=r"\[0, 5\)"):
        F.token_logprobs(ta.randn(2, 5), ta.tensor(np.array([0, 5])))
    with pytest.raises(TypeError, match="integers"):
        F.token_logprobs(ta.randn(2, 5), ta.tensor(np.array([0.0, 1.0])))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_logsigmoid_and_softplus_stay_finite_far_out(dtype):
    x = np.array([-1e4, -100.0, -30.0, -1.0, 0.0, 1.0, 30.0, 100.0, 1e4], dtype=dtype)
    t = ta.tensor(x, dtype=dtype, requires_grad=True)
    out = F.logsigmoid(t)
    assert out.dtype == dtype and out.numpy()[1] == -100.0 and out.numpy()[0] == -1e4 and out.numpy()[-1] == 0.0
    tiny = 1e-37 if dtype == "float32" else 0.0         # (float32's subnormals, near 1e-44, hold a digit or two)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(out.numpy(), -np.logaddexp(0, -x64), rtol=1e-6, atol=tiny)
    out.sum().backward()                                # d/dx log sigmoid(x) = sigmoid(-x)
    np.testing.assert_allclose(t.grad.numpy(), np.exp(-np.logaddexp(0, x64)), rtol=1e-6, atol=tiny)
    plus = F.softplus(ta.tensor(x, dtype=dtype))
    assert np.isfinite(plus.numpy()).all() and plus.numpy()[-1] == 1e4
    np.testing.assert_allclose(plus.numpy(), np.logaddexp(0, x64), rtol=1e-6, atol=tiny)


def test_softplus_is_x_past_the_threshold_and_refuses_integers():
    x = ta.tensor(np.array([2.4, 2.6, 10.0]), dtype="float64")
    np.testing.assert_array_equal(F.softplus(x, beta=2.0, threshold=5.0).numpy()[1:], [2.6, 10.0])
    np.testing.assert_allclose(F.softplus(x, beta=2.0, threshold=5.0).numpy()[0], np.log1p(np.exp(4.8)) / 2)
    with pytest.raises(TypeError, match="softplus: expected a float tensor"):
        F.softplus(ta.tensor(np.array([1, 2])))
