"""The reverse-mode autodiff engine: grad mode, Function, and the backward pass.

Every op is a ``Function`` subclass: ``forward`` works on raw arrays,
``backward`` gets the output gradient as a Tensor and returns one gradient
Tensor (or None) per input. ``Function.apply`` runs forward and, when a
gradient is needed, links the output to its inputs. ``backward`` walks that
graph once in topological order, from the output to the leaves, and adds up
the gradients. Backward formulas use Tensor ops, so ``create_graph=True``
records them and gradients of gradients work.

This file knows nothing of the Tensor API: it only reads a tensor's
``data``, ``backend``, ``requires_grad``, ``grad`` and ``grad_fn``, copies a
gradient that a leaf would share with ``clone()`` (a leaf owns its ``.grad``),
and builds outputs with the Tensor class that ``tinyattn/tensor.py`` hands it.
"""
import contextlib
import threading
import weakref

from .errors import TensorError


class _GradMode(threading.local):
    """Whether ops record a graph: one flag per thread, as in PyTorch, so a thread that runs
    backward (which records nothing) does not switch recording off in another thread.
    (Each thread's values are set in __init__, which every new thread runs: a value on the
    instance is read at once, where a class attribute would be looked up past it on every op.)"""

    def __init__(self):
        self.enabled = True
        self.inference = None   # inside ta.inference_mode(): an object that names the block; else None


_grad_mode = _GradMode()


class _Compiled(threading.local):
    """What a compiled call (ta.compile: tinyattn/fast/compiled.py) runs in place of the library's
    code, in this thread while it runs; outside one, nothing (set as _GradMode's are)."""

    def __init__(self):
        self.ops = {}           # teaching Function class -> the fast layer's subclass (Function.apply runs it)
        self.layers = None      # {layer: its runner}, in a compiled model's call (Module.__call__ runs it)


compiled = _Compiled()
hooks = None   # while ta.detect_anomaly or ta.profile runs: their hooks (tinyattn/hooks.py); else None
_Tensor = None          # the Tensor class: set once by tinyattn/tensor.py (use_tensor_class)


def use_tensor_class(cls):
    """Tell the engine which class wraps op outputs (tinyattn.Tensor)."""
    global _Tensor
    _Tensor = cls


def is_tensor(x):
    return isinstance(x, _Tensor)


def constant(like, array):
    """A Tensor without gradient around a raw ``array`` on ``like``'s device: no copy, no graph.
    (Inside an op, ``self.constant(array)`` is the same.)"""
    return _Tensor._make(array, like.backend)


# --------------------------------------------------------------------------
# grad mode
# --------------------------------------------------------------------------
@contextlib.contextmanager
def set_grad_enabled(mode):
    """Turn graph recording on or off inside a ``with`` block."""
    previous, _grad_mode.enabled = _grad_mode.enabled, bool(mode)
    try:
        yield
    finally:
        _grad_mode.enabled = previous


class no_grad(contextlib.ContextDecorator):
    """``with ta.no_grad():`` or ``@ta.no_grad()``: ops record no graph."""

    def _recreate_cm(self):               # a decorated function's calls (in two threads, say) each get their own
        return type(self)()

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
    return _grad_mode.enabled


class inference_mode(no_grad):
    """``with ta.inference_mode():`` or ``@ta.inference_mode()``: run a trained model. No graph,
    as no_grad, and a promise that no parameter changes in place inside the block, so the fast
    layer may keep what it derives from the weights (a copy laid out as its products run
    fastest) until the block ends. GPT.generate runs in it."""

    def __enter__(self):
        super().__enter__()
        self._outermost = _grad_mode.inference is None
        if self._outermost:
            _grad_mode.inference = object()                 # a new name for each outermost block

    def __exit__(self, *exc):
        if self._outermost:
            _grad_mode.inference = None
        return super().__exit__(*exc)


