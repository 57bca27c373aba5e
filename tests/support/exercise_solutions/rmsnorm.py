"""Reference solution: RMSNorm (exercise 1 of EXERCISES.md)."""
import tinyattn as ta
import tinyattn.nn as nn


def rms_norm(x, weight=None, eps=1e-6):
    """x / sqrt(mean(x^2) + eps) * weight, over the last dim. x (..., C), weight (C,) or None."""
    ms = (x * x).mean(-1, keepdim=True)                 # (..., 1) mean square
    y = x / (ms + eps).sqrt()                           # (..., C) unit root-mean-square
    return y if weight is None else y * weight


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(ta.ones(dim))

    def forward(self, x):                               # (..., C) -> (..., C)
        return rms_norm(x, self.weight, self.eps)
