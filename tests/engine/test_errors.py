"""A learner's mistakes get a clear error in the library's own words, never a silent
wrong answer. Each test names the mistake; the messages are checked for the op and
the shapes or types involved."""
import re
import warnings

import numpy as np
import pytest

import tinyattn as ta
import tinyattn.nn as nn
import tinyattn.nn.functional as F
from tinyattn.models import GPT, GPTConfig


# ---------------------------------------------------------------- operands
@pytest.mark.parametrize("bad, name", [(None, "None"), ("a", "str"), (object(), "object"),
                                       ({"a": 1}, "dict"), (np.array([1, None]), "dtype object")])
@pytest.mark.parametrize("op, fn", [("+", lambda x, v: x + v), ("+", lambda x, v: v + x),
                                    ("*", lambda x, v: x * v), ("*", lambda x, v: v * x),
                                    ("-", lambda x, v: x - v), ("/", lambda x, v: v / x),
                                    ("**", lambda x, v: x ** v), ("@", lambda x, v: x @ v)])
def test_arithmetic_with_a_non_number_is_a_type_error(bad, name, op, fn):
    with pytest.raises(TypeError, match=rf"for {re.escape(op)}: Tensor and .*{name}"):
        fn(ta.randn(2, 3), bad)


def test_numbers_lists_and_numpy_values_still_work():
    x = ta.ones(2, 3)
    assert (x + [1, 2, 3]).tolist() == [[2, 3, 4]] * 2
    assert (x * np.float64(2)).dtype == ta.float32
    assert (np.ones(3) * x).shape == (2, 3)                      # numpy defers to the Tensor
    assert isinstance(np.ones(3) * x, ta.Tensor)
    assert (x ** np.float32(2)).tolist() == [[1, 1, 1]] * 2


@pytest.mark.parametrize("data, said", [(None, "got None"), ("abc", "dtype <U3"), ([1, "a"], "dtype <U"),
                                        (np.array([1, None], dtype=object), "dtype object"),
                                        ([1 + 2j], "dtype complex")])
def test_tensor_refuses_data_that_is_not_numbers(data, said):
    with pytest.raises(TypeError, match=f"tensor: expected numbers or booleans.*{said}"):
        ta.tensor(data)


def test_tensor_of_ragged_lists_says_so():
    with pytest.raises(ValueError, match="tensor: nested lists of uneven lengths"):
        ta.tensor([[1, 2], [3]])


# ---------------------------------------------------------------- shapes and dims
@pytest.mark.parametrize("op, fn", [("add", lambda a, b: a + b), ("sub", lambda a, b: a - b),
                                    ("mul", lambda a, b: a * b), ("div", lambda a, b: a / b),
                                    ("pow", lambda a, b: a.abs() ** b), ("where", lambda a, b: ta.where(a > 0, a, b))])
def test_broadcasting_errors_name_the_op_and_both_shapes(op, fn):
    shapes = r"\(2, 3\) and \(2, 3\) and \(4,\)" if op == "where" else r"\(2, 3\) and \(4,\)"   # where: cond, a, b
    with pytest.raises(ValueError, match=rf"^{op}: shapes {shapes} do not broadcast \(dim -1 has sizes 3 and 4\)"):
        fn(ta.randn(2, 3), ta.randn(4))


def test_broadcast_shape_follows_numpy():
    from tinyattn.autograd import broadcast_shape
    for a, b in [((2, 1, 3), (4, 1)), ((), (5,)), ((1,), (3, 1)), ((0, 1), (1, 7))]:
        assert broadcast_shape("add", a, b) == np.broadcast_shapes(a, b)


