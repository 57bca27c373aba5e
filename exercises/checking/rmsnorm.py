"""The checks of exercise 1 of EXERCISES.md: RMSNorm."""
import numpy as np

import tinyattn as ta

from .common import ExerciseFailure, autodiff_gradcheck, close, compare, double, host, need, rand, rng_


def np_rms_norm(x, w, eps, form="right"):
    rms = np.sqrt((x ** 2).mean(-1, keepdims=True) + (eps if form == "right" else 0.0))
    return x / (rms + (eps if form == "eps outside" else 0.0)) * w


RMS_NORM_EPS_WRONG = {
    "no eps": "your rms_norm leaves eps out: add eps under the square root, x / sqrt(mean(x^2) + eps)",
    "eps outside": "your rms_norm adds eps to the root mean square; it goes under the square root: "
                   "x / sqrt(mean(x^2) + eps)",
}


def rms_norm_matches_formula(mod):
    """Two eps, and an x whose mean square is about eps (0.01), where eps changes the result most."""
    rms_norm, rng = need(mod, "rms_norm"), rng_()
    x, w = rand(rng, 2, 3, 8), rand(rng, 8)
    for xi, eps in ((x, 1e-6), (x, 0.5), (x * 0.1, 0.01)):
        what = f"rms_norm(x, w, eps={eps}) on x {x.shape} with mean square {float((xi * xi).mean()):.2g}"
        got = rms_norm(xi, w, eps)
        try:
            close(got, np_rms_norm(xi.numpy(), w.numpy(), eps), what=what)
        except ExerciseFailure:
            for form, message in RMS_NORM_EPS_WRONG.items():
                if np.allclose(host(got), np_rms_norm(xi.numpy(), w.numpy(), eps, form), rtol=1e-9, atol=1e-12):
                    raise ExerciseFailure(f"{what}: {message}") from None
            raise


def rms_norm_has_unit_rms(mod):
    rms_norm, rng = need(mod, "rms_norm"), rng_()
    x = rand(rng, 4, 16) * 3.0 + 1.0
    y = rms_norm(x, ta.ones(16, dtype="float64"), 1e-6).numpy()
    compare(np.sqrt((y ** 2).mean(-1)), np.ones(4), "the RMS of each row, with a unit weight", tol=1e-6)
    assert not np.allclose(y.mean(-1), 0.0), "RMSNorm does not subtract the mean (LayerNorm does)"


def rms_norm_ignores_scale(mod):
    rms_norm, rng = need(mod, "rms_norm"), rng_()
    x, w = rand(rng, 3, 8), rand(rng, 8)
    close(rms_norm(x * 7.5, w, 1e-12), rms_norm(x, w, 1e-12), tol=1e-8,
          what=f"rms_norm(7.5 * x) against rms_norm(x) on x {x.shape} (RMSNorm ignores the scale of x)")


def rms_norm_gradcheck(mod):
    rms_norm, rng = need(mod, "rms_norm"), rng_()
    x, w = rand(rng, 2, 3, 8, grad=True), rand(rng, 8, grad=True)
    autodiff_gradcheck("the gradients of rms_norm(x (2, 3, 8), w (8,), 1e-6)", lambda x, w: rms_norm(x, w, 1e-6),
                       (x, w), ("x", "w"))


def rms_norm_module(mod):
    RMSNorm, rms_norm, rng = need(mod, "RMSNorm"), need(mod, "rms_norm"), rng_()
    m = RMSNorm(8)
    params = dict(m.named_parameters())
    assert list(params) == ["weight"], f"RMSNorm should have one parameter, weight; it has {list(params)}"
    assert params["weight"].shape == (8,) and np.all(params["weight"].numpy() == 1.0)
    x = ta.tensor(rng.standard_normal((2, 5, 8)).astype(np.float32))
    y = m(x)
    assert y.shape == x.shape and y.dtype == x.dtype
    close(y, rms_norm(x, m.weight, m.eps), tol=1e-6, what=f"RMSNorm(8)(x) against rms_norm(x, weight, eps) on x {x.shape}")
    small = RMSNorm(8, eps=0.25)
    assert small.eps == 0.25, f"RMSNorm(8, eps=0.25).eps is {small.eps}: keep the eps you are given as self.eps"
    x2 = x * 0.5                                                      # mean square about 0.25, as large as eps
    compare(small(x2), np_rms_norm(x2.numpy().astype(np.float64), 1.0, 0.25), "RMSNorm(8, eps=0.25)(x) on x "
            "with mean square near 0.25 (against the formula)", tol=1e-6, hint="Pass self.eps to rms_norm.")
    double(m)
    xg = rand(rng, 2, 8, grad=True)
    autodiff_gradcheck("the gradients of RMSNorm(8)(x (2, 8))", lambda x, w: m(x), (xg, m.weight), ("x", "weight"))


CHECKS = [rms_norm_matches_formula, rms_norm_has_unit_rms, rms_norm_ignores_scale, rms_norm_gradcheck,
           rms_norm_module]
