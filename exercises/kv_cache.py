"""Exercise 16 (EXERCISES.md, "Build the core"): a KV cache for generation.

    python -m exercises kv_cache

nn.MultiHeadAttention, given a cache, calls ``k, v = cache.append(k, v)``
and attends with ``attn_mask=cache.causal_mask(T_new, k.shape[2], x)``
(for one new token, a row that sees every key). GPT.generate makes
one cache per block and reads ``len(cache)`` to place the new positions.
"""
import tinyattn as ta


class KVCache:
    """Keys and values of the tokens seen so far, for one attention layer."""

    def __init__(self):
        raise NotImplementedError

    def __len__(self):
        """How many positions are cached."""
        raise NotImplementedError

    def append(self, k, v):
        """Add the new tokens' keys and values, (B, H, T_new, D) each, and return all of them:
        (B, H, T_past + T_new, D) each. Store them detached (``.detach()``)."""
        raise NotImplementedError

    @staticmethod
    def causal_mask(t_new, t_total, like):
        """A (t_new, t_total) boolean Tensor on ``like.device``: True where new query i may see key j.

        The new queries are the last t_new of t_total positions.
        """
        raise NotImplementedError
