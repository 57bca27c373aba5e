"""Exercise 11 (EXERCISES.md, "Build the core"): the embedding lookup and its backward.

    python -m exercises embedding
"""
import tinyattn as ta


class Embedding(ta.Function):
    """Rows of a (V, C) table for integer ids of any shape: weight[idx]."""

    def forward(self, weight, idx):
        """weight (V, C) float, idx (...) int raw arrays -> (..., C).

        Hint: ``self.xp.take(weight, ids, axis=0)`` takes 1-d ids (the array API's rule, which
        GPU libraries follow): reshape idx to 1-d with ``self.xp.reshape``, take, reshape back."""
        raise NotImplementedError

    def backward(self, g):
        """g (..., C) Tensor -> (dweight shaped (V, C), None). The same id may appear many times."""
        raise NotImplementedError


def embedding(idx, weight):
    return Embedding.apply(weight, idx)
