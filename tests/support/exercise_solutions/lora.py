"""Reference solution: low-rank adapters, LoRA (exercise 17 of EXERCISES.md)."""
import math

import tinyattn as ta
import tinyattn.nn as nn


class LoRALinear(nn.Module):
    """base(x) + (alpha / r) * x A^T B^T: a frozen Linear plus a trainable update of rank r.

    base.weight W (out, in) is left as it is; A (r, in) starts random and B (out, r) at zero,
    so the layer starts as exactly the base layer. Only A and B train: r * (in + out) numbers
    where W has in * out.
    """

    def __init__(self, base, r, alpha=None):
        super().__init__()
        self.base = base
        for p in base.parameters():
            p.requires_grad = False                       # frozen: no gradient, no optimizer step
        self.r = r
        self.scale = (r if alpha is None else alpha) / r
        self.A = nn.Parameter(ta.randn(r, base.in_features) * (1.0 / math.sqrt(base.in_features)))
        self.B = nn.Parameter(ta.zeros(base.out_features, r))

    def forward(self, x):                                 # (..., in) -> (..., out)
        update = (x @ self.A.T) @ self.B.T                # through (..., r): never an (out, in) matrix
        return self.base(x) + update * self.scale

    @ta.no_grad()
    def merge(self):
        """One plain Linear that computes the same function: weight W + (alpha / r) B A."""
        has_bias = self.base.bias is not None
        merged = nn.Linear(self.base.in_features, self.base.out_features, bias=has_bias)
        merged.weight = nn.Parameter(self.base.weight + (self.B @ self.A) * self.scale)
        if has_bias:
            merged.bias = nn.Parameter(self.base.bias * 1.0)
        return merged
