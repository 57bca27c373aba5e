"""Exercise 5 (EXERCISES.md, "Build the core"): undo broadcasting in a binary op's backward.

    python -m exercises sum_to
"""
import tinyattn as ta


def sum_to(g, shape):
    """Sum the Tensor ``g`` down to ``shape``, undoing broadcasting; returns a Tensor of that shape.

    ``shape`` broadcasts to ``g.shape``: it may have fewer dims (the missing
    ones are in front) and dims of size 1 where g has more. Example:
    g (2, 3, 4) to shape (3, 1): sum dim 0 (added in front) and dim 2 (1 in
    shape), keeping dims, then reshape to (3, 1).
    Use Tensor ops (``g.sum(axes, keepdim=True)``, ``.reshape``) so the result
    can be differentiated again.
    """
    raise NotImplementedError


class Mul(ta.Function):
    """a * b with broadcasting: ``Mul.apply(a, b)``."""

    def forward(self, a, b):
        """a, b: raw arrays (numpy, or the device's arrays); return a * b."""
        raise NotImplementedError

    def backward(self, g):
        """g: the Tensor gradient of the output (shaped like a * b).

        Return (grad_a, grad_b), each shaped like its input: ``self.parents``
        holds the input Tensors a and b. Hint: d(a*b)/da = b, then sum_to.
        """
        raise NotImplementedError
