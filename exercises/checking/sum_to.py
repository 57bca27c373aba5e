"""The checks of exercise 5 of EXERCISES.md: sum_to."""
import numpy as np

import tinyattn as ta

from .common import (ExerciseFailure, attempt, compare, gradcheck, gradgradcheck, grads_on, keeps_float32, need,
                     on_strict, rand, rng_, tensors, writes_no_input)


SUM_TO_CASES = [((2, 3, 4), (3, 4)), ((2, 3, 4), (3, 1)), ((2, 3, 4), (1, 3, 1)), ((2, 3, 4), ()),
                ((2, 3, 4), (2, 1, 4)), ((5,), (1,)), ((2, 3), (2, 3)), ((4, 1, 3), (1, 3))]


def np_sum_to(g, shape):
    lead = g.ndim - len(shape)
    g = g.sum(tuple(range(lead)))
    return g.sum(tuple(i for i, n in enumerate(shape) if n == 1), keepdims=True).reshape(shape)


def sum_to_undoes_broadcasting(mod):
    sum_to, rng = need(mod, "sum_to"), rng_()
    for gshape, shape in SUM_TO_CASES:
        g = rand(rng, *gshape)
        what = f"sum_to(g of shape {gshape}, {shape})"
        out = attempt(what, lambda: sum_to(g, shape))
        if not isinstance(out, ta.Tensor):
            raise ExerciseFailure(f"{what} returned a {type(out).__name__}, not a Tensor: use Tensor ops")
        leading_only = g.numpy().sum(tuple(range(len(gshape) - len(shape)))).shape
        if out.shape != shape and out.shape == leading_only:
            raise ExerciseFailure(f"{what} returned shape {out.shape}: you summed the dims that broadcasting added "
                                  "in front, but not the dims where shape has 1 and g does not "
                                  "(sum those too, with keepdim=True)")
        compare(out, np_sum_to(g.numpy(), shape), what, hint="It should add up every element that broadcasting "
                "copied from one element of shape.")


def sum_to_gradcheck(mod):
    sum_to, rng = need(mod, "sum_to"), rng_()
    g = rand(rng, 2, 3, 4, grad=True)
    gradcheck("the gradient through sum_to(g (2, 3, 4), (3, 1))", lambda g: sum_to(g, (3, 1)), (g,),
              hint="Build it from Tensor ops only (g.sum, .reshape), so the engine can differentiate it.")


MUL_SHAPES = [((2, 3, 4), (3, 1)), ((4,), (2, 3, 4)), ((2, 3, 4), ()), ((3, 1), (1, 5))]
MUL_WRONG = [("your Mul backward swaps the inputs: d(a*b)/da is b, so grad_a = sum_to(g * b, a.shape), "
              "and grad_b = sum_to(g * a, b.shape)",
              lambda u, a, b: [np_sum_to(u * a, a.shape), np_sum_to(u * b, b.shape)]),
             ("your Mul backward ignores g, the gradient of the output: multiply by it",
              lambda u, a, b: [np_sum_to(np.broadcast_to(b, u.shape), a.shape),
                               np_sum_to(np.broadcast_to(a, u.shape), b.shape)])]


def mul_gradients(mod):
    Mul, rng = need(mod, "Mul"), rng_()
    for sa, sb in MUL_SHAPES:
        a, b = rand(rng, *sa, grad=True), rand(rng, *sb, grad=True)
        what = f"Mul.apply(a {sa}, b {sb})"
        compare(writes_no_input(what, Mul.apply, [a, b], ["a", "b"]), a.numpy() * b.numpy(), f"{what}, forward")
        gradcheck(f"the gradients of {what}", Mul.apply, (a, b), MUL_WRONG,
                  hint="Each gradient is g times the other input, then sum_to(..., that input's shape).")


def mul_gradgradcheck(mod):
    Mul, rng = need(mod, "Mul"), rng_()
    a, b = rand(rng, 2, 3, 4, grad=True), rand(rng, 3, 1, grad=True)
    gradgradcheck("Mul's backward, differentiated again", Mul.apply, (a, b))


def sum_to_on_strict(mod):
    sum_to, Mul, rng = need(mod, "sum_to"), need(mod, "Mul"), rng_()
    a, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((3, 1))
    on_strict("sum_to and Mul", lambda d: [sum_to(tensors(d, a, grad=False)[0], (3, 1))]
              + grads_on(d, Mul.apply, [a, b]))


def mul_keeps_float32(mod):
    Mul, rng = need(mod, "Mul"), rng_()
    keeps_float32("Mul.apply(a (2, 3, 4), b (3, 1))", Mul.apply, [rng.standard_normal((2, 3, 4)),
                                                                  rng.standard_normal((3, 1))], "ab")


CHECKS = [sum_to_undoes_broadcasting, sum_to_gradcheck, mul_gradients, mul_gradgradcheck, mul_keeps_float32,
          sum_to_on_strict]
