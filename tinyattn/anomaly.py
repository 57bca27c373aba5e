"""``with ta.detect_anomaly():`` stop at the first op that makes a NaN or an Inf.

Inside the block every op's forward output and every gradient its backward
returns is checked, and so is every parameter a Module is about to use.
It raises a RuntimeError at the first of:

- a parameter that already holds NaN or Inf when a Module is called (named by
  its path, ``blocks.0.attn.c_attn.weight``: it went bad before this forward,
  say by an optimizer step on a NaN gradient);
- an op whose forward output holds NaN, or Inf when none of its inputs did
  (a ``masked_fill(mask, float('-inf'))`` passes: its -inf is an input);
- an op whose backward returns a gradient holding NaN or Inf.

The message names the op (its Function class), the pass (forward or
backward), the input shapes and the line of your code that created the op.
Ops also get read-only input arrays inside the block (on the CPU), so one
that writes into its input is stopped there. Outside the block nothing is
checked and nothing is paid.

    with ta.detect_anomaly():
        loss = model(x, y)[1]
        loss.backward()
"""
import contextlib
import linecache
import os
import sys

from .hooks import Tool

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


_ENGINE_FILES = {os.path.join(_PACKAGE_DIR, f) for f in ("autograd.py", "tensor.py", "ops.py", "hooks.py", "anomaly.py")}


def _where(frame):
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    return f"{where}: {line}" if line else where


def _creation_site():
    """Where the op being applied was created: the innermost line of your code
    ('train.py:12: y = x.log()'), and the library line inside tinyattn that
    called it when there is one ('in tinyattn/nn/functional.py:80: ...')."""
    frame, library = sys._getframe(1), None
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(_PACKAGE_DIR + os.sep):
            user = _where(frame)
            if library is None:
                return user
            return f"{user} (in {os.path.relpath(library.f_code.co_filename, os.path.dirname(_PACKAGE_DIR))}:" \
                   f"{library.f_lineno}: {linecache.getline(library.f_code.co_filename, library.f_lineno).strip()})"
        if library is None and filename not in _ENGINE_FILES:
            library = frame
        frame = frame.f_back
    return None


def _bad_values(backend, array):
    """'NaN', 'Inf', 'NaN and Inf' or None: what non-finite values the array holds."""
    if backend.dtype_of(array).kind not in "fc":          # integers and booleans are always finite
        return None
    xp = backend.xp
    if bool(xp.all(xp.isfinite(array))):      # one device read: fine inside the block
        return None
    has_nan, has_inf = bool(xp.any(xp.isnan(array))), bool(xp.any(xp.isinf(array)))
    return " and ".join(name for name, found in (("NaN", has_nan), ("Inf", has_inf)) if found)


def _describe_inputs(shapes_dtypes):
    return ", ".join(f"{tuple(shape)} {dtype}" for shape, dtype in shapes_dtypes)


class _AnomalyTool(Tool):
    order = 0      # outermost: its checks are not timed by a profiler running alongside

    def __init__(self):
        self.names = {}           # id(parameter) -> its path in the first Module called that holds it

    def before_module(self, module):
        """Name the module's parameters (the outermost module is called first, so the paths are
        full), and stop if one already holds NaN or Inf."""
        for name, p in module.named_parameters():
            name = self.names.setdefault(id(p), name)
            bad = _bad_values(p.backend, p.data)
            if bad:
                raise RuntimeError(f"detect_anomaly: parameter '{name}' {p.shape} holds {bad} before "
                                   f"{type(module).__name__}'s forward: it went bad earlier (an optimizer "
                                   "step on a NaN gradient, a learning rate too high, or a NaN loaded)")

    def before_forward(self, ctx, inputs):
        ctx.anomaly_site = _creation_site()
        ctx.anomaly_inputs = [(t.shape, t.dtype) for t in inputs]
        for i, t in enumerate(inputs):                  # made outside the block, or a parameter used bare
            bad = _bad_values(ctx.backend, t.data)
            if bad and (t.grad_fn is None or "NaN" in bad) and (t.requires_grad or "NaN" in bad):
                what = f"the parameter '{self.names[id(t)]}'" if id(t) in self.names else \
                    ("a leaf tensor" if t.grad_fn is None else f"made by {type(t.grad_fn).__name__} outside the block")
                raise RuntimeError(self._message(ctx, "forward", f"its input {i} {t.shape}, {what}, already "
                                                                 f"holds {bad} before this op"))

    def after_forward(self, ctx, inputs, data):
        inputs_inf = None
        for array in data if type(data) is tuple else (data,):          # a tuple: several outputs
            bad = _bad_values(ctx.backend, array)
            if bad == "Inf":                                 # Inf passed on (a -inf mask) is no anomaly
                if inputs_inf is None:
                    inputs_inf = any("Inf" in (_bad_values(ctx.backend, t.data) or "") for t in inputs)
                bad = None if inputs_inf else bad
            if bad:
                raise RuntimeError(self._message(ctx, "forward", f"its output {tuple(array.shape)} holds {bad}"))

    def after_backward(self, ctx, grad, grads):
        for i, g in enumerate(grads):
            bad = None if g is None else _bad_values(ctx.backend, g.data)
            if bad:
                raise RuntimeError(self._message(
                    ctx, "backward", f"the gradient it returned for input {i} {g.shape} holds {bad}"))

    @staticmethod
    def _message(ctx, phase, what):
        inputs = getattr(ctx, "anomaly_inputs", None)
        if inputs is None and ctx.__dict__.get("parents"):
            inputs = [(t.shape, t.dtype) for t in ctx.parents]
        shapes = _describe_inputs(inputs) if inputs else "not recorded"
        site = getattr(ctx, "anomaly_site", None)
        created = (f"; the op was created at {site}" if site else
                   "; the op was created outside detect_anomaly(), so its line was not recorded")
        return (f"detect_anomaly: {type(ctx).__name__} {phase}: {what} (inputs: {shapes}){created}")


@contextlib.contextmanager
def detect_anomaly():
    """Raise at the first op whose forward output or backward gradient holds NaN or Inf."""
    with _AnomalyTool():
        yield
