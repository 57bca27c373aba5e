"""Exercise 6 (EXERCISES.md, "Build the core"): the backward of a batched matmul.

    python -m exercises matmul
"""
import tinyattn as ta


class MatMul(ta.Function):
    """(..., n, k) @ (..., k, m) -> (..., n, m), the batch dims (...) broadcasting: ``MatMul.apply(a, b)``."""

    def forward(self, a, b):
        """Raw arrays in and out: use ``self.xp.matmul`` (never numpy by name)."""
        raise NotImplementedError

    def backward(self, g):
        """g (..., n, m) Tensor -> (grad_a shaped like a, grad_b shaped like b), with Tensor ops.

        Hints: ``t.mT`` swaps the last two dims; batch dims that were broadcast
        in forward are summed away with ``ta.sum_to(grad, shape)`` (exercise 5).
        """
        raise NotImplementedError
