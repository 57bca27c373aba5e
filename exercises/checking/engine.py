"""The checks of exercise 12 of EXERCISES.md: the engine."""
import numpy as np

import tinyattn as ta
import tinyattn.nn as nn
import tinyattn.nn.functional as F

from .common import ExerciseFailure, attempt, compare, need, on_strict, rand, rng_


class SharedGradient(ta.Function):
    """a + b, whose backward hands both inputs the same gradient Tensor (as an addition may)."""

    def forward(self, a, b):
        return a + b

    def backward(self, g):
        return g, g


def _diamond(x):
    """a = x * 2, b = a * a, c = b + a: a is used twice. Returns (c, the tensors by name)."""
    a = x * 2.0
    b = a * a
    c = b + a
    return c, {"x": x, "a": a, "b": b, "c": c}


def engine_toposort(mod):
    toposort, rng = need(mod, "toposort"), rng_()
    x = rand(rng, 3, grad=True)
    c, named = _diamond(x)
    order = attempt("toposort([c]) for c = a * a + a, a = x * 2", lambda: toposort([c]))
    name = {id(t): n for n, t in named.items()}
    names = [name.get(id(t), "another tensor") for t in order]
    for n in ("c", "b", "a", "x"):
        if names.count(n) != 1:
            raise ExerciseFailure(f"toposort([c]) for c = a * a + a: {n} appears {names.count(n)} times in {names}, "
                                  "expected once: mark the tensors you have visited")
    for later, earlier in (("b", "c"), ("a", "b"), ("a", "c"), ("x", "a")):
        if names.index(later) < names.index(earlier):
            raise ExerciseFailure(f"toposort([c]) gave {names}: {later} comes before {earlier}, but {earlier} was "
                                  f"made from {later}. A tensor must come after every tensor that uses it, or "
                                  "backward runs it before its gradient is complete (add a tensor to the order "
                                  "only after all its inputs are done, then reverse)")
    if len(order) != 4:
        raise ExerciseFailure(f"toposort([c]) gave {len(order)} tensors {names}, expected c, b, a, x")
    y = x * 3.0
    frozen = ta.tensor([1.0, 2.0, 3.0], dtype="float64")                     # requires no grad
    z = y * frozen
    order = toposort([z])
    if any(t is frozen for t in order):
        raise ExerciseFailure("toposort includes a tensor that does not require grad: leave those out")


def engine_backward_sums_paths(mod):
    backward, rng = need(mod, "backward"), rng_()
    x = rand(rng, 3, grad=True)
    y = (x * 3.0 + x * 5.0).sum()                                            # x is used twice: dy/dx = 8
    attempt("backward(y) for y = sum(x * 3 + x * 5)", lambda: backward(y))
    if x.grad is None:
        raise ExerciseFailure("backward(y) for y = sum(x * 3 + x * 5) left x.grad as None: put the leaves' "
                              "gradients in .grad")
    got = x.grad.numpy()
    if np.allclose(got, 3.0) or np.allclose(got, 5.0):
        raise ExerciseFailure(f"backward(y) for y = sum(x * 3 + x * 5) gave x.grad = {got[0]:g}, expected 8: x is "
                              "used twice and you kept one path's gradient. Add up the gradients that reach "
                              "the same tensor")
    if np.allclose(got, 16.0) or np.allclose(got, 11.0) or np.allclose(got, 13.0):
        raise ExerciseFailure(f"backward(y) for y = sum(x * 3 + x * 5) gave x.grad = {got[0]:g}, expected 8: a "
                              "gradient was counted twice. Run each tensor's backward once, after all its users "
                              "(in toposort order)")
    compare(got, np.full(3, 8.0), "x.grad for y = sum(x * 3 + x * 5)")
    x2 = rand(rng, 3, grad=True)
    c, _ = _diamond(x2)
    backward(c.sum())
    compare(x2.grad, 8.0 * x2.numpy() + 2.0, "x.grad for c = a * a + a, a = x * 2 (a used twice)",
            hint="dc/dx = (2a + 1) * 2 = 8x + 2: wait until both of a's users have given their gradient.")
    x3 = rand(rng, 3, grad=True)
    p, q = x3 * 2.0, x3 * 3.0
    what = "x.grad for t = (p + q) + p, p = x * 2, q = x * 3, each + giving both its inputs the same g"
    attempt(what, lambda: backward(SharedGradient.apply(SharedGradient.apply(p, q), p).sum()))
    if np.allclose(x3.grad.numpy(), 10.0):
        raise ExerciseFailure(f"{what}: you give 10, expected 7: adding p's second gradient in place "
                              "(pending[k] += g) also changed q's, the same Tensor. Make a new one: "
                              "pending[k] = pending[k] + g")
    compare(x3.grad, np.full(3, 7.0), what)


