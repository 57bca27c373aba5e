"""Issue 38: places where tinyattn differed from PyTorch silently, each pinned to PyTorch's answer
(torch 2.13, CPU). These run without torch; tests/conformance compares with torch itself."""
import numpy as np
import pytest

import tinyattn as ta


def f32(*values):
    return ta.tensor(np.array(values, np.float32))


# ------------------------------------------------------------------ promotion between tensors
@pytest.mark.parametrize("a, b, expected", [
    ("int64", "float32", "float32"),      # numpy: float64
    ("int32", "float16", "float16"),      # numpy: float16 too, but int64 with float16 gave float64
    ("int64", "float16", "float16"),
    ("bool", "int32", "int32"),
    ("bool", "float16", "float16"),
    ("int32", "int64", "int64"),
    ("float32", "float64", "float64"),
])
def test_promotion_between_tensors_follows_categories(a, b, expected):
    x, y = ta.ones(3, dtype=a), ta.ones(3, dtype=b)
    outs = (x + y, y + x, x * y) + ((x - y, y - x) if "bool" not in (a, b) else ())   # (no - on bools)
    for out in outs:
        assert str(out.dtype) == expected


@pytest.mark.parametrize("dim, zero, expected", [
    ("float32", "float64", "float32"),    # a 0-d tensor does not widen within a category
    ("float16", "float64", "float16"),
    ("int32", "int64", "int32"),
    ("int64", "float64", "float64"),      # across categories it does, to its own dtype
    ("bool", "int64", "int64"),
])
def test_a_zero_dim_tensor_widens_only_across_categories(dim, zero, expected):
    x, s = ta.ones(2, 3, dtype=dim), ta.tensor(2, dtype=zero)
    assert str((x * s).dtype) == expected and str((s * x).dtype) == expected


def test_promoted_gradients_come_back_in_each_inputs_dtype():
    x = ta.randn(3, requires_grad=True)                                  # float32
    s = ta.tensor(2.0, dtype="float64", requires_grad=True)              # 0-d float64
    y = x * s
    assert y.dtype == ta.float32
    y.sum().backward()
    assert x.grad.dtype == ta.float32 and s.grad.dtype == ta.float64
    np.testing.assert_allclose(s.grad.item(), x.detach().numpy().sum(), rtol=1e-6)


def test_a_mask_times_embeddings_stays_float32():
    """The learner's padding mask: emb(ids) * (ids != 0).long()[..., None] fed the next Linear float64."""
    emb, lin = ta.nn.Embedding(10, 4), ta.nn.Linear(4, 2)
    ids = ta.tensor([[1, 0, 3]])
    h = emb(ids) * (ids != 0).long()[..., None]
    assert h.dtype == ta.float32
    assert lin(h).shape == (1, 3, 2)


@pytest.mark.parametrize("fn", ["exp", "log", "sqrt", "sigmoid", "tanh", "erf"])
def test_float_functions_of_integers_give_float32(fn):
    for x in (ta.tensor([1, 2]), ta.tensor([1, 2], dtype="int32"), ta.tensor([True, False])):
        out = getattr(x, fn)()
        assert out.dtype == ta.float32
        np.testing.assert_allclose(out.numpy(), getattr(ta.tensor([1.0, 2.0] if x.dtype != ta.bool_ else [1.0, 0.0]), fn)().numpy())


def test_integer_power_and_division_dtypes():
    i = ta.tensor([1, 2, 3])
    assert (i ** 2).dtype == ta.int64 and (i ** 0.5).dtype == ta.float32
    assert (i ** ta.tensor([2.0])).dtype == ta.float32 and (i / i).dtype == ta.float32


def test_arange_and_full_pick_their_dtype_from_the_values():
    assert ta.arange(5.5, 175.5, 2.5).dtype == ta.float32
    assert ta.arange(0, 1, 0.25).dtype == ta.float32
    assert ta.arange(5).dtype == ta.int64
    assert ta.full((2, 2), 4).dtype == ta.int64
    assert ta.full((2, 2), 4.0).dtype == ta.float32
    assert ta.full((2,), True).dtype == ta.bool_
    assert ta.full((2,), 4, dtype="float64").dtype == ta.float64


