"""The GPT model: shapes, init, tying, overfitting, the KV cache, sampling."""
import math

import numpy as np
import pytest

import tinyattn as ta
from tinyattn.models import GPT, GPTConfig
from tinyattn.models.gpt import sample_next


def tiny(**kw):
    ta.manual_seed(0)
    cfg = dict(block_size=16, vocab_size=11, n_layer=2, n_head=2, n_embd=16, dropout=0.0)
    cfg.update(kw)
    return GPT(GPTConfig(**cfg))


def test_forward_shapes_and_initial_loss():
    model = tiny()
    idx = ta.tensor(np.random.default_rng(0).integers(0, 11, (3, 9)))
    logits, loss = model(idx, idx)
    assert logits.shape == (3, 9, 11)
    assert abs(loss.item() - math.log(11)) < 0.2          # near uniform at init
    assert model(idx)[1] is None


def test_tied_embedding_is_one_parameter():
    model = tiny()
    assert model.lm_head.weight is model.wte.weight
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names and "wte.weight" in names
    opt = model.configure_optimizer(0.1, 1e-3, (0.9, 0.99))
    decayed = opt.param_groups[0]["params"]
    assert sum(p is model.wte.weight for p in decayed) == 1
    assert all(p.ndim >= 2 for p in decayed)
    assert all(p.ndim < 2 for p in opt.param_groups[1]["params"])
    assert len(opt.parameters()) == len(model.parameters())


def test_init_follows_gpt2():
    model = tiny(n_embd=64, n_layer=4, vocab_size=50, block_size=64)
    assert abs(model.h[0].mlp.c_fc.weight.numpy().std() - 0.02) < 0.002
    assert abs(model.h[0].attn.c_proj.weight.numpy().std() - 0.02 / math.sqrt(8)) < 0.001
    assert np.all(model.h[0].mlp.c_fc.bias.numpy() == 0)


def test_default_init_keeps_each_layers_own():
    """init="default": what a GPT built from PyTorch's modules starts with (Embedding N(0, 1),
    Linear and its bias uniform in +-1/sqrt(fan_in)); the lesson trains from it."""
    model = tiny(n_embd=64, n_layer=4, vocab_size=50, block_size=64, init="default")
    assert abs(model.wte.weight.numpy().std() - 1.0) < 0.05
    assert abs(model.wpe.weight.numpy().std() - 1.0) < 0.05
    fc = model.h[0].mlp.c_fc
    bound = 1 / math.sqrt(64)
    assert np.abs(fc.weight.numpy()).max() <= bound and abs(fc.weight.numpy().std() - bound / math.sqrt(3)) < 0.005
    assert np.abs(fc.bias.numpy()).max() <= bound and np.any(fc.bias.numpy() != 0)
    assert model.lm_head.weight is model.wte.weight
    gpt2 = tiny(n_embd=64, n_layer=4, vocab_size=50, block_size=64)
    assert abs(gpt2.wte.weight.numpy().std() - 0.02) < 0.002


def test_unknown_init_is_an_error():
    with pytest.raises(ValueError, match=r"init must be one of 'gpt2', 'default', got 'xavier'"):
        GPTConfig(init="xavier")


def test_longer_than_block_size_is_an_error():
    model = tiny()
    with pytest.raises(ValueError, match="block_size"):
        model(ta.zeros(1, 17, dtype="int64"))


def test_overfits_one_batch():
    model = tiny()
    opt = model.configure_optimizer(0.0, 3e-3, (0.9, 0.99))
    rng = np.random.default_rng(1)
    x = ta.tensor(rng.integers(0, 11, (4, 16)))
    y = ta.tensor(rng.integers(0, 11, (4, 16)))
    for _ in range(300):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05


def test_causal_future_tokens_do_not_change_the_past():
    model = tiny()
    rng = np.random.default_rng(2)
    a = rng.integers(0, 11, (1, 12))
    b = a.copy()
    b[0, 7:] = (b[0, 7:] + 1) % 11
    la, _ = model(ta.tensor(a))
    lb, _ = model(ta.tensor(b))
    np.testing.assert_array_equal(la.numpy()[0, :7], lb.numpy()[0, :7])
    assert not np.allclose(la.numpy()[0, 7:], lb.numpy()[0, 7:])