@pytest.mark.parametrize("fn, message", [
    (lambda x: x.expand(4, 3), r"expand: cannot expand shape \(2, 3\) to \(4, 3\): dim 0 has size 2"),
    (lambda x: x.expand(3), r"expand: cannot expand shape \(2, 3\) to \(3,\): the new shape has fewer dims"),
    (lambda x: x.expand(-1, 2, 3), r"expand: .*-1 is only allowed for existing dims"),
    (lambda x: x.reshape(4), r"reshape: cannot reshape a tensor of shape \(2, 3\) \(6 elements\) to \(4,\)"),
    (lambda x: x.view(-1, 4), r"reshape: cannot reshape a tensor of shape \(2, 3\) \(6 elements\) to \(-1, 4\)"),
    (lambda x: x.reshape(-1, -1), r"reshape: .* to \(-1, -1\)"),
    (lambda x: ta.cat([x, ta.randn(2, 3, 1)]), r"cat: shapes \(2, 3\) and \(2, 3, 1\)"),
])
def test_shape_errors_are_in_the_librarys_words(fn, message):
    with pytest.raises(ValueError, match=message):
        fn(ta.randn(2, 3))


def test_reshape_and_expand_still_take_minus_one():
    x = ta.randn(2, 3)
    assert x.reshape(-1).shape == (6,) and x.view(3, -1).shape == (3, 2)
    assert ta.randn(1, 3).expand(4, -1).shape == (4, 3)
    assert ta.randn(3).expand(2, 3).shape == (2, 3)


@pytest.mark.parametrize("op, fn", [
    ("sum", lambda x: x.sum(2)), ("mean", lambda x: x.mean(-3)), ("max", lambda x: x.max(5)),
    ("var", lambda x: x.var(2)), ("softmax", lambda x: x.softmax(2)), ("log_softmax", lambda x: F.log_softmax(x, 3)),
    ("logsumexp", lambda x: x.logsumexp(2)), ("transpose", lambda x: x.transpose(0, 2)),
    ("permute", lambda x: x.permute(0, 2)), ("squeeze", lambda x: x.squeeze(2)),
    ("unsqueeze", lambda x: x.unsqueeze(3)), ("cat", lambda x: ta.cat([x, x], dim=2)),
    ("stack", lambda x: ta.stack([x, x], dim=3)), ("split", lambda x: x.split(1, dim=2)),
])
def test_a_dim_out_of_range_is_an_error_not_a_wrap_around(op, fn):
    with pytest.raises(IndexError, match=rf"^{op}: dim -?\d is out of range for a tensor with \d dims"):
        fn(ta.randn(2, 3))


def test_permute_needs_every_dim_once():
    with pytest.raises(ValueError, match=r"permute: dims \(0, 0\) are not an order of the 2 dims"):
        ta.randn(2, 3).permute(0, 0)


def test_cat_and_stack_of_nothing():
    with pytest.raises(TypeError, match="cat: expected a non-empty list of Tensors"):
        ta.cat([])
    with pytest.raises(TypeError, match="stack: expected a non-empty list"):
        ta.stack([])
    with pytest.raises(TypeError, match=r"cat: expected a non-empty list of Tensors, got \['Tensor', 'ndarray'\]"):
        ta.cat([ta.randn(2), np.ones(2)])


def test_to_with_a_wrong_name_says_what_it_takes():
    with pytest.raises(ValueError, match="to: 'gpu' is neither a device"):
        ta.randn(2).to("gpu")


# ---------------------------------------------------------------- layers and the model
@pytest.mark.parametrize("layer, x, message", [
    (lambda: nn.MultiHeadAttention(8, 2), (5, 8), r"MultiHeadAttention expects \(B, T, C\) with C = 8, got \(5, 8\)"),
    (lambda: nn.MultiHeadAttention(8, 2), (2, 5, 4), r"MultiHeadAttention expects \(B, T, C\) with C = 8, got \(2, 5, 4\)"),
    (lambda: nn.Linear(4, 5), (2, 3), r"Linear expects \(\.\.\., in_features\) with in_features = 4, got \(2, 3\)"),
    (lambda: nn.Linear(4, 5), (), r"Linear expects \(\.\.\., in_features\) with in_features = 4, got \(\)"),
    (lambda: nn.LayerNorm(4), (2, 3), r"layer_norm: normalized_shape \(4,\) does not match input shape \(2, 3\)"),
])
def test_a_layer_says_what_shape_it_expects(layer, x, message):
    with pytest.raises(ValueError, match=message):
        layer()(ta.randn(*x))


