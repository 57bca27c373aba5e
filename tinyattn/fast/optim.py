"""AdamW's step on flat buffers: the same arithmetic as ``tinyattn.optim.AdamW``, one pass per group.

``AdamW(..., fused=True)`` (what a compiled GPT's ``configure_optimizer`` makes) runs ``fused_step``
in place of its loop while the code it stands in for is the library's own (fast/checked.py).
"""
import math

from .. import optim
from . import checked


KERNELS = ("adamw_",)           # what fused_step asks for


def fused_step(opt):
    """One AdamW step for every parameter of ``opt`` on flat buffers; False (nothing done) where it
    cannot run: AdamW's step or update is not the library's (edited, replaced or subclassed), or
    not every parameter has a gradient and the same step count on one host backend.

    The parameters and both moments then live in one flat array each (each parameter's ``.data``
    and state are views into them), so a group's update is a few whole-array passes with no
    temporaries, or one pass of the ``adamw_`` kernel; the numbers are bit for bit the loop's."""
    params = opt.parameters()
    backend = params[0].backend
    if not (backend.on_host and backend.ufunc_out):
        return False
    cls = type(opt)                                      # (a subclass with a step or update of its own: its loop)
    if not (cls.step is optim.AdamW.step and cls.update is optim.AdamW.update
            and "the fused AdamW" in checked.allowed()):
        return False
    if any(p.grad is None or p.backend is not backend or p.dtype != params[0].dtype for p in params):
        return False
    steps = {opt.state[id(p)]["step"] if id(p) in opt.state else 0 for p in params}
    if len(steps) != 1:
        return False
    flat = opt.__dict__.get("_flat")
    if flat is None or not flat.holds(params, opt.state):
        flat = opt._flat = _FlatAdamState(params, opt.state, backend)
    flat.gather_grads(params)
    t = steps.pop() + 1
    for p in params:
        opt.state[id(p)]["step"] = t
    for group, (lo, hi) in zip(opt.param_groups, flat.group_ranges(opt.param_groups)):
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        p, g, m, v, tmp = (a[lo:hi] for a in (flat.p, flat.g, flat.m, flat.v, flat.tmp))
        if backend.run_kernel("adamw_", p, g, m, v, lr, b1, b2, eps, wd, t) is not None:
            continue                                         # a fused kernel did all of the below
        xp = backend.xp
        m *= b1
        m += xp.multiply(g, 1 - b1, out=tmp)                 # first moment
        v *= b2
        tmp = xp.multiply(g, g, out=tmp)
        tmp *= 1 - b2
        v += tmp                                             # second moment
        if wd:
            p *= 1 - lr * wd                                 # decoupled decay
        step_size = lr / (1 - b1 ** t)
        denom = xp.sqrt(v, out=tmp)
        denom *= 1.0 / math.sqrt(1 - b2 ** t)
        denom += eps
        update = xp.divide(m, denom, out=tmp)
        update *= step_size
        p -= update
    return True


class _FlatAdamState:
    """Flat arrays for AdamW's fused step: parameters p, gradients g, moments m and v, and
    one scratch array. Each parameter's ``.data``, and its ``exp_avg`` and ``exp_avg_sq``
    in the optimizer's state, become views of a slice of p, m and v (state_dict and
    checkpoints see the usual per-parameter arrays)."""

    def __init__(self, params, state, backend):
        xp = backend.xp
        sizes = [p.numel() for p in params]
        self.offsets = [0]
        for n in sizes:
            self.offsets.append(self.offsets[-1] + n)
        total, dtype = self.offsets[-1], params[0].data.dtype
        self.p, self.g, self.m, self.v, self.tmp = (xp.empty(total, dtype=dtype) for _ in range(5))
        self.views = []
        for i, prm in enumerate(params):
            lo, hi = self.offsets[i], self.offsets[i + 1]
            pv, gv, mv, vv = (xp.reshape(a[lo:hi], prm.shape) for a in (self.p, self.g, self.m, self.v))
            old = state.get(id(prm))
            pv[...] = prm.data
            mv[...] = old["exp_avg"] if old else 0
            vv[...] = old["exp_avg_sq"] if old else 0
            prm.data = pv
            state[id(prm)] = {"step": old["step"] if old else 0, "exp_avg": mv, "exp_avg_sq": vv}
            self.views.append((prm, pv, gv, mv, vv))

    def holds(self, params, state):
        """True while every parameter and moment is still the view made here (nothing
        replaced them: load_state_dict, model.to(...), p.data = ... all do)."""
        if len(params) != len(self.views):
            return False
        for prm, (own, pv, _, mv, vv) in zip(params, self.views):
            s = state.get(id(prm))
            if prm is not own or prm.data is not pv or s is None or s["exp_avg"] is not mv or s["exp_avg_sq"] is not vv:
                return False
        return True

    def gather_grads(self, params):
        for prm, (_, _, gv, _, _) in zip(params, self.views):
            gv[...] = prm.grad.data

    def group_ranges(self, groups):
        """(start, stop) in the flat arrays of each group's parameters (they are in order)."""
        start = 0
        for group in groups:
            n = len(group["params"])
            yield self.offsets[start], self.offsets[start + n]
            start += n
