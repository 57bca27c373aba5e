"""The modern block's choices of GPTConfig: rotary positions, RMSNorm, SwiGLU and ReLU², grouped-query
attention, QK-norm, untied embeddings; each alone and all together: gradients, the KV cache, defaults."""
import numpy as np
import pytest

import tinyattn as ta
import tinyattn.nn.functional as F
from tinyattn.models import GPT, GPTConfig
from tinyattn.models import gpt

CHOICES = {
    "rope": dict(pos="rope"),
    "rmsnorm": dict(norm="rmsnorm"),
    "swiglu": dict(mlp="swiglu"),
    "relu2": dict(mlp="relu2"),
    "gqa": dict(n_kv_head=2),
    "mqa": dict(n_kv_head=1),
    "qk_norm": dict(qk_norm=True),
    "untied": dict(tie_embeddings=False),
    "no bias": dict(bias=False),
    "llama": dict(pos="rope", norm="rmsnorm", mlp="swiglu", n_kv_head=2, bias=False, tie_embeddings=False),
    "all": dict(pos="rope", norm="rmsnorm", mlp="swiglu", n_kv_head=2, qk_norm=True, bias=False,
                tie_embeddings=False, rope_theta=500.0),
}


def tiny(dtype="float32", **kw):
    ta.manual_seed(0)
    cfg = dict(block_size=24, vocab_size=11, n_layer=2, n_head=4, n_embd=16, dropout=0.0)
    return GPT(GPTConfig(**{**cfg, **kw})).to(dtype)


@pytest.mark.parametrize("name", CHOICES)
def test_gradcheck_through_a_whole_model(name):
    """The loss of a whole 2-layer model (float64) against every parameter: each choice's backward."""
    model = tiny("float64", **CHOICES[name])
    for p in model.parameters():                      # away from the init's zeros and ones
        p.data = p.data + np.random.default_rng(1).normal(0, 0.1, p.shape)
    idx = ta.tensor(np.random.default_rng(2).integers(0, 11, (2, 7)))
    params = list(model.parameters())
    assert ta.gradcheck(lambda *ps: model(idx, idx)[1], params)


def test_choices_change_what_they_should():
    base = tiny()
    assert base.wpe is not None and isinstance(base.h[0].ln_1, ta.nn.LayerNorm)
    assert type(base.h[0].mlp) is gpt.MLP and base.lm_head.weight is base.wte.weight
    modern = tiny(**CHOICES["all"])
    assert modern.wpe is None and isinstance(modern.h[0].ln_1, ta.nn.RMSNorm) and isinstance(modern.ln_f, ta.nn.RMSNorm)
    assert type(modern.h[0].mlp) is gpt.SwiGLU and modern.lm_head.weight is not modern.wte.weight
    attn = modern.h[0].attn
    assert attn.n_kv_head == 2 and attn.rope_theta == 500.0 and attn.c_attn.out_features == 16 + 2 * 2 * 4
    assert not any(name.endswith("bias") for name, _ in modern.named_parameters())
    assert type(tiny(mlp="relu2").h[0].mlp) is gpt.ReLU2MLP


def test_swiglu_width_keeps_the_mlps_weight_count():
    """8C/3 rounded down: for C = 384 exactly GELU's 8 C^2 weights; for C = 128, 341 wide, 0.1% fewer."""
    for C in (384, 128):
        gelu = gpt.MLP(GPTConfig(n_embd=C, bias=False)).num_parameters()
        swiglu = gpt.SwiGLU(GPTConfig(n_embd=C, mlp="swiglu", bias=False)).num_parameters()
        assert gelu == 8 * C * C and abs(swiglu - gelu) / gelu < 0.002
    assert GPTConfig(n_embd=128, mlp="swiglu").hidden == 341 and GPTConfig(mlp="swiglu", mlp_hidden=100).hidden == 100


def test_gqa_has_fewer_parameters_by_its_key_value_heads():
    full, gqa = tiny(bias=False), tiny(bias=False, n_kv_head=1)
    C, D = 16, 4
    assert full.num_parameters() - gqa.num_parameters() == 2 * 2 * (4 - 1) * D * C     # 2 layers, k and v


def test_rmsnorm_block_computes_rms_norm():
    model = tiny(norm="rmsnorm", norm_eps=1e-6)
    x = ta.randn(2, 3, 16)
    np.testing.assert_allclose(model.h[0].ln_1(x).numpy(), F.rms_norm(x, 16, model.h[0].ln_1.weight, 1e-6).numpy())


