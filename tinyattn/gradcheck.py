"""Gradient checks: analytic gradients against central differences, in float64.

The scalar that is differentiated is <u, f(x)> for a random cotangent u, so
every output element counts with its own weight. (Summing the outputs would
pass a softmax whose backward returns zero, since its rows sum to one.)

mode="fast" compares one random direction v over all inputs at once:
<grad, v> against (L(x + eps v) - L(x - eps v)) / 2 eps. When it fails, the
full per-element comparison runs to name the worst input and index.
mode="full" compares every element of every input.
"""
from .backend import get_backend, float64
from .autograd import enable_grad, grad, is_grad_enabled, no_grad
from .hooks import Tool
from .ops import constant
from .tensor import Tensor


class GradcheckError(AssertionError):
    pass


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _differentiable(inputs):
    out = [i for i, t in enumerate(inputs) if isinstance(t, Tensor) and t.requires_grad]
    for i in out:
        if inputs[i].dtype != float64:
            raise ValueError(f"gradcheck needs float64 inputs; input {i} is {inputs[i].dtype}")
    if not out:
        raise ValueError("gradcheck: no input has requires_grad=True")
    return out


class _Objective:
    """L(x) = sum_k <u_k, f(x)_k> with fixed random cotangents u_k."""

    def __init__(self, fn, inputs, seed):
        self.fn, self.inputs = fn, inputs
        with no_grad():
            outs = _as_tuple(fn(*inputs))
        rng = get_backend("cpu").xp.random.default_rng(seed)       # its own generator: ta's is untouched
        self.cotangents = [constant(o, o.backend.asarray(rng.standard_normal(o.shape)))
                           if _is_float(o) else None for o in outs]

    def value(self):
        with no_grad():
            outs = _as_tuple(self.fn(*self.inputs))
        total = 0.0
        for o, u in zip(outs, self.cotangents):
            if u is not None:
                total += float(o.xp.sum(o.data * u.data))
        return total

    def analytic(self, diff):
        outs = _as_tuple(self.fn(*self.inputs))
        pairs = [(o, u) for o, u in zip(outs, self.cotangents) if u is not None and o.requires_grad]
        if not pairs:
            return [None] * len(diff)
        grads = grad([o for o, _ in pairs], [self.inputs[i] for i in diff],
                     grad_outputs=[u for _, u in pairs], allow_unused=True)
        return [None if g is None else g.numpy() for g in grads]

    def numeric_along(self, directions, eps):
        """(L(x + eps v) - L(x - eps v)) / (2 eps), with v given per input (host arrays)."""
        saved = {i: self.inputs[i].data for i in directions}
        values = []
        try:
            for sign in (1.0, -1.0):
                for i, v in directions.items():
                    t = self.inputs[i]
                    t.data = saved[i] + t.backend.asarray(sign * eps * v)
                values.append(self.value())
        finally:                                     # the inputs get their values back, even if fn raised
            for i in directions:
                self.inputs[i].data = saved[i]
        return (values[0] - values[1]) / (2 * eps)


def _is_float(t):
    return t.dtype.kind == "f"


def _full_compare(obj, diff, analytic, eps, atol, rtol):
    """Per-element check; returns (input, index, analytic, numeric) of the worst or None."""
    np = get_backend("cpu").xp
    worst, worst_excess = None, 0.0
    for k, i in enumerate(diff):
        shape = obj.inputs[i].shape
        a = np.zeros(shape) if analytic[k] is None else analytic[k]
        for idx in np.ndindex(*shape):
            v = np.zeros(shape)
            v[idx] = 1.0
            n = obj.numeric_along({i: v}, eps)
            excess = abs(a[idx] - n) - (atol + rtol * abs(n))
            if excess > worst_excess:
                worst, worst_excess = (i, idx, float(a[idx]), n), excess
    return worst


def gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, mode="fast", seed=0, raise_exception=True):
    """Check fn's first derivatives at ``inputs`` (float64 tensors with requires_grad).

    Returns True, or raises GradcheckError naming the input, the worst index,
    and the analytic and numeric values (with raise_exception=False: False).
    """
    inputs = _as_tuple(inputs)
    diff = _differentiable(inputs)
    obj = _Objective(fn, inputs, seed)
    analytic = obj.analytic(diff)
    np = get_backend("cpu").xp
    if mode == "fast":
        rng = np.random.default_rng(seed + 1)
        directions = {i: rng.standard_normal(inputs[i].shape) for i in diff}
        n = obj.numeric_along(directions, eps)
        a = sum(float(np.sum(analytic[k] * directions[i]))
                for k, i in enumerate(diff) if analytic[k] is not None)
        if abs(a - n) <= atol + rtol * abs(n):
            return True
        bad = _full_compare(obj, diff, analytic, eps, atol, rtol)
        message = (f"gradcheck failed along a random direction: analytic {a:.6g}, numeric {n:.6g}")
    elif mode == "full":
        bad = _full_compare(obj, diff, analytic, eps, atol, rtol)
        if bad is None:
            return True
        message = "gradcheck failed"
    else:
        raise ValueError(f"gradcheck: mode must be 'fast' or 'full', not {mode!r}")
    if bad is not None:
        i, idx, a_val, n_val = bad
        message += (f"; worst element: input {i} (shape {inputs[i].shape}) at index {idx}: "
                    f"analytic {a_val:.6g}, numeric {n_val:.6g}")
    if raise_exception:
        raise GradcheckError(message)
    return False


class _GraphlessBackwards(Tool):
    """Records the ops whose backward, while create_graph records it, returned a gradient with no
    graph although their inputs need one: a backward on raw arrays (``.data``, ``self.xp``)."""

    def __init__(self):
        self.ops = []

    def after_backward(self, ctx, grad, grads):
        if is_grad_enabled() and any(
                g is not None and not g.requires_grad and p.requires_grad and g is not grad
                for g, p in zip(grads, ctx.parents)):
            name = type(ctx).__name__
            if name not in self.ops:
                self.ops.append(name)


def gradgradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, mode="fast", seed=0, raise_exception=True):
    """Check fn's second derivatives: gradcheck of x -> d<u, fn(x)>/dx, built with create_graph."""
    inputs = _as_tuple(inputs)
    diff = _differentiable(inputs)
    obj = _Objective(fn, inputs, seed + 7)

    def first_derivatives(*xs):
        with enable_grad():   # gradcheck evaluates this under no_grad
            outs = _as_tuple(fn(*xs))
            pairs = [(o, u) for o, u in zip(outs, obj.cotangents) if u is not None]
            grads = grad([o for o, _ in pairs], [xs[i] for i in diff], grad_outputs=[u for _, u in pairs],
                         create_graph=True, allow_unused=True)
        return tuple(g if g is not None else xs[i] * 0.0 for g, i in zip(grads, diff))

    try:
        return gradcheck(first_derivatives, inputs, eps, atol, rtol, mode, seed, raise_exception=True)
    except GradcheckError as e:
        with _GraphlessBackwards() as graphless:    # why: a backward that the engine cannot see through?
            first_derivatives(*inputs)
        message = str(e)
        if graphless.ops:
            names = " and ".join(f"{name}.backward" for name in graphless.ops)
            message = (f"{names} returned a gradient with no graph: it works on raw arrays (.data, self.xp or "
                       "numpy), so the engine cannot differentiate it again and the second derivatives "
                       "through it come out as 0. Write it with Tensor ops on g, self.parents and "
                       "self.output, or declare differentiable_backward = False on the Function "
                       f"(then create_graph=True says so plainly). ({message})")
        if raise_exception:
            raise GradcheckError(message) from None
        return False
