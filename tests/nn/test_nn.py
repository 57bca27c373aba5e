"""Modules, layers, attention, optimizers."""
import math

import numpy as np
import pytest

import tinyattn as ta
import tinyattn.nn as nn
import tinyattn.nn.functional as F
from tinyattn.models import GPT, GPTConfig
from tinyattn.optim import SGD, AdamW, warmup_cosine


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(8, 2, bias=False)
        self.norm = nn.LayerNorm(2)

    def forward(self, x):
        return self.norm(self.fc2(self.act(self.fc1(x))))


def test_named_parameters_are_ordered_and_stable():
    m = TwoLayer()
    names = [n for n, _ in m.named_parameters()]
    assert names == ["fc1.weight", "fc1.bias", "fc2.weight", "norm.weight", "norm.bias"]
    assert list(m.state_dict()) == names
    assert m.num_parameters() == 4 * 8 + 8 + 8 * 2 + 2 + 2


def test_state_dict_round_trip_and_errors():
    a, b = TwoLayer(), TwoLayer()
    b.load_state_dict(a.state_dict())
    x = ta.randn(3, 4)
    np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())
    state = {k: v.numpy() for k, v in a.state_dict().items()}
    del state["fc1.bias"]
    state["extra.weight"] = np.zeros(3)
    state["fc2.weight"] = np.zeros((5, 5))
    with pytest.raises(RuntimeError) as err:                      # PyTorch's class (and a ValueError)
        b.load_state_dict(state)
    text = str(err.value)
    assert isinstance(err.value, ValueError) and not isinstance(err.value, KeyError)
    assert "fc1.bias" in text and "extra.weight" in text
    assert "size mismatch for fc2.weight: (5, 5) in the state dict, (2, 8) in the model" in text, text


def test_train_eval_and_zero_grad():
    m = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
    assert m.training and m[1].training
    m.eval()
    assert not m[1].training
    x = ta.randn(4, 3)
    np.testing.assert_array_equal(m(x).numpy(), m(x).numpy())    # no dropout in eval
    m.train()
    m(x).sum().backward()
    assert m[0].weight.grad is not None
    m.zero_grad()
    assert m[0].weight.grad is None


def test_module_list_and_repr():
    ml = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    assert len(ml) == 3 and len(list(ml.parameters())) == 6
    assert "Linear(in_features=2" in repr(ml)


def test_linear_matches_numpy():
    lin = nn.Linear(5, 3)
    x = ta.randn(2, 4, 5)
    expected = x.numpy() @ lin.weight.numpy().T + lin.bias.numpy()
    np.testing.assert_allclose(lin(x).numpy(), expected, rtol=1e-5, atol=1e-6)


def test_clip_grad_norm():
    p = nn.Parameter(ta.zeros(4))
    p.grad = ta.tensor([3.0, 4.0, 0.0, 0.0])
    norm = nn.utils.clip_grad_norm_([p], 1.0)
    assert abs(norm.item() - 5.0) < 1e-6
    np.testing.assert_allclose(p.grad.numpy(), [0.6, 0.8, 0, 0], rtol=1e-5)
    p.grad = ta.tensor([0.3, 0.4, 0.0, 0.0])
    nn.utils.clip_grad_norm_([p], 1.0)
    np.testing.assert_allclose(p.grad.numpy(), [0.3, 0.4, 0, 0], rtol=1e-6)


# ------------------------------------------------------------------ attention
def naive_attention(q, k, v, allowed=None):
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True)
    return w @ v


def test_sdpa_matches_numpy_and_gradchecks(rng):
    q, k, v = (ta.tensor(rng.standard_normal((2, 3, 5, 4)), dtype="float64", requires_grad=True) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    allowed = np.tril(np.ones((5, 5), bool))
    np.testing.assert_allclose(out.numpy(), naive_attention(q.numpy(), k.numpy(), v.numpy(), allowed), rtol=1e-10)
    assert ta.gradcheck(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), (q, k, v))


def test_user_mask_and_is_causal_together_are_refused(rng):
    """PyTorch refuses both at once; a causal mask joins a user's mask by hand (the & of the two)."""
    q, k, v = (ta.tensor(rng.standard_normal((1, 2, 4, 3)), dtype="float64") for _ in range(3))
    user = np.array([True, False, True, True])                  # key 1 is padding
    with pytest.raises(ValueError, match="scaled_dot_product_attention: attn_mask and is_causal=True"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=ta.tensor(user), is_causal=True)
    allowed = np.tril(np.ones((4, 4), bool)) & user
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=ta.tensor(allowed))
    np.testing.assert_allclose(out.numpy(), naive_attention(q.numpy(), k.numpy(), v.numpy(), allowed), rtol=1e-10)
    additive = ta.tensor(np.where(allowed, 0.0, -np.inf), dtype="float64")
    out2 = F.scaled_dot_product_attention(q, k, v, attn_mask=additive)
    np.testing.assert_allclose(out2.numpy(), out.numpy(), rtol=1e-10)


