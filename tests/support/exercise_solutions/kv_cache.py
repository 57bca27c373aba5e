"""Reference solution: a KV cache for generation (exercise 16 of EXERCISES.md)."""
import tinyattn as ta


class KVCache:
    """Keys and values of the tokens seen so far, for one attention layer."""

    def __init__(self):
        self.k = self.v = None                                  # (B, H, T_past, D) each

    def __len__(self):
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k, v):                                     # the new tokens' (B, H, T_new, D) each
        if self.k is not None:
            k = ta.cat([self.k, k], dim=2)                      # time is dim 2
            v = ta.cat([self.v, v], dim=2)
        self.k, self.v = k.detach(), v.detach()
        return k, v                                             # (B, H, T_past + T_new, D)

    @staticmethod
    def causal_mask(t_new, t_total, like):
        """(t_new, t_total) booleans: new query i sits at position t_total - t_new + i and sees keys j <= it."""
        rows = ta.arange(t_total - t_new, t_total, device=like.device).reshape(t_new, 1)
        cols = ta.arange(t_total, device=like.device).reshape(1, t_total)
        return cols <= rows
