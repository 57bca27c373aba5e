"""Exercise 7 (EXERCISES.md, "Build the core"): exp, log and tanh, differentiable twice.

    python -m exercises elementwise

In each backward, use Tensor ops on ``g``, ``self.parents[0]`` (the input x)
and ``self.output`` (the result y): then the engine can differentiate the
backward itself, and ta.gradgradcheck passes.
"""
import tinyattn as ta


class Exp(ta.Function):
    def forward(self, x):
        """y = exp(x) on raw arrays (``self.xp``)."""
        raise NotImplementedError

    def backward(self, g):
        """g * dy/dx, as a Tensor."""
        raise NotImplementedError


class Log(ta.Function):
    def forward(self, x):
        """y = log(x), x > 0."""
        raise NotImplementedError

    def backward(self, g):
        raise NotImplementedError


class Tanh(ta.Function):
    def forward(self, x):
        """y = tanh(x)."""
        raise NotImplementedError

    def backward(self, g):
        """Hint: the derivative is easiest to write with y, not x."""
        raise NotImplementedError