def test_defaults_are_gpt2s_and_an_old_checkpoint_loads_unchanged():
    """A config saved before these fields existed builds the same GPT, with the same names and shapes."""
    old = dict(block_size=24, vocab_size=11, n_layer=2, n_head=4, n_embd=16, dropout=0.0, bias=True, gelu="tanh",
               init="gpt2", head_dropout=0.0)
    ta.manual_seed(0)
    model = GPT(GPTConfig(**old))
    names = [n for n, _ in model.named_parameters()]
    assert names[:2] == ["wte.weight", "wpe.weight"] and "lm_head.weight" not in names
    assert [n for n in names if n.startswith("h.0.")] == [
        "h.0.ln_1.weight", "h.0.ln_1.bias", "h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias", "h.0.attn.c_proj.weight",
        "h.0.attn.c_proj.bias", "h.0.ln_2.weight", "h.0.ln_2.bias", "h.0.mlp.c_fc.weight", "h.0.mlp.c_fc.bias",
        "h.0.mlp.c_proj.weight", "h.0.mlp.c_proj.bias"]
    assert model.h[0].attn.c_attn.weight.shape == (48, 16) and model.h[0].mlp.c_fc.weight.shape == (64, 16)
    assert model.h[0].ln_1.eps == 1e-5
    GPT(GPTConfig(**old)).load_state_dict(model.state_dict())


@pytest.mark.parametrize("kw, words", [
    (dict(pos="alibi"), "pos must be one of"), (dict(norm="batchnorm"), "norm must be one of"),
    (dict(mlp="geglu"), "mlp must be one of"), (dict(n_kv_head=3), "n_kv_head (3) must divide n_head (4)"),
    (dict(n_kv_head=0), "n_kv_head (0) must divide"), (dict(pos="rope", n_embd=12), "even head size"),
])
def test_a_wrong_choice_is_a_one_line_error(kw, words):
    with pytest.raises(ValueError, match=None) as e:
        GPTConfig(**{**dict(n_head=4, n_embd=16), **kw})
    assert words in str(e.value) and "\n" not in str(e.value)


def cached_against_recomputed(model, idx, prompt):
    """Logits with the KV cache (a prompt, then one token at a time) and without."""
    full, _ = model(idx)
    caches = [ta.nn.KVCache() for _ in model.h]
    pieces = [model(idx[:, :prompt], kv_caches=caches)[0]]
    for t in range(prompt, idx.shape[1]):
        pieces.append(model(idx[:, t:t + 1], kv_caches=caches)[0])
    return ta.cat(pieces, dim=1).numpy(), full.numpy(), caches


