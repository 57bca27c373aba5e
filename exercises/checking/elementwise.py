"""The checks of exercise 7 of EXERCISES.md: exp, log, tanh."""
import numpy as np

import tinyattn as ta

from .common import (compare, gradcheck, gradgradcheck, grads_on, keeps_float32, need, on_strict, rand, rng_,
                     writes_no_input)


def positive(rng, *shape, grad=True):
    return ta.tensor(np.abs(rng.standard_normal(shape)) + 0.5, dtype="float64", requires_grad=grad)


ELEMENTWISE = {   # name: (numpy forward, make an input, typical wrong gradients)
    "Exp": (np.exp, rand, [("your Exp backward multiplies g by x; the derivative of exp(x) is exp(x) itself: "
                            "g * self.output", lambda u, x: [u * x])]),
    "Log": (np.log, positive, [("your Log backward multiplies g by x; the derivative of log(x) is 1 / x: g / x",
                                lambda u, x: [u * x]),
                               ("your Log backward divides g by log(x) (self.output); the derivative of log(x) "
                                "is 1 / x: divide by the input, self.parents[0]", lambda u, x: [u / np.log(x)])]),
    "Tanh": (np.tanh, rand, [("your Tanh backward uses 1 - x^2; the derivative of tanh(x) is 1 - tanh(x)^2 = "
                              "1 - y^2, with y = self.output", lambda u, x: [u * (1 - x * x)]),
                             ("your Tanh backward uses 1 - y; the derivative of tanh(x) is 1 - y^2",
                              lambda u, x: [u * (1 - np.tanh(x))])]),
}


def elementwise_forward(mod):
    rng = rng_()
    for name, (formula, make, _) in ELEMENTWISE.items():
        op = need(mod, name)
        x = make(rng, 3, 5, grad=False)
        compare(writes_no_input(f"{name}.apply(x)", op.apply, [x], ["x"]), formula(x.numpy()), f"{name}.apply(x)")


def elementwise_gradcheck(mod):
    rng = rng_()
    for name, (_, make, wrong) in ELEMENTWISE.items():
        op = need(mod, name)
        gradcheck(f"the gradient of {name}", op.apply, (make(rng, 3, 5, grad=True),), wrong)


def elementwise_gradgradcheck(mod):
    rng = rng_()
    for name, (_, make, _) in ELEMENTWISE.items():
        gradgradcheck(f"{name}'s backward, differentiated again", need(mod, name).apply, (make(rng, 3, 5, grad=True),))


def elementwise_on_strict(mod):
    x = np.abs(rng_().standard_normal((3, 5))) + 0.5
    ops = [need(mod, name) for name in ELEMENTWISE]
    on_strict("Exp, Log and Tanh, forward and backward",
              lambda d: [r for op in ops for r in grads_on(d, op.apply, [x])])


def elementwise_keeps_float32(mod):
    x = np.abs(rng_().standard_normal((3, 5))) + 0.5
    for name in ELEMENTWISE:
        keeps_float32(f"{name}.apply(x)", need(mod, name).apply, [x], "x")


CHECKS = [elementwise_forward, elementwise_gradcheck, elementwise_gradgradcheck, elementwise_keeps_float32,
                      elementwise_on_strict]
