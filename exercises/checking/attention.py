"""The checks of exercise 13 of EXERCISES.md: attention."""
import math

import numpy as np

import tinyattn.nn.functional as F

from . import formulas
from .softmax import np_softmax
from .common import (ExerciseFailure, attempt, compare, gradcheck, grads_on, keeps_float32, known_mistake, need,
                     on_strict, rand, rng_, vjp, writes_no_input)


def np_attention(q, k, v, is_causal=False, scale=None):
    return formulas.attention(q, k, v, causal=is_causal, scale=scale)


def _attention_parts(q, k, v, is_causal):
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = q @ np.swapaxes(k, -1, -2) * scale
    if is_causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    return np_softmax(s), scale


def _attention_wrong(u, q, k, v, is_causal, form):
    p, scale = _attention_parts(q, k, v, is_causal)
    dp = u @ np.swapaxes(v, -1, -2)
    ds = p * dp if form == "no subtraction" else p * (dp - (dp * p).sum(-1, keepdims=True))
    s = 1.0 if form == "no scale" else scale
    return [ds @ k * s, np.swapaxes(ds, -1, -2) @ q * s, None]


ATTENTION_HINT = ("dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)), dQ = dS K * scale, "
                  "dK = dS^T Q * scale.")
ATTENTION_WRONG = {c: [
    ("your dS is P * dP: the softmax backward also subtracts each row's sum(dP * P). Check the term that "
     "subtracts it: dS = P * (dP - rowsum(dP * P))", lambda u, q, k, v, c=c: _attention_wrong(u, q, k, v, c,
                                                                                              "no subtraction")),
    ("your dQ and dK miss the scale: the scores are q k^T * scale, so dQ = dS K * scale and dK = dS^T Q * scale",
     lambda u, q, k, v, c=c: _attention_wrong(u, q, k, v, c, "no scale")),
] for c in (False, True)}


def attention_forward(mod):
    sdpa, rng = need(mod, "scaled_dot_product_attention"), rng_()
    q, k, v = rand(rng, 2, 2, 4, 8), rand(rng, 2, 2, 6, 8), rand(rng, 2, 2, 6, 3)
    what = "attention(q (2, 2, 4, 8), k (2, 2, 6, 8), v (2, 2, 6, 3))"
    compare(writes_no_input(what, sdpa, [q, k, v], "qkv"), np_attention(q.numpy(), k.numpy(), v.numpy()), what,
            hint="softmax(q k^T / sqrt(D)) v, the softmax over the keys (last dim).")
    q, k, v = rand(rng, 2, 2, 5, 8), rand(rng, 2, 2, 5, 8), rand(rng, 2, 2, 5, 8)
    what = "causal attention (T = 5)"
    compare(attempt(what, lambda: sdpa(q, k, v, is_causal=True)),
            np_attention(q.numpy(), k.numpy(), v.numpy(), True), what,
            hint="Set the scores of keys j > i to -inf before the softmax.")
    q3 = rand(rng, 2, 2, 3, 8)
    what = "causal attention with 3 queries and 5 keys"
    compare(attempt(what, lambda: sdpa(q3, k, v, is_causal=True)),
            np_attention(q3.numpy(), k.numpy(), v.numpy(), True), what,
            hint="Query i sees keys j <= i, counted from the top left as PyTorch's is_causal does, "
                 "also when Tq != Tk (not j <= i + Tk - Tq).")
    what = "causal attention (T = 5) with scale=0.3"
    compare(attempt(what, lambda: sdpa(q, k, v, is_causal=True, scale=0.3)),
            np_attention(q.numpy(), k.numpy(), v.numpy(), True, scale=0.3), what,
            hint="Use the scale forward is given (1 / sqrt(D) is only its default).")


def attention_gradients(mod):
    """dQ, dK, dV against the library's attention (autodiff through primitives), then gradcheck."""
    sdpa, rng = need(mod, "scaled_dot_product_attention"), rng_()
    cases = [((2, 2, 4, 8), (2, 2, 6, 8), (2, 2, 6, 3), False), ((1, 2, 5, 4), (1, 2, 5, 4), (1, 2, 5, 4), True)]
    for sq, sk, sv, causal in cases:
        q, k, v = rand(rng, *sq, grad=True), rand(rng, *sk, grad=True), rand(rng, *sv, grad=True)
        fn = lambda q, k, v, c=causal: sdpa(q, k, v, is_causal=c)           # noqa: E731
        label = f"{'causal' if causal else 'non-causal'} attention, q {sq}, k {sk}, v {sv}"
        _, _, got = attempt(f"your Attention backward ({label})", lambda: vjp(fn, (q, k, v)))
        _, _, expected = vjp(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), (q, k, v))
        for name, g, e in zip(("dQ", "dK", "dV"), got, expected):
            try:
                compare(g, e, f"{name} of {label} (against the library's attention)", tol=1e-8)
            except ExerciseFailure as failure:
                mistake = known_mistake(fn, (q, k, v), ATTENTION_WRONG[causal])
                raise ExerciseFailure(f"{name} of {label}: {mistake}" if mistake else
                                      f"{failure} {ATTENTION_HINT}") from None
        gradcheck(f"the gradients of {label}", fn, (q, k, v), ATTENTION_WRONG[causal], ATTENTION_HINT)
    gradcheck(f"the gradients of {label}, scale=0.3", lambda q, k, v: sdpa(q, k, v, is_causal=True, scale=0.3),
              (q, k, v), hint="Use self.scale, the scale forward was given (1 / sqrt(D) is only its default).")


def attention_on_strict(mod):
    sdpa, rng = need(mod, "scaled_dot_product_attention"), rng_()
    arrays = [rng.standard_normal((1, 2, 5, 4)) for _ in range(3)]
    on_strict("causal attention, forward and backward",
              lambda d: grads_on(d, lambda q, k, v: sdpa(q, k, v, is_causal=True), arrays))


def attention_keeps_float32(mod):
    sdpa, rng = need(mod, "scaled_dot_product_attention"), rng_()
    keeps_float32("causal attention(q, k, v (1, 2, 5, 4))", lambda q, k, v: sdpa(q, k, v, is_causal=True),
                  [rng.standard_normal((1, 2, 5, 4)) for _ in range(3)], "qkv")


CHECKS = [attention_forward, attention_gradients, attention_keeps_float32, attention_on_strict]
