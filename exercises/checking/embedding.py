"""The checks of exercise 11 of EXERCISES.md: embedding."""
import numpy as np

import tinyattn as ta

from .common import (ExerciseFailure, attempt, compare, gradcheck, grads_on, keeps_float32, known_mistake, need,
                     on_strict, rand, rng_, vjp, writes_no_input)


IDS = np.array([[3, 1, 3], [0, 3, 5]])          # id 3 three times, id 2 and 4 never


def np_embedding_grad(u, weight, idx=IDS):
    out = np.zeros_like(weight)
    np.add.at(out, idx.reshape(-1), u.reshape(-1, weight.shape[1]))
    return out


def _last_write_wins(u, weight, idx=IDS):
    out = np.zeros_like(weight)
    out[idx.reshape(-1)] = u.reshape(-1, weight.shape[1])
    return out


EMBEDDING_WRONG = [("id 3 is looked up three times, but its row of dweight holds only one of those gradients: "
                    "`dw[idx] = g` and `dw[idx] += g` keep one write per row. Scatter-add: every occurrence adds "
                    "its row (a one-hot matrix @ g does it)", lambda u, w: [_last_write_wins(u, w)])]


def embedding_forward(mod):
    embedding, rng = need(mod, "embedding"), rng_()
    w = rand(rng, 6, 4)
    got = writes_no_input("embedding(idx (2, 3), weight (6, 4))", embedding, [ta.tensor(IDS), w], ["idx", "weight"])
    compare(got, w.numpy()[IDS],
            "embedding(idx (2, 3), weight (6, 4))", hint="Row idx[b, t] of weight, for every position.")
    for ids in (IDS[0], IDS.reshape(2, 1, 3)):                        # positions are 1-d ids (T,)
        what = f"embedding(idx {ids.shape}, weight (6, 4))"
        hint = ("The ids may have any shape (GPT looks up positions (T,) and tokens (B, T)): the output is "
                "idx.shape + (C,).")
        compare(attempt(what, lambda: embedding(ta.tensor(ids), w), hint), w.numpy()[ids], what, hint=hint)


def embedding_gradients(mod):
    embedding, rng = need(mod, "embedding"), rng_()
    w, idx = rand(rng, 6, 4, grad=True), ta.tensor(IDS)
    fn = lambda w: embedding(idx, w)                                         # noqa: E731
    _, u, (got,) = attempt("your Embedding backward", lambda: vjp(fn, (w,)))
    try:
        compare(got, np_embedding_grad(u, w.numpy()), "dweight of embedding(ids with repeats, weight (6, 4))",
                hint="Row v of dweight is the sum of g over every position whose id is v; rows never looked up "
                     "are zero.")
    except ExerciseFailure as failure:
        raise ExerciseFailure(known_mistake(fn, (w,), EMBEDDING_WRONG) or str(failure)) from None
    gradcheck("the gradient of embedding", fn, (w,), EMBEDDING_WRONG)


def embedding_on_strict(mod):
    embedding, rng = need(mod, "embedding"), rng_()
    w = rng.standard_normal((6, 4))
    on_strict("embedding, forward and backward",
              lambda d: grads_on(d, lambda w, idx: embedding(idx, w), [w], ints=[IDS]))


def embedding_keeps_float32(mod):
    embedding = need(mod, "embedding")
    keeps_float32("embedding(idx (2, 3), weight (6, 4))", lambda w, idx: embedding(idx, w),
                  [rng_().standard_normal((6, 4))], ["weight"], ints=[IDS])


CHECKS = [embedding_forward, embedding_gradients, embedding_keeps_float32, embedding_on_strict]
