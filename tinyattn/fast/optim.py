"""The fast AdamW: the same arithmetic as ``tinyattn.optim.AdamW``, one pass per group over flat buffers."""
import math

from .. import optim


class AdamW(optim.AdamW):
    """Where every parameter has a gradient and the same step count on one host backend, the
    parameters and both moments live in one flat array each (each parameter's ``.data`` and
    state are views into them), so a group's update is a few whole-array passes with no
    temporaries, or one pass of the ``adamw_`` kernel; the numbers are bit for bit the
    teaching loop's. Elsewhere, the loop, each parameter by the kernel where it takes it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._flat = None

    def step(self):
        if not self._fused_step():
            super().step()

    def update(self, p, group):
        """The kernel, where it takes this parameter; else the teaching arithmetic."""
        if p.backend.kernel("adamw_") is not None:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            if id(p) not in self.state:
                self.state[id(p)] = {"step": 0, "exp_avg": p.xp.zeros_like(p.data),
                                     "exp_avg_sq": p.xp.zeros_like(p.data)}
            state = self.state[id(p)]
            t = state["step"] + 1
            if p.backend.run_kernel("adamw_", p.data, p.grad.data, state["exp_avg"], state["exp_avg_sq"],
                                    lr, b1, b2, eps, wd, t) is not None:
                state["step"] = t
                return
        super().update(p, group)

    def _fused_step(self):
        """The step on flat buffers, where it can run: every parameter has a gradient and the
        same step count, on one host backend. Returns False where it cannot run."""
        params = self.parameters()
        backend = params[0].backend
        if not (backend.on_host and backend.ufunc_out):
            return False
        if any(p.grad is None or p.backend is not backend or p.dtype != params[0].dtype for p in params):
            return False
        steps = {self.state[id(p)]["step"] if id(p) in self.state else 0 for p in params}
        if len(steps) != 1:
            return False
        if self._flat is None or not self._flat.holds(params, self.state):
            self._flat = _FlatAdamState(params, self.state, backend)
        flat = self._flat
        flat.gather_grads(params)
        t = steps.pop() + 1
        for p in params:
            self.state[id(p)]["step"] = t
        for group, (lo, hi) in zip(self.param_groups, flat.group_ranges(self.param_groups)):
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
