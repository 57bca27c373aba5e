"""Where PyTorch refuses, tinyattn refuses too, in its own words (one line naming the op and
the shapes or dtypes involved), with an error that is an instance of PyTorch's class, so that
PyTorch code's ``except`` catches it (torch_compare.same_kind_of_refusal)."""
import numpy as np
import pytest

from torch_compare import check, refusals, same_kind_of_refusal, torch

import tinyattn as ta  # noqa: E402


def f64(*shape):
    return np.random.default_rng(0).standard_normal(shape)


REFUSED = {
    "shapes that do not broadcast": (lambda m, a, b: a + b, [f64(2, 3), f64(4)]),
    "matmul that does not fit": (lambda m, a, b: a @ b, [f64(2, 3), f64(4, 2)]),
    "matmul of a 0-d tensor": (lambda m, a, b: a @ b, [f64(), f64(3)]),
    "reshape to the wrong size": (lambda m, a: a.reshape(4), [f64(2, 3)]),
    "expand a dim that is not 1": (lambda m, a: a.expand(3, 4), [f64(2, 4)]),
    "a dim out of range": (lambda m, a: a.sum(2), [f64(2, 3)]),
    "a dim of a 0-d tensor": (lambda m, a: a.sum(1), [f64()]),
    "softmax over a missing dim": (lambda m, a: m.F.softmax(a, 3), [f64(2, 3)]),
    "permute with a repeated dim": (lambda m, a: a.permute(0, 0), [f64(2, 3)]),
    "an index out of range": (lambda m, a, i: a[i], [f64(3), np.array([5])]),
    "an int out of range": (lambda m, a: a[3], [f64(3)]),
    "a float index tensor": (lambda m, a, i: a[i], [f64(3), np.array([0.0])]),
    "clamp with no bound": (lambda m, a: a.clamp(), [f64(3)]),
    "cat of 0-d tensors": (lambda m, a, b: m.cat([a, b]), [f64(), f64()]),
    "cat of mismatched shapes": (lambda m, a, b: m.cat([a, b], 0), [f64(2, 3), f64(2, 4)]),
    "stack of mismatched shapes": (lambda m, a, b: m.stack([a, b]), [f64(2, 3), f64(3, 2)]),
    "mean of integers": (lambda m, a: a.mean(), [np.array([1, 2])]),
    "softmax of integers": (lambda m, a: m.F.softmax(a, -1), [np.array([1, 2])]),
    "gelu of integers": (lambda m, a: m.F.gelu(a), [np.array([1, 2])]),
    "linear with integer input": (lambda m, a, w: m.F.linear(a, w), [np.array([[1, 2]]), f64(3, 2)]),
    "linear of float32 and float64": (lambda m, a, w: m.F.linear(a, w), [f64(2, 2).astype("float32"), f64(3, 2)]),
    "matmul of float32 and float64": (lambda m, a, w: a @ w, [f64(2, 2).astype("float32"), f64(2, 2)]),
    "bool minus bool": (lambda m, a: a - a, [np.array([True, False])]),
    "int minus True": (lambda m, a: a - True, [np.array([1, 2])]),
    "abs of bool": (lambda m, a: a.abs(), [np.array([True])]),
    "argmax of bool": (lambda m, a: a.argmax(), [np.array([True, False])]),
    "where with a float condition": (lambda m, c, a: m.where(c, a, 0.0), [f64(3), f64(3)]),
    "sdpa gqa with heads that do not divide": (lambda m, q, k: m.F.scaled_dot_product_attention(q, k, k, enable_gqa=True),
                                               [f64(1, 4, 3, 2), f64(1, 3, 3, 2)]),
    "cross_entropy with targets out of range": (lambda m, x, t: m.F.cross_entropy(x, t), [f64(3, 4), np.array([0, 1, 7])]),
    "cross_entropy with float class indices": (lambda m, x, t: m.F.cross_entropy(x, t), [f64(3, 4), np.array([0.0, 1.0, 2.0])]),
    "cross_entropy with a bad reduction": (lambda m, x, t: m.F.cross_entropy(x, t, reduction="avg"), [f64(3, 4), np.array([0, 1, 2])]),
    "cross_entropy with (B, T, C) logits and (B, T) targets": (lambda m, x, t: m.F.cross_entropy(x, t),
                                                              [f64(2, 3, 4), np.array([[0, 1, 2], [3, 0, 1]])]),
    "cross_entropy with a weight per row, not per class": (lambda m, x, t: m.F.cross_entropy(x, t, weight=x[:, 0].detach()),
                                                           [f64(3, 4), np.array([0, 1, 2])]),
    "cross_entropy with float32 weights for float64 logits": (
        lambda m, x, t: m.F.cross_entropy(x, t, weight=m.ones(4, dtype=m.float32)), [f64(3, 4), np.array([0, 1, 2])]),
    "gather with an index out of range": (lambda m, x, i: m.gather(x, 1, i), [f64(2, 3), np.array([[0, 3]])]),
    "gather with a negative index": (lambda m, x, i: m.gather(x, 1, i), [f64(2, 3), np.array([[0, -1]])]),
    "gather with an index of other dims": (lambda m, x, i: m.gather(x, 1, i), [f64(2, 3), np.array([0, 1])]),
    "gather with an index longer than the input": (lambda m, x, i: m.gather(x, 1, i), [f64(2, 3), np.zeros((3, 1), int)]),
    "gather from a 0-d tensor at 1": (lambda m, x, i: m.gather(x, 0, i), [f64(), np.array(1)]),
    "gather with a 0-d index from 2-d": (lambda m, x, i: m.gather(x, 0, i), [f64(2, 3), np.array(1)]),
    "gather with a float index": (lambda m, x, i: m.gather(x, 0, i), [f64(2, 3), np.zeros((1, 3))]),
    "logsigmoid of integers": (lambda m, a: m.F.logsigmoid(a), [np.array([1, 2])]),
    "embedding with float ids": (lambda m, w, i: m.F.embedding(i, w), [f64(5, 3), np.array([0.0, 1.0])]),
    "layer_norm over the wrong shape": (lambda m, x: m.F.layer_norm(x, (3,)), [f64(2, 4)]),
    "x ** y with a negative integer exponent": (lambda m, a: a ** -1, [np.array([1, 2])]),
    "len() of a 0-d tensor": (lambda m, a: len(a), [f64()]),
    "item() of several elements": (lambda m, a: a.item(), [f64(3)]),
    "requires_grad_ on a non-leaf": (lambda m, a: (a * 2).requires_grad_(False), [f64(3)]),
    "backward of a non-scalar without a gradient": (lambda m, a: (a * 2).backward(), [f64(3)]),
    "in-place on a leaf that requires grad": (lambda m, a: a.__iadd__(1.0), [f64(3)]),
    "floor division backward": (lambda m, a: (a // 2).sum().backward(), [f64(3)]),
    # the everyday API of issue 46
    "dot of 2-d tensors": (lambda m, a: a.dot(a), [f64(2, 2)]),
    "dot of different lengths": (lambda m, a, b: m.dot(a, b), [f64(2), f64(3)]),
    "dot of float32 and float64": (lambda m, a, b: a.float().dot(b), [f64(2), f64(2)]),
    "dot of bools": (lambda m, a: a.dot(a), [np.array([True, False])]),
    "dot with a number": (lambda m, a: a.dot(2.0), [f64(2)]),
    "clip with no bound": (lambda m, a: m.clip(a), [f64(3)]),
    "topk with k past the dim": (lambda m, a: a.topk(4), [f64(2, 3)]),
    "topk with a negative k": (lambda m, a: a.topk(-1), [f64(2, 3)]),
    "topk with a float k": (lambda m, a: a.topk(1.0), [f64(2, 3)]),
    "topk over a missing dim": (lambda m, a: a.topk(1, dim=2), [f64(2, 3)]),
    "topk of bools": (lambda m, a: a.topk(1), [np.array([True, False])]),
    "masked_fill_ on a leaf that requires grad": (lambda m, a: a.masked_fill_(a > 0, 0.0), [f64(3)]),
    "masked_fill_ with a float mask": (lambda m, a: a.detach().masked_fill_(a.detach(), 0.0), [f64(3)]),
    "masked_fill_ with a mask of more dims": (lambda m, a, k: a.detach().masked_fill_(k, 0.0), [f64(3), np.ones((2, 3), bool)]),
    "masked_fill with a 1-d value": (lambda m, a: a.masked_fill(a > 0, a), [f64(3)]),
    "multinomial of integer weights": (lambda m, p: m.multinomial(p, 1), [np.array([1, 2])]),
    "multinomial of 3-d weights": (lambda m, p: m.multinomial(p, 1), [np.ones((1, 1, 2))]),
    "multinomial of a 0-d weight": (lambda m, p: m.multinomial(p, 1), [np.array(1.0)]),
    "multinomial of more samples than categories": (lambda m, p: m.multinomial(p, 3), [np.ones(2)]),
    "multinomial of 0 samples": (lambda m, p: m.multinomial(p, 0), [np.ones(2)]),
    "multinomial of a negative weight": (lambda m, p: m.multinomial(p, 1), [np.array([1.0, -1.0])]),
    "multinomial of a NaN weight": (lambda m, p: p.multinomial(1), [np.array([1.0, np.nan])]),
    "multinomial of an infinite weight": (lambda m, p: p.multinomial(1, True), [np.array([1.0, np.inf])]),
    "multinomial of weights that add up to 0": (lambda m, p: m.multinomial(p, 2, True), [np.zeros((2, 3))]),
    "nll_loss with a bad reduction": (lambda m, x, t: m.F.nll_loss(x, t, reduction="avg"), [f64(3, 4), np.array([0, 1, 2])]),
    "nll_loss with targets out of range": (lambda m, x, t: m.F.nll_loss(x, t), [f64(3, 4), np.array([0, 1, 7])]),
    "nll_loss with a negative target": (lambda m, x, t: m.F.nll_loss(x, t), [f64(3, 4), np.array([0, 1, -2])]),
    "nll_loss with float targets": (lambda m, x, t: m.F.nll_loss(x, t), [f64(3, 4), np.array([0.0, 1.0, 2.0])]),
    "nll_loss with integer input": (lambda m, x, t: m.F.nll_loss(x, t), [np.ones((3, 4), int), np.array([0, 1, 2])]),
    "nll_loss with fewer targets than rows": (lambda m, x, t: m.F.nll_loss(x, t), [f64(3, 4), np.array([0, 1])]),
    "nll_loss of a 0-d input": (lambda m, x, t: m.F.nll_loss(x, t), [f64(), np.array(0)]),
    "nll_loss with a weight per row, not per class": (lambda m, x, t: m.F.nll_loss(x, t, weight=x[:, 0].detach()),
                                                      [f64(3, 4), np.array([0, 1, 2])]),
    "nll_loss with float32 weights for float64 input": (
        lambda m, x, t: m.F.nll_loss(x, t, weight=m.ones(4, dtype=m.float32)), [f64(3, 4), np.array([0, 1, 2])]),
    "kl_div with a bad reduction": (lambda m, x, p: m.F.kl_div(x, p, reduction="avg"), [f64(3, 4), f64(3, 4)]),
    "kl_div of integers": (lambda m, x, p: m.F.kl_div(x, p, reduction="sum"), [np.ones(3, int), np.ones(3, int)]),
    "rms_norm over the wrong shape": (lambda m, x: m.F.rms_norm(x, (3,)), [f64(2, 4)]),
    "rms_norm with a weight of the wrong shape": (lambda m, x, w: m.F.rms_norm(x, (4,), w), [f64(2, 4), f64(3)]),
    "rms_norm of integers": (lambda m, x: m.F.rms_norm(x, (4,)), [np.ones((2, 4), int)]),
    "clamp with a min that does not broadcast": (lambda m, a, b: a.clamp(b), [f64(2, 3), f64(4)]),
    "clip with a max that does not broadcast": (lambda m, a, b: m.clip(a, max=b), [f64(2, 3), f64(2, 2)]),
    "view of a transposed tensor": (lambda m, a: a.T.view(-1), [f64(2, 3)]),
    "view of an expanded tensor": (lambda m, a: a.expand(2, 3).view(6), [f64(3)]),
    "get_total_norm of infinite gradients, asked to refuse": (
        lambda m, g: m.nn.utils.get_total_norm([g.detach()], error_if_nonfinite=True), [np.array([1.0, np.inf])]),
    "clip_grad_norm_ of NaN gradients, asked to refuse": (
        lambda m, g: m.nn.utils.clip_grad_norm_([grad_of(g)], 1.0, error_if_nonfinite=True), [np.array([1.0, np.nan])]),
}


def grad_of(t):
    """A leaf whose .grad is ``t`` (a tensor that requires grad, of either library)."""
    leaf = t.detach().clone().requires_grad_()
    leaf.grad = t.detach().clone()
    return leaf


@pytest.mark.parametrize("case", REFUSED)
def test_refused_by_both(case):
    fn, arrays = REFUSED[case]
    error = check(fn, arrays)
    assert isinstance(error, Exception), f"{case}: both accept it"
    message = str(error)
    assert message and len(message.splitlines()) == 1, f"{case}: not one line: {message!r}"
    assert not type(error).__module__.startswith("numpy") and "numpy" not in message, \
        f"{case}: numpy's error, not the library's: {message}"
    ours, theirs = refusals(fn, arrays)
    assert same_kind_of_refusal(ours, theirs), f"{case}: {type(ours).__name__}, PyTorch {type(theirs).__name__}"


def test_load_state_dict_with_a_wrong_shape_names_the_key_and_both_shapes():
    errors = {}
    for lib in (ta, torch):
        model = lib.nn.Linear(2, 3)
        state = dict(model.state_dict())
        state["weight"] = lib.zeros(4, 2)
        try:
            model.load_state_dict(state)
        except Exception as e:                          # noqa: BLE001 (the class is what is compared)
            errors[lib] = e
    ours, theirs = errors[ta], errors[torch]
    assert same_kind_of_refusal(ours, theirs), f"{type(ours).__name__}, PyTorch {type(theirs).__name__}"
    assert not isinstance(ours, KeyError)
    assert "weight" in str(ours) and "(4, 2)" in str(ours) and "(3, 2)" in str(ours), str(ours)
