"""Exercise 9 (EXERCISES.md, "Build the core"): LayerNorm's backward by hand, on raw arrays.

    python -m exercises layernorm       # or: pytest tests/test_exercises_layernorm.py -v
"""
import tinyattn as ta


class LayerNorm(ta.Function):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dim. x (..., C), weight and bias (C,)."""

    differentiable_backward = False      # backward works on raw arrays: no second derivatives

    def forward(self, x, weight, bias, eps):
        """Raw arrays in and out (``self.xp``). Keep what backward needs on self (xhat, 1/std)."""
        raise NotImplementedError

    def backward(self, g):
        """Return (dx, dweight, dbias) as Tensors: compute on raw arrays (g.data, self.xp), then wrap
        each with ``ta.tensor(array, dtype=g.dtype, device=g.device)``."""
        raise NotImplementedError


def layer_norm(x, weight, bias, eps=1e-5):
    return LayerNorm.apply(x, weight, bias, eps=eps)