@pytest.mark.parametrize("name", ["rope", "gqa", "mqa", "qk_norm", "all"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_kv_cache_is_exact_against_recomputation(name, dtype):
    """Rotary positions go on after the cached tokens; GQA's cache holds n_kv_head heads. A prompt of 20
    (past the cache's first buffers of 16), then tokens to 24; logits within 1e-6."""
    model = tiny(dtype, **CHOICES[name]).eval()
    idx = ta.tensor(np.random.default_rng(4).integers(0, 11, (3, 24)))
    cached, full, _ = cached_against_recomputed(model, idx, 20)
    np.testing.assert_allclose(cached, full, rtol=0, atol=1e-6)
    prompt = idx[:, :5]
    with_cache = model.generate(prompt, 19, temperature=0)
    np.testing.assert_array_equal(with_cache.numpy(), model.generate(prompt, 19, temperature=0, use_cache=False).numpy())


def test_a_gqa_cache_takes_n_kv_head_over_n_head_of_the_memory():
    idx = ta.tensor(np.random.default_rng(5).integers(0, 11, (2, 10)))
    sizes = {}
    for n_kv_head in (4, 2, 1):
        _, _, caches = cached_against_recomputed(tiny(n_kv_head=n_kv_head).eval(), idx, 4)
        assert caches[0].k.shape == (2, n_kv_head, 10, 4)
        sizes[n_kv_head] = sum(c.k_buffer.nbytes + c.v_buffer.nbytes for c in caches)
    assert sizes[2] * 2 == sizes[4] and sizes[1] * 4 == sizes[4]


def test_rotary_positions_make_the_model_see_order_without_wpe():
    """With pos='rope' and no position table, the logits of a token still depend on where it stands."""
    model = tiny(pos="rope").eval()
    a, _ = model(ta.tensor([[1, 2, 3, 4]]))
    b, _ = model(ta.tensor([[2, 1, 3, 4]]))
    assert not np.allclose(a.numpy()[0, 3], b.numpy()[0, 3])


def test_attention_weights_are_kept_per_query_head_with_gqa():
    model = tiny(n_kv_head=1).eval()
    model.h[0].attn.keep_weights = True
    model(ta.tensor([[1, 2, 3, 4, 5]]))
    weights = model.h[0].attn.last_weights
    assert weights.shape == (1, 4, 5, 5)
    np.testing.assert_allclose(weights.numpy().sum(-1), 1.0, rtol=1e-6)


def test_rotary_embedding_is_relative_and_matches_transformers():
    """q_m . k_n depends on m - n only; and the rotation is transformers' Llama's (rotate_half)."""
    rng = np.random.default_rng(6)
    q, k = ta.tensor(rng.normal(size=(1, 8)), dtype="float64"), ta.tensor(rng.normal(size=(1, 8)), dtype="float64")

    def score(m, n):
        return float((F.rotary_embedding(q, [m]) * F.rotary_embedding(k, [n])).sum().item())
    assert abs(score(7, 4) - score(30, 27)) < 1e-12 and abs(score(7, 4) - score(7, 5)) > 1e-6
    torch = pytest.importorskip("torch")
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    x = rng.normal(size=(2, 3, 5, 8))
    theta = 500.0 ** (-np.arange(0, 8, 2) / 8)
    angles = np.concatenate([np.arange(3, 8)[:, None] * theta] * 2, -1)              # (T, D)
    cos, sin = torch.tensor(np.cos(angles)), torch.tensor(np.sin(angles))
    want, _ = llama.apply_rotary_pos_emb(torch.tensor(x), torch.tensor(x), cos, sin, unsqueeze_dim=0)
    got = F.rotary_embedding(ta.tensor(x, dtype="float64"), range(3, 8), base=500.0)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-12)


def test_rotary_embedding_refuses_an_odd_head_size_and_wrong_positions():
    with pytest.raises(ValueError, match="D even"):
        F.rotary_embedding(ta.randn(2, 3, 5), range(3))
    with pytest.raises(ValueError, match="2 positions for x"):
        F.rotary_embedding(ta.randn(2, 3, 4), range(2))


@pytest.mark.parametrize("name", ["rope", "rmsnorm", "swiglu", "relu2", "gqa", "qk_norm", "untied", "all"])
def test_compiled_gives_the_same_loss_gradients_and_tokens(name):
    """ta.compile steps aside where a fused layer does not take a choice: the same loss, gradients
    and greedy tokens as the model uncompiled (float64, so any other arithmetic would show)."""
    model = tiny("float64", **CHOICES[name])
    compiled = ta.compile(model)
    idx = ta.tensor(np.random.default_rng(7).integers(0, 11, (4, 12)))
    results = []
    for run in (model, compiled):
        model.zero_grad()
        _, loss = run(idx, idx)
        loss.backward()
        results.append((loss.item(), [p.grad.numpy().copy() for p in model.parameters()]))
    assert abs(results[0][0] - results[1][0]) < 1e-12
    for a, b in zip(results[0][1], results[1][1]):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    prompt = idx[:2, :3]
    np.testing.assert_array_equal(compiled.generate(prompt, 15, temperature=0).numpy(),
                                  model.generate(prompt, 15, temperature=0).numpy())


def test_print_of_a_compiled_model_says_why_each_layer_steps_aside():
    text = repr(ta.compile(tiny(**CHOICES["all"])))
    assert "GPT(fused: off, rotary positions (no wpe) run op by op" in text
    assert "Block(fused: off, ln_1 is RMSNorm" in text
    assert "fused: off, grouped-query attention (n_kv_head 2 of n_head 4) runs op by op" in text
    text = repr(ta.compile(tiny(mlp="swiglu")))
    assert "one op in training: off, mlp is SwiGLU, not the library's MLP" in text
    assert "fused: off, qk_norm runs op by op" in repr(ta.compile(tiny(qk_norm=True)))


@pytest.mark.parametrize("name", ["rope", "all"])
def test_generation_past_block_size_is_the_same_with_and_without_the_cache(name):
    """Past block_size the window slides: positions start again at 0 for the cropped context, and
    the cache, rebuilt from it, counts from there too."""
    model = tiny(**CHOICES[name])
    prompt = ta.tensor([[1, 2, 3]])
    with_cache = model.generate(prompt, 40, temperature=0)                  # block_size 24
    np.testing.assert_array_equal(with_cache.numpy(), model.generate(prompt, 40, temperature=0, use_cache=False).numpy())