def test_attention_weights_come_back(rng):
    q, k, v = (ta.tensor(rng.standard_normal((1, 1, 3, 2))) for _ in range(3))
    out, w = F.scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)
    assert w.shape == (1, 1, 3, 3)
    np.testing.assert_allclose(w.numpy().sum(-1), 1.0, rtol=1e-6)
    assert np.all(np.triu(w.numpy()[0, 0], 1) == 0)


def test_multi_head_attention_is_causal():
    ta.manual_seed(0)
    mha = nn.MultiHeadAttention(8, 2)
    x = ta.randn(1, 6, 8)
    y1 = mha(x, is_causal=True).numpy()
    x2 = x.numpy().copy()
    x2[:, 4:] = np.random.default_rng(1).standard_normal((1, 2, 8))
    y2 = mha(ta.tensor(x2), is_causal=True).numpy()
    np.testing.assert_array_equal(y1[:, :4], y2[:, :4])
    assert not np.allclose(y1[:, 4:], y2[:, 4:])


def test_one_head_equals_single_head_attention():
    ta.manual_seed(1)
    mha = nn.MultiHeadAttention(6, 1)
    x = ta.randn(2, 5, 6)
    qkv = x.numpy() @ mha.c_attn.weight.numpy().T + mha.c_attn.bias.numpy()
    q, k, v = np.split(qkv, 3, axis=-1)
    att = naive_attention(q, k, v, np.tril(np.ones((5, 5), bool)))
    expected = att @ mha.c_proj.weight.numpy().T + mha.c_proj.bias.numpy()
    np.testing.assert_allclose(mha(x, is_causal=True).numpy(), expected, rtol=1e-4, atol=1e-5)


def test_multi_head_attention_gradcheck():
    ta.manual_seed(2)
    mha = nn.MultiHeadAttention(4, 2)
    for p in mha.parameters():
        p.data = p.data.astype("float64")
    x = ta.randn(1, 3, 4, dtype="float64", requires_grad=True)
    w = mha.c_attn.weight
    assert ta.gradcheck(lambda a, b: mha(a, is_causal=True), (x, w))


def test_head_dropout_drops_whole_heads_per_sequence():
    """Each (sequence, head) output is either gone or scaled by 1/(1-p): with c_proj the identity,
    the output's columns of one head are 0 or 1/(1-p) times the eval-mode output's."""
    ta.manual_seed(3)
    B, T, H, D, p = 64, 5, 4, 3, 0.25
    mha = nn.MultiHeadAttention(H * D, H, head_dropout=p)
    mha.c_proj.weight.data = np.eye(H * D, dtype=np.float32)
    mha.c_proj.bias.data = np.zeros(H * D, dtype=np.float32)
    x = ta.randn(B, T, H * D)
    full = mha.eval()(x, is_causal=True).numpy().reshape(B, T, H, D)
    got = mha.train()(x, is_causal=True).numpy().reshape(B, T, H, D)
    dropped = np.all(got == 0, axis=(1, 3))                                       # (B, H)
    kept = np.all(np.isclose(got, full / (1 - p), rtol=1e-5, atol=1e-6), axis=(1, 3))
    assert np.all(dropped ^ kept)
    assert 0.15 < dropped.mean() < 0.35                                           # about p of 256
    np.testing.assert_array_equal(mha.eval()(x, is_causal=True).numpy().reshape(B, T, H, D), full)


def test_head_dropout_gradcheck_with_the_mask_fixed():
    """The mask is a constant of the graph: gradients flow through the kept heads only."""
    mha = nn.MultiHeadAttention(4, 2, head_dropout=0.5)
    for p in mha.parameters():
        p.data = p.data.astype("float64")
    x = ta.randn(3, 3, 4, dtype="float64", requires_grad=True)

    def f(a):
        ta.manual_seed(7)                     # the same heads dropped at every evaluation
        return mha(a, is_causal=True)
    assert ta.gradcheck(f, (x,))


def test_head_dropout_out_of_range_is_an_error():
    with pytest.raises(ValueError, match=r"head_dropout must be in \[0, 1\), got 1.0"):
        nn.MultiHeadAttention(4, 2, head_dropout=1.0)


# ------------------------------------------------------------------ optimizers
def quadratic_descends(opt_cls, **kw):
    ta.manual_seed(0)
    p = nn.Parameter(ta.tensor([3.0, -2.0]))
    opt = opt_cls([p], **kw)
    for _ in range(200):
        loss = (p * p).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return np.abs(p.numpy()).max()


def test_sgd_and_adamw_minimise_a_quadratic():
    assert quadratic_descends(SGD, lr=0.1) < 1e-6
    assert quadratic_descends(SGD, lr=0.05, momentum=0.9) < 1e-3
    assert quadratic_descends(AdamW, lr=0.1, weight_decay=0.0) < 1e-2


