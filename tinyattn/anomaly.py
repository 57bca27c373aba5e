"""``with ta.detect_anomaly():`` stop at the first op that makes a NaN or an Inf.

Inside the block every op's forward output and every gradient its backward
returns is checked. The first one holding NaN or Inf raises a RuntimeError
that names the op (its Function class), the pass (forward or backward), the
input shapes and the line of your code that created the op. Outside the
block nothing is checked and nothing is paid.

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

    def before_forward(self, ctx, inputs):
        ctx.anomaly_site = _creation_site()
        ctx.anomaly_inputs = [(t.shape, t.dtype) for t in inputs]

    def after_forward(self, ctx, inputs, data):
        for array in data if type(data) is tuple else (data,):          # a tuple: several outputs
            bad = _bad_values(ctx.backend, array)
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
