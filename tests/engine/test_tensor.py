"""Tensor semantics, the engine, devices and numerics."""
import numpy as np
import pytest

import tinyattn as ta
import tinyattn.nn.functional as F
from tinyattn.backend import get_backend


def test_default_dtype_is_float32_and_float64_is_kept():
    assert ta.tensor([1.0, 2.0]).dtype == ta.float32
    assert ta.tensor(np.ones(3)).dtype == ta.float32
    assert ta.tensor([1, 2]).dtype == ta.int64
    x = ta.randn(3, dtype="float64")
    assert (x * 2 + 1).exp().dtype == ta.float64
    assert ta.zeros(2, 3).shape == (2, 3) and ta.ones(4).dtype == ta.float32


def test_scalars_keep_the_tensor_dtype():
    x = ta.randn(3, 4)                      # float32
    for y in (x / 8.0, x * 2, 1.0 - x, x ** 2, 2.0 ** x, x / np.sqrt(64.0), F.softmax(x / 8.0)):
        assert y.dtype == ta.float32


def test_attributes():
    x = ta.randn(2, 3, 4)
    assert x.shape == (2, 3, 4) and x.ndim == 3 and x.size() == (2, 3, 4) and x.size(1) == 3
    assert x.numel() == 24 and x.device == "cpu" and not x.requires_grad
    assert ta.tensor(3.5).item() == 3.5
    assert isinstance(x.numpy(), np.ndarray)


def test_gradients_accumulate_until_cleared():
    x = ta.tensor([1.0, 2.0], requires_grad=True)
    (x * 3).sum().backward()
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [6.0, 6.0])
    x.grad = None
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0])


def test_backward_of_non_scalar_needs_a_gradient():
    x = ta.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="scalar"):
        (x * 2).backward()
    (x * 2).backward(ta.ones(3))
    np.testing.assert_allclose(x.grad.numpy(), [2, 2, 2])


def test_second_backward_through_freed_graph_is_an_error():
    x = ta.randn(3, requires_grad=True)
    y = (x.exp() * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="retain_graph"):
        y.backward()


def test_retain_graph_allows_a_second_backward():
    x = ta.randn(3, requires_grad=True)
    y = (x.exp() * x).sum()
    y.backward(retain_graph=True)
    first = x.grad.numpy().copy()
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * first, rtol=1e-6)


def test_create_graph_gives_higher_derivatives():
    x = ta.tensor([0.5, -1.5, 2.0], dtype="float64", requires_grad=True)
    (dy,) = ta.grad((x ** 3).sum(), x, create_graph=True)          # 3x^2
    (d2y,) = ta.grad(dy.sum(), x, create_graph=True)               # 6x
    (d3y,) = ta.grad(d2y.sum(), x)                                 # 6
    np.testing.assert_allclose(dy.numpy(), 3 * x.numpy() ** 2)
    np.testing.assert_allclose(d2y.numpy(), 6 * x.numpy())
    np.testing.assert_allclose(d3y.numpy(), [6, 6, 6])


def test_backward_create_graph_keeps_a_graph_on_grad():
    x = ta.tensor([1.0, 2.0], dtype="float64", requires_grad=True)
    (x * x * x).sum().backward(create_graph=True)
    g = x.grad
    x.grad = None
    g.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [6.0, 12.0])


def test_shared_subexpression_gradient():
    """A node used twice, reached by paths of different length (a topological-order trap)."""
    x = ta.tensor([0.3, -0.7], dtype="float64", requires_grad=True)
    a = x.exp()
    b = a * 2.0
    y = (a * b).sum()                       # 2 e^{2x}
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 4 * np.exp(2 * x.numpy()))


def test_no_grad_and_detach():
    x = ta.randn(3, requires_grad=True)
    with ta.no_grad():
        y = x * 2
    assert not y.requires_grad and y.grad_fn is None
    z = (x * 2).detach()
    assert not z.requires_grad

    @ta.no_grad()
    def f(t):
        return t * 3
    assert not f(x).requires_grad


