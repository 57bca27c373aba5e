"""The engine's one hook point, shared by the learner tools.

While ``ta.detect_anomaly()`` or ``ta.profile()`` runs, the engine's module
variable ``hooks`` holds the ``Hooks`` below, and every op's forward and
backward goes through it. Outside those blocks it is None, and the engine
pays one ``is None`` test per op: nothing else.

A tool is an object with four methods, each called around the op's own code:
``before_forward(ctx, inputs)``, ``after_forward(ctx, inputs, data)``,
``before_backward(ctx, grad)``, ``after_backward(ctx, grad, grads)``; and
``failed(ctx)`` when the op raised instead (its "after" hook never comes).
``before_module(module)`` comes when a Module is called, before its forward.
For an op with several outputs, ``data`` and ``grad`` are tuples (one per
output; a gradient may be None). The engine's own checks of what forward and
backward return run before the tools see it, so a broken op gets the same
error with or without a tool.
Ops run inside another op's backward (backward formulas use Tensor ops) are
part of that backward: tools see them as ``nested``.
"""
from . import autograd as _engine


class Hooks:
    def __init__(self):
        self.tools = []          # outermost first: each tool's "before" runs before the next one's
        self.backward_depth = 0  # > 0 while an op's backward runs

    def forward(self, ctx, inputs, arrays, params):
        if self.backward_depth:                    # an op inside a backward formula
            return ctx.forward(*arrays, **params)
        for tool in self.tools:
            tool.before_forward(ctx, inputs)
        try:                                       # the engine's checks first: tools see only arrays
            data = ctx.forward(*arrays, **params)
            data = (tuple(_engine.forward_result(ctx, a) for a in data) if type(data) is tuple
                    else _engine.forward_result(ctx, data))
        except BaseException:
            self._failed(ctx)
            raise
        for tool in reversed(self.tools):
            tool.after_forward(ctx, inputs, data)
        return data

    def backward(self, ctx, grad):
        for tool in self.tools:
            tool.before_backward(ctx, grad)
        self.backward_depth += 1
        try:                                       # the Function contract first: tools see Tensors
            raw = ctx.backward(*grad) if type(grad) is tuple else ctx.backward(grad)   # tuple: several outputs
            grads = _engine.check_backward_grads(ctx, raw)
        except BaseException:
            self._failed(ctx)
            raise
        finally:
            self.backward_depth -= 1
        for tool in reversed(self.tools):
            tool.after_backward(ctx, grad, grads)
        return grads

    def module_called(self, module):
        """A Module is about to run its forward (Module.__call__)."""
        if not self.backward_depth:
            for tool in self.tools:
                tool.before_module(module)

    def _failed(self, ctx):
        for tool in reversed(self.tools):
            tool.failed(ctx)


def install(tool):
    """Start routing ops through ``tool`` (tools with a lower ``order`` wrap the others)."""
    if _engine.hooks is None:
        _engine.hooks = Hooks()
    tools = _engine.hooks.tools
    tools.append(tool)
    tools.sort(key=lambda t: t.order)


def uninstall(tool):
    hooks = _engine.hooks
    if hooks is None or tool not in hooks.tools:
        return
    hooks.tools.remove(tool)
    if not hooks.tools:
        _engine.hooks = None


class Tool:
    """A tool that does nothing; subclasses override what they need."""
    order = 0

    def before_module(self, module):
        pass

    def before_forward(self, ctx, inputs):
        pass

    def after_forward(self, ctx, inputs, data):
        pass

    def before_backward(self, ctx, grad):
        pass

    def after_backward(self, ctx, grad, grads):
        pass

    def failed(self, ctx):
        """The op's forward or backward raised: its "after" hook will not come."""

    def __enter__(self):
        install(self)
        return self

    def __exit__(self, *exc):
        uninstall(self)
        return False