def test_a_layer_called_on_a_numpy_array():
    with pytest.raises(TypeError, match=r"Linear expects a Tensor \(\.\.\., in_features\), got ndarray"):
        nn.Linear(3, 2)(np.ones((2, 3)))


@pytest.fixture(scope="module")
def gpt():
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=10))


@pytest.mark.parametrize("idx, targets, error, message", [
    ([1, 2, 3], None, ValueError, r"GPT expects idx \(B, T\) of token ids, got shape \(3,\)"),
    ([[1.0, 2.0]], None, TypeError, "GPT: idx must be integers, got float32"),
    (np.array([[1, 2]]), None, TypeError, "GPT: idx must be a Tensor of integers, got ndarray"),
    ([[1, 2]], [[1, 2, 3]], ValueError, r"GPT: targets shape \(1, 3\) does not match idx shape \(1, 2\)"),
    ([[1, 2]], [[1.0, 2.0]], TypeError, "GPT: targets must be integers, got float32"),
    ([[1, 20]], None, IndexError, r"embedding: ids must be in \[0, 10\), got 1..20"),
])
def test_the_model_checks_its_input(gpt, idx, targets, error, message):
    wrap = lambda v: ta.tensor(v) if isinstance(v, list) else v          # noqa: E731
    with pytest.raises(error, match=message):
        gpt(wrap(idx), wrap(targets))


# ---------------------------------------------------------------- dtypes
def test_embedding_ids_must_be_integers():
    with pytest.raises(TypeError, match=r"embedding: ids must be integers, got float32 \(convert with .long\(\)\)"):
        nn.Embedding(10, 4)(ta.tensor([1.0, 2.0]))
    assert nn.Embedding(10, 4)(ta.tensor([1.0, 2.0]).long()).shape == (2, 4)


def test_cross_entropy_targets_must_be_integers_in_range():
    logits = ta.randn(3, 4)
    with pytest.raises(TypeError, match="cross_entropy: targets must be integers, got float32"):
        F.cross_entropy(logits, ta.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(IndexError, match=r"cross_entropy: targets must be in \[0, 4\) \(or ignore_index -100\), got 0..7"):
        F.cross_entropy(logits, ta.tensor([0, 1, 7]))
    with pytest.raises(TypeError, match="cross_entropy: expected a float tensor, got int64"):
        F.cross_entropy(ta.tensor([[1, 2]]), ta.tensor([0]))
    F.cross_entropy(logits, ta.tensor([0, -100, 3]))                        # ignored rows are fine


@pytest.mark.parametrize("fn, op", [
    (lambda x: nn.Linear(3, 2)(x), "linear"), (lambda x: x @ ta.randn(3, 2), "matmul"),
    (lambda x: F.layer_norm(x, 3), "layer_norm"),
])
def test_an_integer_tensor_meeting_a_float_layer_is_refused(fn, op):
    """The decision (as in PyTorch): layers and matmul never promote integers silently.
    Elementwise arithmetic promotes, as in PyTorch and numpy."""
    with pytest.raises(TypeError, match=rf"{op}: got int64 and float32 tensors; convert the integer one with .float\(\)"
                       if op != "layer_norm" else "layer_norm: .*int64"):
        fn(ta.tensor([[1, 2, 3]]))
    assert (ta.tensor([1, 2]) * ta.ones(2)).dtype.kind == "f"


# ---------------------------------------------------------------- the Function contract
def _op(backward):
    class MyOp(ta.Function):
        def forward(self, a, b):
            return a * b

        def backward(self, g):
            return backward(self, g)
    return MyOp


@pytest.mark.parametrize("backward, error, message", [
    (lambda self, g: (g.data, g.data), TypeError, r"MyOp.backward returned a numpy.ndarray for input 0: return a Tensor"),
    (lambda self, g: (g, g, g), RuntimeError, "MyOp.backward returned 3 gradients for 2 inputs"),
    (lambda self, g: g, RuntimeError, "MyOp.backward returned 1 gradient for 2 inputs"),
    (lambda self, g: (g, 1.0), TypeError, "MyOp.backward returned a builtins.float for input 1"),
    (lambda self, g: (g.sum(), g), RuntimeError, r"MyOp.backward returned a gradient of shape \(\) for input 0 of shape \(3,\)"),
])
def test_the_function_contract_names_the_class_and_the_fault(backward, error, message):
    a, b = ta.randn(3, requires_grad=True), ta.randn(3, requires_grad=True)
    with pytest.raises(error, match=message):
        _op(backward).apply(a, b).sum().backward()
    assert a.grad is None and b.grad is None


def test_a_function_may_return_none_and_a_list():
    a, b = ta.randn(3, requires_grad=True), ta.randn(3)
    _op(lambda self, g: [g * self.parents[1], None]).apply(a, b).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), b.numpy())