def test_grad_mode_belongs_to_each_thread():
    """As in PyTorch: no_grad (or a backward, which records nothing) in one thread does not stop
    another thread from recording its graph, and a new thread starts with recording on."""
    import threading
    x = ta.randn(3, requires_grad=True)
    inside, release, seen = threading.Event(), threading.Event(), {}

    def other():
        seen["starts_on"] = ta.is_grad_enabled()
        with ta.no_grad():
            inside.set()
            release.wait(10)
            seen["off_there"] = not (x * 2).requires_grad

    worker = threading.Thread(target=other)
    with ta.no_grad():                     # this thread's no_grad is not the new thread's
        worker.start()
        assert inside.wait(10)
    y = (x * 2).sum()                      # recorded here while the other thread sits in no_grad
    release.set()
    worker.join()
    assert y.requires_grad and seen == {"starts_on": True, "off_there": True}
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2.0)


def test_inference_mode_records_no_graph_even_for_parameters():
    lin = ta.nn.Linear(4, 3)
    x = ta.randn(2, 4, requires_grad=True)
    with ta.inference_mode():
        assert not ta.is_grad_enabled()
        y, z = lin(x), x * 2
    assert lin.weight.requires_grad and ta.is_grad_enabled()
    assert not y.requires_grad and y.grad_fn is None and not z.requires_grad and z.grad_fn is None


def test_inference_block_names_the_outermost_inference_mode_block():
    from tinyattn.autograd import inference_block
    assert inference_block() is None
    with ta.inference_mode():
        first = inference_block()
        assert first is not None
        with ta.inference_mode():                 # nested: the same block
            assert inference_block() is first
        with ta.no_grad():
            assert inference_block() is first
        assert inference_block() is first         # an inner block's end is not the outer one's
    assert inference_block() is None
    with ta.no_grad():
        assert inference_block() is None          # no_grad alone is no inference block
        with ta.inference_mode():
            second = inference_block()
    assert second is not None and second is not first and inference_block() is None
    with pytest.raises(KeyError):
        with ta.inference_mode():
            raise KeyError("inside")
    assert inference_block() is None and ta.is_grad_enabled()


def test_inference_mode_as_a_decorator():
    from tinyattn.autograd import inference_block
    x = ta.randn(3, requires_grad=True)

    @ta.inference_mode()
    def f(t):
        return t * 3, inference_block()
    y, block = f(x)
    assert not y.requires_grad and block is not None
    assert f(x)[1] is not block                   # each call is a block of its own
    assert inference_block() is None and ta.is_grad_enabled()


@pytest.mark.parametrize("decorator", ["no_grad", "inference_mode"])
def test_a_decorated_function_called_from_two_threads_at_once(decorator):
    """Each call enters a context of its own: the two calls overlap (A enters, B enters, A
    leaves, B leaves), and each thread finds grad mode on again after its call."""
    import threading
    from tinyattn.autograd import inference_block
    x = ta.randn(3, requires_grad=True)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    @getattr(ta, decorator)()
    def body(entered, wait_for):
        entered.set()
        waited = wait_for.wait(10)
        return waited, (x * 2).requires_grad, inference_block()

    def thread_a():
        seen["a"] = body(a_in, b_in)
        a_out.set()
        seen["a after"] = ta.is_grad_enabled(), inference_block(), (x * 2).requires_grad

    def thread_b():
        a_in.wait(10)
        seen["b"] = body(b_in, a_out)
        seen["b after"] = ta.is_grad_enabled(), inference_block(), (x * 2).requires_grad

    workers = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(20)
    assert seen["a"][:2] == seen["b"][:2] == (True, False)        # both waited; no graph inside
    if decorator == "inference_mode":
        assert seen["a"][2] is not None and seen["b"][2] is not None and seen["a"][2] is not seen["b"][2]
    else:
        assert seen["a"][2] is None and seen["b"][2] is None
    assert seen["a after"] == seen["b after"] == (True, None, True)


def test_non_leaf_grad_only_with_retain_grad():
    x = ta.randn(3, requires_grad=True)
    h = x * 2
    h.retain_grad()
    k = h * 3
    k.sum().backward()
    np.testing.assert_allclose(h.grad.numpy(), [3, 3, 3])
    assert k.grad is None


