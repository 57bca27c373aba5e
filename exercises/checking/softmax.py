"""The checks of exercise 8 of EXERCISES.md: softmax."""
import numpy as np

import tinyattn as ta

from . import formulas
from .common import (ExerciseFailure, attempt, compare, gradcheck, gradgradcheck, grads_on, keeps_float32, need,
                     on_strict, peak_bytes, rand, rng_, writes_no_input)


def np_softmax(x, dim=-1):
    return formulas.softmax(x, dim)


SOFTMAX_HINT = "The gradient is y * (g - sum(g * y)), the sum along dim with keepdim=True."
SOFTMAX_WRONG = [
    ("your softmax backward returns the gradient of sum(y), which is zero since every row of y sums to 1, not the "
     "gradient of <g, y>: it leaves g out. Check the term that subtracts sum_j g_j y_j: the gradient is "
     "y * (g - sum(g * y))", lambda u, x: [np.zeros_like(x)]),
    ("your softmax backward keeps only the Jacobian's diagonal, g * y * (1 - y): every y_i depends on every x_j. "
     "Check the term that subtracts sum_j g_j y_j: the gradient is y * (g - sum(g * y))",
     lambda u, x: [u * np_softmax(x) * (1 - np_softmax(x))]),
    ("your softmax backward ignores g, the gradient of the output: the gradient is y * (g - sum(g * y))",
     lambda u, x: [np_softmax(x) * (1 - np_softmax(x))]),
    ("your softmax backward subtracts sum(g), not sum(g * y): check the term that subtracts sum_j g_j y_j",
     lambda u, x: [np_softmax(x) * (u - u.sum(-1, keepdims=True))]),
    ("your softmax backward sums g * y over the whole tensor: sum along dim only, with keepdim=True, "
     "one sum per row", lambda u, x: [np_softmax(x) * (u - (u * np_softmax(x)).sum())]),
]


def softmax_forward(mod):
    softmax, rng = need(mod, "softmax"), rng_()
    x = rand(rng, 3, 4, 5)
    for dim in (-1, 0, 1):
        what = f"softmax(x (3, 4, 5), dim={dim})"
        compare(writes_no_input(what, lambda x: softmax(x, dim), [x], ["x"]), np_softmax(x.numpy(), dim), what,
                hint="exp(x) / sum(exp(x)), both along dim.")
    big = ta.tensor(rng.standard_normal((2, 6)) * 3 + 1000.0, dtype="float64")
    compare(attempt("softmax of inputs near 1000", lambda: softmax(big)), np_softmax(big.numpy()),
            "softmax of inputs near 1000", hint="exp(1000) overflows: subtract the max along dim before exp.")
    apart = ta.tensor(rng.standard_normal((2, 6)) * 3 + np.array([[1000.0], [-1000.0]]), dtype="float64")
    compare(attempt("softmax of a row near 1000 and a row near -1000", lambda: softmax(apart)),
            np_softmax(apart.numpy()), "softmax of a row near 1000 and a row near -1000",
            hint="Subtract each row's max along dim (keepdims=True), not the max of the whole tensor: "
                 "exp of a row far below it underflows to 0, and 0 / 0 is nan.")


def softmax_gradcheck(mod):
    softmax, rng = need(mod, "softmax"), rng_()
    gradcheck("the gradient of softmax(x (3, 4, 5))", softmax, (rand(rng, 3, 4, 5, grad=True),), SOFTMAX_WRONG,
              SOFTMAX_HINT)
    gradcheck("the gradient of softmax(x (3, 4, 5), dim=1)", lambda x: softmax(x, 1), (rand(rng, 3, 4, 5, grad=True),),
              hint="Keep dim on self in forward and sum along it in backward.")


def softmax_gradgradcheck(mod):
    softmax, rng = need(mod, "softmax"), rng_()
    gradgradcheck("softmax's backward, differentiated again", softmax, (rand(rng, 3, 5, grad=True),))


def softmax_builds_no_jacobian(mod):
    """The backward of a (2, 1024) softmax must not hold a (1024, 1024) Jacobian (8 MB per row)."""
    softmax, rng = need(mod, "softmax"), rng_()
    x = rand(rng, 2, 1024, grad=True)
    y = attempt("softmax(x (2, 1024))", lambda: softmax(x))
    u = ta.tensor(rng.standard_normal(y.shape), dtype="float64")
    used = peak_bytes(lambda: attempt("softmax's backward on (2, 1024)", lambda: y.backward(u)))
    if used > 4 * 2**20:
        raise ExerciseFailure(f"your softmax backward used {used / 2**20:.0f} MB at once for an input of "
                              f"{x.numel() * 8 / 2**10:.0f} KB: it builds the (C, C) Jacobian. Write J^T g as one "
                              "formula instead: y * (g - sum(g * y)), a few arrays shaped like x")


def softmax_on_strict(mod):
    softmax = need(mod, "softmax")
    x = rng_().standard_normal((3, 5))
    on_strict("softmax, forward and backward", lambda d: grads_on(d, softmax, [x]))


def softmax_keeps_float32(mod):
    keeps_float32("softmax(x (3, 5))", need(mod, "softmax"), [rng_().standard_normal((3, 5))], "x")


CHECKS = [softmax_forward, softmax_gradcheck, softmax_gradgradcheck, softmax_builds_no_jacobian,
           softmax_keeps_float32, softmax_on_strict]