def test_cat_and_where_promote_as_elementwise_ops_do():
    i, f = ta.tensor([1, 2]), f32(0.5, 1.5)
    assert ta.cat([i, f]).dtype == ta.float32
    cond = ta.tensor([True, False])
    assert ta.where(cond, i, f).dtype == ta.float32
    assert ta.where(cond, f, ta.tensor([1.0, 2.0], dtype="float64")).dtype == ta.float64
    assert ta.where(cond, f.double(), 0.0).dtype == ta.float64


def test_layers_still_refuse_integers():
    with pytest.raises(TypeError, match="linear: got int64 and float32"):
        ta.nn.Linear(2, 2)(ta.tensor([[1, 2]]))
    with pytest.raises(TypeError, match="softmax: expected a float tensor"):
        ta.tensor([1, 2]).softmax()


# ------------------------------------------------------------------ edge values
def test_gradient_of_x_to_the_zero_at_zero_is_zero():
    x = ta.zeros(3, dtype="float64", requires_grad=True)
    (x ** 0).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), 0.0)


def test_gradients_of_a_tensor_power_at_a_zero_base():
    """PyTorch: d/da of a ** b is 0 where b == 0; d/db is 0 where a == 0 and b >= 0 (not NaN or -inf)."""
    a = ta.zeros(3, dtype="float64", requires_grad=True)
    b = ta.tensor([0.0, 1.0, 2.5], dtype="float64", requires_grad=True)
    (a ** b).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [0.0, 1.0, 0.0])
    np.testing.assert_array_equal(b.grad.numpy(), [0.0, 0.0, 0.0])
    a2 = ta.tensor([0.5, 2.0], dtype="float64", requires_grad=True)
    b2 = ta.tensor([0.0, 1.5], dtype="float64", requires_grad=True)
    assert ta.gradcheck(lambda x, y: x ** y, (a2, b2))


def test_sign_records_a_zero_gradient():
    x = ta.tensor([-2.0, 0.0, 3.0], requires_grad=True)
    y = x.sign()
    assert y.requires_grad
    (y * 5).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), 0.0)
    np.testing.assert_array_equal(y.detach().numpy(), [-1.0, 0.0, 1.0])


def test_a_dim_that_a_0d_tensor_does_not_have_is_refused():
    x = ta.tensor(3.0)
    assert x.sum(0).item() == 3.0 and x.sum(-1).item() == 3.0
    for op in ("sum", "mean", "max"):
        with pytest.raises(IndexError, match=f"{op}: dim 1 is out of range"):
            getattr(x, op)(1)


def test_min_of_bool_and_unsigned_tensors():
    assert ta.tensor([True, False]).min().item() is False
    assert ta.tensor([True, True]).min().item() is True
    u = ta.tensor(np.array([3, 200, 7], np.uint8))
    assert u.min().item() == 3 and u.min().dtype == np.uint8
    assert ta.tensor([[4, -1], [2, 9]]).min(1).tolist() == [-1, 2]


def test_clamp_needs_a_bound():
    with pytest.raises(ValueError, match="clamp: give min, max or both"):
        ta.ones(2).clamp()
    with pytest.raises(ValueError, match="clamp: give min, max or both"):
        ta.clamp(ta.ones(2), None, None)


def test_mixed_integer_and_tensor_indexing_places_dims_as_pytorch():
    x = ta.randn(2, 3, 12, 5, 4)
    d = ta.tensor([0, 2, 1])
    assert x[1, :, 3:11:2, d, 0:2].shape == (3, 4, 3, 2)          # numpy: (3, 3, 4, 2), d's dim first
    np.testing.assert_array_equal(x[1, :, 3:11:2, d, 0:2].numpy(), x.numpy()[1][:, 3:11:2, [0, 2, 1], 0:2])
    assert x[0, d, :, 1].shape == (3, 12, 4)
    w = ta.randn(3, 4, 5, dtype="float64", requires_grad=True)
    assert ta.gradcheck(lambda t: t[1, :, ta.tensor([0, 4, 4])], (w,))