def test_scatter_add_counts_repeated_indices():
    w = ta.randn(4, 3, dtype="float64", requires_grad=True)
    idx = ta.tensor([1, 1, 1, 3])
    w[idx].sum().backward()
    np.testing.assert_allclose(w.grad.numpy()[:, 0], [0, 3, 0, 1])
    e = ta.randn(5, 2, requires_grad=True)
    F.embedding(ta.tensor([[0, 0], [4, 0]]), e).sum().backward()
    np.testing.assert_allclose(e.grad.numpy()[:, 1], [3, 0, 0, 0, 1])


def test_broadcast_gradient_reduced_to_input_shape():
    a = ta.randn(2, 1, 3, requires_grad=True)
    b = ta.randn(4, 1, requires_grad=True)
    (a * b).sum().backward()
    assert a.grad.shape == (2, 1, 3) and b.grad.shape == (4, 1)
    np.testing.assert_allclose(b.grad.numpy()[:, 0], np.full(4, a.numpy().sum()), rtol=1e-5)


def test_shape_errors_name_both_shapes():
    with pytest.raises(ValueError, match=r"\(3, 4\).*\(5, 2\)"):
        ta.randn(3, 4) @ ta.randn(5, 2)
    with pytest.raises(ValueError, match=r"\(3,.*4\).*\(5,"):
        ta.randn(3, 4) + ta.randn(5)
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(2, 4\)"):
        ta.stack([ta.randn(2, 3), ta.randn(2, 4)])
    with pytest.raises(ValueError, match=r"\(4, 5\).*\(3,\)"):
        F.cross_entropy(ta.randn(4, 5), ta.tensor([0, 1, 2]))


def test_errors_are_also_the_runtime_errors_pytorch_raises():
    """Shape, dtype and index errors are caught by PyTorch code's ``except RuntimeError`` and by
    ``except ValueError`` / ``TypeError`` / ``IndexError`` as before; a bad dim stays an IndexError."""
    cases = [(lambda: ta.randn(3, 4) @ ta.randn(5, 2), ta.TensorError, ValueError),
             (lambda: ta.cat([ta.randn(2, 3), ta.randn(2, 4)]), ta.TensorError, ValueError),
             (lambda: ta.randn(2, 3).reshape(4), ta.TensorError, ValueError),
             (lambda: ta.randn(2, 3).permute(0, 0), ta.TensorError, ValueError),
             (lambda: ta.tensor([1, 2]) ** -1, ta.TensorError, ValueError),
             (lambda: ta.tensor([True]) - ta.tensor([False]), ta.DtypeError, TypeError),
             (lambda: ta.tensor([1, 2]).mean(), ta.DtypeError, TypeError),
             (lambda: ta.randn(2, 3).gather(1, ta.tensor([[0, 3]])), ta.IndexRangeError, IndexError)]
    for make, cls, python_class in cases:
        with pytest.raises(cls) as caught:
            make()
        assert isinstance(caught.value, RuntimeError) and isinstance(caught.value, python_class)
    with pytest.raises(IndexError, match="dim 2 is out of range"):
        ta.randn(2, 3).sum(2)
    assert not issubclass(ta.DtypeError, NotImplementedError)      # that means "not written yet" (exercise stubs)


def test_clamp_with_a_bound_that_does_not_broadcast_names_the_op_and_both_shapes():
    x = ta.randn(2, 3)
    for call in (lambda: x.clamp(ta.zeros(4)), lambda: ta.clip(x, max=ta.zeros(2, 2))):
        with pytest.raises(RuntimeError, match=r"clamp's (min|max): shapes \(2, 3\) and \((4,|2, 2)\) do not broadcast"):
            call()
    assert x.clamp(ta.zeros(3)).shape == (2, 3)                    # one that broadcasts is fine


