"""Reference solution: sum_to and a broadcasting multiply (exercise 5 of EXERCISES.md)."""
import tinyattn as ta


def sum_to(g, shape):
    """Sum g down to ``shape``, undoing broadcasting. g (...), shape a tuple that broadcasts to g.shape."""
    lead = g.ndim - len(shape)                                  # dims that broadcasting added in front
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1)
    return g.sum(axes, keepdim=True).reshape(shape) if axes else g.reshape(shape)


class Mul(ta.Function):
    """a * b, broadcasting; each gradient is summed back to its input's shape."""

    def forward(self, a, b):
        return a * b

    def backward(self, g):                                      # g shaped like the output
        a, b = self.parents
        return sum_to(g * b, a.shape), sum_to(g * a, b.shape)
