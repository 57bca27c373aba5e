"""nn.KVCache: keys and values kept in buffers that double when full, and attention over them."""
import numpy as np
import pytest

import tinyattn as ta
import tinyattn.nn as nn
import tinyattn.nn.functional as F


def random_kv(rng, B, H, T, D, dtype="float32", requires_grad=False):
    return [ta.tensor(rng.standard_normal((B, H, T, D)), dtype=dtype, requires_grad=requires_grad)
            for _ in range(2)]


def test_buffers_double_when_full_and_keep_what_was_appended():
    rng = np.random.default_rng(0)
    cache = nn.KVCache()
    assert cache.k is None and cache.v is None and len(cache) == 0
    ks, vs, capacities = [], [], []
    for t in range(1, 41):                                       # one token at a time, past 16 and 32
        k, v = random_kv(rng, 2, 3, 1, 4)
        ks.append(k.numpy())
        vs.append(v.numpy())
        got_k, got_v = cache.append(k, v)
        assert len(cache) == cache.length == t
        np.testing.assert_array_equal(got_k.numpy(), np.concatenate(ks, axis=2))
        np.testing.assert_array_equal(got_v.numpy(), np.concatenate(vs, axis=2))
        assert np.shares_memory(got_k.data, cache.k_buffer)     # views of the buffers, no copy
        assert np.shares_memory(got_v.data, cache.v_buffer)
        capacities.append(cache.k_buffer.shape[2])
    assert capacities[0] == 16 and capacities[16] == 32 and capacities[32] == 64   # doubled at 17 and 33
    assert cache.k_buffer.shape == cache.v_buffer.shape == (2, 3, 64, 4)
    np.testing.assert_array_equal(cache.k.numpy(), np.concatenate(ks, axis=2))    # the properties too
    np.testing.assert_array_equal(cache.v.numpy(), np.concatenate(vs, axis=2))


def test_a_chunk_longer_than_double_grows_the_buffers_to_fit_it():
    rng = np.random.default_rng(1)
    cache = nn.KVCache()
    first, second = random_kv(rng, 1, 2, 5, 3), random_kv(rng, 1, 2, 40, 3)
    cache.append(*first)
    k, v = cache.append(*second)
    assert k.shape == v.shape == (1, 2, 45, 3) and cache.k_buffer.shape[2] >= 45
    np.testing.assert_array_equal(k.numpy(), np.concatenate([first[0].numpy(), second[0].numpy()], axis=2))
    np.testing.assert_array_equal(v.numpy(), np.concatenate([first[1].numpy(), second[1].numpy()], axis=2))


def test_keys_and_values_of_different_shapes_are_an_error_naming_both():
    cache = nn.KVCache()
    with pytest.raises(ValueError, match=r"\(2, 3, 1, 4\).*\(2, 3, 2, 4\)"):
        cache.append(ta.zeros(2, 3, 1, 4), ta.zeros(2, 3, 2, 4))
    assert len(cache) == 0 and cache.k is None


def test_keys_that_do_not_fit_the_cache_are_an_error_naming_both_shapes():
    """The buffers must grow for these keys (20 cached, capacity 20): the check runs there."""
    rng = np.random.default_rng(2)
    cache = nn.KVCache()
    cache.append(*random_kv(rng, 2, 3, 20, 4))
    before = cache.k.numpy().copy()
    with pytest.raises(ValueError, match=r"\(2, 5, 1, 4\).*\(2, 3, 20, 4\)"):
        cache.append(*random_kv(rng, 2, 5, 1, 4))
    with pytest.raises(ValueError, match=r"float64.*float32"):
        cache.append(*random_kv(rng, 2, 3, 1, 4, dtype="float64"))
    assert len(cache) == 20                                        # nothing lost
    np.testing.assert_array_equal(cache.k.numpy(), before)


@pytest.mark.parametrize("shape, dtype", [((1, 3, 1, 4), "float32"), ((2, 3, 1, 4), "float64"),
                                          ((2, 5, 1, 4), "float32")])
def test_keys_that_do_not_fit_are_an_error_while_the_buffers_have_room(shape, dtype):
    rng = np.random.default_rng(3)
    cache = nn.KVCache()
    cache.append(*random_kv(rng, 2, 3, 1, 4))                      # capacity 16: room for more
    with pytest.raises(ValueError, match=r"KVCache\.append") as error:
        cache.append(*random_kv(rng, *shape, dtype=dtype))
    assert str(shape) in str(error.value) and "(2, 3, 1, 4)" in str(error.value)   # the new keys and the cache's
    assert len(cache) == 1