def test_adamw_matches_the_formula():
    p = nn.Parameter(ta.tensor([1.0, -2.0], dtype="float64"))
    opt = AdamW([p], lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.5)
    g = np.array([0.3, -0.4])
    x, m, v = p.numpy().copy(), 0, 0
    for t in (1, 2):
        p.grad = ta.tensor(g, dtype="float64")
        opt.step()
        x = x * (1 - 0.1 * 0.5)
        m = 0.9 * m + 0.1 * g
        v = 0.99 * v + 0.01 * g * g
        x = x - 0.1 * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.99 ** t)) + 1e-8)
    np.testing.assert_allclose(p.numpy(), x, rtol=1e-12)


def test_fused_adamw_is_the_loop_bit_for_bit():
    """The flat-buffer step (two groups, decay and none) against the per-parameter loop,
    over steps where the parameters are also replaced from outside (load_state_dict)."""
    def model():
        ta.manual_seed(0)
        return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=11))
    a, b = model(), model()
    opt_a = ta.compile(a).configure_optimizer(0.1, 1e-2, (0.9, 0.99))       # a compiled model's: fused
    opt_b = b.configure_optimizer(0.1, 1e-2, (0.9, 0.99))                    # the per-parameter loop
    rng = np.random.default_rng(0)
    for step in range(4):
        if step == 2:                                            # replaced from outside: the flat buffers follow
            a.load_state_dict({k: v.numpy().copy() for k, v in a.state_dict().items()})
            opt_a.load_state_dict(opt_a.state_dict())
        idx = ta.tensor(rng.integers(0, 11, (2, 8)))
        for m, o in ((a, opt_a), (b, opt_b)):
            m(idx, idx)[1].backward()
            o.step()
            o.zero_grad()
    assert "_flat" in opt_a.__dict__ and "_flat" not in opt_b.__dict__     # each ran the path it should
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        np.testing.assert_array_equal(pa.numpy(), pb.numpy(), err_msg=name)
    for i, state in opt_a.state_dict()["state"].items():
        for key, value in state.items():
            np.testing.assert_array_equal(value, opt_b.state_dict()["state"][i][key])


def test_fused_adamw_falls_back_when_a_gradient_is_missing():
    p, q = nn.Parameter(ta.tensor([1.0, 2.0])), nn.Parameter(ta.tensor([3.0]))
    opt = AdamW([p, q], lr=0.1, fused=True)
    p.grad = ta.tensor([0.5, -0.5])
    opt.step()                                                   # q has no gradient: the loop, q untouched
    assert q.numpy()[0] == 3.0 and opt.state_dict()["state"].keys() == {0}
    p.grad, q.grad = ta.tensor([0.5, -0.5]), ta.tensor([1.0])
    opt.step()                                                   # step counts differ (2 and 1): the loop again
    assert opt.state[id(p)]["step"] == 2 and opt.state[id(q)]["step"] == 1 and "_flat" not in opt.__dict__


def test_optimizer_state_round_trip():
    p = nn.Parameter(ta.tensor([1.0, 2.0]))
    opt = AdamW([p], lr=0.01)
    p.grad = ta.tensor([0.1, 0.2])
    opt.step()
    q = nn.Parameter(ta.tensor(p.numpy()))
    opt2 = AdamW([q], lr=0.5)
    opt2.load_state_dict(opt.state_dict())
    assert opt2.param_groups[0]["lr"] == 0.01
    for o, t in ((opt, p), (opt2, q)):
        t.grad = ta.tensor([0.3, -0.1])
        o.step()
    np.testing.assert_array_equal(p.numpy(), q.numpy())


def test_a_parameter_in_two_groups_is_an_error():
    p = nn.Parameter(ta.zeros(2))
    with pytest.raises(ValueError, match="more than one group"):
        AdamW([{"params": [p]}, {"params": [p]}])


def test_warmup_cosine_schedule():
    lr = [warmup_cosine(s, 1.0, 0.1, 10, 100) for s in range(0, 120)]
    assert lr[0] < lr[5] < lr[9] < 1.0
    assert abs(lr[10] - 1.0) < 1e-12
    assert abs(lr[55] - 0.55) < 1e-12
    assert all(abs(x - 0.1) < 1e-12 for x in lr[101:])
    assert all(a >= b for a, b in zip(lr[10:101], lr[11:101]))


def test_module_to_a_dtype_casts_the_float_parameters_in_place():
    model = nn.Linear(3, 2)
    model.register_buffer("counts", ta.tensor([1, 2]))          # an integer buffer keeps its dtype
    weight = model.weight
    model(ta.randn(4, 3)).sum().backward()
    assert model.to(ta.float64) is model and model.weight is weight      # the same Parameter: optimizers keep it
    assert {p.dtype for p in model.parameters()} == {np.dtype("float64")} and weight.grad is None
    assert model.counts.dtype == np.dtype("int64") and weight.requires_grad and weight.is_leaf
    assert model(ta.randn(4, 3, dtype="float64")).dtype == np.dtype("float64")
    back = model.to("float32").weight.numpy()
    assert back.dtype == np.float32
    with pytest.raises(ValueError, match="cast to a float dtype"):
        model.to("int64")
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        model.to("gpu")