def test_function_apply_takes_tensors_only():
    with pytest.raises(TypeError, match=r"MyOp.apply: input 1 is a ndarray, not a Tensor"):
        _op(None).apply(ta.randn(3), np.ones(3))


@pytest.mark.parametrize("call", [lambda t, a: ta.matmul(t, a), lambda t, a: F.linear(t, a),
                                  lambda t, a: F.linear(a, t), lambda t, a: F.layer_norm(t, 3, a, a)],
                         ids=["matmul", "linear weight", "linear input", "layer_norm weight"])
def test_a_numpy_array_for_a_tensor_is_named_by_apply(call):
    with pytest.raises(TypeError, match=r"\.apply: input \d is a ndarray, not a Tensor"):
        call(ta.ones(3, 3), np.ones((3, 3), np.float32))


@pytest.mark.parametrize("call", [lambda a, b: a @ b, lambda a, b: F.linear(a, b),
                                  lambda a, b: F.layer_norm(a, 3, b[0], b[0])],
                         ids=["matmul", "linear", "layer_norm"])
def test_tensors_on_two_devices_get_the_device_error_not_a_dtype_error(call):
    pytest.importorskip("array_api_strict")
    with warnings.catch_warnings():
        warnings.simplefilter("error")            # nor a warning first (comparing two backends' dtypes)
        with pytest.raises(RuntimeError, match="expected all tensors on one device, found cpu and strict"):
            call(ta.ones(3, 3), ta.ones(3, 3, device="strict"))


def test_gradcheck_of_a_bad_backward_names_the_function():
    with pytest.raises(TypeError, match="MyOp.backward returned a numpy.ndarray"):
        ta.gradcheck(lambda a, b: _op(lambda self, g: (g.data, g.data)).apply(a, b),
                     (ta.randn(3, dtype="float64", requires_grad=True),
                      ta.randn(3, dtype="float64", requires_grad=True)))


# ---------------------------------------------------------------- leaves and in-place updates
@pytest.mark.parametrize("op", ["+", "-", "*", "/"])
def test_in_place_update_of_a_leaf_that_requires_grad_is_refused(op):
    w = ta.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match=rf"in-place {re.escape(op)}= on a leaf tensor that requires grad"):
        exec(f"w {op}= 1", {"w": w})


def test_in_place_update_under_no_grad_keeps_the_leaf():
    w = ta.tensor([1.0, 2.0, 3.0], requires_grad=True)
    same = w
    (w * 2).sum().backward()
    with ta.no_grad():
        w -= 0.5 * w.grad                                   # the hand-written SGD step
        w *= 2
    assert w is same and w.is_leaf and w.requires_grad
    assert w.tolist() == [0.0, 2.0, 4.0] and w.dtype == ta.float32
    (w * 3).sum().backward()                                # still trains: grads accumulate into it
    assert w.grad.tolist() == [5.0, 5.0, 5.0]


