"""ta.compile: the fast layer, asked for by name (PyTorch's name, nanoGPT's --compile).

    model = ta.compile(model)          # its fused blocks, fast ops and decoding on arrays
    optimizer = model.configure_optimizer(...)      # and AdamW's flat step (fused=True)

Without it nothing here runs: every op runs its teaching formula, as PyTorch eager
runs its own ops. A call of the compiled model runs the model's own forward with,
for the length of the call and in its thread, each op's fast version in place of
its formula and each layer the fast layer knows run by its runner
(``autograd.compiled``, read by Function.apply and Module.__call__). Each call
first asks checked.py which of those may run: an edit of the code they stand in
for, or a replacement made while the program runs, turns them off, saying so.

Unlike PyTorch's, the compiled model's ``state_dict`` has the model's own keys (no
``_orig_mod.`` prefix), so a checkpoint saved from it loads into the model itself.
"""
import contextlib
import functools
import inspect
import threading

from .. import autograd
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


class _Outermost(threading.local):
    allowed = None          # the paths the outermost compiled call running in this thread allowed


_outermost = _Outermost()


@contextlib.contextmanager
def running(layers=None):
    """Inside, in this thread: every op's fast version, and ``layers`` ({layer: runner}) in place of
    those layers' forwards, each while the code it stands in for is the library's (checked.allowed:
    asked by the outermost compiled call; one inside it, a compiled model called by a compiled
    function, runs as it was told)."""
    outermost = _outermost.allowed is None
    allowed = checked.allowed() if outermost else _outermost.allowed
    state = autograd.compiled
    before = state.ops, state.layers, _outermost.allowed
    state.ops = FAST_OPS if "the fast ops" in allowed else {}
    state.layers = layers if "the fused layers" in allowed else None
    _outermost.allowed = allowed
    try:
        yield
    finally:
        state.ops, state.layers, _outermost.allowed = before


class CompiledModule(Module):
    """What ta.compile returns for a Module: the model itself (``_orig_mod``, as in PyTorch), run
    on the fast layer. Every attribute is the model's, looked up on it each time: its parameters,
    state_dict, config, train() and eval() (which return the compiled model); its own methods
    (``generate``) run compiled too, and ``configure_optimizer`` asks for AdamW's flat step.
    print() shows how each layer runs."""

    def __init__(self, model):                           # (no Module.__init__: nothing is the wrapper's own)
        object.__setattr__(self, "_orig_mod", model)
        object.__setattr__(self, "_layers", (None, None))   # (nn.modules.changes when walked, {layer: runner})

    def __getattribute__(self, name):                    # (the model's, but for what this class defines)
        if name.startswith("__") or name in _OWN:
            return object.__getattribute__(self, name)
        model = object.__getattribute__(self, "_orig_mod")
        value = getattr(model, name)
        if not (inspect.ismethod(value) and value.__self__ is model):
            return value
        runs_the_model = getattr(type(model), name, None) is not getattr(Module, name, None)   # (not Module's own)

        @functools.wraps(value)
        def method(*args, **kwargs):                     # a method of the model (its own: run compiled)
            with running(self._runners()) if runs_the_model else contextlib.nullcontext():
                out = value(*args, **kwargs)
            return self if out is model else out
        return method

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

    def __setattr__(self, name, value):
        setattr(self._orig_mod, name, value)

    def __len__(self):                                   # (a compiled Sequential or ModuleList, as the model)
        return len(self._orig_mod)

    def __iter__(self):
        return iter(self._orig_mod)

    def __getitem__(self, index):
        return self._orig_mod[index]

    def __dir__(self):
        return dir(self._orig_mod)

    def __delattr__(self, name):
        delattr(self._orig_mod, name)

    def configure_optimizer(self, *args, **kwargs):
        """The model's optimizer, with AdamW's flat step (fused=True) unless told otherwise (where the
        model's configure_optimizer takes ``fused``)."""
        configure = self._orig_mod.configure_optimizer
        if "fused" in inspect.signature(configure).parameters:
            kwargs.setdefault("fused", True)
        return configure(*args, **kwargs)

    def __repr__(self):
        allowed, layers = checked.allowed(), self._runners()
        off = "" if "the fused layers" in allowed else "off, not the library's code (see the line on stderr)"

        def note(layer):
            runner = layers.get(layer)
            return None if runner is None else f"fused: {off}" if off else runner.describe(layer)
        paths = ", ".join(f"{path}: {'on' if path in allowed else 'off'}" for path in checked.DEPENDS)
        return f"CompiledModule({paths}\n  (_orig_mod): " + self._orig_mod._tree(note).replace("\n", "\n  ") + "\n)"


_OWN = {"_orig_mod", "_layers", "_runners", "forward", "configure_optimizer"}      # (CompiledModule's own)