def engine_backward_accumulates(mod):
    backward, rng = need(mod, "backward"), rng_()
    x = rand(rng, 3, grad=True)
    backward((x * 2.0).sum())
    backward((x * 5.0).sum())
    compare(x.grad, np.full(3, 7.0), "x.grad after backward(sum(x * 2)) then backward(sum(x * 5))",
            hint="As in PyTorch, .grad adds up across backward calls (the training loop accumulates "
                 "micro-batches this way): the first gradient (a copy), then grad = grad + g.")
    y = x * 4.0
    backward(y, ta.tensor([1.0, 0.0, 2.0], dtype="float64"))
    compare(x.grad, np.array([11.0, 7.0, 15.0]), "x.grad after backward(y, gradient) for y = x * 4 (not a scalar)",
            hint="Start from the given gradient, not from ones.")
    w = rand(rng, 3, grad=False)
    backward((x * w).sum())
    if w.grad is not None:
        raise ExerciseFailure("backward gave a .grad to a tensor that does not require grad")


def _shares(a, b):
    """Do two Tensors share memory (the same Tensor, or arrays that overlap)?"""
    return a is b or np.shares_memory(a.data, b.data)


OWN_GRAD = ("a leaf's .grad must be its own array, as in PyTorch: code that scales one gradient in place "
            "(clip_grad_norm_, an optimizer) would change the other. Copy the first gradient that reaches a leaf "
            "(g.clone() is a copy), then add: t.grad = t.grad + g")


def engine_grads_are_their_own(mod):
    """After backward, no two leaves share a .grad array, nor a leaf and the caller's gradient; accumulating
    does not write into an array that another tensor holds."""
    backward, rng = need(mod, "backward"), rng_()
    a, b = rand(rng, 3, grad=True), rand(rng, 3, grad=True)
    u = ta.tensor(rng.standard_normal(3), dtype="float64")
    kept = u.numpy().copy()
    attempt("backward(a + b, gradient)", lambda: backward(SharedGradient.apply(a, b), u))
    if _shares(a.grad, b.grad):
        raise ExerciseFailure(f"after backward(a + b, gradient), a.grad and b.grad are the same array: {OWN_GRAD}")
    if _shares(a.grad, u) or _shares(b.grad, u):
        raise ExerciseFailure("after backward(a + b, gradient), a.grad is the gradient array you were given: "
                              f"{OWN_GRAD}")
    held = b.grad.numpy().copy()
    attempt("a second backward, of sum(a * 2)", lambda: backward((a * 2.0).sum()))
    if not np.array_equal(u.numpy(), kept) or not np.array_equal(b.grad.numpy(), held):
        raise ExerciseFailure("a second backward, of sum(a * 2), added a's gradient into an array that another "
                              f"tensor holds (b.grad, or the gradient given to the first backward): {OWN_GRAD}")
    x = rand(rng, 3, grad=True)
    attempt("backward(x, gradient) with x a leaf", lambda: backward(x, u))
    if _shares(x.grad, u):
        raise ExerciseFailure(f"after backward(x, gradient) with x a leaf, x.grad is the gradient array you were "
                              f"given, which the caller still holds and may change: {OWN_GRAD}")


def _mlp_grads(backward_fn, device):
    ta.manual_seed(0)
    layers = [nn.Linear(5, 7), nn.Linear(7, 3)]
    params = [p for layer in layers for p in layer.parameters()]
    for p in params:
        p.data = p.double().data
    for layer in layers:
        layer.to(device)
    rng = rng_(1)
    x = ta.tensor(rng.standard_normal((4, 5)), dtype="float64", device=device)
    t = ta.tensor(rng.integers(0, 3, 4), device=device)
    h = layers[0](x).tanh()
    loss = F.cross_entropy(layers[1](h + h), t)                             # h is used twice
    backward_fn(loss)
    return [p.grad for p in params]


def engine_matches_the_library(mod):
    backward = need(mod, "backward")
    got = attempt("your backward on a small MLP with cross-entropy", lambda: _mlp_grads(backward, "cpu"))
    expected = _mlp_grads(lambda loss: loss.backward(), "cpu")
    for i, (g, e) in enumerate(zip(got, expected)):
        compare(g, e.numpy(), f"the gradient of parameter {i} of a small MLP (against loss.backward())", tol=1e-9)


def engine_on_strict(mod):
    backward = need(mod, "backward")
    on_strict("your backward on a small MLP", lambda d: _mlp_grads(backward, d))


CHECKS = [engine_toposort, engine_backward_sums_paths, engine_backward_accumulates, engine_grads_are_their_own,
          engine_matches_the_library, engine_on_strict]
