"""Reference solution: embedding lookup and its scatter-add backward (exercise 11 of EXERCISES.md)."""
import tinyattn as ta


class Embedding(ta.Function):
    """weight[idx]: rows of a (V, C) table for integer ids of any shape."""

    def forward(self, weight, idx):                             # weight (V, C), idx (...)
        flat = self.xp.reshape(idx, (-1,))                      # (N,)
        self.save(flat)
        rows = self.xp.take(weight, flat, axis=0)               # (N, C)
        return self.xp.reshape(rows, tuple(idx.shape) + tuple(weight.shape[1:]))

    def backward(self, g):                                      # g (..., C)
        xp, weight, (flat,) = self.xp, self.parents[0], self.saved
        V, C = weight.shape
        onehot = xp.astype(self.backend.arange(V)[:, None] == flat[None, :], g.data.dtype)   # (V, N)
        return self.constant(onehot) @ g.reshape(-1, C), None    # repeated ids add up


def embedding(idx, weight):
    return Embedding.apply(weight, idx)
