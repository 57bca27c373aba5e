"""Optimizers (SGD with momentum, Adam, AdamW) and the warmup + cosine learning-rate schedule;
PyTorch's schedulers are in ``lr_scheduler.py``.

Updates work on raw arrays, in place, outside the autodiff graph. The fast
layer (``tinyattn/fast``) has a faster AdamW step with the same arithmetic,
which ``AdamW(..., fused=True)`` asks for (``configure_optimizer`` of a model made by
``ta.compile`` does).
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
        self.defaults = dict(defaults)     # the hyperparameters that a group does not set (PyTorch's name)
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
        """One update of each parameter that has a gradient: ``update(p, group)``, each optimizer's own."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.update(p, group)

    def update(self, p, group):
        raise NotImplementedError(f"{type(self).__name__} has no update (or a step of its own)")

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
    """p -= lr * g, g = grad + weight_decay * p, with heavy-ball momentum as PyTorch's:

        buf = momentum * buf + (1 - dampening) * g      (buf = g at the first step)
        g = buf,   or with nesterov=True   g = g + momentum * buf   (the step looks ahead)
    """

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov))
        for group in self.param_groups:
            if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
                raise ValueError(f"SGD: Nesterov momentum needs momentum > 0 and dampening 0, got momentum "
                                 f"{group['momentum']} and dampening {group['dampening']}")

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
                    buf = g.copy() if buf is None else buf * mom + (1 - group["dampening"]) * g
                    state["momentum_buffer"] = buf
                    g = g + mom * buf if group["nesterov"] else buf
                p.data -= lr * g


def adam_moments(states, p, g, b1, b2, amsgrad=False):
    """Adam's and AdamW's shared part: parameter p's state in ``states`` (made at its first step),
    its step count advanced and its two moments updated in place by the gradient array g.
    -> (t, m, v): the step count, the first moment and the second (with amsgrad, the running max
    of the second, which the step divides by)."""
    xp = p.xp
    state = states.get(id(p))
    if state is None:
        state = states[id(p)] = {"step": 0, "exp_avg": xp.zeros_like(p.data), "exp_avg_sq": xp.zeros_like(p.data)}
        if amsgrad:
            state["max_exp_avg_sq"] = xp.zeros_like(p.data)
    state["step"] += 1
    m, v = state["exp_avg"], state["exp_avg_sq"]
    m *= b1
    m += (1 - b1) * g                                       # first moment
    v *= b2
    v += (1 - b2) * (g * g)                                 # second moment
    if amsgrad:
        v = state["max_exp_avg_sq"] = xp.maximum(state["max_exp_avg_sq"], v)
    return state["step"], m, v


class Adam(Optimizer):
    """Adam (Kingma and Ba), as PyTorch's: moments of the gradient, corrected for their start at 0.

        g = grad + weight_decay * p          (L2 regularization: the decay goes through the moments,
                                              so it is scaled down where gradients are large; AdamW
                                              decays p directly instead)
        m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2
        p -= lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps)

    ``amsgrad=True`` divides by the largest v so far instead of v (Reddi et al.).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad))

    def update(self, p, group):
        """One Adam step for parameter ``p``, on its arrays, in place."""
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        g, xp = p.grad.data, p.xp
        if wd:
            g = g + wd * p.data                             # L2, into the gradient
        t, m, v = adam_moments(self.state, p, g, b1, b2, group["amsgrad"])
        step_size = lr / (1 - b1 ** t)                      # bias corrections
        denom = xp.sqrt(v) / math.sqrt(1 - b2 ** t) + eps
        p.data -= step_size * (m / denom)


class AdamW(Optimizer):
    """Adam with decoupled weight decay (Loshchilov and Hutter): p -= lr * wd * p, then the Adam step.

    ``fused=True`` asks for the fast layer's step on flat buffers, one pass over every parameter
    (tinyattn/fast/optim.py), with the same arithmetic, as in PyTorch; it runs while ``step`` and
    ``update`` below are the library's own, and the moments stay each parameter's, in ``state``.
    Else this loop runs.
    """

    fused_step = None       # the fast layer's step, (optimizer) -> True where it ran: set when it is imported

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, fused=False):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self.fused = fused

    def step(self):
        if self.fused and AdamW.fused_step is not None and AdamW.fused_step(self):   # (False: the loop runs)
            return
        super().step()

    def update(self, p, group):
        """One AdamW step for parameter ``p``, on its arrays, in place."""
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        g, xp = p.grad.data, p.xp
        t, m, v = adam_moments(self.state, p, g, b1, b2)
        if wd:
            p.data *= 1 - lr * wd                           # decoupled decay
        step_size = lr / (1 - b1 ** t)                      # bias corrections
        denom = xp.sqrt(v) * (1.0 / math.sqrt(1 - b2 ** t)) + eps
        p.data -= step_size * (m / denom)


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


from . import lr_scheduler  # noqa: E402,F401 (PyTorch's schedulers: they need Optimizer, above)