def test_in_place_update_of_a_plain_tensor():
    t = ta.zeros(2, 3)
    same = t
    t += ta.ones(3)                                         # broadcasts into t
    t *= 2
    assert t is same and t.tolist() == [[2.0] * 3] * 2
    with pytest.raises(ValueError, match=r"in-place \+=: the result has shape \(2, 3\), the tensor has shape \(3,\)"):
        u = ta.zeros(3)
        u += ta.ones(2, 3)
    with pytest.raises(TypeError, match=r"in-place \+=: the result is float\d+, which cannot be stored in a int64"):
        i = ta.tensor([1, 2])
        i += ta.ones(2)


def test_in_place_on_a_non_leaf_records_a_new_node():
    w = ta.randn(3, requires_grad=True)
    h = w * 2
    h += 1                                                  # h = h + 1
    h.sum().backward()
    assert w.grad.tolist() == [2.0, 2.0, 2.0]
    acc = ta.zeros(3)
    acc += w * w                                            # acc now depends on w
    assert acc.requires_grad


@pytest.mark.parametrize("make", [lambda: ta.optim.SGD, lambda: ta.optim.AdamW])
def test_optimizers_refuse_non_leaves_and_bad_settings(make):
    opt = make()
    w = ta.randn(3, requires_grad=True)
    name = opt.__name__
    with pytest.raises(ValueError, match=rf"{name} can't optimize a non-leaf tensor \(shape \(3,\), made by Mul\)"):
        opt([w * 2])
    with pytest.raises(TypeError, match=f"{name}: params must be a list of Tensors"):
        opt(w)
    with pytest.raises(ValueError, match=f"{name} got an empty list of parameters"):
        opt([])
    for bad in (float("nan"), -1.0, float("inf")):
        with pytest.raises(ValueError, match=f"{name}: lr must be a finite number >= 0"):
            opt([w], lr=bad)


def test_adamw_betas_in_range():
    with pytest.raises(ValueError, match=r"AdamW: betas must be in \[0, 1\), got \(0.9, 1.5\)"):
        ta.optim.AdamW([ta.randn(2, requires_grad=True)], betas=(0.9, 1.5))


# ---------------------------------------------------------------- interop and display
def test_np_asarray_gives_a_numeric_array():
    t = ta.randn(2, 3)
    a = np.asarray(t)
    assert a.dtype == np.float32 and a.shape == (2, 3)
    np.testing.assert_array_equal(a, t.numpy())
    assert np.asarray(t, dtype=np.float64).dtype == np.float64
    assert np.asarray(t.sum()).shape == ()
    assert np.asarray(ta.tensor([1, 2])).dtype == np.int64


def test_numpy_functions_do_not_silently_drop_the_graph():
    w = ta.randn(3, requires_grad=True)
    with pytest.raises(TypeError, match="np.asarray: this tensor requires grad, and numpy would drop its graph"):
        np.exp(w)
    np.testing.assert_array_equal(np.asarray(w.detach()), w.numpy())


def test_np_asarray_of_a_device_tensor_needs_an_explicit_copy():
    pytest.importorskip("array_api_strict")
    with pytest.raises(TypeError, match="np.asarray: this tensor is on strict; copy it to the host explicitly"):
        np.asarray(ta.randn(2, device="strict"))


@pytest.mark.parametrize("make", [lambda: ta.tensor(3.0), lambda: ta.randn(3).sum(),
                                  lambda: ta.randn(3, requires_grad=True).sum(), lambda: ta.randn(200, 200),
                                  lambda: ta.zeros(0, 3), lambda: ta.tensor([1, 2]).sum(),
                                  lambda: ta.randn(4).max(), lambda: ta.randn(3).argmax()])
def test_a_tensor_prints_as_tensor_whatever_its_size(make):
    text = repr(make())
    assert text.startswith("tensor(") and text.endswith(")") and "np." not in text, text
    assert str(make()).startswith("tensor(")


def test_zero_d_results_are_arrays():
    loss = ta.randn(3, requires_grad=True).sum()
    assert isinstance(loss.data, np.ndarray) and loss.data.shape == ()
    assert repr(loss).endswith("requires_grad=True)")


