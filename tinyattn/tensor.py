"""Tensor: the n-d array that users hold, and the functions that create one.

A Tensor wraps one backend array. Its methods are thin: each calls an op
from ``ops.py``, and the engine in ``autograd.py`` records it.
"""
from . import autograd, ops as _ops
from .errors import DtypeError, TensorError
from .backend import get_backend, float32, float64, int64, dtype_of_host, is_device, seed_all, host_rng


# --------------------------------------------------------------------------
# Tensor
# --------------------------------------------------------------------------
class Tensor:
    """An n-d array on one device, that can record the ops applied to it."""

    __slots__ = ("data", "grad", "requires_grad", "grad_fn", "_backend", "retains_grad", "__weakref__")
    __array_priority__ = 1000     # numpy_array * tensor calls Tensor.__rmul__

    def __init__(self, data, dtype=None, device=None, requires_grad=False):
        """From host data (as ``ta.tensor``); a Tensor with no dtype or device given is shared, not copied."""
        same = isinstance(data, Tensor) and dtype is None and device is None
        other = data if same else tensor(data, dtype=dtype, device=device)
        self._init(other.data, other._backend, requires_grad)

    def _init(self, data, backend, requires_grad):
        self.data = data
        self._backend = backend
        self.requires_grad = requires_grad
        self.grad = None
        self.grad_fn = None                  # the Function that made it (None for a leaf)
        self.retains_grad = False

    @classmethod
    def _make(cls, data, backend, requires_grad=False):
        """Wrap an array already on ``backend``: no copy, no conversion."""
        t = cls.__new__(cls)
        t.data, t._backend, t.requires_grad = data, backend, requires_grad     # (_init's body: every op makes one)
        t.grad = t.grad_fn = None
        t.retains_grad = False
        return t

    # --- what it is ---
    @property
    def shape(self):
        """The size of each dim, a tuple of ints (the array's own)."""
        return self.data.shape

    @property
    def ndim(self):
        return self.data.ndim

    def dim(self):
        """The number of dims, as ``ndim`` (PyTorch has both)."""
        return self.data.ndim

    @property
    def dtype(self):
        """A numpy dtype, on every device."""
        return self._backend.dtype_of(self.data)

    @property
    def device(self):
        return self._backend.name

    @property
    def backend(self):
        """The backend (device) that holds the data; fixed for the tensor's life."""
        return self._backend

    @property
    def is_leaf(self):
        return self.grad_fn is None

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
        if not self.shape:
            raise TypeError("len() of a 0-d tensor (it has no dims; use .item() or .numel())")
        return self.shape[0]

    def __repr__(self):
        body = repr(self.numpy()).replace("array(", "tensor(", 1)
        extra = "" if self._backend is get_backend() else f", device='{self.device}'"
        extra += ", requires_grad=True" if self.requires_grad else ""
        return body[:-1] + extra + ")" if extra else body

    # --- leaving the graph, the device, the dtype ---
    def numpy(self):
        """A host numpy array (an explicit copy off the device)."""
        return _host_array(self._backend.to_numpy(self.data))

    def __array__(self, dtype=None, copy=None):
        """``np.asarray(t)``: a numeric host array, for CPU tensors. Like CuPy, a tensor on
        another device must be copied explicitly, with ``t.numpy()``; as in PyTorch, so must a
        tensor that requires grad (``np.exp(w)`` would silently leave the graph)."""
        if not self.backend.on_host:
            raise TypeError(f"np.asarray: this tensor is on {self.device}; copy it to the host "
                            "explicitly with t.numpy()")
        if self.requires_grad:
            raise TypeError("np.asarray: this tensor requires grad, and numpy would drop its graph; "
                            "use Tensor ops, or t.detach().numpy() for the values")
        out = self.numpy()
        return out if dtype is None else out.astype(dtype, copy=False)

    def item(self):
        if self.numel() != 1:
            raise TensorError(f"item() needs a tensor with one element, not shape {self.shape}")
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

    def clone(self):
        """A copy with an array of its own (differentiable, as in PyTorch)."""
        return _ops.Clone.apply(self)

    def requires_grad_(self, mode=True):
        if not self.is_leaf:
            raise RuntimeError(f"requires_grad_: this tensor (shape {self.shape}) was computed by "
                               f"{type(self.grad_fn).__name__}, and only a leaf's flag can change; "
                               "use t.detach() for a copy outside the graph")
        if mode and not _is_float(self.dtype):
            raise RuntimeError(f"only floating point tensors can require gradients, not {self.dtype} "
                               "(convert with .float() first)")
        self.requires_grad = mode
        return self

    def retain_grad(self):
        """Keep ``.grad`` on this non-leaf tensor after backward."""
        self.retains_grad = True

    def set_(self, source):
        """Take over ``source``'s array and device, in place (as ``torch.Tensor.set_``)."""
        self.data, self._backend = source.data, source.backend
        return self

    def zero_(self):
        """Zeros, written in place (its views see them)."""
        self._write(self._backend.xp.zeros_like(self.data), "zero_", "use ta.zeros_like(x) for a new tensor")
        return self

    def to(self, target):
        """``x.to("cuda")`` moves it (differentiably); ``x.to(ta.float64)`` casts it."""
        if isinstance(target, str) and is_device(target):
            backend = get_backend(target)
            if backend is self._backend:
                return self
            return _ops.ToDevice.apply(self, backend=backend)
        try:
            dtype = dtype_of_host(target)
        except TypeError:
            raise ValueError(f"to: {target!r} is neither a device ('cpu', 'cuda', 'strict') "
                             "nor a dtype ('float32', ta.float64, ...)") from None
        if dtype == self.dtype:
            return self
        if not _is_float(dtype):                 # an integer or bool result has no gradient (as in PyTorch)
            with autograd.set_grad_enabled(False):
                return _ops.Cast.apply(self, dtype=dtype)
        return _ops.Cast.apply(self, dtype=dtype)

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

    def is_contiguous(self):
        """Whether the elements lie in memory one after another in row-major order, as a new
        tensor's do (a transpose, an ``expand`` or a slice with a step may not)."""
        strides = self._backend.strides(self.data)
        if strides is None or 0 in self.shape:
            return True
        return all(n == 1 or step == row_major            # (a dim of size 1 has no neighbour: any stride will do)
                   for n, step, row_major in zip(self.shape, strides, _row_major(self.shape)))

    def contiguous(self):
        """This tensor if it is contiguous, else a contiguous copy (the gradient passes through)."""
        return self if self.is_contiguous() else _ops.Clone.apply(self)

    # --- autodiff ---
    def backward(self, gradient=None, retain_graph=False, create_graph=False):
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad``."""
        g = autograd.initial_grad(self, gradient)
        autograd.run_backward([self], [g], retain_graph or create_graph, create_graph)

    # --- arithmetic (Python numbers on either side, by PyTorch's rules: ops.operands) ---
    def __add__(self, other):
        return _ops.Add.apply(*_ops.operands(self, other, "+"))

    def __radd__(self, other):
        return _ops.Add.apply(*_ops.operands(self, other, "+", reverse=True))

    def __iadd__(self, other):
        return self._inplace(other, Tensor.__add__, "in-place +=", "x = x + ...")

    def __sub__(self, other):
        return _ops.Sub.apply(*_ops.operands(self, other, "-"))

    def __rsub__(self, other):
        return _ops.Sub.apply(*_ops.operands(self, other, "-", reverse=True))

    def __isub__(self, other):
        return self._inplace(other, Tensor.__sub__, "in-place -=", "x = x - ...")

    def __mul__(self, other):
        return _ops.Mul.apply(*_ops.operands(self, other, "*"))

    def __rmul__(self, other):
        return _ops.Mul.apply(*_ops.operands(self, other, "*", reverse=True))

    def __imul__(self, other):
        return self._inplace(other, Tensor.__mul__, "in-place *=", "x = x * ...")

    def __truediv__(self, other):
        return _ops.Div.apply(*_ops.operands(self, other, "/", true_division=True))

    def __rtruediv__(self, other):
        return _ops.Div.apply(*_ops.operands(self, other, "/", reverse=True, true_division=True))

    def __itruediv__(self, other):
        return self._inplace(other, Tensor.__truediv__, "in-place /=", "x = x / ...")

    def __pow__(self, other):
        if isinstance(other, Tensor):
            return _ops.Pow.apply(*_ops.operands(self, other, "**"))
        if not isinstance(other, (int, float)) or isinstance(other, bool):
            return _ops.Pow.apply(*_ops.operands(self, other, "**"))
        if isinstance(other, int) and other < 0 and self.dtype.kind != "f":
            raise TensorError(f"**: integers to negative integer powers are refused, as in PyTorch "
                              f"(this tensor is {self.dtype}; convert it with .float() first)")
        base = self if self.dtype.kind == "f" or isinstance(other, int) else self.to(float32)
        base = base if base.dtype.kind != "b" else base.to(int64)          # bool ** 2 is int64, as in PyTorch
        return _ops.PowScalar.apply(base, exponent=other)

    def __rpow__(self, other):
        return _ops.Pow.apply(*_ops.operands(self, other, "**", reverse=True))

    def dot(self, other):
        """The inner product of two 1-d tensors of one length and one dtype: a 0-d tensor."""
        return _ops.dot(self, other)

    def __matmul__(self, other):
        return _ops.matmul(self, other if isinstance(other, Tensor) else _ops.lift(self, other, "@"))

    def __rmatmul__(self, other):
        return _ops.matmul(_ops.lift(self, other, "@"), self)

    def _inplace(self, other, out_of_place, what, new):
        """``t += x`` and friends (``what``: "in-place +="; ``new``: the out-of-place spelling,
        "x = x + ..."). A leaf that requires grad refuses (as in PyTorch): its
        ``.grad`` would silently stay None. Where no graph is recorded (``ta.no_grad()``, or
        nothing requires grad) the values are written into the tensor's own array, as in
        PyTorch: every view of it (``w[0]``, ``w.T``, ``w.view(...)``, ``w.detach()``) and the
        tensor it views see them. While a graph is recorded the result is a new graph node,
        as ``t = t + x`` would be; a view refuses there, since what it views would not change."""
        if autograd.is_grad_enabled() and self.requires_grad and self.is_leaf:
            raise RuntimeError(f"{what} on a leaf tensor that requires grad (shape {self.shape}): "
                               "its .grad would be lost. Update it under `with ta.no_grad():`, or "
                               f"write `{new}` to make a new tensor")
        recording = autograd.is_grad_enabled() and (self.requires_grad or (isinstance(other, Tensor) and other.requires_grad))
        if recording:
            if self._backend.is_view(self.data):
                raise RuntimeError(f"{what} on a view (shape {self.shape}) while a graph is recorded: "
                                   "the tensor it views would keep its old values. Write "
                                   f"`{new}` for a new tensor, or update it under `with ta.no_grad():`")
            return out_of_place(self, other)
        with autograd.set_grad_enabled(False):
            result = out_of_place(self, other)
        if result.shape != self.shape:
            raise TensorError(f"{what}: the result has shape {result.shape}, "
                              f"the tensor has shape {self.shape}")
        if result.dtype != self.dtype:
            if _is_float(result.dtype) and not _is_float(self.dtype):
                raise DtypeError(f"{what}: the result is {result.dtype}, which cannot be stored "
                                 f"in a {self.dtype} tensor (convert it first with .float())")
            result = result.to(self.dtype)
        self._write(result.data, what, f"write `{new}` for a new tensor")
        return self

    def _write(self, values, what, instead):
        """Put ``values`` into this tensor's own array (so its views see them), or refuse."""
        try:
            self._backend.write(self.data, values)
        except ValueError:
            raise RuntimeError(f"{what}: this tensor (shape {self.shape}) is an expanded or read-only view whose "
                               f"elements share memory, so it cannot be written in place (as in PyTorch); {instead}, "
                               "or write into a copy (x = x.clone())") from None

    def __floordiv__(self, other):
        return _ops.FloorDiv.apply(*_ops.operands(self, other, "//"))

    def __rfloordiv__(self, other):
        return _ops.FloorDiv.apply(*_ops.operands(self, other, "//", reverse=True))

    def __abs__(self):                                  # abs(t), as in PyTorch
        return self.abs()

    def __neg__(self):
        return _ops.Neg.apply(self)

    def neg(self):
        return _ops.Neg.apply(self)

    # --- comparisons: boolean tensors, no gradient ---
    def _compare(self, other, fn):
        if not isinstance(other, Tensor) and other is not None:
            _ops.check_operand(other, "a comparison")
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
        _check_not_bool(self, "argmax")
        return Tensor._make(self.xp.argmax(self.data, axis=dim, keepdims=keepdim), self._backend)

    def argmin(self, dim=None, keepdim=False):
        _check_not_bool(self, "argmin")
        return Tensor._make(self.xp.argmin(self.data, axis=dim, keepdims=keepdim), self._backend)

    # --- elementwise (exp, log, sqrt, tanh, sigmoid, erf: integers and bools give float32, as in PyTorch) ---
    def exp(self):
        return _ops.Exp.apply(_floating(self))

    def log(self):
        return _ops.Log.apply(_floating(self))

    def sqrt(self):
        return _ops.Sqrt.apply(_floating(self))

    def abs(self):
        _check_not_bool(self, "abs")
        return _ops.Abs.apply(self)

    def tanh(self):
        return _ops.Tanh.apply(_floating(self))

    def sigmoid(self):
        return _ops.Sigmoid.apply(_floating(self))

    def relu(self):
        if not _is_float(self.dtype):                   # integers stay integers; bools are refused (PyTorch's)
            _check_not_bool(self, "relu")
            return Tensor._make(self.xp.where(self.data > 0, self.data, self.xp.zeros_like(self.data)), self._backend)
        return _ops.Relu.apply(self)

    def erf(self):
        return _ops.Erf.apply(_floating(self))

    def gelu(self, approximate="none"):
        return _ops.gelu(self, approximate)

    def clamp(self, min=None, max=None):
        """Each element limited to [min, max] (numbers, or tensors that broadcast with it). The
        gradient passes where the element is inside (bounds included); where a tensor bound
        binds, it is the bound's. With min > max, max wins, as in PyTorch."""
        if min is None and max is None:
            raise TensorError("clamp: give min, max or both (both None would clamp nothing)")
        for name, bound in (("min", min), ("max", max)):
            if getattr(bound, "shape", ()) not in ((), self.shape):       # a tensor bound: it must broadcast
                autograd.broadcast_shape(f"clamp's {name}", self.shape, bound.shape)
        if isinstance(min, Tensor) or isinstance(max, Tensor):          # (a bound that is a tensor)
            if not all(b is None or isinstance(b, Tensor) for b in (min, max)):
                raise TypeError("clamp: min and max are both numbers or both tensors, as in PyTorch "
                                f"(got {type(min).__name__} and {type(max).__name__})")
            out = self if min is None else _ops.where(self < min, min, self)
            return out if max is None else _ops.where(out > max, max, out)
        return _ops.Clamp.apply(self, lo=min, hi=max)

    clip = clamp                                        # PyTorch's alias (numpy's name)

    def sign(self):
        return _ops.Sign.apply(self)

    # --- reductions (dim: an int, a tuple of ints, or None for all) ---
    def sum(self, dim=None, keepdim=False):
        return _ops.Sum.apply(self, dim=_axes(dim, self.ndim, "sum"), keepdim=keepdim)

    def mean(self, dim=None, keepdim=False):
        """The mean over ``dim``; NaN over zero elements (0 / 0), as in PyTorch."""
        if not _is_float(self.dtype):
            raise DtypeError(f"mean: expected a float tensor, got {self.dtype} (convert with .float())")
        axes = _axes(dim, self.ndim, "mean")
        count = 1
        for a in axes:
            count *= self.shape[a]
        return self.sum(axes, keepdim) * _reciprocal(count)

    def max(self, dim=None, keepdim=False):
        """Largest values (like ``torch.amax``: values only; ties share the gradient)."""
        return _ops.Max.apply(self, dim=_axes(dim, self.ndim, "max"), keepdim=keepdim)

    def min(self, dim=None, keepdim=False):
        if not _is_float(self.dtype):                   # (bool and unsigned: no negation; no gradient anyway)
            return Tensor._make(self.xp.min(self.data, axis=_axes(dim, self.ndim, "min"), keepdims=keepdim),
                                self._backend)
        return -((-self).max(dim, keepdim))

    def var(self, dim=None, keepdim=False, correction=1):
        """Variance over ``dim``, divided by count - correction: with no degrees of freedom
        left that is a division by 0 (NaN, or inf), as in PyTorch."""
        axes = _axes(dim, self.ndim, "var")
        count = 1
        for a in axes:
            count *= self.shape[a]
        centred = self - self.mean(axes, keepdim=True)
        return (centred * centred).sum(axes, keepdim) * _reciprocal(count - correction)

    def std(self, dim=None, keepdim=False, correction=1):
        """sqrt(var); where the variance is 0 its gradient is taken as 0 (PyTorch's), not 0 / 0."""
        var = self.var(dim, keepdim, correction)
        zero = var == 0
        return _ops.where(zero, 0.0, _ops.where(zero, 1.0, var).sqrt())

    def softmax(self, dim=-1):
        return _ops.softmax(self, dim)

    def log_softmax(self, dim=-1):
        return _ops.log_softmax(self, dim)

    def logsumexp(self, dim=-1, keepdim=False):
        return _ops.logsumexp(self, dim, keepdim)

    # --- shape ---
    def reshape(self, *shape):
        """The same elements under another shape: a view (sharing memory) where the strides
        allow one, as ``view``; else a copy. As PyTorch's."""
        shape = _shape_arg(shape)
        if shape == self.shape:
            return self
        _check_reshape(self.shape, shape)
        return _ops.Reshape.apply(self, shape=shape)           # (the array's reshape: a view where it can)

    def view(self, *shape):
        """The same elements under another shape, always sharing memory: refused, as in PyTorch,
        where the strides do not allow it (a transposed, expanded or stepped tensor); use
        ``reshape``, which copies there, or ``.contiguous().view(...)``."""
        shape = _shape_arg(shape)
        if shape == self.shape:
            return self
        new = _check_reshape(self.shape, shape)
        strides = self._backend.strides(self.data)
        if strides is not None and _view_strides(self.shape, strides, new) is None:
            raise TensorError(f"view: a tensor of shape {self.shape} with strides {strides} cannot be seen as "
                              f"{shape} without a copy: view size is not compatible with input tensor's size and "
                              "stride (at least one dimension spans across two contiguous subspaces). "
                              "Use .reshape(...) instead.")
        return _ops.Reshape.apply(self, shape=shape)

    def permute(self, *dims):
        dims = tuple(_ops.normalize_dim(d, self.ndim, "permute") for d in _shape_arg(dims))
        if sorted(dims) != list(range(self.ndim)):
            raise TensorError(f"permute: dims {_shape_arg(dims)} are not an order of the {self.ndim} dims "
                              f"of shape {self.shape}")
        return _ops.Permute.apply(self, dims=dims)

    def transpose(self, dim0, dim1):
        dim0, dim1 = _ops.normalize_dim(dim0, self.ndim, "transpose"), _ops.normalize_dim(dim1, self.ndim, "transpose")
        dims = list(range(self.ndim))
        dims[dim0], dims[dim1] = dims[dim1], dims[dim0]
        return _ops.Permute.apply(self, dims=tuple(dims))

    @property
    def T(self):
        return self.permute(tuple(reversed(range(self.ndim))))

    @property
    def mT(self):
        return self.transpose(-2, -1)

    def expand(self, *shape):
        shape = _shape_arg(shape)
        lead = len(shape) - self.ndim
        _check_expand(self.shape, shape)
        shape = tuple(self.shape[i - lead] if n == -1 else n for i, n in enumerate(shape))
        return self if shape == self.shape else _ops.Expand.apply(self, shape=shape)

    def broadcast_to(self, shape):
        return self.expand(shape)

    def expand_as(self, other):
        return self.expand(other.shape)

    def squeeze(self, dim=None):
        dims = range(self.ndim) if dim is None else [_ops.normalize_dim(d, self.ndim, "squeeze") for d in _shape_arg((dim,))]
        drop = {d for d in dims if d < self.ndim and self.shape[d] == 1}     # (a 0-d tensor takes dim 0 and -1)
        return self.reshape(tuple(n for i, n in enumerate(self.shape) if i not in drop))

    def unsqueeze(self, dim):
        dim = _ops.normalize_dim(dim, self.ndim + 1, "unsqueeze")
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

    def gather(self, dim, index):
        """Values picked along ``dim`` by an integer index shaped like the result (see ops.gather)."""
        return _ops.gather(self, dim, index)

    def split(self, split_size_or_sections, dim=0):
        return _ops.split(self, split_size_or_sections, dim)

    def chunk(self, chunks, dim=0):
        size = -(-self.shape[dim] // chunks)
        return self.split(size, dim)

    def masked_fill(self, mask, value):
        """``value`` (a number or a 0-d tensor) where ``mask`` is True; the result keeps this
        tensor's dtype (as in PyTorch)."""
        if isinstance(value, Tensor) and value.ndim:
            raise TensorError(f"masked_fill: value must be a number or a 0-d tensor, got a tensor of shape "
                              f"{value.shape} (use ta.where(mask, values, x) for one value per element)")
        return _ops.to_dtype(_ops.where(mask, value, self), self.dtype)

    def masked_fill_(self, mask, value):
        """``masked_fill``, written into this tensor: an in-place op, as ``+=`` is (see _inplace)."""
        return self._inplace(value, lambda t, v: t.masked_fill(mask, v), "masked_fill_",
                             "x = x.masked_fill(mask, value)")

    def topk(self, k, dim=-1, largest=True, sorted=True):
        """The k largest (or smallest) values along ``dim`` and their indices (see ops.topk)."""
        return _ops.topk(self, k, dim, largest, sorted)

    def multinomial(self, num_samples, replacement=False):
        """Indices drawn from the categories that this tensor weighs (see ``multinomial``)."""
        return multinomial(self, num_samples, replacement)

    def tril(self, diagonal=0):
        return _ops.Tril.apply(self, k=diagonal, upper=False)

    def triu(self, diagonal=0):
        return _ops.Tril.apply(self, k=diagonal, upper=True)


def _is_float(dtype):
    return dtype.kind == "f"


def _check_not_bool(t, op):
    if t.dtype.kind == "b":
        raise DtypeError(f"{op}: a bool tensor is refused, as in PyTorch (convert with .long() first)")


def _floating(t):
    """``t`` for an elementwise float function: integers and bools become float32, the
    default float dtype, as in PyTorch (numpy would give float64)."""
    return t if t.dtype.kind == "f" else t.to(float32)


def _reciprocal(n):
    """1 / n for a count, inf for n <= 0: so x * _reciprocal(0) is NaN (0 / 0) or inf, as x / 0 is."""
    return 1.0 / n if n > 0 else float("inf")


def _axes(dim, ndim, op):
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = (dim,)
    axes = tuple(sorted(_ops.normalize_dim(d, ndim, op) for d in dim))   # (a 0-d tensor: 0 and -1 only)
    axes = axes if ndim else ()
    if len(set(axes)) != len(axes):
        raise TensorError(f"{op}: dim {tuple(dim)} names a dim twice")
    return axes


def _check_reshape(old, new):
    """``new`` with its -1 (one is allowed) worked out; a TensorError naming both shapes unless
    ``old`` can be reshaped to it."""
    total = 1
    for n in old:
        total *= n
    known, unknown = 1, 0
    for n in new:
        if n == -1:
            unknown += 1
        elif n < 0:
            unknown = 2                                       # no other negative size exists
        else:
            known *= n
    fits = known == total if not unknown else unknown == 1 and known > 0 and total % known == 0
    if not fits:
        raise TensorError(f"reshape: cannot reshape a tensor of shape {old} ({total} elements) to {new}")
    return tuple(total // known if n == -1 else n for n in new) if unknown else new


def _view_strides(shape, strides, new):
    """The strides (in elements) that a view of shape ``new`` would have over elements laid out
    by ``shape`` and ``strides``; None where no view can show them (PyTorch's rule).

    Cut the old dims into runs that are one block of memory (each dim steps over the whole of
    the dim to its right; a dim of size 1 joins any run). A view can split or merge dims only
    within a run: walking both shapes from the right, the new dims must use up each run's
    elements exactly. A transpose or an ``expand`` breaks the runs, so ``t.T.view(-1)`` fails."""
    if not shape:                                             # a 0-d tensor: new dims are all 1
        return (1,) * len(new)
    if 0 in shape:                                            # no elements: any strides will do
        return _row_major(new)
    out = [0] * len(new)
    v = len(new) - 1                                          # the next new dim to place, from the right
    d = len(shape) - 1
    while d >= 0:
        step, size = strides[d], shape[d]                     # the run: its last dim's stride, its elements
        while d > 0 and (shape[d - 1] == 1 or strides[d - 1] == size * step):
            d -= 1
            size *= shape[d]
        placed = 1
        while v >= 0 and (placed < size or new[v] == 1):      # new dims from this run's elements
            out[v] = placed * step
            placed *= new[v]
            v -= 1
        if placed != size:                                    # a new dim would cross into another run
            return None
        d -= 1
    return tuple(out) if v == -1 else None


def _row_major(shape):
    """The strides of a new (C-contiguous) array of ``shape``, in elements."""
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


def _check_expand(old, new):
    """A ValueError naming both shapes unless ``old`` broadcasts to ``new`` (-1 keeps a dim)."""
    lead = len(new) - len(old)
    problem = None
    if lead < 0:
        problem = "the new shape has fewer dims"
    elif any(n == -1 for n in new[:lead]):
        problem = "-1 is only allowed for existing dims"
    else:
        for i, n in enumerate(old):
            if new[lead + i] not in (-1, n) and n != 1:
                problem = f"dim {i} has size {n}; only a dim of size 1 can grow"
                break
    if problem:
        raise TensorError(f"expand: cannot expand shape {old} to {new}: {problem}")


def _host_array(a):
    """numpy gives 0-d results as scalars (np.float32(1.0)): make them 0-d arrays."""
    host = get_backend("cpu")
    return a if host.is_array(a) else host.xp.asarray(a)


def _check_data(host):
    """``ta.tensor`` takes numbers and booleans only: never None, strings or objects."""
    if host.dtype.kind not in "biuf":
        what = "None" if host.dtype.kind == "O" and host.ndim == 0 and host.item() is None else \
            f"data of dtype {host.dtype}"
        raise TypeError(f"tensor: expected numbers or booleans (a number, a nested list, a numpy "
                        f"array), got {what}")


def _shape_arg(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


# --------------------------------------------------------------------------
# creation
# --------------------------------------------------------------------------
def tensor(data, dtype=None, device=None, requires_grad=False):
    """A new tensor from host data (lists, scalars, numpy arrays) or a device array.

    Floating data becomes float32 unless ``dtype`` says otherwise.
    """
    dtype = None if dtype is None else dtype_of_host(dtype)
    if isinstance(data, Tensor):
        device, dtype = device or data.device, dtype or data.dtype
        data = data.data if data._backend is get_backend(device) else data.numpy()
    backend = get_backend(device or "cpu")
    if backend.is_array(data):
        if backend.on_host:
            _check_data(data)
        if dtype is None and backend.dtype_of(data).kind == "f":
            dtype = float32
        array = backend.copy(data) if dtype is None else backend.xp.astype(data, backend.native_dtype(dtype))
    else:
        try:
            host = get_backend("cpu").asarray(data)
        except ValueError as e:
            if "inhomogeneous" not in str(e) and "sequence" not in str(e):
                raise
            raise ValueError("tensor: nested lists of uneven lengths do not make a tensor "
                             "(every row must have the same length)") from None
        _check_data(host)
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


def empty(*shape, dtype=None, device=None, requires_grad=False):
    """A tensor to be written before it is read. PyTorch leaves its values unset (whatever
    the memory held); here they are zeros."""
    return _filled(shape, 0, dtype, device, requires_grad)


def full(shape, fill_value, dtype=None, device=None, requires_grad=False):
    """``shape`` filled with ``fill_value``; with no dtype, the value's kind picks it, as in
    PyTorch: bool for True/False, int64 for an int, float32 for a float."""
    if dtype is None:
        dtype = "bool" if isinstance(fill_value, bool) else int64 if isinstance(fill_value, int) else float32
    return _filled((shape,), fill_value, dtype, device, requires_grad)


def arange(start, end=None, step=1, dtype=None, device=None):
    """start, start + step, ... below end: int64 for ints, float32 if any of them is a float."""
    if end is None:
        start, end = 0, start
    if step == 0:
        raise TensorError("arange: step must not be 0")
    host = get_backend("cpu").xp.arange(start, end, step)
    default = float32 if any(isinstance(v, float) for v in (start, end, step)) else int64
    return tensor(host, dtype=dtype or default, device=device)


def randn(*shape, dtype=None, device=None, requires_grad=False):
    """Standard normal numbers from the host generator (the same on every device)."""
    dtype = _float_dtype(dtype, "randn")
    host = get_backend("cpu").normal(_shape_arg(shape), dtype)
    return tensor(host, dtype=dtype, device=device, requires_grad=requires_grad)


def rand(*shape, dtype=None, device=None, requires_grad=False):
    """Uniform numbers in [0, 1) from the host generator."""
    dtype = _float_dtype(dtype, "rand")
    host = get_backend("cpu").uniform(_shape_arg(shape), dtype)
    return tensor(host, dtype=dtype, device=device, requires_grad=requires_grad)


def multinomial(input, num_samples, replacement=False):
    """Category indices drawn from weights: ``input`` (C,) or (N, C), finite, >= 0 and not all 0
    in a row (they need not add up to 1) -> int64 (num_samples,) or (N, num_samples).

    Drawn on the host, from the generator that ``ta.manual_seed`` seeds, so a seeded run
    draws the same indices on every device. With replacement, each draw is an inverse-CDF
    lookup: u uniform in [0, row total), and the first category whose running sum passes u.
    Without, PyTorch's exponential race: category c gets the key w[c] / E[c], E[c] ~ Exp(1),
    and the num_samples largest keys win, in order of their keys. That is the same as
    drawing one category at a time and taking each winner out (the Gumbel top-k trick);
    categories of weight 0 come after all the others, as in PyTorch.
    """
    if not isinstance(input, Tensor):
        raise TypeError(f"multinomial: input must be a Tensor of weights, got {type(input).__name__}")
    if input.ndim not in (1, 2):
        raise TensorError(f"multinomial: expected weights of shape (C,) or (N, C), got {input.shape}")
    if not _is_float(input.dtype):
        raise DtypeError(f"multinomial: expected float weights, got {input.dtype} (convert with .float())")
    C = input.shape[-1]
    if num_samples <= 0 or (not replacement and num_samples > C):
        raise TensorError(f"multinomial: cannot draw {num_samples} samples from {C} categories"
                          + ("" if replacement else " without replacement"))
    np = get_backend("cpu").xp
    w = input.numpy().astype(np.float64).reshape(-1, C)                 # (rows, C), on the host
    if not (np.isfinite(w).all() and (w >= 0).all()):
        raise TensorError("multinomial: the weights must be finite and >= 0 (got inf, nan or a negative weight)")
    if (w.sum(-1) <= 0).any():
        raise TensorError("multinomial: a row of weights adds up to 0 (nothing to draw from)")
    rng = host_rng()
    if replacement:
        cdf = np.cumsum(w, -1)                                           # (rows, C), running sums
        u = rng.random((len(w), num_samples)) * cdf[:, -1:]              # (rows, S), in [0, total)
        picks = np.stack([np.searchsorted(c, row, side="right") for c, row in zip(cdf, u)])
        picks = np.minimum(picks, C - 1)                                 # (rounding at the very top)
    else:
        keys = w / rng.standard_exponential(w.shape)                     # (rows, C)
        picks = np.argsort(-keys, axis=-1, stable=True)[:, :num_samples]
    return tensor(picks.reshape(input.shape[:-1] + (num_samples,)), dtype=int64, device=input.device)


def _float_dtype(dtype, op):
    dtype = dtype_of_host(dtype or float32)
    if not _is_float(dtype):
        raise TypeError(f"{op}: dtype must be a float type, got {dtype}")
    return dtype


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
    seed_all(seed)


autograd.use_tensor_class(Tensor)
