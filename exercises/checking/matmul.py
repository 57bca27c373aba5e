"""The checks of exercise 6 of EXERCISES.md: matmul."""
import numpy as np

from .common import (compare, gradcheck, gradgradcheck, grads_on, keeps_float32, need, on_strict, rand, rng_,
                     writes_no_input)


MATMUL_SHAPES = [((3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (4, 5)), ((1, 3, 4), (2, 4, 5)),
                 ((2, 1, 3, 4), (5, 4, 2)), ((2, 4, 4), (2, 4, 4))]
MATMUL_HINT = ("dA = g @ B^T and dB = A^T @ g, with .mT for ^T, then ta.sum_to(..., shape) for batch dims "
               "that were broadcast in forward.")
MATMUL_WRONG = [("your dB is g^T @ A, the transpose of the right answer: dB = A^T @ g (A^T on the left)",
                 lambda u, a, b: [None, np.swapaxes(u, -1, -2) @ a]),
                ("your dA is g @ B without the transpose: dA = g @ B^T (use b.mT)",
                 lambda u, a, b: [u @ b, None]),
                ("your dB is A @ g without the transpose: dB = A^T @ g (use a.mT)",
                 lambda u, a, b: [None, a @ u])]


def matmul_forward(mod):
    MatMul, rng = need(mod, "MatMul"), rng_()
    for sa, sb in MATMUL_SHAPES:
        a, b = rand(rng, *sa), rand(rng, *sb)
        what = f"MatMul.apply(a {sa}, b {sb})"
        compare(writes_no_input(what, MatMul.apply, [a, b], ["a", "b"]), a.numpy() @ b.numpy(), what)


def matmul_gradients(mod):
    MatMul, rng = need(mod, "MatMul"), rng_()
    for sa, sb in MATMUL_SHAPES:
        a, b = rand(rng, *sa, grad=True), rand(rng, *sb, grad=True)
        gradcheck(f"the gradients of MatMul.apply(a {sa}, b {sb})", MatMul.apply, (a, b), MATMUL_WRONG,
                  hint=MATMUL_HINT)


def matmul_gradgradcheck(mod):
    MatMul, rng = need(mod, "MatMul"), rng_()
    a, b = rand(rng, 2, 3, 4, grad=True), rand(rng, 4, 5, grad=True)
    gradgradcheck("MatMul's backward, differentiated again", MatMul.apply, (a, b))


def matmul_on_strict(mod):
    MatMul, rng = need(mod, "MatMul"), rng_()
    a, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5))
    on_strict("MatMul, forward and backward", lambda d: grads_on(d, MatMul.apply, [a, b]))


def matmul_keeps_float32(mod):
    MatMul, rng = need(mod, "MatMul"), rng_()
    keeps_float32("MatMul.apply(a (2, 3, 4), b (4, 5))", MatMul.apply, [rng.standard_normal((2, 3, 4)),
                                                                        rng.standard_normal((4, 5))], "ab")


CHECKS = [matmul_forward, matmul_gradients, matmul_gradgradcheck, matmul_keeps_float32, matmul_on_strict]
