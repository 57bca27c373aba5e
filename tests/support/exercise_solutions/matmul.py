"""Reference solution: batched matmul and its backward (exercise 6 of EXERCISES.md)."""
import tinyattn as ta


class MatMul(ta.Function):
    """(..., n, k) @ (..., k, m) -> (..., n, m); the batch dims (...) broadcast.

    A Linear layer's (B, T, k) @ (k, m) runs as one (B*T, k) @ (k, m) product,
    forward and backward: one big matmul is faster than B small ones (and
    gives the library's numbers to the last bit).
    """

    def forward(self, a, b):
        if a.ndim > 2 and b.ndim == 2:
            flat = self.xp.matmul(self.xp.reshape(a, (-1, a.shape[-1])), b)       # (B*T, m)
            return self.xp.reshape(flat, a.shape[:-1] + b.shape[-1:])
        return self.xp.matmul(a, b)

    def backward(self, g):                                      # g (..., n, m)
        a, b = self.parents
        grad_a = g @ b.mT                                       # (..., n, m) @ (..., m, k) -> (..., n, k)
        if a.ndim > 2 and b.ndim == 2:                          # (k, B*T) @ (B*T, m): the sum over B and T
            grad_b = a.reshape(-1, a.shape[-1]).mT @ g.reshape(-1, g.shape[-1])
        else:
            grad_b = a.mT @ g                                   # (..., k, n) @ (..., n, m) -> (..., k, m)
        return ta.sum_to(grad_a, a.shape), ta.sum_to(grad_b, b.shape)
