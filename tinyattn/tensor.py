"""Tensor and the reverse-mode autodiff engine.

A Tensor wraps one backend array. An op is a ``Function`` subclass: its
``forward`` works on raw arrays, its ``backward`` gets the output gradient as
a Tensor and returns one gradient Tensor (or None) per input. Backward
formulas use Tensor ops, so ``backward(create_graph=True)`` records them and
gradients of gradients work.
"""
import contextlib
import functools
import weakref

from .backend import get_backend, float32, float64, int64, dtype_of_host

_grad_enabled = True
hooks = None   # while ta.detect_anomaly or ta.profile runs: their hooks (tinyattn/hooks.py); else None


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
    Inside them: ``self.xp`` is the array namespace, ``self.parents`` the input
    Tensors, ``self.output`` the output Tensor, ``self.needs_input_grad`` a
    tuple of bools. Keep arrays that backward needs as attributes of ``self``.
    """

    registry = []                  # every Function subclass, for the op-table coverage test
    trace = None                   # a set that records applied ops, while the coverage test runs
    differentiable_backward = True  # False: backward works on raw arrays (a fused kernel)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        Function.registry.append(cls)

    def forward(self, *arrays, **params):
        raise NotImplementedError(f"{type(self).__name__} has no forward")

    def backward(self, grad):
        raise NotImplementedError(f"{type(self).__name__} has no backward")

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
        if hooks is None:
            data = ctx.forward(*[t.data for t in inputs], **params)
        else:
            data = hooks.forward(ctx, inputs, params)
        requires_grad = _grad_enabled and any(t.requires_grad for t in inputs)
        out = Tensor._make(data, backend, requires_grad)
        if requires_grad:
            ctx.parents = inputs
            ctx.needs_input_grad = tuple(t.requires_grad for t in inputs)
            ctx._output = weakref.ref(out)
            out._ctx = ctx
        return out


def _common_backend(tensors, op_name):
    backend = tensors[0]._backend
    for t in tensors[1:]:
        if t._backend is not backend:
            raise RuntimeError(f"{op_name}: expected all tensors on one device, "
                               f"found {backend.name} and {t._backend.name}")
    return backend


# --------------------------------------------------------------------------
# the engine
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
        ctx = node._ctx
        if ctx is not None and ctx.parents is not None:
            stack.extend((p, False) for p in ctx.parents if p.requires_grad and id(p) not in visited)
    order.reverse()
    return order


def _run_backward(roots, root_grads, retain_graph, create_graph, inputs=None):
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
            if wanted is not None:
                if id(node) in wanted:
                    wanted[id(node)] = g
            elif node._ctx is None or node._retains_grad:
                node.grad = g if node.grad is None else node.grad + g
            ctx = node._ctx
            if ctx is None:
                continue
            if ctx.parents is None:
                raise RuntimeError(
                    "Trying to backward through the graph a second time: its saved values were "
                    "freed by the first backward. Pass retain_graph=True to the first one.")
            if create_graph and not ctx.differentiable_backward:
                raise RuntimeError(f"{type(ctx).__name__} has a fused backward that cannot be "
                                   "differentiated again (create_graph=True)")
            grads = ctx.backward(g) if hooks is None else hooks.backward(ctx, g)
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
                ctx.parents = None
                ctx.__dict__.pop("saved", None)
    if wanted is not None:
        return tuple(wanted[id(t)] for t in inputs)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=False):
    """Gradients of ``outputs`` with respect to ``inputs``, without touching ``.grad``."""
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    elif isinstance(grad_outputs, Tensor):
        grad_outputs = [grad_outputs]
    root_grads = [_initial_grad(o, g) for o, g in zip(outputs, grad_outputs)]
    retain = create_graph if retain_graph is None else retain_graph
    result = _run_backward(outputs, root_grads, retain, create_graph, inputs)
    for t, g in zip(inputs, result):
        if g is None and not allow_unused:
            raise RuntimeError(f"an input of shape {t.shape} was not used to compute the outputs "
                               "(pass allow_unused=True to get None for it)")
    return result


def _initial_grad(output, gradient):
    if not output.requires_grad:
        raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
    if gradient is None:
        if output.numel() != 1:
            raise RuntimeError(f"grad can be implicitly created only for scalar outputs; this output has "
                               f"shape {output.shape}: pass a gradient of that shape to backward()")
        return ones_like(output)
    if not isinstance(gradient, Tensor):
        gradient = tensor(gradient, dtype=output.dtype, device=output.device)
    if gradient.shape != output.shape:
        raise RuntimeError(f"gradient has shape {gradient.shape} but the output has shape {output.shape}")
    return gradient


# --------------------------------------------------------------------------
# Tensor
# --------------------------------------------------------------------------
class Tensor:
    """An n-d array on one device, that can record the ops applied to it."""

    __slots__ = ("data", "grad", "requires_grad", "_ctx", "_backend", "_retains_grad", "__weakref__")
    __array_priority__ = 1000     # numpy_array * tensor calls Tensor.__rmul__

    def __init__(self, data, dtype=None, device=None, requires_grad=False):
        other = tensor(data, dtype=dtype, device=device)
        self._init(other.data, other._backend, requires_grad)

    def _init(self, data, backend, requires_grad):
        self.data = data
        self._backend = backend
        self.requires_grad = requires_grad
        self.grad = None
        self._ctx = None
        self._retains_grad = False

    @classmethod
    def _make(cls, data, backend, requires_grad=False):
        """Wrap an array already on ``backend``: no copy, no conversion."""
        t = cls.__new__(cls)
        t._init(data, backend, requires_grad)
        return t

    # --- what it is ---
    @property
    def shape(self):
        return tuple(self.data.shape)

    @property
    def ndim(self):
        return self.data.ndim

    @property
    def dtype(self):
        return self._backend.dtype_of(self.data)

    @property
    def device(self):
        return self._backend.name

    @property
    def is_leaf(self):
        return self._ctx is None

    @property
    def grad_fn(self):
        return self._ctx

    @property
    def xp(self):
        return self._backend.xp

    def size(self, dim=None):
        """The shape, as in PyTorch; ``size(d)`` is one dimension."""
        return self.shape if dim is None else self.shape[dim]

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        body = repr(self.numpy()).replace("array(", "tensor(", 1)
        extra = "" if self.device == "cpu" else f", device='{self.device}'"
        extra += ", requires_grad=True" if self.requires_grad else ""
        return body[:-1] + extra + ")" if extra else body

    # --- leaving the graph, the device, the dtype ---
    def numpy(self):
        """A host numpy array (an explicit copy off the device)."""
        return self._backend.to_numpy(self.data)

    def item(self):
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor with one element, not shape {self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    def __bool__(self):
        return bool(self.item())

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def detach(self):
        return Tensor._make(self.data, self._backend)

    def requires_grad_(self, mode=True):
        self.requires_grad = mode
        return self

    def retain_grad(self):
        """Keep ``.grad`` on this non-leaf tensor after backward."""
        self._retains_grad = True

    def zero_(self):
        self.data = self._backend.xp.zeros_like(self.data)
        return self

    def to(self, target):
        """``x.to("cuda")`` moves it (differentiably); ``x.to(ta.float64)`` casts it."""
        if isinstance(target, str) and (target in ("cpu", "strict") or target.startswith("cuda")):
            backend = get_backend(target)
            if backend is self._backend:
                return self
            return _ops.ToDevice.apply(self, backend=backend)
        dtype = dtype_of_host(target)
        return self if dtype == self.dtype else _ops.Cast.apply(self, dtype=dtype)

    def cpu(self):
        return self.to("cpu")

    def cuda(self):
        return self.to("cuda")

    def float(self):
        return self.to(float32)

    def double(self):
        return self.to(float64)

    def long(self):
        return self.to(int64)

    def contiguous(self):
        return self

    # --- autodiff ---
    def backward(self, gradient=None, retain_graph=False, create_graph=False):
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad``."""
        g = _initial_grad(self, gradient)
        _run_backward([self], [g], retain_graph or create_graph, create_graph)

    # --- arithmetic (Python scalars on either side) ---
    def _lift(self, other):
        if isinstance(other, Tensor):
            return other
        return Tensor._make(self._backend.asarray(other, self.dtype if _is_float(self.dtype) else None),
                            self._backend)

    def __add__(self, other):
        return _ops.Add.apply(self, self._lift(other))

    def __radd__(self, other):
        return _ops.Add.apply(self._lift(other), self)

    def __sub__(self, other):
        return _ops.Sub.apply(self, self._lift(other))

    def __rsub__(self, other):
        return _ops.Sub.apply(self._lift(other), self)

    def __mul__(self, other):
        return _ops.Mul.apply(self, self._lift(other))

    def __rmul__(self, other):
        return _ops.Mul.apply(self._lift(other), self)

    def __truediv__(self, other):
        return _ops.Div.apply(self, self._lift(other))

    def __rtruediv__(self, other):
        return _ops.Div.apply(self._lift(other), self)

    def __pow__(self, other):
        if isinstance(other, Tensor):
            return _ops.Pow.apply(self, other)
        return _ops.PowScalar.apply(self, exponent=other)

    def __rpow__(self, other):
        return _ops.Pow.apply(self._lift(other), self)

    def __matmul__(self, other):
        return _ops.matmul(self, self._lift(other))

    def __rmatmul__(self, other):
        return _ops.matmul(self._lift(other), self)

    def __neg__(self):
        return _ops.Neg.apply(self)

    # --- comparisons: boolean tensors, no gradient ---
    def _compare(self, other, fn):
        other = other.data if isinstance(other, Tensor) else other
        return Tensor._make(fn(self.data, other), self._backend)

    def __lt__(self, other):
        return self._compare(other, lambda a, b: a < b)

    def __le__(self, other):
        return self._compare(other, lambda a, b: a <= b)

    def __gt__(self, other):
        return self._compare(other, lambda a, b: a > b)

    def __ge__(self, other):
        return self._compare(other, lambda a, b: a >= b)

    def __eq__(self, other):
        return self._compare(other, lambda a, b: a == b)

    def __ne__(self, other):
        return self._compare(other, lambda a, b: a != b)

    def __and__(self, other):
        return self._compare(other, lambda a, b: a & b)

    def __or__(self, other):
        return self._compare(other, lambda a, b: a | b)

    def __invert__(self):
        return Tensor._make(~self.data, self._backend)

    __hash__ = object.__hash__

    def argmax(self, dim=None, keepdim=False):
        return Tensor._make(self.xp.argmax(self.data, axis=dim, keepdims=keepdim), self._backend)

    def argmin(self, dim=None, keepdim=False):
        return Tensor._make(self.xp.argmin(self.data, axis=dim, keepdims=keepdim), self._backend)

    # --- elementwise ---
    def exp(self):
        return _ops.Exp.apply(self)

    def log(self):
        return _ops.Log.apply(self)

    def sqrt(self):
        return _ops.Sqrt.apply(self)

    def abs(self):
        return _ops.Abs.apply(self)

    def tanh(self):
        return _ops.Tanh.apply(self)

    def sigmoid(self):
        return _ops.Sigmoid.apply(self)

    def relu(self):
        return _ops.Relu.apply(self)

    def erf(self):
        return _ops.Erf.apply(self)

    def gelu(self, approximate="none"):
        return _ops.gelu(self, approximate)

    def clamp(self, min=None, max=None):
        return _ops.Clamp.apply(self, lo=min, hi=max)

    def sign(self):
        return Tensor._make(self.xp.sign(self.data), self._backend)

    # --- reductions (dim: an int, a tuple of ints, or None for all) ---
    def sum(self, dim=None, keepdim=False):
        return _ops.Sum.apply(self, dim=_axes(dim, self.ndim), keepdim=keepdim)

    def mean(self, dim=None, keepdim=False):
        axes = _axes(dim, self.ndim)
        count = 1
        for a in axes:
            count *= self.shape[a]
        return self.sum(axes, keepdim) * (1.0 / count)

    def max(self, dim=None, keepdim=False):
        """Largest values (like ``torch.amax``: values only; ties share the gradient)."""
        return _ops.Max.apply(self, dim=_axes(dim, self.ndim), keepdim=keepdim)

    def min(self, dim=None, keepdim=False):
        return -((-self).max(dim, keepdim))

    def var(self, dim=None, keepdim=False, correction=1):
        axes = _axes(dim, self.ndim)
        count = 1
        for a in axes:
            count *= self.shape[a]
        centred = self - self.mean(axes, keepdim=True)
        return (centred * centred).sum(axes, keepdim) * (1.0 / max(count - correction, 0))

    def std(self, dim=None, keepdim=False, correction=1):
        return self.var(dim, keepdim, correction).sqrt()

    def softmax(self, dim=-1):
        return _F().softmax(self, dim)

    def log_softmax(self, dim=-1):
        return _F().log_softmax(self, dim)

    def logsumexp(self, dim=-1, keepdim=False):
        return _F().logsumexp(self, dim, keepdim)

    # --- shape ---
    def reshape(self, *shape):
        shape = _shape_arg(shape)
        return self if shape == self.shape else _ops.Reshape.apply(self, shape=shape)

    view = reshape

    def permute(self, *dims):
        return _ops.Permute.apply(self, dims=tuple(d % self.ndim for d in _shape_arg(dims)))

    def transpose(self, dim0, dim1):
        dims = list(range(self.ndim))
        dims[dim0], dims[dim1] = dims[dim1], dims[dim0]
        return self.permute(dims)

    @property
    def T(self):
        return self.permute(tuple(reversed(range(self.ndim))))

    @property
    def mT(self):
        return self.transpose(-2, -1)

    def expand(self, *shape):
        shape = _shape_arg(shape)
        lead = len(shape) - self.ndim
        shape = tuple(self.shape[i - lead] if n == -1 else n for i, n in enumerate(shape))
        return self if shape == self.shape else _ops.Expand.apply(self, shape=shape)

    def broadcast_to(self, shape):
        return self.expand(shape)

    def expand_as(self, other):
        return self.expand(other.shape)

    def squeeze(self, dim=None):
        dims = range(self.ndim) if dim is None else [d % self.ndim for d in _shape_arg((dim,))]
        drop = {d for d in dims if self.shape[d] == 1}
        return self.reshape(tuple(n for i, n in enumerate(self.shape) if i not in drop))

    def unsqueeze(self, dim):
        dim = dim % (self.ndim + 1)
        return self.reshape(self.shape[:dim] + (1,) + self.shape[dim:])

    def flatten(self, start_dim=0, end_dim=-1):
        start, end = start_dim % max(self.ndim, 1), end_dim % max(self.ndim, 1)
        if self.ndim == 0:
            return self.reshape(1)
        middle = 1
        for n in self.shape[start:end + 1]:
            middle *= n
        return self.reshape(self.shape[:start] + (middle,) + self.shape[end + 1:])

    # --- indexing, joining, selecting ---
    def __getitem__(self, index):
        return _ops.getitem(self, index)

    def split(self, split_size_or_sections, dim=0):
        return _ops.split(self, split_size_or_sections, dim)

    def chunk(self, chunks, dim=0):
        size = -(-self.shape[dim] // chunks)
        return self.split(size, dim)

    def masked_fill(self, mask, value):
        return _ops.where(mask, value, self)

    def tril(self, diagonal=0):
        return _ops.Tril.apply(self, k=diagonal, upper=False)

    def triu(self, diagonal=0):
        return _ops.Tril.apply(self, k=diagonal, upper=True)


def _is_float(dtype):
    return dtype.kind == "f"


def _axes(dim, ndim):
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = (dim,)
    return tuple(sorted(d % ndim for d in dim)) if ndim else ()


def _shape_arg(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


@functools.cache
def _F():
    from .nn import functional
    return functional


# --------------------------------------------------------------------------
# creation
# --------------------------------------------------------------------------
def tensor(data, dtype=None, device=None, requires_grad=False):
    """A new tensor from host data (lists, scalars, numpy arrays) or a device array.

    Floating data becomes float32 unless ``dtype`` says otherwise.
    """
    if isinstance(data, Tensor):
        device, dtype = device or data.device, dtype or data.dtype
        data = data.data if data._backend is get_backend(device) else data.numpy()
    backend = get_backend(device or "cpu")
    if backend.is_array(data):
        if dtype is None and backend.dtype_of(data).kind == "f":
            dtype = float32
        array = data if dtype is None else backend.xp.astype(data, backend.native_dtype(dtype))
    else:
        host = get_backend("cpu").asarray(data)
        if dtype is None and host.dtype.kind == "f":
            dtype = float32
        array = backend.asarray(host, dtype)
    if requires_grad and not _is_float(backend.dtype_of(array)):
        raise RuntimeError("only floating point tensors can require gradients")
    return Tensor._make(array, backend, requires_grad)


def _filled(shape, value, dtype, device, requires_grad):
    backend = get_backend(device or "cpu")
    dtype = dtype_of_host(dtype or float32)
    array = backend.full(_shape_arg(shape), value, dtype)
    return Tensor._make(array, backend, requires_grad)


def zeros(*shape, dtype=None, device=None, requires_grad=False):
    return _filled(shape, 0, dtype, device, requires_grad)


def ones(*shape, dtype=None, device=None, requires_grad=False):
    return _filled(shape, 1, dtype, device, requires_grad)


def full(shape, fill_value, dtype=None, device=None, requires_grad=False):
    return _filled((shape,), fill_value, dtype, device, requires_grad)


def arange(start, end=None, step=1, dtype=None, device=None):
    if end is None:
        start, end = 0, start
    host = get_backend("cpu").xp.arange(start, end, step)
    return tensor(host, dtype=dtype or host.dtype, device=device)


def randn(*shape, dtype=None, device=None, requires_grad=False):
    """Standard normal numbers from the host generator (the same on every device)."""
    dtype = dtype_of_host(dtype or float32)
    host = get_backend("cpu").normal(_shape_arg(shape), dtype)
    return tensor(host, dtype=dtype, device=device, requires_grad=requires_grad)


def rand(*shape, dtype=None, device=None, requires_grad=False):
    """Uniform numbers in [0, 1) from the host generator."""
    dtype = dtype_of_host(dtype or float32)
    host = get_backend("cpu").uniform(_shape_arg(shape), dtype)
    return tensor(host, dtype=dtype, device=device, requires_grad=requires_grad)


def _like(fn):
    def like(t, dtype=None, device=None, requires_grad=False, **kwargs):
        return fn(*t.shape, dtype=dtype or t.dtype, device=device or t.device,
                  requires_grad=requires_grad, **kwargs)
    like.__name__ = fn.__name__ + "_like"
    like.__doc__ = f"``{fn.__name__}`` with the shape, dtype and device of ``t``."
    return like


zeros_like, ones_like, randn_like, rand_like = map(_like, (zeros, ones, randn, rand))


def full_like(t, fill_value, dtype=None, device=None, requires_grad=False):
    return full(t.shape, fill_value, dtype=dtype or t.dtype, device=device or t.device,
                requires_grad=requires_grad)


def manual_seed(seed):
    """Seed the host generator (randn, rand, init) and every device's (dropout)."""
    from .backend import _BACKENDS
    get_backend("cpu")
    for backend in _BACKENDS.values():
        backend.seed(seed)


from . import ops as _ops  # noqa: E402  (ops needs Tensor and Function, defined above)
