"""Reference solution: batched matmul and its backward (exercise 6 of EXERCISES.md)."""
import tinyattn as ta


class MatMul(ta.Function):
    """(..., n, k) @ (..., k, m) -> (..., n, m); the batch dims (...) broadcast."""

    def forward(self, a, b):
        return self.xp.matmul(a, b)

    def backward(self, g):                                      # g (..., n, m)
        a, b = self.parents
        grad_a = g @ b.mT                                       # (..., n, m) @ (..., m, k) -> (..., n, k)
        grad_b = a.mT @ g                                       # (..., k, n) @ (..., n, m) -> (..., k, m)
        return ta.sum_to(grad_a, a.shape), ta.sum_to(grad_b, b.shape)
