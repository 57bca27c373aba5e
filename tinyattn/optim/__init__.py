"""Optimizers (SGD with momentum, AdamW) and the warmup + cosine learning-rate schedule.

Updates work on raw arrays, in place, outside the autodiff graph.
"""
import math
import numbers

from ..tensor import Tensor


class Optimizer:
    """Holds parameter groups (dicts with "params" and hyperparameters) and per-parameter state."""

    def __init__(self, params, defaults):
        if isinstance(params, Tensor):
            raise TypeError(f"{type(self).__name__}: params must be a list of Tensors (or of dicts), "
                            "not one Tensor: pass [t]")
        if hasattr(params, "parameters") and hasattr(params, "named_modules"):
            raise TypeError(f"{type(self).__name__}: pass model.parameters(), not the model")
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__} got an empty list of parameters")
        if isinstance(params[0], Tensor):
            params = [{"params": params}]
        self.param_groups = []
        seen = set()
        for group in params:
            group = {**defaults, **group, "params": list(group["params"])}
            _check_hyperparameters(type(self).__name__, group)
            for p in group["params"]:
                _check_param(type(self).__name__, p)
                if id(p) in seen:
                    raise ValueError("a parameter appears in more than one group (a tied weight counts once)")
                seen.add(id(p))
            self.param_groups.append(group)
        self.state = {}                    # id(param) -> dict of arrays

    def parameters(self):
        return [p for g in self.param_groups for p in g["params"]]

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    def step(self):
        raise NotImplementedError

    # --- saving: state keyed by the parameter's position, values on the host ---
    def state_dict(self):
        state = {}
        for i, p in enumerate(self.parameters()):
            if id(p) in self.state:
                state[i] = {k: (p.backend.to_numpy(v).copy() if not isinstance(v, (int, float)) else v)
                            for k, v in self.state[id(p)].items()}
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, saved):
        params = self.parameters()
        if len(saved["param_groups"]) != len(self.param_groups):
            raise ValueError(f"optimizer state has {len(saved['param_groups'])} groups, "
                             f"this optimizer has {len(self.param_groups)}")
        for group, hyper in zip(self.param_groups, saved["param_groups"]):
            group.update(hyper)
        self.state = {}
        if saved["state"] and max(int(i) for i in saved["state"]) >= len(params):
            raise ValueError(f"optimizer state is for {max(int(i) for i in saved['state']) + 1} or more "
                             f"parameters, this optimizer has {len(params)}")
        for i, values in saved["state"].items():
            p = params[int(i)]
            for k, v in values.items():                  # a moment of another shape would broadcast silently
                if not isinstance(v, (int, float)) and tuple(v.shape) != p.shape:
                    raise ValueError(f"optimizer state {k!r} of parameter {i} has shape {tuple(v.shape)}, "
                                     f"the parameter has shape {p.shape}: it is another model's state")
            self.state[id(p)] = {k: (v if isinstance(v, (int, float)) else p.backend.asarray(v, p.dtype))
                                 for k, v in values.items()}


def _check_param(opt, p):
    """Optimizers update leaves: a computed tensor (``w * 2``) gets no ``.grad`` to step with."""
    if not isinstance(p, Tensor):
        raise TypeError(f"{opt}: parameters must be Tensors, got {type(p).__name__}")
    if not p.is_leaf:
        raise ValueError(f"{opt} can't optimize a non-leaf tensor (shape {p.shape}, made by "
                         f"{type(p.grad_fn).__name__}): pass the leaf it was computed from, "
                         "or p.detach().requires_grad_()")
    if p.dtype.kind != "f":
        raise TypeError(f"{opt}: parameters must be float tensors, got {p.dtype}")


def _check_hyperparameters(opt, group):
    """Finite, non-negative rates; betas in [0, 1)."""
    for key in ("lr", "momentum", "weight_decay", "eps"):
        if key in group and not (isinstance(group[key], numbers.Real) and math.isfinite(group[key])
                                 and group[key] >= 0):
            raise ValueError(f"{opt}: {key} must be a finite number >= 0, got {group[key]}")
    for b in group.get("betas", ()):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"{opt}: betas must be in [0, 1), got {tuple(group['betas'])}")


class SGD(Optimizer):
    """p -= lr * (g + weight_decay * p), with heavy-ball momentum: buf = momentum * buf + g."""

    def __init__(self, params, lr=1e-2, momentum=0.0, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    def step(self):
        for group in self.param_groups:
            lr, mom, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.data
                if wd:
                    g = g + wd * p.data
                if mom:
                    state = self.state.setdefault(id(p), {})
                    buf = state.get("momentum_buffer")
                    state["momentum_buffer"] = g.copy() if buf is None else buf * mom + g
                    g = state["momentum_buffer"]
                p.data -= lr * g


class AdamW(Optimizer):
    """Adam with decoupled weight decay (Loshchilov and Hutter): p -= lr * wd * p, then the Adam step."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self._flat = None

    def step(self):
        if self._fused_step():
            return
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.data
                xp = p.xp
                state = self.state.get(id(p))
                if state is None:
                    state = self.state[id(p)] = {"step": 0, "exp_avg": xp.zeros_like(p.data),
                                                 "exp_avg_sq": xp.zeros_like(p.data)}
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                if p.backend.run_kernel("adamw_", p.data, g, m, v, lr, b1, b2, eps, wd, t):
                    continue                                        # a fused kernel did all of the below
                m *= b1
                m += (1 - b1) * g                                   # first moment
                v *= b2
                v += (1 - b2) * (g * g)                             # second moment
                if wd:
                    p.data *= 1 - lr * wd                           # decoupled decay
                step_size = lr / (1 - b1 ** t)
                denom = xp.sqrt(v) * (1.0 / math.sqrt(1 - b2 ** t)) + eps
                p.data -= step_size * (m / denom)


    # --- the fused step: one pass per group over flat buffers -----------------------
    def _fused_step(self):
        """The step below on flat buffers, where it can run: every parameter has a gradient
        and the same step count, on one host backend. The
        parameters and both moments then live in one flat array each (each parameter's
        ``.data`` and state are views into them), so a group's update is a few whole-array
        passes with no temporaries (or one pass of the backend's ``adamw_`` kernel), and
        the numbers are bit for bit the loop's. Returns
        False where it cannot run (the loop below does the step)."""
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
            if backend.run_kernel("adamw_", p, g, m, v, lr, b1, b2, eps, wd, t):
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


def warmup_cosine(step, max_lr, min_lr, warmup_iters, lr_decay_iters):
    """nanoGPT's schedule: linear warmup to max_lr, cosine down to min_lr at lr_decay_iters, then flat."""
    if step < warmup_iters:
        return max_lr * (step + 1) / (warmup_iters + 1)
    if step > lr_decay_iters:
        return min_lr
    ratio = (step - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)


def set_lr(optimizer, lr):
    for group in optimizer.param_groups:
        group["lr"] = lr