def test_view_shares_memory_or_refuses_and_reshape_copies_only_where_it_must():
    t = ta.arange(6.0).reshape(2, 3)
    for refused in (lambda: t.permute(1, 0).view(6), lambda: ta.arange(3.0).expand(2, 3).view(6),
                    lambda: t.T.view(-1), lambda: t[:, ::2].view(-1), lambda: t[:, 1:].view(4)):
        with pytest.raises(RuntimeError, match=r"view size is not compatible .* Use \.reshape\(\.\.\.\) instead"):
            refused()
    v, r, c = t[:, 1:].view(2, 2, 1), t.T.reshape(6), t.T.contiguous()    # a view of a slice; two copies
    with ta.no_grad():
        v += 100
    assert t.numpy().tolist() == [[0, 101, 102], [3, 104, 105]]
    assert r.numpy().tolist() == c.view(-1).numpy().tolist() == [0, 3, 1, 4, 2, 5]
    assert t.is_contiguous() and not t.T.is_contiguous() and c.is_contiguous() and t.contiguous() is t


@pytest.mark.parametrize("seed", range(3))
def test_view_strides_are_the_arrays_own(seed):
    """Where view allows a shape, the array's reshape gives a view with the strides view worked out."""
    from tinyattn.tensor import _view_strides
    rng = np.random.default_rng(seed)
    base = np.zeros((2, 3, 4, 2))
    for _ in range(200):
        a = np.transpose(base, rng.permutation(4))[tuple(slice(None, None, int(rng.integers(1, 3))) for _ in range(4))]
        backend = get_backend("cpu")
        for new in [(-1,), (a.shape[0], -1), (-1, a.shape[-1]), (1,) + a.shape, a.shape[::-1], (a.size, 1)]:
            new = tuple(a.size // max(1, -int(np.prod(new))) if n == -1 else n for n in new)
            if int(np.prod(new)) != a.size:
                continue
            strides = _view_strides(a.shape, backend.strides(a), new)
            r = a.reshape(new)
            assert (strides is not None) == np.shares_memory(r, base), (a.shape, a.strides, new)
            if strides is not None:
                assert all(s * 8 == rs for s, rs, n in zip(strides, r.strides, new) if n > 1)


def test_ops_across_devices_name_both():
    pytest.importorskip("array_api_strict")
    a = ta.randn(3)
    b = ta.randn(3, device="strict")
    with pytest.raises(RuntimeError, match="cpu and strict"):
        a + b


def test_stand_in_device_refuses_implicit_host_conversion():
    pytest.importorskip("array_api_strict")
    x = ta.randn(3, device="strict")
    with pytest.raises(RuntimeError):
        np.asarray(x.data)
    np.testing.assert_allclose(x.numpy(), x.to("cpu").numpy())     # the explicit copy works


def test_cuda_without_cupy_is_one_clear_error():
    if ta.cuda_is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(RuntimeError, match=r'pip install "tinyattn\[gpu\]"'):
        ta.randn(3, device="cuda")
    with pytest.raises(RuntimeError, match="gpu"):
        ta.randn(3).to("cuda")


def test_manual_seed_reproduces_numbers():
    ta.manual_seed(123)
    a = ta.randn(5).numpy()
    b = ta.rand(3).numpy()
    ta.manual_seed(123)
    np.testing.assert_array_equal(a, ta.randn(5).numpy())
    np.testing.assert_array_equal(b, ta.rand(3).numpy())
    assert ta.randn_like(ta.zeros(2, 2, dtype="float64")).dtype == ta.float64


def test_creation_functions():
    np.testing.assert_array_equal(ta.arange(5).numpy(), np.arange(5))
    np.testing.assert_array_equal(ta.arange(1, 7, 2).numpy(), [1, 3, 5])
    np.testing.assert_array_equal(ta.full((2, 2), 7.0).numpy(), np.full((2, 2), 7.0))
    assert ta.full_like(ta.zeros(3), 2.0).numpy().tolist() == [2.0, 2.0, 2.0]
    assert ta.zeros_like(ta.zeros(3, dtype="float64")).dtype == ta.float64


# ------------------------------------------------------------------ conventions at kinks
def test_relu_and_abs_at_zero_have_zero_gradient():
    x = ta.tensor([0.0, 1.0, -1.0], requires_grad=True)
    x.relu().sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0, 1, 0])
    x.grad = None
    x.abs().sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0, 1, -1])


