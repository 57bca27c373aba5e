"""ta.compile: the fast layer, asked for by name (PyTorch's name, nanoGPT's --compile).

    model = ta.compile(model)          # its fused blocks, fast ops and decoding on arrays
    optimizer = model.configure_optimizer(...)      # and AdamW's flat step (fused=True)

Without it nothing here runs: every op runs its teaching formula, as PyTorch eager
runs its own ops. A call of the compiled model runs the model's own forward with,
for the length of the call, each op's fast version in place of its formula
(``backend.fast_ops``, read by Function.apply) and each layer the fast layer knows
run by its runner (``nn.modules.compiled``, read by Module.__call__). Each call
first asks checked.py which of those may run: an edit of the code they stand in
for, or a replacement made while the program runs, turns them off, saying so.

Unlike PyTorch's, the compiled model's ``state_dict`` has the model's own keys (no
``_orig_mod.`` prefix), so a checkpoint saved from it loads into the model itself.
"""
import contextlib
import functools
import inspect

from ..backend import made_backends
from ..nn import modules
from ..nn.modules import Module
from . import checked
from .models import runners
from .ops import FAST_OPS


def compile(model=None, *, disable=False):
    """``model`` run on the fast layer: a Module (returns a CompiledModule) or a function (returns
    a function). ``ta.compile()`` is a decorator; ``disable=True`` returns ``model`` as it is."""
    if model is None:
        return functools.partial(compile, disable=disable)
    if disable or isinstance(model, CompiledModule):
        return model
    checked.allowed()                                    # (what steps aside is said now, once)
    if isinstance(model, Module):
        return CompiledModule(model)
    if not callable(model):
        raise TypeError(f"ta.compile: expected a Module or a function, got {type(model).__name__}")

    @functools.wraps(model)
    def compiled(*args, **kwargs):
        with running():
            return model(*args, **kwargs)
    return compiled


_inside = []                # the paths allowed by each compiled call running now (outermost first)


@contextlib.contextmanager
def running(layers=None):
    """Inside: every op's fast version, and ``layers`` ({layer: runner}) in place of those layers'
    forwards, each while the code it stands in for is the library's (checked.allowed: asked by the
    outermost compiled call; one inside it, a compiled model called by a compiled function, runs
    as it was told)."""
    allowed = _inside[0] if _inside else checked.allowed()
    ops = FAST_OPS if "the fast ops" in allowed else {}
    before = modules.compiled, [(backend, backend.fast_ops) for backend in made_backends()]
    modules.compiled = layers if "the fused layers" in allowed else None
    for backend, _ in before[1]:
        backend.fast_ops = ops
    _inside.append(allowed)
    try:
        yield
    finally:
        _inside.pop()
        modules.compiled = before[0]
        for backend, was in before[1]:
            backend.fast_ops = was


class CompiledModule(Module):
    """What ta.compile returns for a Module: the model itself (``_orig_mod``, as in PyTorch), run
    on the fast layer. Every attribute is the model's: its parameters, state_dict, config, train()
    and eval(); its methods (``generate``) run compiled too, and ``configure_optimizer`` asks for
    AdamW's flat step. print() shows how each layer runs."""

    def __init__(self, model):                           # (no Module.__init__: nothing is the wrapper's own)
        object.__setattr__(self, "_orig_mod", model)
        object.__setattr__(self, "_layers", (None, None))   # (nn.modules.changes when walked, {layer: runner})
        for name, fn in vars(Module).items():            # Module's methods that the model's class has its own of
            if callable(fn) and not name.startswith("__") and name not in vars(CompiledModule) \
                    and getattr(type(model), name, fn) is not fn:
                object.__setattr__(self, name, self.__getattr__(name))     # (GPT.num_parameters)

    def _runners(self):
        """{layer: runner} for the model's layers, walked again after a layer's attribute was set."""
        changes, layers = self._layers
        if changes != modules.changes:
            layers = runners(self._orig_mod)
            object.__setattr__(self, "_layers", (modules.changes, layers))
        return layers

    def __call__(self, *args, **kwargs):
        with running(self._runners()):
            return self._orig_mod(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return self(*args, **kwargs)

    def __getattr__(self, name):                         # (what the wrapper does not have: the model's)
        value = getattr(self._orig_mod, name)
        if not (inspect.ismethod(value) and value.__self__ is self._orig_mod):
            return value

        @functools.wraps(value)
        def method(*args, **kwargs):                     # a method of the model, run compiled
            with running(self._runners()):
                out = value(*args, **kwargs)
            return self if out is self._orig_mod else out
        return method

    def __setattr__(self, name, value):
        setattr(self._orig_mod, name, value)

    def __delattr__(self, name):
        delattr(self._orig_mod, name)

    def named_modules(self, prefix=""):                  # (so parameters, state_dict, train, to: the model's)
        return self._orig_mod.named_modules(prefix)

    def configure_optimizer(self, *args, fused=True, **kwargs):
        """The model's optimizer, with AdamW's flat step (fused=True) unless told otherwise."""
        return self._orig_mod.configure_optimizer(*args, fused=fused, **kwargs)

    def __repr__(self):
        allowed, layers = checked.allowed(), self._runners()
        off = "" if "the fused layers" in allowed else "off, not the library's code (see the line on stderr)"

        def note(layer):
            runner = layers.get(layer)
            return None if runner is None else f"fused: {off}" if off else runner.describe(layer)
        paths = ", ".join(f"{path}: {'on' if path in allowed else 'off'}" for path in checked.DEPENDS)
        return f"CompiledModule({paths}\n  (_orig_mod): " + self._orig_mod.__repr__(note).replace("\n", "\n  ") + "\n)"
