"""The checks of exercise 9 of EXERCISES.md: LayerNorm."""
import numpy as np

import tinyattn.nn.functional as F

from . import formulas
from .common import (ExerciseFailure, attempt, compare, gradcheck, grads_on, keeps_float32, known_mistake, need,
                     on_strict, rand, rng_, vjp, writes_no_input)


def np_layer_norm(x, w, b, eps):
    return formulas.layer_norm(x, w, b, eps)


def _ln_parts(x, w, eps=1e-5):
    xc = x - x.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt((xc * xc).mean(-1, keepdims=True) + eps)
    return xc * rstd, rstd


def _ln_wrong_dx(u, x, w, b, form):
    xhat, rstd = _ln_parts(x, w)
    gx = u * w if form != "no weight" else u
    mean = gx.mean(-1, keepdims=True)
    proj = xhat * (gx * xhat).mean(-1, keepdims=True)
    if form == "no variance term":
        dx = rstd * (gx - mean)
    elif form == "no mean term":
        dx = rstd * (gx - proj)
    else:
        dx = rstd * (gx - mean - proj)
    return [dx, None, None]


LAYERNORM_HINT = ("With xhat = (x - mean) * rstd and gx = g * weight: dx = rstd * (gx - mean(gx) - xhat * "
                  "mean(gx * xhat)), dweight = sum(g * xhat), dbias = sum(g), the sums over every leading dim.")
LAYERNORM_WRONG = [
    ("your dx treats the variance as a constant: check the term that subtracts xhat * mean(gx * xhat) "
     "(the variance depends on x too)", lambda u, x, w, b: _ln_wrong_dx(u, x, w, b, "no variance term")),
    ("your dx treats the mean as a constant: check the term that subtracts mean(gx) (the mean depends on x too)",
     lambda u, x, w, b: _ln_wrong_dx(u, x, w, b, "no mean term")),
    ("your dx forgets the weight: the gradient that reaches xhat is gx = g * weight",
     lambda u, x, w, b: _ln_wrong_dx(u, x, w, b, "no weight")),
    ("your dweight is sum(g * x); the weight multiplies xhat, the normalised x: dweight = sum(g * xhat)",
     lambda u, x, w, b: [None, (u * x).reshape(-1, x.shape[-1]).sum(0), None]),
]


def layernorm_forward(mod):
    layer_norm, rng = need(mod, "layer_norm"), rng_()
    x, w, b = rand(rng, 2, 3, 8) * 2.0 + 1.0, rand(rng, 8), rand(rng, 8)
    for eps in (1e-5, 0.5):
        what = f"layer_norm(x (2, 3, 8), weight, bias, eps={eps})"
        got = writes_no_input(what, lambda x, w, b: layer_norm(x, w, b, eps), [x, w, b], ["x", "weight", "bias"])
        compare(got, np_layer_norm(x.numpy(), w.numpy(), b.numpy(), eps),
                what, hint="(x - mean) / sqrt(var + eps) * weight + bias; var is the mean of (x - mean)^2.")
    far = x + 1e5
    what = "layer_norm(x + 100000, weight, bias), rows whose mean is far larger than their spread"
    compare(attempt(what, lambda: layer_norm(far, w, b, 1e-5)), np_layer_norm(x.numpy(), w.numpy(), b.numpy(), 1e-5),
            what, tol=1e-9, hint="Take var as mean((x - mean)^2): mean(x^2) - mean^2 subtracts two numbers near "
                                 "10^10 and loses the digits that make var (in float32, rows with a mean of 1000 "
                                 "come out 50% off).")


def layernorm_matches_composite(mod):
    """Each of dx, dweight, dbias against the library's composite layer norm (built from primitives)."""
    layer_norm, rng = need(mod, "layer_norm"), rng_()
    x, w, b = rand(rng, 2, 3, 8, grad=True), rand(rng, 8, grad=True), rand(rng, 8, grad=True)
    fn = lambda x, w, b: layer_norm(x, w, b, 1e-5)                           # noqa: E731
    _, _, got = attempt("your LayerNorm backward", lambda: vjp(fn, (x, w, b)), LAYERNORM_HINT)
    _, _, expected = vjp(lambda x, w, b: F.layer_norm(x, (8,), w, b, 1e-5, fused=False), (x, w, b))
    for name, g, e in zip(("dx", "dweight", "dbias"), got, expected):
        try:
            compare(g, e, f"{name} of your LayerNorm (against the composite layer norm)", tol=1e-8)
        except ExerciseFailure as failure:
            mistake = known_mistake(fn, (x, w, b), LAYERNORM_WRONG)
            raise ExerciseFailure(f"{name} of your LayerNorm: {mistake}" if mistake else
                                  f"{failure} {LAYERNORM_HINT}") from None


def layernorm_gradcheck(mod):
    layer_norm, rng = need(mod, "layer_norm"), rng_()
    x, w, b = rand(rng, 4, 6, grad=True), rand(rng, 6, grad=True), rand(rng, 6, grad=True)
    gradcheck("the gradients of your LayerNorm", lambda x, w, b: layer_norm(x, w, b, 1e-5), (x, w, b),
              LAYERNORM_WRONG, LAYERNORM_HINT)
    gradcheck("the gradients of your LayerNorm with eps=0.5", lambda x, w, b: layer_norm(x, w, b, 0.5), (x, w, b),
              hint="They are right with eps=1e-5: backward must use the eps given to forward, through the rstd "
                   "that forward saved.")


def layernorm_on_strict(mod):
    layer_norm, rng = need(mod, "layer_norm"), rng_()
    arrays = [rng.standard_normal((2, 3, 8)), rng.standard_normal(8), rng.standard_normal(8)]
    on_strict("LayerNorm, forward and backward", lambda d: grads_on(d, lambda x, w, b: layer_norm(x, w, b), arrays))


def layernorm_keeps_float32(mod):
    layer_norm, rng = need(mod, "layer_norm"), rng_()
    arrays = [rng.standard_normal((2, 3, 8)), rng.standard_normal(8), rng.standard_normal(8)]
    keeps_float32("layer_norm(x (2, 3, 8), weight, bias)", lambda x, w, b: layer_norm(x, w, b), arrays,
                  ["x", "weight", "bias"])


CHECKS = [layernorm_forward, layernorm_matches_composite, layernorm_gradcheck, layernorm_keeps_float32,
             layernorm_on_strict]