def test_max_ties_share_the_gradient():
    x = ta.tensor([[1.0, 3.0, 3.0], [2.0, 0.0, 1.0]], requires_grad=True)
    x.max(-1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0, 0.5, 0.5], [1, 0, 0]])


def test_clamp_gradient_includes_the_bounds():
    x = ta.tensor([-1.0, 0.0, 0.5, 1.0, 2.0], requires_grad=True)
    x.clamp(0.0, 1.0).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0, 1, 1, 1, 0])


def test_dropout_scales_and_its_gradient_is_the_mask():
    ta.manual_seed(0)
    x = ta.ones(1000, requires_grad=True)
    y = F.dropout(x, 0.25)
    kept = y.numpy() != 0
    assert 0.65 < kept.mean() < 0.85
    np.testing.assert_allclose(y.numpy()[kept], 1 / 0.75, rtol=1e-6)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), y.numpy(), rtol=1e-6)
    assert F.dropout(x, 0.25, training=False) is x


# ------------------------------------------------------------------ numerics
@pytest.mark.parametrize("scale", [1e4, -1e4])
def test_softmax_family_is_finite_for_huge_logits(scale):
    logits = ta.tensor(np.array([[1.0, 0.0, -1.0], [0.5, 0.25, 2.0]]) * scale, requires_grad=True)
    for out in (F.softmax(logits), F.log_softmax(logits), F.logsumexp(logits),
                F.cross_entropy(logits, ta.tensor([2, 0]))):
        assert np.all(np.isfinite(out.numpy()))
    loss = F.cross_entropy(logits, ta.tensor([2, 0]))
    loss.backward()
    assert np.all(np.isfinite(logits.grad.numpy()))


def test_fully_masked_attention_row_is_zero_with_zero_gradient():
    q = ta.randn(1, 1, 3, 4, requires_grad=True)
    k = ta.randn(1, 1, 3, 4, requires_grad=True)
    v = ta.randn(1, 1, 3, 4, requires_grad=True)
    mask = ta.tensor(np.array([[True, True, True], [False, False, False], [True, False, True]]))
    out, w = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, return_weights=True)
    assert np.all(np.isfinite(out.numpy()))
    np.testing.assert_array_equal(out.numpy()[0, 0, 1], 0.0)
    np.testing.assert_array_equal(w.numpy()[0, 0, 1], 0.0)
    out.backward(ta.randn(*out.shape))
    for t in (q, k, v):
        assert np.all(np.isfinite(t.grad.numpy()))
    np.testing.assert_array_equal(q.grad.numpy()[0, 0, 1], 0.0)


def test_cross_entropy_ignore_index():
    logits = ta.randn(4, 3, requires_grad=True)
    targets = ta.tensor([0, -100, 2, -100])
    loss = F.cross_entropy(logits, targets)
    expected = F.cross_entropy(logits[ta.tensor([0, 2])], ta.tensor([0, 2]))
    np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-6)
    loss.backward()
    np.testing.assert_array_equal(logits.grad.numpy()[[1, 3]], 0.0)


def test_erf_matches_math_erf_to_float64_precision():
    import math
    x = np.concatenate([np.linspace(-8, 8, 2001), [0.0, 2.4999, 2.5, 2.5001, 1e-8]])
    got = get_backend("cpu").erf(x)
    np.testing.assert_allclose(got, [math.erf(v) for v in x], rtol=1e-13, atol=1e-15)


class TwoOutputs(ta.Function):
    """(2a, a^2): a Function with two outputs, counting its backward calls."""
    calls = 0

    def forward(self, a):
        return a * 2.0, a * a

    def backward(self, g_double, g_square):
        TwoOutputs.calls += 1
        a = self.parents[0]
        total = 0.0
        if g_double is not None:
            total = total + g_double * 2.0
        if g_square is not None:
            total = total + g_square * a * 2.0
        return total


def test_a_function_with_several_outputs_runs_its_backward_once_with_every_gradient():
    a = ta.tensor([1.0, -2.0, 3.0], requires_grad=True)
    double, square = TwoOutputs.apply(a)
    assert double.grad_fn is square.grad_fn and double.grad_fn.outputs == (double, square)
    TwoOutputs.calls = 0
    (double * square + square).sum().backward()       # d/da (2a^3 + a^2) = 6a^2 + 2a
    assert TwoOutputs.calls == 1
    np.testing.assert_allclose(a.grad.numpy(), 6 * a.numpy() ** 2 + 2 * a.numpy(), rtol=1e-6)


