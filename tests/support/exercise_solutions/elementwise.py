"""Reference solution: exp, log and tanh, twice differentiable (exercise 7 of EXERCISES.md)."""
import tinyattn as ta


class Exp(ta.Function):
    def forward(self, x):
        return self.xp.exp(x)

    def backward(self, g):
        return g * self.output                                  # d exp(x) = exp(x) = y


class Log(ta.Function):
    def forward(self, x):
        return self.xp.log(x)

    def backward(self, g):
        return g / self.parents[0]                              # d log(x) = 1 / x


class Tanh(ta.Function):
    def forward(self, x):
        return self.xp.tanh(x)

    def backward(self, g):
        y = self.output
        return g * (1.0 - y * y)                                # d tanh(x) = 1 - tanh(x)^2
