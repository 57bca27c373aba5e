"""The checks of exercise 4 of EXERCISES.md: SwiGLU."""
import numpy as np

from .common import autodiff_gradcheck, close, double, need, rand, rng_


def silu_matches_formula(mod):
    silu, rng = need(mod, "silu"), rng_()
    x = rand(rng, 3, 7, grad=True)
    xn = x.numpy()
    close(silu(x), xn / (1.0 + np.exp(-xn)), what=f"silu(x) against x * sigmoid(x) on x {x.shape}")
    autodiff_gradcheck(f"the gradient of silu(x {x.shape})", silu, (x,), ("x",))


def swiglu_matches_formula(mod):
    SwiGLU, rng = need(mod, "SwiGLU"), rng_()
    m = double(SwiGLU(8, 12))
    x = rand(rng, 2, 3, 8)
    W1, V, W2 = (layer.weight.numpy() for layer in (m.w1, m.v, m.w2))   # (out, in) each
    h = x.numpy() @ W1.T
    expected = (h / (1.0 + np.exp(-h)) * (x.numpy() @ V.T)) @ W2.T
    close(m(x), expected, what=f"SwiGLU(x) against w2(silu(w1(x)) * v(x)) on x {x.shape}")


def swiglu_parameters(mod):
    SwiGLU = need(mod, "SwiGLU")
    m = SwiGLU(8, 12)
    names = [n for n, _ in m.named_parameters()]
    assert sorted(names) == ["v.weight", "w1.weight", "w2.weight"], f"expected w1, v, w2 without biases, got {names}"
    assert m.w1.weight.shape == (12, 8) and m.v.weight.shape == (12, 8) and m.w2.weight.shape == (8, 12)
    assert SwiGLU(48).w1.weight.shape == (128, 48), "the default hidden size is 8 * n_embd // 3"


def swiglu_gradcheck(mod):
    SwiGLU, rng = need(mod, "SwiGLU"), rng_()
    m = double(SwiGLU(6, 10))
    x = rand(rng, 2, 3, 6, grad=True)
    autodiff_gradcheck("the gradients of SwiGLU(6, 10)(x (2, 3, 6))", lambda x, *params: m(x), (x, *m.parameters()),
                       ("x", *(n for n, _ in m.named_parameters())))


CHECKS = [silu_matches_formula, swiglu_matches_formula, swiglu_parameters, swiglu_gradcheck]