def inference_block():
    """The ta.inference_mode() block that runs now (an object that names it), or None."""
    return _grad_mode.inference


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
    ``backward`` returns one Tensor (or None) per input, shaped like it: anything
    else is an error naming the class (``check_backward_grads``).

    A forward that returns a tuple of arrays makes one output Tensor each
    (``apply`` returns them as a tuple; ``self.outputs`` holds them). Its
    ``backward(self, *grads)`` is called once, with one gradient per output
    (None for an output that got none), after every output's gradient is in.
    """

    differentiable_backward = True  # False: backward works on raw arrays (a fused kernel)
    broadcasts = False             # True: the inputs broadcast against each other (add, mul, ...)
    saved = ()
    _outputs = None                # weak references to the outputs of a forward that returned a tuple

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # An op written outside the library (yours) gets its input arrays read-only where the
        # device allows it (numpy), so a forward that writes into one (x -= m) fails at that
        # line instead of changing the caller's tensor. The library's own ops are tested for it.
        cls.guard_inputs = not cls.__module__.startswith("tinyattn.")

    def forward(self, *arrays, **params):
        raise NotImplementedError(f"{type(self).__name__} has no forward")

    def backward(self, grad):
        raise NotImplementedError(f"{type(self).__name__} has no backward")

    def save(self, *arrays):
        """Keep arrays for backward (as ``self.saved``); freed once backward has run."""
        self.saved = arrays

    def constant(self, array):
        """A Tensor without gradient around ``array``, on this op's device (for backward)."""
        return _Tensor._make(array, self.backend)

    @property
    def output(self):
        return self._output()

    @property
    def outputs(self):
        """The outputs of a Function with several (None for one that is gone)."""
        return tuple(ref() for ref in self._outputs)

    @classmethod
    def apply(cls, *inputs, **params):
        arrays, backend = _arrays_and_backend(inputs, cls)
        ctx = compiled.ops.get(cls, cls)()            # in a compiled call: the op's fast version, if it has one
        ctx.backend = backend
        ctx.xp = backend.xp
        try:
            if cls.guard_inputs or hooks is not None:             # (inside detect_anomaly: every op)
                arrays = [backend.read_only(a) for a in arrays]
            data = ctx.forward(*arrays, **params) if hooks is None else hooks.forward(ctx, inputs, arrays, params)
        except Exception as e:
            better = _explain_forward_error(cls, inputs, e)
            if better is None:
                raise
            raise better from None
        if type(data) is not backend.array_type:                  # (a numpy scalar, or not an array)
            if type(data) is tuple:
                return _several_outputs(ctx, inputs, data)
            data = forward_result(ctx, data)
        if not (_grad_mode.enabled and _any_requires_grad(inputs)):
            return _Tensor._make(data, ctx.backend)               # no graph: forward may move ctx to another device
        out = _Tensor._make(data, ctx.backend, True)              # a graph: link the output to ctx, ctx to the inputs
        ctx.parents = inputs
        ctx.needs_input_grad = tuple(t.requires_grad for t in inputs)
        ctx._output = weakref.ref(out)
        out.grad_fn = ctx
        return out


def _any_requires_grad(tensors):
    for t in tensors:
        if t.requires_grad:
            return True
    return False


def _several_outputs(ctx, inputs, arrays):
    """apply for a forward that returned a tuple: one Tensor per array, all made by ``ctx``."""
    arrays = [forward_result(ctx, a) for a in arrays]
    requires_grad = _grad_mode.enabled and _any_requires_grad(inputs)
    outs = tuple(_Tensor._make(a, ctx.backend, requires_grad) for a in arrays)
    if requires_grad:
        ctx.parents = inputs
        ctx.needs_input_grad = tuple(t.requires_grad for t in inputs)
        ctx._outputs = tuple(weakref.ref(o) for o in outs)
        for o in outs:
            o.grad_fn = ctx
    return outs


def forward_result(ctx, data):
    """What forward returned, as an array: numpy's 0-d scalars become 0-d arrays; anything
    that is not numbers (None, a Tensor, a string) is an error naming the Function."""
    if ctx.backend.is_array(data):
        return data
    name = f"{type(ctx).__name__}.forward"
    if is_tensor(data):
        raise TypeError(f"{name} returned a Tensor: forward works on raw arrays (return t.data, "
                        "or compute with self.xp)")
    array = ctx.backend.xp.asarray(data) if data is not None else None
    if array is None or ctx.backend.dtype_of(array).kind not in "biuf":
        raise TypeError(f"{name} returned {describe(data)}: return the output array")
    return array