def test_crop_keeps_the_last_positions_and_appending_goes_on_after_them():
    rng = np.random.default_rng(4)
    cache = nn.KVCache()
    k, v = random_kv(rng, 2, 2, 10, 3)
    cache.append(k, v)
    cache.crop(4)
    assert len(cache) == 4
    np.testing.assert_array_equal(cache.k.numpy(), k.numpy()[:, :, 6:])
    np.testing.assert_array_equal(cache.v.numpy(), v.numpy()[:, :, 6:])
    cache.crop(8)                                                  # longer than the cache: nothing changes
    assert len(cache) == 4
    k2, v2 = random_kv(rng, 2, 2, 1, 3)
    got_k, got_v = cache.append(k2, v2)
    np.testing.assert_array_equal(got_k.numpy(), np.concatenate([k.numpy()[:, :, 6:], k2.numpy()], axis=2))
    np.testing.assert_array_equal(got_v.numpy(), np.concatenate([v.numpy()[:, :, 6:], v2.numpy()], axis=2))


def _attend_over_cache(q, k_new, v_new, k_past, v_past):
    """Attention of q over the past keys (a cache) and the new ones appended to it."""
    cache = nn.KVCache()
    cache.append(k_past, v_past)
    k, v = cache.append(k_new, v_new)
    mask = cache.causal_mask(q.shape[2], k.shape[2], q)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("needs_grad", ["both", "keys", "values"])
def test_new_keys_and_values_that_need_a_gradient_get_it_through_the_cache(needs_grad):
    rng = np.random.default_rng(5)
    k_past, v_past = random_kv(rng, 2, 2, 17, 3, dtype="float64")   # 17 + 2: the buffers grow at the append
    wants = {"q": True, "k": needs_grad in ("both", "keys"), "v": needs_grad in ("both", "values")}
    q, k_new, v_new = [ta.tensor(rng.standard_normal((2, 2, 2, 3)), dtype="float64", requires_grad=wants[name])
                       for name in "qkv"]
    out = _attend_over_cache(q, k_new, v_new, k_past, v_past)
    g = rng.standard_normal(out.shape)
    out.backward(ta.tensor(g, dtype="float64"))
    # the same attention without a cache: the past and the new keys joined by hand
    q2, k2, v2 = [ta.tensor(t.numpy(), dtype="float64", requires_grad=t.requires_grad) for t in (q, k_new, v_new)]
    ref = F.scaled_dot_product_attention(q2, ta.cat([k_past, k2], dim=2), ta.cat([v_past, v2], dim=2),
                                         attn_mask=nn.KVCache.causal_mask(2, 19, q2))
    ref.backward(ta.tensor(g, dtype="float64"))
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-12, atol=1e-12)
    for got, want in ((q, q2), (k_new, k2), (v_new, v2)):
        if got.requires_grad:
            assert got.grad is not None
            np.testing.assert_allclose(got.grad.numpy(), want.grad.numpy(), rtol=1e-12, atol=1e-12)
    ta.gradcheck(lambda a, b, c: _attend_over_cache(a, b, c, k_past, v_past), (q, k_new, v_new), mode="full")


@pytest.mark.parametrize("seed, B, T, prompt", [(0, 2, 20, 3),      # the cache grows past 16 during the tokens
                                             (1, 3, 40, 18)])    # 18 > 16 in one forward, then tokens
def test_mha_with_a_cache_one_token_at_a_time_matches_the_full_causal_pass(seed, B, T, prompt):
    ta.manual_seed(seed)
    mha = nn.MultiHeadAttention(8, 2)
    x = ta.tensor(np.random.default_rng(seed + 6).standard_normal((B, T, 8)), dtype="float32")
    with ta.no_grad():
        full = mha(x, is_causal=True)
        cache = nn.KVCache()
        pieces = [mha(x[:, :prompt], kv_cache=cache)]
        for t in range(prompt, T):
            pieces.append(mha(x[:, t:t + 1], kv_cache=cache))
    assert len(cache) == T
    np.testing.assert_allclose(ta.cat(pieces, dim=1).numpy(), full.numpy(), rtol=1e-5, atol=1e-6)