def test_kv_cache_matches_the_uncached_path():
    model = tiny().eval()
    rng = np.random.default_rng(3)
    idx = ta.tensor(rng.integers(0, 11, (2, 12)))
    full, _ = model(idx)
    caches = [ta.nn.KVCache() for _ in model.h]
    pieces = [model(idx[:, :5], kv_caches=caches)[0]]              # a prompt of 5
    for t in range(5, 12):                                         # then one token at a time
        pieces.append(model(idx[:, t:t + 1], kv_caches=caches)[0])
    cached = ta.cat(pieces, dim=1)
    np.testing.assert_allclose(cached.numpy(), full.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference_mode"])
def test_kv_cache_matches_the_uncached_path_as_its_buffers_grow(mode):
    """A prompt of 20 (longer than the first buffers, 16), then tokens to 45 (the buffers grow
    inside the forwards); batch 3. With grad on the cache hands back cats, else views."""
    model = tiny(block_size=48).eval()
    idx = ta.tensor(np.random.default_rng(4).integers(0, 11, (3, 45)))
    full, _ = model(idx)
    context = {"grad": ta.enable_grad, "no_grad": ta.no_grad, "inference_mode": ta.inference_mode}[mode]
    caches = [ta.nn.KVCache() for _ in model.h]
    with context():
        pieces = [model(idx[:, :20], kv_caches=caches)[0]]
        for t in range(20, 45):
            pieces.append(model(idx[:, t:t + 1], kv_caches=caches)[0])
    assert all(len(c) == 45 for c in caches) and pieces[-1].requires_grad == (mode == "grad")
    cached = ta.cat(pieces, dim=1)
    np.testing.assert_allclose(cached.numpy(), full.numpy(), rtol=1e-4, atol=1e-5)


def test_greedy_generation_is_identical_with_and_without_cache():
    model = tiny()
    prompt = ta.tensor([[1, 2, 3]])
    with_cache = model.generate(prompt, 30, temperature=0, use_cache=True)     # passes block_size 16
    without = model.generate(prompt, 30, temperature=0, use_cache=False)
    assert with_cache.shape == (1, 33)
    np.testing.assert_array_equal(with_cache.numpy(), without.numpy())


def test_generation_is_deterministic_under_a_seed():
    model = tiny()
    prompt = ta.tensor([[1, 2]])
    ta.manual_seed(5)
    a = model.generate(prompt, 20, temperature=1.0, top_k=5).numpy()
    ta.manual_seed(5)
    b = model.generate(prompt, 20, temperature=1.0, top_k=5).numpy()
    np.testing.assert_array_equal(a, b)
    assert model.training                     # generate restores the mode


def test_top_k_and_top_p_filtering():
    logits = ta.tensor([[0.0, 5.0, 4.9, -3.0, 1.0]])
    ta.manual_seed(0)
    picks = {int(sample_next(logits, 1.0, top_k=2)[0, 0]) for _ in range(200)}
    assert picks == {1, 2}
    picks = {int(sample_next(logits, 1.0, top_p=0.3)[0, 0]) for _ in range(100)}
    assert picks == {1}                       # the best token alone holds over 30%
    assert int(sample_next(logits, 0.0)[0, 0]) == 1


def test_a_training_step_leaves_no_reference_cycles():
    """A Module that hands its input back (Dropout with p=0) once noted itself on that tensor's op:
    a cycle that kept every activation of a step alive until Python's cyclic collector ran, and the
    process grew by about a megabyte a step (baby config). A step now leaves no garbage for it."""
    import gc
    model = GPT(GPTConfig(vocab_size=11, n_layer=2, n_head=2, n_embd=16, block_size=8, dropout=0.0))
    opt = model.configure_optimizer(0.1, 1e-3, (0.9, 0.99))
    idx = ta.tensor(np.random.default_rng(0).integers(0, 11, (3, 8)))

    def step():
        _, loss = model(idx, idx)
        loss.backward()
        opt.step()
        opt.zero_grad()

    step()
    gc.collect()
    gc.disable()
    try:
        step()
        found = gc.collect()
    finally:
        gc.enable()
    assert found == 0, f"{found} objects were left in reference cycles by one step"
