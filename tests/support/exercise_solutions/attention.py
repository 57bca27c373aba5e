"""Reference solution: scaled dot-product attention with a hand-written backward (exercise 13 of EXERCISES.md)."""
import math

import tinyattn as ta


class Attention(ta.Function):
    """softmax(q k^T * scale [causal]) v. q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv)."""

    differentiable_backward = False

    def forward(self, q, k, v, scale, is_causal):
        xp = self.xp
        self.scale = scale
        q_scaled = q * scale                                                # scaling q is cheaper than S
        s = xp.matmul(q_scaled, xp.matrix_transpose(k))                # (B, H, Tq, Tk) scores
        if is_causal:                                                       # query i sees keys j <= i
            rows = self.backend.arange(q.shape[-2])[:, None]
            cols = self.backend.arange(k.shape[-2])[None, :]
            s = xp.where(cols <= rows, s, -math.inf)
        e = xp.exp(s - xp.max(s, axis=-1, keepdims=True))
        p = e / xp.sum(e, axis=-1, keepdims=True)                           # (B, H, Tq, Tk) weights
        self.save(q_scaled, p)
        return xp.matmul(p, v)                                         # (B, H, Tq, Dv)

    def backward(self, g):                                                  # g = dO (B, H, Tq, Dv)
        xp, (q_scaled, p) = self.xp, self.saved
        k, v = self.parents[1].data, self.parents[2].data
        do = g.data
        dv = xp.matmul(xp.matrix_transpose(p), do)                          # P^T dO      (B, H, Tk, Dv)
        dp = xp.matmul(do, xp.matrix_transpose(v))                          # dO V^T      (B, H, Tq, Tk)
        ds = p * (dp - xp.sum(dp * p, axis=-1, keepdims=True))              # softmax backward, per row
        dq = xp.matmul(ds, k) * self.scale                                  # (B, H, Tq, D)
        # dK = dS^T Q * scale, taken as (Q * scale)^T dS, transposed: the product the library's
        # autodiff takes, so a run on this solution matches the library's to the last bit
        dk = xp.matrix_transpose(xp.matmul(xp.matrix_transpose(q_scaled), ds))   # (B, H, Tk, D)
        return tuple(self.constant(a) for a in (dq, dk, dv))


def scaled_dot_product_attention(q, k, v, is_causal=False, scale=None):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return Attention.apply(q, k, v, scale=scale, is_causal=is_causal)