def _arrays_and_backend(tensors, op):
    """The arrays of ``op``'s input Tensors, and the backend (device) they are all on: one pass
    over the inputs. An error naming the op when an input is not a Tensor or the inputs are on
    two devices."""
    arrays, backend = [], None
    for t in tensors:
        if not isinstance(t, _Tensor) or (backend is not None and t._backend is not backend):
            raise _input_fault(tensors, op)
        arrays.append(t.data)
        backend = t._backend
    if backend is None:
        raise TypeError(f"{op.__name__}.apply needs at least one Tensor input")
    return arrays, backend


def _input_fault(tensors, op):
    """The error for the first input of ``op`` that is not a Tensor, or on another device."""
    backend = None
    for i, t in enumerate(tensors):
        if not isinstance(t, _Tensor):
            return TypeError(f"{op.__name__}.apply: input {i} is a {type(t).__name__}, not a Tensor "
                             "(pass other values as keyword arguments)")
        if backend is None:
            backend = t._backend
        elif t._backend is not backend:
            return RuntimeError(f"{op.__name__}: expected all tensors on one device, "
                                f"found {backend.name} and {t._backend.name}")


def broadcast_shape(op, *shapes):
    """The shape that ``shapes`` broadcast to, as numpy's rules say; a TensorError (a ValueError,
    and a RuntimeError as in PyTorch) naming ``op`` and the shapes when they do not fit."""
    out = []
    for i in range(1, max(len(s) for s in shapes) + 1):
        sizes = {s[-i] for s in shapes if len(s) >= i} - {1}
        if len(sizes) > 1:
            raise TensorError(f"{op}: shapes {' and '.join(str(tuple(s)) for s in shapes)} do not broadcast "
                              f"(dim -{i} has sizes {' and '.join(str(n) for n in sorted(sizes))})")
        out.append(sizes.pop() if sizes else 1)
    return tuple(reversed(out))


def _explain_forward_error(cls, inputs, error):
    """A forward failed: if it wrote into an input array, or if the inputs of a broadcasting op
    do not fit, an error that says so in the library's words (else None: the original error stands)."""
    if isinstance(error, ValueError) and "read-only" in str(error):
        return RuntimeError(f"{cls.__name__}.forward wrote into one of its input arrays ({error}): those are "
                            "the caller's tensors, and forward must leave them unchanged. Compute a new "
                            "array instead (x = x - m, not x -= m)")
    if cls.broadcasts and isinstance(error, ValueError):
        try:
            broadcast_shape(cls.__name__.lower(), *[t.shape for t in inputs])
        except ValueError as better:
            return better
    return None


def describe(value):
    """How an error message names a value: its type, and short values themselves."""
    kind = type(value).__name__
    dtype = getattr(value, "dtype", None)
    if dtype is not None:
        return f"{kind} of dtype {dtype}"
    text = repr(value)
    return f"{kind} ({text})" if len(text) <= 20 and kind != "NoneType" else ("None" if value is None else kind)


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
    handed = {}             # id -> each array whose memory a gradient kept by a leaf may share: see _own
    for g in root_grads:    # the caller's gradients are the caller's
        base = _base(g.data)
        if base is not None:
            handed[id(base)] = base
    wanted = None if inputs is None else {id(t): None for t in inputs}
    waiting = {}            # id(ctx) -> [grad per output, outputs still to come], for several outputs
    with set_grad_enabled(create_graph):
        order = _toposort(roots)
        for node in order:
            ctx = node.grad_fn
            if ctx is not None and ctx._outputs is not None:
                waiting.setdefault(id(ctx), [[None] * len(ctx._outputs), 0])[1] += 1
        for node in order:
            g = pending.pop(id(node), None)
            ctx = node.grad_fn
            several = ctx is not None and ctx._outputs is not None
            if g is None and not several:
                continue
            if g is not None and wanted is not None:
                if id(node) in wanted:
                    wanted[id(node)] = _own(g, handed)
            elif g is not None and (ctx is None or node.retains_grad):
                node.grad = _own(g, handed) if node.grad is None else node.grad + g   # later ones added
            if ctx is None:
                continue
            if several:                                  # backward once, when every output's gradient is in
                grads_out, _ = slot = waiting[id(ctx)]
                grads_out[next(i for i, ref in enumerate(ctx._outputs) if ref() is node)] = g
                slot[1] -= 1
                if slot[1] or all(x is None for x in grads_out):
                    continue
                g = tuple(grads_out)
            if ctx.parents is None:
                raise RuntimeError(
                    "Trying to backward through the graph a second time: its saved values were "
                    "freed by the first backward. Pass retain_graph=True to the first one.")
            if create_graph and not ctx.differentiable_backward:
                raise RuntimeError(f"{type(ctx).__name__} has a fused backward that cannot be "
                                   "differentiated again (create_graph=True)")
            if hooks is not None:
                grads = hooks.backward(ctx, g)
            else:
                grads = ctx.backward(*g) if several else ctx.backward(g)
            grads = check_backward_grads(ctx, grads)
            for parent, pg in zip(ctx.parents, grads):
                if pg is None or not parent.requires_grad:
                    continue
                key = id(parent)
                pending[key] = pg if key not in pending else pending[key] + pg
            if not retain_graph:
                ctx.parents = None                       # the inputs and saved arrays can go now
                ctx.__dict__.pop("saved", None)
    if wanted is not None:
        return tuple(wanted[id(t)] for t in inputs)