def test_reductions_over_nothing_give_nan():
    e = ta.zeros(2, 0)
    assert np.isnan(e.mean(1).numpy()).all() and e.mean(1).shape == (2,)
    assert np.isnan(e.var(1).numpy()).all() and np.isnan(e.std(1).numpy()).all()
    assert np.isnan(ta.zeros(0).mean().item())


def test_var_with_no_degrees_of_freedom_left():
    assert np.isnan(ta.tensor([1.5]).var().item())                # 0 / 0
    assert np.isinf(ta.tensor([1.0, 3.0]).var(correction=2).item())   # 2 / 0
    assert ta.tensor([1.0, 3.0]).var(correction=0).item() == 1.0


def test_mean_of_integers_is_refused():
    with pytest.raises(TypeError, match="mean: expected a float tensor, got int64"):
        ta.tensor([1, 2]).mean()


# ------------------------------------------------------------------ errors in the library's words
def test_len_of_a_0d_tensor():
    with pytest.raises(TypeError, match=r"len\(\) of a 0-d tensor"):
        len(ta.tensor(2.0))
    assert len(ta.zeros(4, 2)) == 4


def test_requires_grad_of_a_non_leaf_is_refused():
    x = ta.randn(2, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"requires_grad_: this tensor \(shape \(2,\)\) was computed by Mul"):
        (x * 2).requires_grad_(False)
    x.requires_grad_(False)                                        # a leaf may
    assert not x.requires_grad


def test_cat_of_0d_tensors_is_refused():
    with pytest.raises(ValueError, match="cat: tensor 0 is 0-d"):
        ta.cat([ta.tensor(1.0), ta.tensor(2.0)])
    assert ta.stack([ta.tensor(1.0), ta.tensor(2.0)]).shape == (2,)


def test_bpe_decode_takes_tensors_and_refuses_non_ids():
    from tinyattn.tokenizers import BPE
    bpe = BPE.train("hello hello world", 260) if hasattr(BPE, "train") else None
    if bpe is None:
        pytest.skip("no BPE.train")
    ids = bpe.encode("hello")
    assert bpe.decode(ta.tensor(ids)) == "hello"
    with pytest.raises(TypeError, match="decode: token ids must be ints, got 1.0"):
        bpe.decode([1.0])
    with pytest.raises(TypeError, match="decode: token ids must be ints, got '1'"):
        bpe.decode(["1"])
    with pytest.raises(TypeError, match="decode: token ids must be integers, got a Tensor of float32"):
        bpe.decode(ta.tensor([1.0]))


def test_save_safetensors_to_a_folder_and_export_hf_to_a_file(tmp_path):
    with pytest.raises(ta.SafetensorsError, match="is a folder"):
        ta.save_safetensors({"w": ta.ones(2)}, tmp_path)
    from tinyattn.models import GPT, GPTConfig
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=4, block_size=4, vocab_size=5))
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(ValueError, match="export_hf: .* is a file"):
        model.export_hf(f)


def test_uint8_tensors_round_trip_through_safetensors(tmp_path):
    u = ta.tensor(np.array([0, 7, 255], np.uint8))
    ta.save_safetensors({"u": u, "i8": ta.tensor(np.array([-3], np.int8))}, tmp_path / "a.safetensors")
    back = ta.load_safetensors(tmp_path / "a.safetensors")
    assert back["u"].dtype == np.uint8 and back["u"].tolist() == [0, 7, 255]
    assert back["i8"].dtype == np.int8


