"""The checks of exercise 10 of EXERCISES.md: cross-entropy."""
import numpy as np

import tinyattn as ta

from . import formulas
from .softmax import np_softmax
from .common import attempt, compare, gradcheck, grads_on, keeps_float32, need, on_strict, rand, rng_, writes_no_input


def np_cross_entropy(logits, targets, ignore_index=-100):
    return formulas.cross_entropy(logits, targets, ignore_index)


def _ce_grad(u, logits, targets, ignore_index=-100, count="valid", zero_ignored=True, scale=True):
    keep = targets != ignore_index
    onehot = np.eye(logits.shape[1])[np.where(keep, targets, 0)]
    d = np_softmax(logits) - onehot
    if zero_ignored:
        d = d * keep[:, None]
    n = {"valid": keep.sum(), "all": len(targets), "none": 1}[count]
    return [(u if scale else 1.0) * d / n]


CE_HINT = "d loss / d logits = g * (softmax(logits) - onehot(targets)) / N, N the number of rows that count."
CE_WRONG = [
    ("your cross-entropy gradient is N times too large: the loss is the mean over the rows, so divide by N",
     lambda u, lg, t: _ce_grad(u, lg, t, count="none")),
    ("your cross-entropy backward ignores g, the gradient of the loss (here a random number): multiply by it",
     lambda u, lg, t: _ce_grad(u, lg, t, scale=False)),
    ("your cross-entropy gradient has the wrong sign: it is softmax(logits) - onehot(targets)",
     lambda u, lg, t: [-_ce_grad(u, lg, t)[0]]),
    ("your cross-entropy gives a gradient to the rows whose target is ignore_index: they count for nothing, "
     "so their rows of dlogits are zero", lambda u, lg, t: _ce_grad(u, lg, t, zero_ignored=False)),
    ("your cross-entropy divides by all N rows, not by the rows that count (targets != ignore_index)",
     lambda u, lg, t: _ce_grad(u, lg, t, count="all")),
]


def ce_inputs(rng, n=6, c=5, device="cpu"):
    targets = rng.integers(0, c, n)
    targets[[1, 4]] = -100                                                   # two ignored rows
    targets[2] = targets[0]
    return rand(rng, n, c, grad=True, device=device), ta.tensor(targets, device=device)


def cross_entropy_forward(mod):
    cross_entropy, rng = need(mod, "cross_entropy"), rng_()
    logits, targets = ce_inputs(rng)
    what = "cross_entropy(logits (6, 5), targets with two rows ignored)"
    got = writes_no_input(what, cross_entropy, [logits, targets], ["logits", "targets"])
    compare(got, np_cross_entropy(logits.numpy(), targets.numpy()),
            what, hint="The mean over the rows that count of -log softmax(logits)[target].")
    big = ta.tensor(rng.standard_normal((3, 4)) * 3 + 1000.0, dtype="float64")
    t = ta.tensor(np.array([0, 3, 1]))
    compare(attempt("cross_entropy of logits near 1000", lambda: cross_entropy(big, t)),
            np_cross_entropy(big.numpy(), t.numpy()), "cross_entropy of logits near 1000",
            hint="Subtract each row's max before exp (log softmax = x - max - log sum exp(x - max)).")
    far = ta.tensor(rng.standard_normal((2, 4)) * 3 + np.array([[1000.0], [-1000.0]]), dtype="float64")
    t = ta.tensor(np.array([1, 2]))
    what = "cross_entropy of a row of logits near 1000 and a row near -1000"
    compare(attempt(what, lambda: cross_entropy(far, t)), np_cross_entropy(far.numpy(), t.numpy()), what,
            hint="Subtract each row's own max (axis=1, keepdims=True), not the max of all the logits: "
                 "exp of a row far below it is 0, and log(0) is -inf.")
    logits, targets = ce_inputs(rng)
    targets = ta.tensor(np.where(targets.numpy() == -100, -1, targets.numpy()))
    what = "cross_entropy(logits (6, 5), targets, ignore_index=-1), two rows ignored (GPT pads with -1)"
    compare(attempt(what, lambda: cross_entropy(logits, targets, ignore_index=-1)),
            np_cross_entropy(logits.numpy(), targets.numpy(), -1), what,
            hint="Leave out the rows whose target is the ignore_index you are given (-100 is only its default).")


def cross_entropy_gradcheck(mod):
    cross_entropy, rng = need(mod, "cross_entropy"), rng_()
    logits, targets = ce_inputs(rng)
    fn = lambda lg: cross_entropy(lg, targets)                               # noqa: E731
    gradcheck("the gradient of cross_entropy(logits (6, 5), targets)", fn, (logits,),
              [(m, lambda u, lg, f=f: f(u, lg, targets.numpy())) for m, f in CE_WRONG], CE_HINT)
    padded = ta.tensor(np.where(targets.numpy() == -100, -1, targets.numpy()))
    gradcheck("the gradient of cross_entropy(logits (6, 5), targets, ignore_index=-1)",
              lambda lg: cross_entropy(lg, padded, ignore_index=-1), (logits,),
              hint="Leave out the rows whose target is the ignore_index you are given (-100 is only its default).")


def cross_entropy_on_strict(mod):
    cross_entropy, rng = need(mod, "cross_entropy"), rng_()
    logits, targets = ce_inputs(rng)
    on_strict("cross_entropy, forward and backward",
              lambda d: grads_on(d, cross_entropy, [logits.numpy()], ints=[targets.numpy()]))


def cross_entropy_keeps_float32(mod):
    cross_entropy, rng = need(mod, "cross_entropy"), rng_()
    logits, targets = ce_inputs(rng)
    keeps_float32("cross_entropy(logits (6, 5), targets)", cross_entropy, [logits.numpy()], ["logits"],
                  ints=[targets.numpy()])


CHECKS = [cross_entropy_forward, cross_entropy_gradcheck, cross_entropy_keeps_float32, cross_entropy_on_strict]