def _own(g, handed):
    """``g`` as a gradient that a leaf (or ta.grad's caller) owns, as in PyTorch: ``g`` itself when
    its memory is new to this backward pass, else a copy (``clone()``). Add hands both inputs the
    same gradient, a view shares its base's memory, and the caller's gradient is the caller's:
    ``handed`` holds the base array of each one handed out so far, by id. Arrays that do not say
    what they view (no ``.base``) are always copied."""
    base = _base(g.data)
    if base is None or id(base) in handed:
        return g.clone()
    handed[id(base)] = base                          # kept alive, so that its id stays its own
    return g


def _base(array):
    """The array whose memory ``array`` views (itself when it views none); None for arrays that
    do not say (no ``.base``)."""
    if not hasattr(array, "base"):
        return None
    while getattr(array, "base", None) is not None:  # (the last may be a buffer: bytes, an mmap)
        array = array.base
    return array


def check_backward_grads(ctx, grads):
    """The Function contract: backward returns one Tensor (or None) per input, each
    shaped like its input. Anything else is an error naming the Function."""
    name = f"{type(ctx).__name__}.backward"
    if not isinstance(grads, (tuple, list)):
        grads = (grads,)
    n = len(ctx.parents)
    if len(grads) != n:
        raise RuntimeError(f"{name} returned {len(grads)} gradient{'s' * (len(grads) != 1)} for "
                           f"{n} input{'s' * (n != 1)}: return one per input (None for an input "
                           "that needs none)")
    for i, (parent, pg) in enumerate(zip(ctx.parents, grads)):
        if pg is None:
            continue
        if not is_tensor(pg):
            raise TypeError(f"{name} returned a {type(pg).__module__}.{type(pg).__name__} for input {i}: "
                            "return a Tensor (build it with Tensor ops, or wrap an array a as "
                            "ta.tensor(a, dtype=a.dtype)) or None")
        if parent.requires_grad and pg.shape != parent.shape:
            raise RuntimeError(f"{name} returned a gradient of shape {pg.shape} for input {i} "
                               f"of shape {parent.shape}")
        if parent.requires_grad and pg.dtype != parent.dtype:
            raise RuntimeError(f"{name} returned a {pg.dtype} gradient for input {i}, which is {parent.dtype}: "
                               "return each gradient in its input's dtype (a float64 array would "
                               "silently turn float32 weights into float64)")
    return tuple(grads)


def initial_grad(output, gradient):
    """The gradient that starts backward at ``output``: ones for a scalar, else ``gradient``."""
    if not output.requires_grad:
        raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
    if gradient is None:
        if output.numel() != 1:
            raise RuntimeError(f"grad can be implicitly created only for scalar outputs; this output has "
                               f"shape {output.shape}: pass a gradient of that shape to backward()")
        return constant(output, output.backend.full(output.shape, 1, output.dtype))
    if not isinstance(gradient, _Tensor):
        gradient = _Tensor(gradient, dtype=output.dtype, device=output.device)
    if gradient.shape != output.shape:
        raise RuntimeError(f"gradient has shape {gradient.shape} but the output has shape {output.shape}")
    if gradient.dtype != output.dtype:
        raise RuntimeError(f"gradient has dtype {gradient.dtype} but the output has dtype {output.dtype} "
                           f"(convert it with .to({str(output.dtype)!r}))")
    if gradient.device != output.device:
        raise RuntimeError(f"gradient is on {gradient.device} but the output is on {output.device}")
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
