"""tinyattn.nn.functional and the layers against PyTorch: values, dtypes and gradients."""
import numpy as np
import pytest

from torch_compare import check, torch
from conftest import compiled_ops

import tinyattn as ta


def normal(*shape, seed=0, dtype="float64"):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_softmax_family(dtype):
    x = normal(3, 5, dtype=dtype)
    check(lambda m, t: m.F.softmax(t, -1), [x])
    check(lambda m, t: m.F.softmax(t, 0), [x])
    check(lambda m, t: m.F.log_softmax(t, 1), [x])
    check(lambda m, t: t.logsumexp(0), [x])
    check(lambda m, t: m.F.softmax(t, -1), [np.array([[0.0, -np.inf, 1.0], [np.inf, 0.0, 0.0]])], grad=False)


CE_CASES = {
    "mean": {}, "sum": {"reduction": "sum"}, "none": {"reduction": "none"},
    "ignore_index": {"ignore_index": 2}, "label_smoothing": {"label_smoothing": 0.2},
    "none, smoothing, ignore": {"reduction": "none", "label_smoothing": 0.1, "ignore_index": 0},
    "mean, smoothing, ignore": {"label_smoothing": 0.1, "ignore_index": 0},
}
CLASS_WEIGHTS = np.array([0.5, 2.0, 1.0, 0.25])


@pytest.mark.parametrize("case", CE_CASES)
def test_cross_entropy_with_class_indices(case):
    kw = CE_CASES[case]
    check(lambda m, x, t: m.F.cross_entropy(x, t, **kw), [normal(6, 4), np.array([0, 3, 2, 1, 2, 0])])


@pytest.mark.parametrize("case", ["mean", "sum", "none", "label_smoothing"])
def test_cross_entropy_with_class_probabilities(case):
    kw = CE_CASES[case]
    p = np.random.default_rng(1).random((5, 4))
    check(lambda m, x, t: m.F.cross_entropy(x, t, **kw), [normal(5, 4), p / p.sum(1, keepdims=True)])