# ------------------------------------------------------------------ everyday API
def test_neg_floor_division_and_where_with_numbers():
    x = ta.tensor([5, -5])
    assert x.neg().tolist() == [-5, 5]
    assert (x // 2).tolist() == [2, -3] and (x // 2).dtype == ta.int64
    assert (f32(5.0, -5.0) // 2).tolist() == [2.0, -3.0]
    assert (x // 2.0).dtype == ta.float32 and (7 // ta.tensor([2])).tolist() == [3]
    cond = ta.tensor([True, False])
    out = ta.where(cond, 4, 2)
    assert out.tolist() == [4, 2] and out.dtype == ta.int64
    assert ta.where(cond, 4, 2.5).dtype == ta.float32
    with pytest.raises(TypeError, match="where: cond must be a boolean Tensor, got float32"):
        ta.where(f32(1.0, 0.0), 1, 2)


def test_floor_division_has_no_gradient():
    x = ta.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"floor division \(//\) has no gradient"):
        (x // 2).sum().backward()


def test_cross_entropy_reductions_and_label_smoothing():
    rng = np.random.default_rng(0)
    logits = ta.tensor(rng.standard_normal((4, 3)), dtype="float64", requires_grad=True)
    t = ta.tensor([0, 2, -100, 1])
    per_row = ta.nn.functional.cross_entropy(logits, t, reduction="none")
    assert per_row.shape == (4,) and per_row[2].item() == 0.0
    mean = ta.nn.functional.cross_entropy(logits, t)
    np.testing.assert_allclose(per_row.sum().item() / 3, mean.item(), rtol=1e-12)
    np.testing.assert_allclose(ta.nn.functional.cross_entropy(logits, t, reduction="sum").item(),
                               per_row.sum().item(), rtol=1e-12)
    smooth = ta.nn.functional.cross_entropy(logits, t, label_smoothing=0.3)
    logp = np.log(np.exp(logits.detach().numpy()) / np.exp(logits.detach().numpy()).sum(1, keepdims=True))
    rows = [0, 1, 3]
    expected = np.mean([0.7 * -logp[i, t.tolist()[i]] + 0.3 * -logp[i].mean() for i in rows])
    np.testing.assert_allclose(smooth.item(), expected, rtol=1e-12)
    with pytest.raises(ValueError, match="cross_entropy: reduction must be"):
        ta.nn.functional.cross_entropy(logits, t, reduction="avg")


def test_cross_entropy_with_class_probabilities():
    logits = ta.randn(3, 4, dtype="float64")
    onehot = ta.tensor(np.eye(4)[[1, 0, 3]], dtype="float64")
    np.testing.assert_allclose(ta.nn.functional.cross_entropy(logits, onehot).item(),
                               ta.nn.functional.cross_entropy(logits, ta.tensor([1, 0, 3])).item(), rtol=1e-12)
    with pytest.raises(ValueError, match="class-probability targets must have the logits' shape"):
        ta.nn.functional.cross_entropy(logits, onehot[:, :2])


def test_layer_norm_over_several_trailing_dims():
    ln = ta.nn.LayerNorm((3, 4))
    x = ta.randn(2, 3, 4, dtype="float64")
    ln.to("cpu")
    out = ta.nn.functional.layer_norm(x, (3, 4))
    flat = x.numpy().reshape(2, 12)
    expected = (flat - flat.mean(1, keepdims=True)) / np.sqrt(flat.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(out.numpy().reshape(2, 12), expected, rtol=1e-10)
    assert ln(ta.randn(5, 3, 4)).shape == (5, 3, 4)
    with pytest.raises(ValueError, match="layer_norm: normalized_shape"):
        ln(ta.randn(5, 4, 3))


def test_grouped_query_attention():
    q, k, v = ta.randn(2, 4, 3, 5), ta.randn(2, 2, 3, 5), ta.randn(2, 2, 3, 5)
    F = ta.nn.functional
    out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    repeated = [ta.tensor(np.repeat(t.numpy(), 2, axis=1)) for t in (k, v)]
    np.testing.assert_allclose(out.numpy(), F.scaled_dot_product_attention(q, *repeated).numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match=r"enable_gqa needs q's heads \(4\) to be a multiple of k's \(3\)"):
        F.scaled_dot_product_attention(q, ta.randn(2, 3, 3, 5), ta.randn(2, 3, 3, 5), enable_gqa=True)


def test_clip_grad_norm_of_one_tensor_and_other_norms():
    w = ta.zeros(3, requires_grad=True)
    w.grad = f32(3.0, 4.0, 0.0)
    assert ta.nn.utils.clip_grad_norm_(w, 10.0).item() == pytest.approx(5.0)
    assert ta.nn.utils.clip_grad_norm_(w, 1.0, norm_type=1).item() == pytest.approx(7.0)
    np.testing.assert_allclose(w.grad.numpy(), [3 / 7, 4 / 7, 0.0], rtol=1e-5)
    w.grad = f32(3.0, -4.0, 0.0)
    assert ta.nn.utils.clip_grad_norm_([w], 2.0, norm_type=float("inf")).item() == pytest.approx(4.0)
    np.testing.assert_allclose(w.grad.numpy(), [1.5, -2.0, 0.0], rtol=1e-5)


def test_subtraction_with_a_bool_is_refused():
    with pytest.raises(TypeError, match="-: subtraction with a bool operand is refused"):
        ta.tensor([True]) - ta.tensor([False])
    with pytest.raises(TypeError, match="-: subtraction with a bool operand is refused"):
        1 - ta.tensor([True])
    assert (1 - ta.tensor([True]).long()).tolist() == [0]


def test_bool_and_integer_inputs_of_relu_abs_sign_gelu_pow():
    assert ta.tensor([-2, 3]).relu().tolist() == [0, 3] and ta.tensor([-2, 3]).relu().dtype == ta.int64
    assert ta.tensor([True, False]).sign().tolist() == [True, False]
    assert (ta.tensor([True, False]) ** 2).dtype == ta.int64
    for fn in (lambda x: x.abs(), lambda x: x.relu(), lambda x: x.argmax()):
        with pytest.raises(TypeError, match="a bool tensor"):
            fn(ta.tensor([True]))
    with pytest.raises(TypeError, match="gelu: expected a float tensor, got int64"):
        ta.nn.functional.gelu(ta.tensor([1, 2]))


def test_relu_passes_nan_and_softmax_of_nothing_is_nothing():
    assert np.isnan(ta.tensor([np.nan, -1.0]).relu().numpy()[0])
    assert ta.zeros(3, 0).softmax(-1).shape == (3, 0)
    assert ta.tensor([1, 2]).logsumexp(0).dtype == ta.float32


def test_std_at_zero_variance_has_a_zero_gradient():
    x = ta.ones(1, 3, dtype="float64", requires_grad=True)
    x.std(0, correction=0).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), 0.0)


# ------------------------------------------------------------------ in-place writes through views
@pytest.mark.parametrize("make_view", [lambda w: w[0], lambda w: w[:, 1], lambda w: w.view(-1), lambda w: w.T,
                                       lambda w: w.detach(), lambda w: w[1, 2], lambda w: w.split(1)[0]],
                         ids=["w[0]", "w[:, 1]", "view", "T", "detach", "w[1, 2]", "split"])
def test_an_in_place_op_on_a_view_writes_through(make_view):
    w = ta.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    with ta.no_grad():
        v = make_view(w)
        before = w.numpy().copy()
        v -= 1
    assert (w.numpy() != before).any(), "the write through the view was dropped"
    assert (w.numpy() - before).sum() == -v.numel()


def test_zero_and_updates_keep_a_detached_view_in_step():
    w = ta.ones(3, requires_grad=True)
    seen = w.detach()
    with ta.no_grad():
        w -= 0.5
    assert seen.tolist() == [0.5, 0.5, 0.5]
    seen.zero_()
    assert w.tolist() == [0.0, 0.0, 0.0]


def test_writes_that_cannot_be_shared_are_refused():
    e = ta.ones(3, 1).expand(3, 4)
    with pytest.raises(RuntimeError, match=r"in-place \*=: this tensor \(shape \(3, 4\)\) is an expanded"):
        e *= 2
    h = ta.randn(2, 3, requires_grad=True) * 2
    row = h[0]
    with pytest.raises(RuntimeError, match=r"in-place \+= on a view \(shape \(3,\)\) while a graph is recorded"):
        row += 1


def test_a_tensor_made_from_a_numpy_array_does_not_share_it():
    a = np.array([1, 2, 3])
    t = ta.tensor(a)
    t += 1
    assert a.tolist() == [1, 2, 3] and t.tolist() == [2, 3, 4]


def test_a_cast_to_integers_leaves_the_graph():
    """x.long() required grad, and its truncated gradient flowed back when it was added to a float."""
    x = ta.tensor([1.7, -2.2], dtype="float64", requires_grad=True)
    assert not x.long().requires_grad and not (x > 0).requires_grad
    (x * 2 + x.long()).sum().backward(ta.tensor(0.6, dtype="float64"))
    np.testing.assert_allclose(x.grad.numpy(), [1.2, 1.2])