def test_an_unused_output_gets_none_and_second_order_works():
    a = ta.tensor([1.0, -2.0], requires_grad=True, dtype="float64")
    _, square = TwoOutputs.apply(a)                     # the first output is dropped
    (g,) = ta.grad((square * a).sum(), [a], create_graph=True)   # 3a^2
    np.testing.assert_allclose(g.numpy(), 3 * a.numpy() ** 2)
    (gg,) = ta.grad(g.sum(), [a])                       # 6a
    np.testing.assert_allclose(gg.numpy(), 6 * a.numpy())


def test_several_outputs_follow_retain_graph():
    a = ta.tensor([2.0], requires_grad=True)
    double, square = TwoOutputs.apply(a)
    (double + square).sum().backward(retain_graph=True)
    (double + square).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [12.0])   # 2 * (2 + 2a)
    with pytest.raises(RuntimeError, match="second time"):
        (double + square).sum().backward()


@pytest.mark.parametrize("dim", [0, -1, None])
def test_squeeze_of_a_0d_tensor_returns_it_as_in_pytorch(dim):
    t = ta.tensor(2.0)
    out = t.squeeze() if dim is None else t.squeeze(dim)
    assert out.shape == () and out.item() == 2.0
    with pytest.raises(IndexError, match="out of range"):
        t.squeeze(1)


def test_topk_ties_go_to_the_lower_index():
    """PyTorch leaves the order of tied values unspecified; here of equal values the one at
    the lower index comes first (a stable sort), so it also gets the gradient."""
    x = ta.tensor([[2.0, 5.0, 5.0, 1.0, 5.0]], dtype="float64", requires_grad=True)
    values, indices = x.topk(2)
    assert indices.tolist() == [[1, 2]] and values.tolist() == [[5.0, 5.0]]
    values.sum().backward()
    assert x.grad.tolist() == [[0.0, 1.0, 1.0, 0.0, 0.0]]
    assert ta.tensor([1, 0, 1, 0]).topk(3, largest=False).indices.tolist() == [1, 3, 0]
    assert ta.tensor([[3.0], [3.0], [1.0]]).topk(2, dim=0).indices.tolist() == [[0], [1]]


def test_topk_and_multinomial_on_the_stand_in_device():
    pytest.importorskip("array_api_strict")
    x = ta.tensor([[0.5, 2.0, 1.0, 2.0]], device="strict")
    values, indices = x.topk(3)
    assert values.device == indices.device == "strict"
    assert indices.numpy().tolist() == [[1, 3, 2]] and values.numpy().tolist() == [[2.0, 2.0, 1.0]]
    ta.manual_seed(1)
    draws = ta.multinomial(x, 3)
    assert draws.device == "strict" and draws.dtype == ta.int64
    ta.manual_seed(1)
    assert ta.multinomial(x.cpu(), 3).tolist() == draws.numpy().tolist()       # the same host generator


def test_masked_fill_in_place_reaches_views_and_refuses_as_other_in_place_ops():
    w = ta.zeros(2, 3)
    row = w[1]
    row.masked_fill_(ta.tensor([True, False, True]), 4.0)
    assert w.tolist() == [[0.0, 0.0, 0.0], [4.0, 0.0, 4.0]]
    with pytest.raises(RuntimeError, match=r"masked_fill_ on a leaf tensor that requires grad .*"
                                           r"x = x.masked_fill\(mask, value\)"):
        ta.zeros(2, requires_grad=True).masked_fill_(ta.tensor([True, False]), 1.0)
    with pytest.raises(RuntimeError, match="masked_fill_: this tensor .* is an expanded"):
        ta.zeros(3, 1).expand(3, 4).masked_fill_(ta.ones(3, 4) > 0, 1.0)
    assert ta.empty(2, 3).tolist() == [[0.0] * 3] * 2 and ta.empty((2,), dtype="int64").dtype == ta.int64
