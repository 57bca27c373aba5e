"""The checks of exercise 16 of EXERCISES.md: KV cache."""
import numpy as np

import tinyattn as ta
import tinyattn.nn as nn

from .common import ExerciseFailure, attempt, compare, need, on_strict, rand, rng_


def tiny_gpt(device="cpu"):
    from tinyattn.models import GPT, GPTConfig
    ta.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=11, n_layer=2, n_head=2, n_embd=16)).to(device)
    return model.eval()


def kv_cache_append(mod):
    KVCache, rng = need(mod, "KVCache"), rng_()
    cache = KVCache()
    if len(cache) != 0:
        raise ExerciseFailure(f"len(KVCache()) is {len(cache)}, expected 0")
    k1, v1 = rand(rng, 1, 2, 3, 4), rand(rng, 1, 2, 3, 4)
    k2, v2 = rand(rng, 1, 2, 1, 4), rand(rng, 1, 2, 1, 4)
    attempt("cache.append(k (1, 2, 3, 4), v)", lambda: cache.append(k1, v1))
    k, v = attempt("a second cache.append(k (1, 2, 1, 4), v)", lambda: cache.append(k2, v2),
                   hint="Concatenate the cached and the new keys along the time dim, dim 2 of (B, H, T, D).")
    if k.shape == (1, 2, 1, 4):
        raise ExerciseFailure("after appending 3 positions then 1, append returned only the new one: return the "
                              "cached keys and values followed by the new ones, (B, H, T_past + T_new, D)")
    if k.shape == (1, 4, 3, 4) or k.shape == (2, 2, 3, 4) or k.shape == (1, 2, 3, 8):
        raise ExerciseFailure(f"after appending 3 positions then 1, append returned keys of shape {k.shape}: "
                              "concatenate along the time dim, dim 2 of (B, H, T, D)")
    compare(k, np.concatenate([k1.numpy(), k2.numpy()], 2), "the keys after two appends (3 positions, then 1)")
    compare(v, np.concatenate([v1.numpy(), v2.numpy()], 2), "the values after two appends (3 positions, then 1)")
    if len(cache) != 4:
        raise ExerciseFailure(f"len(cache) after appending 3 positions then 1 is {len(cache)}, expected 4")


def kv_cache_mask(mod):
    KVCache = need(mod, "KVCache")
    like = ta.zeros(1)
    for t_new, t_total in [(2, 5), (3, 3), (1, 4)]:
        what = f"causal_mask({t_new}, {t_total}, like)"
        mask = attempt(what, lambda: KVCache.causal_mask(t_new, t_total, like))
        expected = np.arange(t_total)[None, :] <= np.arange(t_total - t_new, t_total)[:, None]
        got = mask.numpy() if isinstance(mask, ta.Tensor) else None
        if got is None or got.shape != expected.shape:
            raise ExerciseFailure(f"{what} should be a ({t_new}, {t_total}) boolean Tensor, got "
                                  f"{getattr(got, 'shape', type(mask).__name__)}")
        if got.dtype != bool:
            raise ExerciseFailure(f"{what} is {got.dtype}, not boolean: attention adds a float mask to the scores "
                                  "(0 and 1 would change them, not hide keys); return the comparison itself, "
                                  "True where a query may see the key")
        if np.array_equal(got, np.tril(np.ones((t_new, t_total), bool))) and t_new != t_total:
            raise ExerciseFailure(f"{what} lines the new queries up at the top left (query i sees keys <= i); they "
                                  f"are the last {t_new} of {t_total} positions: query i sits at position "
                                  f"t_total - t_new + i and sees the keys up to there")
        if not np.array_equal(got, expected):
            raise ExerciseFailure(f"{what} is wrong: new query i sits at position t_total - t_new + i and may see "
                                  "every key j up to and including that position")


def _cached_logits(model, KVCache, idx, prefill):
    """Logits of each position after the prefill, from a cached run: [(B, V), ...]."""
    caches = [KVCache() for _ in model.h]
    logits, _ = model(idx[:, :prefill], kv_caches=caches)
    out = [logits[:, -1]]
    for t in range(prefill, idx.shape[1]):
        logits, _ = model(idx[:, t:t + 1], kv_caches=caches)
        out.append(logits[:, -1])
    return out


def kv_cache_token_for_token(mod, device="cpu"):
    """Prefill 4 tokens, then one at a time: every step's logits equal the uncached forward's."""
    KVCache = need(mod, "KVCache")
    model = tiny_gpt(device)
    idx = ta.tensor(rng_(6).integers(0, 11, (2, 10)), device=device)
    with ta.no_grad():
        got = attempt("a GPT run with your KVCache (prefill 4 tokens, then 6 one at a time)",
                      lambda: _cached_logits(model, KVCache, idx, 4))
        for step, logits in enumerate(got):
            t = 4 + step
            full, _ = model(idx[:, :t])
            where = "after the 4-token prefill" if step == 0 else f"at token {t} (the {step}th cached step)"
            hint = ("The prefill goes through causal_mask." if step == 0 else
                    "The prefill matched, so the cache loses or misplaces positions when one token is added.")
            compare(logits, full[:, -1].numpy(), f"the cached logits {where} (against the uncached forward)",
                    tol=1e-5, hint=hint)
    return got


def kv_cache_generate(mod):
    """GPT.generate with your KVCache (greedy) writes the same tokens as without a cache."""
    KVCache = need(mod, "KVCache")
    model = tiny_gpt()
    idx = ta.tensor(rng_(7).integers(0, 11, (2, 3)))
    expected = model.generate(idx, 8, temperature=0, use_cache=False).numpy()
    saved = nn.KVCache
    nn.KVCache = KVCache                                    # what GPT.generate builds its caches from
    try:
        got = attempt("GPT.generate with your KVCache", lambda: model.generate(idx, 8, temperature=0)).numpy()
    finally:
        nn.KVCache = saved
    if not np.array_equal(got, expected):
        first = int(np.argwhere((got != expected).any(0))[0, 0])
        raise ExerciseFailure(f"GPT.generate(greedy) with your KVCache writes a different token at position "
                              f"{first} than without a cache")


def kv_cache_on_strict(mod):
    need(mod, "KVCache")
    on_strict("a GPT run with your KVCache", lambda d: kv_cache_token_for_token(mod, d), tol=1e-5)


CHECKS = [kv_cache_append, kv_cache_mask, kv_cache_token_for_token, kv_cache_generate, kv_cache_on_strict]