# ---------------------------------------------------------------- more probes a newcomer tries
@pytest.mark.parametrize("fn, error, message", [
    (lambda: ta.randn(2, 3).sum("a"), TypeError, r"sum: dim must be an int \(or a tuple of ints\), got str"),
    (lambda: ta.randn(2, 3).mean((0, 0)), ValueError, r"mean: dim \(0, 0\) names a dim twice"),
    (lambda: ta.randn(2, 3)[ta.tensor([0.5])], IndexError, "index: a tensor used as an index must hold integers"),
    (lambda: ta.tensor([1.0], dtype="foo"), TypeError, "unknown dtype 'foo': use one of float16, float32"),
    (lambda: ta.randn(2, dtype="int64"), TypeError, "randn: dtype must be a float type, got int64"),
    (lambda: ta.rand(2, dtype="bool"), TypeError, "rand: dtype must be a float type, got bool"),
    (lambda: F.softmax(ta.tensor([1, 2, 3])), TypeError, r"softmax: expected a float tensor, got int64 \(convert with .float\(\)\)"),
    (lambda: ta.tensor([1, 2]).log_softmax(), TypeError, "log_softmax: expected a float tensor"),
    (lambda: nn.MultiHeadAttention(8, 0), ValueError, "MultiHeadAttention needs n_embd >= 1 and n_head >= 1"),
    (lambda: nn.Dropout(1.5), ValueError, r"Dropout: p must be in \[0, 1\], got 1.5"),
    (lambda: F.dropout(ta.randn(3), -0.1), ValueError, r"dropout: p must be in \[0, 1\], got -0.1"),
    (lambda: ta.optim.AdamW(nn.Linear(2, 2)), TypeError, r"AdamW: pass model.parameters\(\), not the model"),
    (lambda: ta.optim.SGD(nn.Linear(2, 2).parameters(), lr="a"), ValueError, "SGD: lr must be a finite number >= 0, got a"),
])
def test_more_newcomer_mistakes(fn, error, message):
    with pytest.raises(error, match=message):
        fn()


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-1), "temperature -1"), (dict(top_k=0), "top_k 0"), (dict(top_p=0.0), "top_p 0.0"),
    (dict(top_p=1.5), "top_p 1.5"), (dict(temperature=float("nan")), "temperature nan"),
    (dict(temperature=float("inf")), "temperature inf"),
])
def test_generate_checks_its_settings(gpt, kwargs, message):
    with pytest.raises(ValueError, match=f"generate: need temperature >= 0, top_k >= 1 and top_p in .*{message}"):
        gpt.generate(ta.tensor([[1, 2]]), 2, **kwargs)


def test_generate_takes_a_batch(gpt):
    with pytest.raises(ValueError, match=r"GPT expects idx \(B, T\) of token ids, got shape \(2,\)"):
        gpt.generate(ta.tensor([1, 2]), 2)
    assert gpt.generate(ta.tensor([[1, 2]]), 2, temperature=0).shape == (1, 4)


def test_moving_a_module_to_an_unknown_device():
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        nn.Linear(2, 2).to("gpu")


@pytest.mark.parametrize("result, said", [(None, "returned None"), ("tensor", "returned a Tensor: forward works on raw arrays"),
                                          ("text", r"returned str \('abc'\)")])
def test_forward_must_return_an_array(result, said):
    class MyForward(ta.Function):
        def forward(self, a):
            return {"tensor": ta.tensor(a), "text": "abc"}.get(result) if result else None

        def backward(self, g):
            return g
    with pytest.raises(TypeError, match=f"MyForward.forward {said}"):
        MyForward.apply(ta.randn(2))


def test_forward_may_return_a_number():
    class Total(ta.Function):
        def forward(self, a):
            return float(a.sum())

        def backward(self, g):
            return g.expand(self.parents[0].shape)
    out = Total.apply(ta.ones(3, dtype="float64", requires_grad=True))
    assert out.shape == () and out.item() == 3.0
