"""Exercise 9 (EXERCISES.md, "Build the core"): LayerNorm's backward by hand, on raw arrays.

    python -m exercises layernorm
"""
import tinyattn as ta


class LayerNorm(ta.Function):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dim. x (..., C), weight and bias (C,)."""

    differentiable_backward = False      # backward works on raw arrays: no second derivatives

    def forward(self, x, weight, bias, eps):
        """Raw arrays in and out (``self.xp``). Keep the arrays backward needs with
        ``self.save(xhat, rstd)``: they come back as ``self.saved`` (freed after backward)."""
        raise NotImplementedError

    def backward(self, g):
        """Return (dx, dweight, dbias) as Tensors: compute on raw arrays (g.data, self.xp,
        self.saved), then wrap each with ``self.constant(array)``."""
        raise NotImplementedError


def layer_norm(x, weight, bias, eps=1e-5):
    return LayerNorm.apply(x, weight, bias, eps=eps)