@pytest.mark.parametrize("case", CE_CASES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cross_entropy_with_class_weights(case, dtype):
    """weight: each class's terms scaled, and "mean" divided by the weights of the targets."""
    kw = CE_CASES[case]
    with_weights = lambda m, x, t: m.F.cross_entropy(x, t, weight=m.tensor(CLASS_WEIGHTS, dtype=x.dtype), **kw)  # noqa: E731
    check(with_weights, [normal(6, 4, dtype=dtype), np.array([0, 3, 2, 1, 2, 0])])
    check(with_weights, [normal(2, 4, 3, dtype=dtype), np.array([[0, 3, 2], [1, 2, 2]])])
    if "ignore_index" not in kw:
        p = np.random.default_rng(1).random((5, 4))
        check(with_weights, [normal(5, 4, dtype=dtype), (p / p.sum(1, keepdims=True)).astype(dtype)])


@pytest.mark.parametrize("case", CE_CASES)
def test_cross_entropy_with_the_classes_along_dim_1(case):
    """(N, C, d1, d2) logits with (N, d1, d2) targets: "none" gives the targets' shape."""
    kw = CE_CASES[case]
    targets = np.random.default_rng(1).integers(0, 4, (2, 3, 2))
    check(lambda m, x, t: m.F.cross_entropy(x, t, **kw), [normal(2, 4, 3, 2), targets])


@pytest.mark.parametrize("case", CE_CASES)
def test_cross_entropy_of_one_row(case):
    kw = CE_CASES[case]
    for target in (0, 1, 2):
        if target == kw.get("ignore_index") and kw.get("reduction", "mean") == "mean":
            continue                                             # (a mean over nothing: see test_torch_differences)
        check(lambda m, x, t: m.F.cross_entropy(x, t, **kw), [normal(4), np.array(target)])


@pytest.mark.parametrize("case", ["mean", "sum", "none", "label_smoothing"])
def test_cross_entropy_with_probabilities_along_dim_1(case):
    kw = CE_CASES[case]
    p = np.random.default_rng(1).random((2, 4, 3))
    check(lambda m, x, t: m.F.cross_entropy(x, t, **kw), [normal(2, 4, 3), p / p.sum(1, keepdims=True)])


def test_cross_entropy_in_float32_compiled_or_not():
    targets = np.array([0, 3, -100, 1, 2, -100, 0])
    for fast in (True, False):
        with compiled_ops(fast):
            for reduction in ("mean", "sum", "none"):
                check(lambda m, x, t: m.F.cross_entropy(x, t, reduction=reduction),
                      [normal(7, 4, dtype="float32"), targets])


EDGES = np.array([-1000.0, -100.0, -30.0, -20.5, -1.0, -1e-3, 0.0, 1e-3, 1.0, 10.0, 19.9, 20.0, 20.5, 30.0, 100.0, 1000.0])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_logsigmoid_and_softplus_far_into_both_tails(dtype):
    x = EDGES.astype(dtype)
    out = check(lambda m, t: m.F.logsigmoid(t), [x])[0]
    assert out.numpy()[1] == -100.0 and np.isfinite(out.numpy()).all()
    check(lambda m, t: m.F.softplus(t), [x])
    check(lambda m, t: m.F.softplus(t, beta=2.0, threshold=5.0), [x])          # x itself past x = 2.5
    check(lambda m, t: m.F.softplus(t, beta=0.5), [x])


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather(dim):
    rng = np.random.default_rng(2)
    x = normal(3, 4, 5)
    shape = [2, 3, 4]                                            # no longer than x outside dim
    shape[dim] = 6                                               # and along dim any length
    index = rng.integers(0, x.shape[dim], shape)
    check(lambda m, a, i: m.gather(a, dim, i), [x, index])
    check(lambda m, a, i: a.gather(dim, i), [x, index])


def test_gather_with_0_d_tensors_and_an_empty_index():
    check(lambda m, a, i: m.gather(a, 0, i), [np.array(2.0), np.array(0)])
    check(lambda m, a, i: m.gather(a, -1, i), [normal(3), np.array(1)])
    check(lambda m, a, i: m.gather(a, 0, i), [normal(3), np.array([2, 2, 0, 1])])
    check(lambda m, a, i: m.gather(a, 1, i), [normal(3, 4), np.zeros((0, 2), dtype=np.int64)])


def test_token_logprobs_is_log_softmax_gathered():
    """F.token_logprobs against what a PyTorch user writes (PyTorch has no such function)."""
    def logprobs(m, x, t):
        if m.name == "tinyattn":
            return m.F.token_logprobs(x, t)
        return m.F.log_softmax(x, -1).gather(-1, t.unsqueeze(-1)).squeeze(-1)
    targets = np.random.default_rng(3).integers(0, 7, (2, 5))
    for dtype in ("float32", "float64"):
        check(logprobs, [normal(2, 5, 7, dtype=dtype), targets])
        check(lambda m, x, t: m.F.log_softmax(x, -1).gather(-1, t.unsqueeze(-1)).squeeze(-1),
              [normal(2, 5, 7, dtype=dtype), targets])


@pytest.mark.parametrize("shape, normalized", [((2, 3, 4), (4,)), ((2, 3, 4), (3, 4)), ((5, 2), (2,))])
def test_layer_norm(shape, normalized):
    n = (normalized,) if isinstance(normalized, int) else normalized
    check(lambda m, x, w, b: m.F.layer_norm(x, normalized, w, b), [normal(*shape), normal(*n, seed=1), normal(*n, seed=2)])
    check(lambda m, x: m.F.layer_norm(x, normalized), [normal(*shape)])


def test_linear_embedding_gelu_dropout():
    check(lambda m, x, w, b: m.F.linear(x, w, b), [normal(2, 3, 4), normal(5, 4, seed=1), normal(5, seed=2)])
    check(lambda m, x, w: m.F.linear(x, w), [normal(4), normal(2, 4, seed=1)])
    check(lambda m, w, i: m.F.embedding(i, w), [normal(5, 3), np.array([[4, 0, 4], [1, 4, 2]])])
    check(lambda m, x: m.F.gelu(x), [normal(3, 4)])
    check(lambda m, x: m.F.gelu(x, approximate="tanh"), [normal(3, 4)])
    check(lambda m, x: m.F.relu(x), [normal(3, 4)])
    check(lambda m, x: m.F.dropout(x, 0.5, training=False), [normal(3, 4)])


def test_matmul_shapes():
    for a, b in [((3, 4), (4, 2)), ((4,), (4, 2)), ((3, 4), (4,)), ((4,), (4,)), ((2, 1, 3, 4), (5, 4, 2))]:
        check(lambda m, x, y: x @ y, [normal(*a), normal(*b, seed=1)])


@pytest.mark.parametrize("case", ["plain", "causal", "bool mask", "additive mask", "scale", "Tq < Tk causal", "gqa",
                                  "bool mask and causal"])
def test_scaled_dot_product_attention(case):
    q, k, v = normal(2, 4, 3, 5), normal(2, 4, 6, 5, seed=1), normal(2, 4, 6, 2, seed=2)
    mask = np.random.default_rng(3).random((3, 6)) > 0.3
    mask[:, 0] = True
    F = lambda m: m.F.scaled_dot_product_attention    # noqa: E731
    if case == "plain":
        check(lambda m, a, b, c: F(m)(a, b, c), [q, k, v])
    elif case == "causal":
        check(lambda m, a, b, c: F(m)(a, b, c, is_causal=True), [q, q, q])
    elif case == "bool mask":
        check(lambda m, a, b, c, msk: F(m)(a, b, c, attn_mask=msk), [q, k, v, mask])
    elif case == "additive mask":
        check(lambda m, a, b, c, msk: F(m)(a, b, c, attn_mask=msk), [q, k, v, normal(3, 6, seed=4)])
    elif case == "bool mask and causal":     # refused by both (PyTorch's docs; its CPU flash kernel skips the check)
        check(lambda m, a, b, c, msk: F(m)(a, b, c, attn_mask=msk, is_causal=True), [q, k, v, mask])
    elif case == "scale":
        check(lambda m, a, b, c: F(m)(a, b, c, scale=0.3), [q, k, v])
    elif case == "Tq < Tk causal":
        check(lambda m, a, b, c: F(m)(a, b, c, is_causal=True), [q, k, v])
    else:
        check(lambda m, a, b, c: F(m)(a, b, c, enable_gqa=True), [q, k[:, :2], v[:, :2]])


def test_layers_built_the_same_way_agree():
    """nn.Linear, nn.LayerNorm((3, 4)) and nn.Embedding with the same weights give the same results."""
    for ta_layer, torch_layer, x in [
        (ta.nn.Linear(4, 3), torch.nn.Linear(4, 3), normal(2, 4, dtype="float32")),
        (ta.nn.LayerNorm((3, 4)), torch.nn.LayerNorm((3, 4)), normal(2, 3, 4, dtype="float32")),
    ]:
        with torch.no_grad():
            for (name, p), tp in zip(ta_layer.named_parameters(), torch_layer.parameters()):
                tp.copy_(torch.tensor(p.numpy()))
        np.testing.assert_allclose(ta_layer(ta.tensor(x)).detach().numpy(),
                                   torch_layer(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_clip_grad_norm():
    for norm_type in (2.0, 1.0, float("inf"), 3.0):
        g = normal(3, 4)
        w, tw = ta.zeros(3, 4, dtype="float64", requires_grad=True), torch.zeros(3, 4, dtype=torch.float64, requires_grad=True)
        w.grad, tw.grad = ta.tensor(g, dtype="float64"), torch.tensor(g)
        n = ta.nn.utils.clip_grad_norm_(w, 0.5, norm_type=norm_type)
        tn = torch.nn.utils.clip_grad_norm_(tw, 0.5, norm_type=norm_type)
        np.testing.assert_allclose(n.item(), tn.item(), rtol=1e-10)
        np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-5)


NLL_CASES = {"mean": {}, "sum": {"reduction": "sum"}, "none": {"reduction": "none"}, "ignore_index": {"ignore_index": 2},
             "none, ignore": {"reduction": "none", "ignore_index": 0}, "sum, ignore": {"reduction": "sum", "ignore_index": 3}}


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("case", NLL_CASES)
def test_nll_loss(case, weighted):
    """Of log_softmax's output (nll_loss(log_softmax(x)) is cross_entropy(x)) and of any input, in
    PyTorch's shapes: (N, C), (N, C, d1, d2) and (C,)."""
    kw = dict(NLL_CASES[case])
    for dtype in ("float32", "float64"):
        def nll(m, x, t):
            w = {"weight": m.tensor(CLASS_WEIGHTS, dtype=x.dtype)} if weighted else {}
            return m.F.nll_loss(x, t, **w, **kw)
        check(lambda m, x, t: nll(m, m.F.log_softmax(x, 1), t), [normal(6, 4, dtype=dtype), np.array([0, 3, 2, 1, 2, 0])])
        check(nll, [normal(6, 4, dtype=dtype), np.array([0, 3, 2, 1, 2, 0])])
        check(nll, [normal(2, 4, 3, 2, dtype=dtype), np.random.default_rng(1).integers(0, 4, (2, 3, 2))])
        check(nll, [normal(4, dtype=dtype), np.array(1)])


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides")       # (PyTorch's advice to use batchmean)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean", "batchmean"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div(reduction, log_target):
    """Gradients for both the input and the target; targets of 0 count 0 (their own gradient: see
    test_torch_differences)."""
    p = np.random.default_rng(1).random((3, 5))
    p /= p.sum(1, keepdims=True)
    target = np.log(p) if log_target else p
    for dtype in ("float32", "float64"):
        check(lambda m, x, t: m.F.kl_div(m.F.log_softmax(x, 1), t, reduction=reduction, log_target=log_target),
              [normal(3, 5, dtype=dtype), target.astype(dtype)])
    check(lambda m, x, t: m.F.kl_div(x, t, reduction=reduction, log_target=log_target), [normal(2, 3, 4), target[0]])
    zeros = p * (np.arange(5) != 2)                               # a target of 0 at class 2
    check(lambda m, x, t: m.F.kl_div(x, t.detach(), reduction=reduction), [normal(3, 5), zeros])


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")    # (PyTorch: no fused kernel)
@pytest.mark.parametrize("shape, normalized", [((2, 3, 4), (4,)), ((2, 3, 4), (3, 4)), ((5, 2), (2,))])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_rms_norm(shape, normalized, dtype):
    """eps None is the epsilon of the dtype it is computed in (float16 is computed in float32)."""
    x, w = normal(*shape, dtype=dtype) * 3, normal(*normalized, seed=1, dtype=dtype)
    for eps in (None, 1e-5, 0.5):
        check(lambda m, a, b: m.F.rms_norm(a, normalized, b, eps=eps), [x, w])
        check(lambda m, a: m.F.rms_norm(a, normalized, eps=eps), [x])
    check(lambda m, a, b: m.F.rms_norm(a, normalized, b), [x, w.astype("float64")])      # the result in x's dtype


def test_rms_norm_layer():
    for shape, kw in (((4,), {}), ((3, 4), {"eps": 1e-3}), (4, {"elementwise_affine": False})):
        layer, torch_layer = ta.nn.RMSNorm(shape, **kw), torch.nn.RMSNorm(shape, **kw)
        assert repr(layer) == repr(torch_layer)
        assert [n for n, _ in layer.named_parameters()] == [n for n, _ in torch_layer.named_parameters()]
        with torch.no_grad():
            for p, tp in zip(layer.parameters(), torch_layer.parameters()):
                p.data = p.data * 0.5 + 0.25                      # not all ones
                tp.copy_(torch.tensor(p.numpy()))
        x = normal(2, 3, 4, dtype="float32")
        np.testing.assert_allclose(layer(ta.tensor(x)).detach().numpy(), torch_layer(torch.tensor(x)).detach().numpy(),
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf"), 3.0, 0.5])
def test_get_total_norm_and_clip_grads_with_norm(norm_type):
    """The two halves of clip_grad_norm_: the norm, then the scaling by that norm."""
    grads = [normal(3, 4), normal(5, seed=1), normal(2, 2, 2, seed=2)]
    for lib, make in ((ta, lambda g: ta.tensor(g, dtype="float64")), (torch, torch.tensor)):
        norm = lib.nn.utils.get_total_norm([make(g) for g in grads], norm_type=norm_type)
        one = lib.nn.utils.get_total_norm(make(grads[0]), norm_type)
        params = [make(np.zeros_like(g)).requires_grad_() for g in grads]
        for p, g in zip(params, grads):
            p.grad = make(g)
        assert lib.nn.utils.clip_grads_with_norm_(params, 1.5, norm) is None
        result = (norm.item(), one.item(), [p.grad.numpy() for p in params])
        if lib is torch:
            np.testing.assert_allclose(result[:2], ours[:2], rtol=1e-12)
            for a, b in zip(ours[2], result[2]):
                np.testing.assert_allclose(a, b, rtol=1e-12)
        ours = result
    mixed = [(ta.ones(2), ta.ones(2, dtype="float64")), (torch.ones(2), torch.ones(2, dtype=torch.float64))]
    n, tn = (lib.nn.utils.get_total_norm(ts, norm_type) for lib, ts in zip((ta, torch), mixed))
    assert (n.dtype, n.item()) == (ta.float64, pytest.approx(tn.item())) and tn.dtype == torch.float64


def test_grad_norms_of_nothing_are_0():
    for lib in (ta, torch):
        for norm in (lib.nn.utils.get_total_norm([]), lib.nn.utils.clip_grad_norm_([], 1.0)):
            assert norm.item() == 0.0 and str(norm.dtype).endswith("float32"), lib
        assert lib.nn.utils.clip_grads_with_norm_([], 1.0, lib.tensor(0.0)) is None


def test_creation_dtypes():
    for fn in (lambda m: m.arange(5), lambda m: m.arange(5.5, 175.5, 2.5), lambda m: m.arange(0, 1, 0.25),
               lambda m: m.full((2, 2), 4), lambda m: m.full((2, 2), 4.0), lambda m: m.full((2,), True),
               lambda m: m.zeros(2, 3), lambda m: m.ones(0), lambda m: m.tensor([1, 2]), lambda m: m.tensor([1.0, 2]),
               lambda m: m.tensor(True), lambda m: m.tensor([[1, 2]]).float().exp()):
        check(fn, [], grad=False)
