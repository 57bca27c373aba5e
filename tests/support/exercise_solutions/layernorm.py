"""Reference solution: a fused LayerNorm with a hand-written backward (exercise 9 of EXERCISES.md)."""
import tinyattn as ta


class LayerNorm(ta.Function):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dim; backward on raw arrays."""

    differentiable_backward = False

    def forward(self, x, weight, bias, eps):                    # x (..., C), weight and bias (C,)
        xp = self.xp
        mu = xp.mean(x, axis=-1, keepdims=True)                 # (..., 1)
        xc = x - mu
        var = xp.mean(xc * xc, axis=-1, keepdims=True)          # (..., 1)
        rstd = 1.0 / xp.sqrt(var + eps)                         # (..., 1)
        xhat = xc * rstd                                        # (..., C)
        self.save(xhat, rstd)
        return xhat * weight + bias

    def backward(self, g):
        xp, (xhat, rstd) = self.xp, self.saved
        weight = self.parents[1].data
        gd = g.data                                             # (..., C)
        lead = tuple(range(gd.ndim - 1))
        gx = gd * weight                                        # d loss / d xhat
        dx = rstd * (gx - xp.mean(gx, axis=-1, keepdims=True) - xhat * xp.mean(gx * xhat, axis=-1, keepdims=True))
        dw = xp.sum(gd * xhat, axis=lead)                       # (C,)
        db = xp.sum(gd, axis=lead)                              # (C,)
        return tuple(self.constant(a) for a in (dx, dw, db))


def layer_norm(x, weight, bias, eps=1e-5):
    return LayerNorm.apply(x, weight, bias, eps=eps)
