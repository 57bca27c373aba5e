"""The reverse-mode autodiff engine: grad mode, Function, and the backward pass.

Every op is a ``Function`` subclass: ``forward`` works on raw arrays,
``backward`` gets the output gradient as a Tensor and returns one gradient
Tensor (or None) per input. ``Function.apply`` runs forward and, when a
gradient is needed, links the output to its inputs. ``backward`` walks that
graph once in topological order, from the output to the leaves, and adds up
the gradients. Backward formulas use Tensor ops, so ``create_graph=True``
records them and gradients of gradients work.

This file knows nothing of the Tensor API: it only reads a tensor's
``data``, ``backend``, ``requires_grad``, ``grad`` and ``grad_fn``, and builds
outputs with the Tensor class that ``tinyattn/tensor.py`` hands it.
"""
import contextlib
import weakref

_grad_enabled = True
_Tensor = None          # the Tensor class: set once by tinyattn/tensor.py (use_tensor_class)


def use_tensor_class(cls):
    """Tell the engine which class wraps op outputs (tinyattn.Tensor)."""
    global _Tensor
    _Tensor = cls


def is_tensor(x):
    return isinstance(x, _Tensor)


def wrap(array, backend, requires_grad=False):
    """A Tensor around an array already on ``backend``: no copy, no graph."""
    return _Tensor._make(array, backend, requires_grad)


# --------------------------------------------------------------------------
# grad mode
# --------------------------------------------------------------------------
@contextlib.contextmanager
def set_grad_enabled(mode):
    """Turn graph recording on or off inside a ``with`` block."""
    global _grad_enabled
    previous, _grad_enabled = _grad_enabled, bool(mode)
    try:
        yield
    finally:
        _grad_enabled = previous


class no_grad(contextlib.ContextDecorator):
    """``with ta.no_grad():`` or ``@ta.no_grad()``: ops record no graph."""

    def __enter__(self):
        self._cm = set_grad_enabled(False)
        self._cm.__enter__()

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


class enable_grad(no_grad):
    def __enter__(self):
        self._cm = set_grad_enabled(True)
        self._cm.__enter__()


def is_grad_enabled():
    return _grad_enabled


# --------------------------------------------------------------------------
# Function: one op, forward and backward side by side
# --------------------------------------------------------------------------
class Function:
    """Base class of every differentiable op, and of learners' own ops.

    Subclass it, write ``forward(self, *arrays, **params) -> array`` and
    ``backward(self, grad) -> grads``, then call ``MyOp.apply(*tensors, **params)``.
    Inside them: ``self.xp`` is the array namespace, ``self.backend`` the
    device's backend, ``self.parents`` the input Tensors, ``self.output`` the
    output Tensor, ``self.needs_input_grad`` a tuple of bools. Arrays that
    backward needs go through ``self.save(...)`` in forward and come back as
    the tuple ``self.saved``; the engine frees them after backward.
    """

    registry = []                  # every Function subclass, for the op-table coverage test
    trace = None                   # a set that records applied ops, while the coverage test runs
    differentiable_backward = True  # False: backward works on raw arrays (a fused kernel)
    saved = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        Function.registry.append(cls)

    def forward(self, *arrays, **params):
        raise NotImplementedError(f"{type(self).__name__} has no forward")

    def backward(self, grad):
        raise NotImplementedError(f"{type(self).__name__} has no backward")

    def save(self, *arrays):
        """Keep arrays for backward (as ``self.saved``); freed once backward has run."""
        self.saved = arrays

    def constant(self, array):
        """A Tensor without gradient around ``array``, on this op's device (for backward)."""
        return wrap(array, self.backend)

    @property
    def output(self):
        return self._output()

    @classmethod
    def apply(cls, *inputs, **params):
        backend = _common_backend(inputs, cls.__name__)
        ctx = cls()
        ctx.backend, ctx.xp = backend, backend.xp
        if Function.trace is not None:
            Function.trace.add(cls)
        data = ctx.forward(*[t.data for t in inputs], **params)
        requires_grad = _grad_enabled and any(t.requires_grad for t in inputs)
        out = wrap(data, ctx.backend, requires_grad)     # forward may move ctx to another device
        if requires_grad:
            ctx.parents = inputs
            ctx.needs_input_grad = tuple(t.requires_grad for t in inputs)
            ctx._output = weakref.ref(out)
            out.grad_fn = ctx
        return out


