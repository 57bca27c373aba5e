"""The fast layers (tinyattn/fast/modules.py, models.py): where no graph is recorded a GPT's attention,
MLP and block run on arrays; their results are the teaching forward's, and anywhere else the
teaching forward runs."""
import numpy as np
import pytest

import tinyattn as ta
import tinyattn.nn as nn
from tinyattn.fast import modules as fast_modules
from tinyattn.models import GPT, GPTConfig


@pytest.fixture
def count_array_path(monkeypatch):
    calls = []
    real = fast_modules.linear_on_arrays

    def counting(x2, layer):
        calls.append(layer)
        return real(x2, layer)
    monkeypatch.setattr(fast_modules, "linear_on_arrays", counting)
    import tinyattn.fast.models as fast_models
    monkeypatch.setattr(fast_models, "linear_on_arrays", counting)
    return calls


def gpt(**kw):
    ta.manual_seed(0)
    return GPT(GPTConfig(block_size=48, vocab_size=13, n_layer=2, n_head=2, n_embd=16, init="default", **kw)).eval()


def cached_logits(model, idx, prompt):
    caches = [nn.KVCache() for _ in model.h]
    pieces = [model(idx[:, :prompt], kv_caches=caches)[0]]
    for t in range(prompt, idx.shape[1]):
        pieces.append(model(idx[:, t:t + 1], kv_caches=caches)[0])
    return ta.cat(pieces, dim=1).numpy()


def test_fast_classes_are_the_teaching_classes_subclassed_under_their_names():
    from tinyattn.fast.modules import FAST_MODULES
    assert len(FAST_MODULES) == 3
    for teaching, fast in FAST_MODULES.items():
        assert issubclass(fast, teaching) and fast.__name__ == teaching.__name__
        assert not teaching.__module__.startswith("tinyattn.fast")
    model = gpt()
    assert type(model.h[0]).__module__ == "tinyattn.fast.models"
    assert type(model.h[0].attn).__module__ == "tinyattn.fast.modules"
    ta.set_fast(False)
    try:
        assert type(gpt().h[0]).__module__ == "tinyattn.models.gpt"
    finally:
        ta.set_fast(True)


@pytest.mark.parametrize("batch, prompt", [(1, 4), (3, 20)])      # 20: the cache grows past 16 in the prompt
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_the_array_path_gives_the_teaching_logits(count_array_path, batch, prompt, mode):
    model = gpt()
    idx = ta.tensor(np.random.default_rng(batch).integers(0, 13, (batch, 40)))
    with getattr(ta, mode)():
        fast = [model(idx)[0].numpy(), cached_logits(model, idx, prompt)]
        assert count_array_path                                   # the array path ran
        ta.set_fast(False)
        try:
            count_array_path.clear()
            slow = [model(idx)[0].numpy(), cached_logits(model, idx, prompt)]
        finally:
            ta.set_fast(True)
        assert not count_array_path                               # and here it did not
    for a, b in zip(fast, slow):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fast[1], slow[0], rtol=1e-4, atol=1e-5)   # cached = uncached


def test_generate_writes_the_same_tokens_both_ways():
    model = gpt()
    idx = ta.tensor(np.random.default_rng(5).integers(0, 13, (2, 3)))
    fast = model.generate(idx, 40, temperature=0).numpy()
    ta.set_fast(False)
    try:
        slow = model.generate(idx, 40, temperature=0).numpy()
    finally:
        ta.set_fast(True)
    np.testing.assert_array_equal(fast, slow)


def test_with_a_graph_the_teaching_forward_runs_and_gradients_flow(count_array_path):
    model = gpt()
    idx = ta.tensor(np.random.default_rng(1).integers(0, 13, (2, 10)))
    _, loss = model(idx, idx)
    loss.backward()
    assert not count_array_path
    assert all(p.grad is not None for p in model.parameters())


def test_a_layer_that_is_not_the_librarys_own_is_called(count_array_path):
    """A Linear subclass (a LoRA adapter, say) in place of c_attn: its forward runs."""
    class Shifted(nn.Linear):
        def forward(self, x):
            return super().forward(x) + 1.0
    model = gpt()
    idx = ta.tensor(np.random.default_rng(2).integers(0, 13, (1, 8)))
    with ta.no_grad():
        before = model(idx)[0].numpy()
        old = model.h[0].attn.c_attn
        shifted = Shifted(16, 48)
        shifted.weight, shifted.bias = old.weight, old.bias
        model.h[0].attn.c_attn = shifted
        count_array_path.clear()
        after = model(idx)[0].numpy()
    assert not any(layer is shifted for layer in count_array_path)
    assert not np.allclose(before, after)


def test_under_the_profiler_every_op_is_recorded(count_array_path):
    model = gpt()
    idx = ta.tensor(np.random.default_rng(3).integers(0, 13, (1, 8)))
    with ta.no_grad(), ta.profile() as prof:
        model(idx)
    assert not count_array_path and "Linear" in prof.key_averages()


def test_keep_weights_and_a_learners_cache_take_the_teaching_path(count_array_path):
    from exercise_solutions.kv_cache import KVCache as LearnersCache
    model = gpt()
    idx = ta.tensor(np.random.default_rng(4).integers(0, 13, (2, 12)))
    with ta.no_grad():
        want = model(idx)[0].numpy()
        count_array_path.clear()
        caches = [LearnersCache() for _ in model.h]
        pieces = [model(idx[:, :5], kv_caches=caches)[0]]
        pieces += [model(idx[:, t:t + 1], kv_caches=caches)[0] for t in range(5, 12)]
        assert not any(layer is model.h[0].attn.c_attn for layer in count_array_path)
        np.testing.assert_allclose(ta.cat(pieces, dim=1).numpy(), want, rtol=1e-4, atol=1e-5)
        model.h[0].attn.keep_weights = True
        model(idx)
    assert model.h[0].attn.last_weights.shape == (2, 2, 12, 12)


def test_a_wrong_input_gets_the_teaching_error():
    with ta.no_grad(), pytest.raises(ValueError, match=r"MultiHeadAttention expects \(B, T, C\) with C = 8, got \(5, 8\)"):
        nn.MultiHeadAttention(8, 2)(ta.randn(5, 8), is_causal=True)
