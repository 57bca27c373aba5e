"""Reference solution: the SwiGLU feed-forward block (exercise 4 of EXERCISES.md)."""
import tinyattn.nn as nn


def silu(x):
    """x * sigmoid(x), also called swish."""
    return x * x.sigmoid()


class SwiGLU(nn.Module):
    """w2(silu(w1(x)) * v(x)): a gated MLP, (B, T, C) -> (B, T, C) through (B, T, hidden)."""

    def __init__(self, n_embd, hidden=None, bias=False):
        super().__init__()
        hidden = hidden or 8 * n_embd // 3          # the parameter count of a 4x GELU MLP
        self.w1 = nn.Linear(n_embd, hidden, bias=bias)
        self.v = nn.Linear(n_embd, hidden, bias=bias)
        self.w2 = nn.Linear(hidden, n_embd, bias=bias)

    def forward(self, x):
        return self.w2(silu(self.w1(x)) * self.v(x))