def _common_backend(tensors, op_name):
    backend = tensors[0].backend
    for t in tensors[1:]:
        if t.backend is not backend:
            raise RuntimeError(f"{op_name}: expected all tensors on one device, "
                               f"found {backend.name} and {t.backend.name}")
    return backend


# --------------------------------------------------------------------------
# the backward pass
# --------------------------------------------------------------------------
def _toposort(roots):
    """Every node that needs a gradient, each after all the nodes that consume it."""
    order, visited, added = [], set(), set()
    stack = [(r, False) for r in roots]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            if id(node) not in added:
                added.add(id(node))
                order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        ctx = node.grad_fn
        if ctx is not None and ctx.parents is not None:
            stack.extend((p, False) for p in ctx.parents if p.requires_grad and id(p) not in visited)
    order.reverse()
    return order


def run_backward(roots, root_grads, retain_graph, create_graph, inputs=None):
    """Propagate gradients from ``roots``. With ``inputs``, return their gradients
    instead of accumulating into ``.grad`` (that is ``ta.grad``)."""
    pending = {}
    for root, g in zip(roots, root_grads):
        pending[id(root)] = g if id(root) not in pending else pending[id(root)] + g
    wanted = None if inputs is None else {id(t): None for t in inputs}
    with set_grad_enabled(create_graph):
        for node in _toposort(roots):
            g = pending.pop(id(node), None)
            if g is None:
                continue
            ctx = node.grad_fn
            if wanted is not None:
                if id(node) in wanted:
                    wanted[id(node)] = g
            elif ctx is None or node.retains_grad:
                node.grad = g if node.grad is None else node.grad + g
            if ctx is None:
                continue
            if ctx.parents is None:
                raise RuntimeError(
                    "Trying to backward through the graph a second time: its saved values were "
                    "freed by the first backward. Pass retain_graph=True to the first one.")
            if create_graph and not ctx.differentiable_backward:
                raise RuntimeError(f"{type(ctx).__name__} has a fused backward that cannot be "
                                   "differentiated again (create_graph=True)")
            grads = ctx.backward(g)
            if not isinstance(grads, tuple):
                grads = (grads,)
            for parent, pg in zip(ctx.parents, grads):
                if pg is None or not parent.requires_grad:
                    continue
                if pg.shape != parent.shape:
                    raise RuntimeError(f"{type(ctx).__name__}.backward returned a gradient of shape "
                                       f"{pg.shape} for an input of shape {parent.shape}")
                key = id(parent)
                pending[key] = pg if key not in pending else pending[key] + pg
            if not retain_graph:
                ctx.parents = None                       # the inputs and saved arrays can go now
                ctx.__dict__.pop("saved", None)
    if wanted is not None:
        return tuple(wanted[id(t)] for t in inputs)


def initial_grad(output, gradient):
    """The gradient that starts backward at ``output``: ones for a scalar, else ``gradient``."""
    if not output.requires_grad:
        raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
    if gradient is None:
        if output.numel() != 1:
            raise RuntimeError(f"grad can be implicitly created only for scalar outputs; this output has "
                               f"shape {output.shape}: pass a gradient of that shape to backward()")
        return wrap(output.backend.full(output.shape, 1, output.dtype), output.backend)
    if not isinstance(gradient, _Tensor):
        gradient = _Tensor(gradient, dtype=output.dtype, device=output.device)
    if gradient.shape != output.shape:
        raise RuntimeError(f"gradient has shape {gradient.shape} but the output has shape {output.shape}")
    return gradient


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=False):
    """Gradients of ``outputs`` with respect to ``inputs``, without touching ``.grad``."""
    outputs = [outputs] if isinstance(outputs, _Tensor) else list(outputs)
    inputs = [inputs] if isinstance(inputs, _Tensor) else list(inputs)
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    elif isinstance(grad_outputs, _Tensor):
        grad_outputs = [grad_outputs]
    root_grads = [initial_grad(o, g) for o, g in zip(outputs, grad_outputs)]
    retain = create_graph if retain_graph is None else retain_graph
    result = run_backward(outputs, root_grads, retain, create_graph, inputs)
    for t, g in zip(inputs, result):
        if g is None and not allow_unused:
            raise RuntimeError(f"an input of shape {t.shape} was not used to compute the outputs "
                               "(pass allow_unused=True to get None for it)")
    return result
