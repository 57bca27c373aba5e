"""The checks of exercise 15 of EXERCISES.md: AdamW."""
import numpy as np

import tinyattn as ta

from .common import ExerciseFailure, attempt, compare, need, on_strict, rng_


def _np_adam(p, grads, lrs, b1, b2, eps, wd, form="adamw"):
    """The parameter after each step, for a few kinds of Adam."""
    m, v, out = np.zeros_like(p), np.zeros_like(p), []
    for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
        if form == "l2":
            g = g + wd * p
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        mh, vh = (m, v) if form == "no bias correction" else (m / (1 - b1 ** t), v / (1 - b2 ** t))
        lr = lrs[0] if form == "first lr" else lr
        if form not in ("l2", "decay after"):
            p = p * (1 - lr * wd)                                        # decoupled decay, first
        p = p - lr * mh / (np.sqrt(vh) + eps)
        if form == "decay after":
            p = p * (1 - lr * wd)
        out.append(p)
    return out


ADAMW_WRONG = {
    "l2": "your step adds weight_decay * p to the gradient (Adam with L2), which Adam then rescales; AdamW decays "
          "the weights directly, apart from the gradient: p *= 1 - lr * weight_decay",
    "no bias correction": "your step has no bias correction: divide m by (1 - beta1^t) and v by (1 - beta2^t), "
                          "t the step count of that parameter (from 1)",
    "decay after": "you decay the weights after the Adam update; AdamW (and ta.optim.AdamW, and PyTorch) decay "
                   "first: p *= 1 - lr * weight_decay, then the Adam step",
    "first lr": "your step keeps the first learning rate: read group['lr'] at every step, the training loop "
                "changes it (warmup, cosine)",
}


def _adam_run(AdamW, device, grads, lrs, hyper):
    p = ta.tensor(rng_(2).standard_normal((3, 4)), dtype="float64", device=device, requires_grad=True)
    q = ta.tensor(rng_(3).standard_normal(4), dtype="float64", device=device, requires_grad=True)
    opt = AdamW([{"params": [p], "weight_decay": hyper["weight_decay"]}, {"params": [q], "weight_decay": 0.0}],
                lr=lrs[0], betas=hyper["betas"], eps=hyper["eps"])
    states = []
    for g, lr in zip(grads, lrs):
        for group in opt.param_groups:
            group["lr"] = lr
        p.grad = ta.tensor(g, dtype="float64", device=device)
        q.grad = ta.tensor(g[0], dtype="float64", device=device)
        opt.step()
        states.append((p.numpy().copy(), q.numpy().copy()))
    return states


ADAM_HYPER = dict(betas=(0.8, 0.9), eps=1e-8, weight_decay=0.5)


def _adam_case():
    rng = rng_(4)
    return [rng.standard_normal((3, 4)) for _ in range(4)], [0.1, 0.05, 0.2, 0.1]


def adamw_matches_the_library(mod):
    AdamW = need(mod, "AdamW")
    grads, lrs = _adam_case()
    got = attempt("your AdamW, four steps", lambda: _adam_run(AdamW, "cpu", grads, lrs, ADAM_HYPER))
    expected = _adam_run(ta.optim.AdamW, "cpu", grads, lrs, ADAM_HYPER)
    p0 = rng_(2).standard_normal((3, 4))
    b1, b2 = ADAM_HYPER["betas"]
    for step, ((gp, gq), (ep, eq)) in enumerate(zip(got, expected), start=1):
        try:
            compare(gq, eq, f"a parameter with weight_decay 0 after step {step} (against ta.optim.AdamW)", tol=1e-9)
            compare(gp, ep, f"a parameter with weight_decay 0.5 after step {step} (against ta.optim.AdamW)",
                    tol=1e-9)
        except ExerciseFailure as failure:
            for form, message in ADAMW_WRONG.items():
                wrong = _np_adam(p0, grads, lrs, b1, b2, ADAM_HYPER["eps"], ADAM_HYPER["weight_decay"], form)
                if all(np.allclose(g[0], w, atol=1e-9) for g, w in zip(got, wrong)):
                    raise ExerciseFailure(message) from None
            raise ExerciseFailure(f"{failure} AdamW: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, "
                                  "p *= 1 - lr wd, p -= lr m_hat / (sqrt(v_hat) + eps).") from None


def adamw_skips_missing_gradients(mod):
    AdamW = need(mod, "AdamW")
    p = ta.tensor(np.ones(3), dtype="float64", requires_grad=True)
    q = ta.tensor(np.ones(3), dtype="float64", requires_grad=True)
    opt = AdamW([p, q], lr=0.1, weight_decay=0.1)
    p.grad = ta.tensor(np.ones(3), dtype="float64")
    attempt("AdamW.step() with a parameter whose .grad is None", opt.step,
            hint="Skip parameters with no gradient (p.grad is None): they were not used.")
    compare(q, np.ones(3), "a parameter with no gradient, after a step",
            hint="Skip it: no decay and no update without a gradient, as in PyTorch.")
    q.grad = ta.tensor(np.full(3, 0.5), dtype="float64")              # q's first step is the optimizer's second
    attempt("a second AdamW.step(), with both gradients", opt.step)
    q_lib = ta.tensor(np.ones(3), dtype="float64", requires_grad=True)
    q_lib.grad = q.grad
    ta.optim.AdamW([q_lib], lr=0.1, weight_decay=0.1).step()
    compare(q, q_lib.numpy(), "a parameter after its first step, taken at the optimizer's second step "
            "(against ta.optim.AdamW)", tol=1e-9, hint="Count steps per parameter (t in the state of p, "
            "from 1): a parameter skipped before takes its first step with t = 1.")


def adamw_on_strict(mod):
    AdamW = need(mod, "AdamW")
    grads, lrs = _adam_case()
    on_strict("AdamW, four steps", lambda d: [ta.tensor(a, device=d) for state in _adam_run(AdamW, d, grads, lrs,
                                                                                            ADAM_HYPER) for a in state])


def adamw_keeps_float32(mod):
    """A float32 parameter stays float32, and so do the arrays AdamW keeps for it (m and v)."""
    AdamW, rng = need(mod, "AdamW"), rng_()
    p = ta.tensor(rng.standard_normal((3, 4)), dtype="float32", requires_grad=True)
    opt = AdamW([p], lr=0.1, weight_decay=0.1)
    for step in (1, 2):
        p.grad = ta.tensor(rng.standard_normal((3, 4)), dtype="float32")
        attempt(f"AdamW step {step} on a float32 parameter", opt.step)
        if p.dtype != np.float32:
            raise ExerciseFailure(f"after step {step}, your AdamW turned a float32 parameter into {p.dtype}: keep "
                                  "the moments m and v in the parameter's dtype (xp.zeros_like(p.data)), and every "
                                  "parameter stays float32 (float64 state doubles the memory and slows every step)")
        for state in opt.state.values():
            for key, value in (state.items() if isinstance(state, dict) else ()):
                dtype = getattr(value, "dtype", None)
                if getattr(value, "shape", None) == p.shape and np.dtype(dtype).kind == "f" and dtype != p.dtype:
                    raise ExerciseFailure(f"your AdamW keeps state[{key!r}] of a float32 parameter in {dtype}: the "
                                          "moments m and v have the parameter's dtype (xp.zeros_like(p.data)), float32 "
                                          "here: float64 state doubles the memory and slows every step")


CHECKS = [adamw_matches_the_library, adamw_skips_missing_gradients, adamw_keeps_float32, adamw_on_strict]
