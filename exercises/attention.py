"""Exercise 13 (EXERCISES.md, "Build the core"): scaled dot-product attention's backward by hand.

    python -m exercises attention
"""
import math

import tinyattn as ta


class Attention(ta.Function):
    """softmax(q k^T * scale [causal]) v. q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv)."""

    differentiable_backward = False      # backward works on raw arrays

    def forward(self, q, k, v, scale, is_causal):
        """Raw arrays in, (B, H, Tq, Dv) out. Causal: query i sees keys j <= i only.

        ``self.xp.matrix_transpose(k)`` swaps the last two dims; ``self.backend.arange(n)``
        makes positions on the right device. Keep the weights P for backward: ``self.save(...)``.
        """
        raise NotImplementedError

    def backward(self, g):
        """g = dO (B, H, Tq, Dv) Tensor -> (dq, dk, dv) Tensors, from raw arrays
        (``self.saved`` gives back what forward saved; wrap each result with ``self.constant(array)``)."""
        raise NotImplementedError


def scaled_dot_product_attention(q, k, v, is_causal=False, scale=None):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return Attention.apply(q, k, v, scale=scale, is_causal=is_causal)
