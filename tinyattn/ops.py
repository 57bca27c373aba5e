"""The ops: one small Function each, forward and backward side by side.

``forward`` gets raw arrays and uses ``self.xp``; ``backward`` gets the output
gradient ``g`` as a Tensor and returns gradients built from Tensor ops, so
they can be differentiated again. Arrays that backward needs go through
``self.save(...)``. Shapes in comments: a, b inputs; g like out.

Each op here is the arithmetic that defines it, and nothing else. The fast
layer (``tinyattn/fast``) has faster versions of some of them, subclasses
that run the same arithmetic with fused kernels, threads or BLAS tricks, and
fall back to these formulas whenever they cannot. They run only inside a
model (or function) given to ``ta.compile``; everywhere else these formulas run.
"""
import collections
import functools
import math

from .autograd import Function, constant, describe, is_tensor
from .backend import get_backend, category, promote_types, float16, float32, float64
from .errors import DtypeError, IndexRangeError, TensorError


def sum_to(g, shape):
    """Sum ``g`` down to ``shape``: undoes broadcasting, for every binary op."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1)
    return g.sum(axes, keepdim=True).reshape(shape)


def lift(like, value, op="an op"):
    """``value`` as a Tensor on ``like``'s device: a Tensor as it is, a Python number
    as a 0-d array. A number takes like's dtype when it fits in it (a float next to
    a float tensor, an int next to an integer one): as in PyTorch, a number never
    widens a tensor. Anything that is not a number is a TypeError naming ``op``."""
    if is_tensor(value):
        return value
    kind = check_operand(value, op)
    fits = like.dtype.kind == "f" or (like.dtype.kind in "iu" and kind in "biu")
    return constant(like, like.backend.asarray(value, like.dtype if fits else None))


def operands(t, other, op, reverse=False, true_division=False):
    """The two Tensors of ``t <op> other`` (``other <op> t`` with reverse=True), in one dtype, by
    PyTorch's rules: a Python number never widens a tensor (float32 * 0.5 is float32), a float
    number with an integer or boolean tensor gives float32, the default float dtype (ids * 0.5
    is float32, not numpy's float64), and so does true division of integers. Two tensors
    promote as ``result_dtype`` says (int64 + float32 is float32)."""
    if is_tensor(other):
        # The usual case, one float dtype, needs nothing. It is checked on the arrays' own dtypes,
        # at once (a strict array's dtype is none of numpy's: it goes the long way).
        one = t.data.dtype
        if other.data.dtype is one and (one is float32 or one is float64 or one is float16):
            return (other, t) if reverse else (t, other)
        _refuse_bool_subtraction(op, t.dtype, other.dtype)
        dtype = result_dtype(t, other)
        if true_division and dtype.kind != "f":
            dtype = float32
        t, other = to_dtype(t, dtype), to_dtype(other, dtype)
    else:
        dtype = t.dtype
        _refuse_bool_subtraction(op, dtype, bool if isinstance(other, bool) else None)
        if dtype.kind != "f" and (true_division or check_operand(other, op) == "f"):
            t = t.to("float32")
        other = lift(t, other, op)
    return (other, t) if reverse else (t, other)


def _refuse_bool_subtraction(op, *dtypes):
    if op == "-" and any(d is bool or getattr(d, "kind", None) == "b" for d in dtypes):
        raise DtypeError("-: subtraction with a bool operand is refused, as in PyTorch; "
                         "to invert a mask use ~mask, or convert with .long() or .float() first")


def result_dtype(*tensors):
    """The dtype of an elementwise op on ``tensors``, by PyTorch's rules: categories bool <
    integer < float, and the higher category wins whole (int64 + float32 is float32). A 0-d
    tensor next to tensors with dims widens only across categories: float32 * a float64 0-d
    tensor is float32, int64 * a float64 0-d tensor is float64."""
    dims = [t.dtype for t in tensors if t.ndim]
    zeros = [t.dtype for t in tensors if not t.ndim]
    dtype = functools.reduce(promote_types, dims or zeros)
    if dims and zeros:
        zero = functools.reduce(promote_types, zeros)
        if category(zero) > category(dtype):
            dtype = promote_types(dtype, zero)
    return dtype


def to_dtype(t, dtype):
    """``t`` in ``dtype`` (itself when it is already; else a differentiable cast)."""
    return t if t.dtype == dtype else t.to(dtype)


def unbroadcast(g, x):
    """The gradient of a broadcasting op for its input ``x``: ``g`` summed down to x's shape
    (sum_to), in x's dtype (float32 + float64 gives float64, and the float32 input's
    gradient comes back as float32)."""
    g = sum_to(g, x.shape)
    return g if g.dtype == x.dtype else g.to(x.dtype)


def normalize_dim(dim, ndim, op):
    """``dim`` as an index in [0, ndim), negative dims counting from the end; an IndexError
    naming ``op`` when it is out of range (a 0-d tensor takes 0 and -1, as in PyTorch)."""
    if type(dim) is int and -ndim <= dim < ndim:            # the usual case, at once
        return dim % ndim
    n = max(ndim, 1)
    if not isinstance(dim, int) and not (hasattr(dim, "__index__") and not hasattr(dim, "shape")):
        raise TypeError(f"{op}: dim must be an int (or a tuple of ints), got {describe(dim)}")
    dim = int(dim)
    if not -n <= dim < n:
        raise IndexError(f"{op}: dim {dim} is out of range for a tensor with {ndim} dims "
                         f"(expected a dim in [{-n}, {n - 1}])")
    return dim % n


def check_operand(value, op):
    """A Python number, a numeric numpy value or a (nested) list of numbers; else a TypeError.
    Returns its kind: "b" (bool), "i" or "u" (integer) or "f" (float)."""
    if isinstance(value, (bool, int, float)):
        return "b" if isinstance(value, bool) else "i" if isinstance(value, int) else "f"
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    if kind is None and isinstance(value, (list, tuple)):
        try:
            kind = get_backend("cpu").xp.asarray(value).dtype.kind
        except (ValueError, TypeError):
            kind = None
    if kind is None or kind not in "biuf":
        raise TypeError(f"unsupported operand for {op}: Tensor and {describe(value)}; "
                        "use a number or a Tensor")
    return kind


# ---------------------------------------------------------------- arithmetic
class Add(Function):
    broadcasts = True

    def forward(self, a, b):
        return a + b

    def backward(self, g):
        a, b = self.parents
        return unbroadcast(g, a), unbroadcast(g, b)


class Sub(Function):
    broadcasts = True

    def forward(self, a, b):
        return a - b

    def backward(self, g):
        a, b = self.parents
        return unbroadcast(g, a), unbroadcast(-g, b)


class Mul(Function):
    broadcasts = True

    def forward(self, a, b):
        return a * b

    def backward(self, g):
        a, b = self.parents
        da, db = self.needs_input_grad
        return (unbroadcast(g * b, a) if da else None,
                unbroadcast(g * a, b) if db else None)


class Div(Function):
    broadcasts = True

    def forward(self, a, b):
        return a / b

    def backward(self, g):
        a, b = self.parents
        da, db = self.needs_input_grad
        return (unbroadcast(g / b, a) if da else None,
                unbroadcast(-g * a / (b * b), b) if db else None)


class FloorDiv(Function):
    """floor(a / b), as Python's // (rounds toward -inf). Not differentiable, as in PyTorch:
    a backward through it is an error rather than a silent zero."""

    broadcasts = True

    def forward(self, a, b):
        return self.xp.floor_divide(a, b)

    def backward(self, g):
        raise RuntimeError("floor division (//) has no gradient (as in PyTorch); "
                           "detach its inputs, or use / for a differentiable quotient")


class Neg(Function):
    def forward(self, a):
        return -a

    def backward(self, g):
        return -g


class PowScalar(Function):
    """a ** p for a Python number p."""

    def forward(self, a, exponent):
        self.p = exponent
        return a ** exponent

    def backward(self, g):
        (a,) = self.parents
        if self.p == 2:
            return g * a * 2.0
        if self.p == 0:                                     # a ** 0 is 1 everywhere: 0, not 0 * inf at a = 0
            return g * 0.0
        return g * self.p * a ** (self.p - 1)


class Pow(Function):
    """a ** b for two tensors. d/da = b a^(b-1), taken as 0 where b == 0; d/db = a^b log a, which
    needs a > 0, taken as 0 where a == 0 and b >= 0 (PyTorch's conventions: no 0 * inf = NaN)."""

    broadcasts = True

    def forward(self, a, b):
        return a ** b

    def backward(self, g):
        a, b = self.parents
        da, db = self.needs_input_grad
        zero = self.constant(self.backend.zeros((), g.dtype))
        return (unbroadcast(where(b == 0, zero, g * b * a ** (b - 1.0)), a) if da else None,
                unbroadcast(where((a == 0) & (b >= 0), zero, g * self.output * a.log()), b) if db else None)


class MatMul(Function):
    """(..., n, k) @ (..., k, m) -> (..., n, m), batch dims broadcast."""

    def forward(self, a, b):
        return self.xp.matmul(a, b)

    def backward(self, g):                                    # g (..., n, m)
        a, b = self.parents
        da, db = self.needs_input_grad
        return (sum_to(g @ b.mT, a.shape) if da else None,    # (..., n, k)
                sum_to(a.mT @ g, b.shape) if db else None)    # (..., k, m)


def check_same_dtype(op, *tensors):
    """Layers and matmul do not mix dtypes, as in PyTorch: ids fed to a Linear layer by
    mistake, or a float64 input to float32 weights, would otherwise give a float64 result
    silently. (Elementwise ops promote instead: float32 + float64 is float64.)"""
    first = tensors[0].dtype
    for t in tensors:
        if t.dtype != first:
            break
    else:
        return
    dtypes = [t.dtype for t in tensors]
    names = " and ".join(str(d) for d in dict.fromkeys(dtypes))             # each dtype once, in order
    if all(d.kind == "f" for d in dtypes):
        raise DtypeError(f"{op}: got {names} tensors; convert one so both match (.float() or .double()): "
                         f"{op} does not mix float dtypes")
    if any(d.kind == "f" for d in dtypes):
        raise DtypeError(f"{op}: got {names} tensors; convert the integer one with .float() "
                         "(token ids go through an Embedding first)")


def matmul(a, b):
    """numpy's matmul rules: a 1-d operand gains a dim of 1, which is dropped after."""
    a_shape, b_shape = a.shape, b.shape
    if not a_shape or not b_shape:
        raise TensorError(f"matmul needs at least 1-d operands, got shapes {a_shape} and {b_shape}")
    if a.dtype != b.dtype:
        check_same_dtype("matmul", a, b)
    inner = b_shape[-2] if len(b_shape) > 1 else b_shape[0]
    if a_shape[-1] != inner:
        raise TensorError(f"matmul: shapes {a_shape} and {b_shape} do not fit ({a_shape[-1]} != {inner})")
    if len(a_shape) > 1 and len(b_shape) > 1:        # (..., n, k) @ (..., k, m): the usual case
        return MatMul.apply(a, b)
    if len(a_shape) == 1 and len(b_shape) == 1:
        return (a * b).sum()
    if len(a_shape) == 1:
        return MatMul.apply(a.unsqueeze(0), b).squeeze(-2)
    return MatMul.apply(a, b.unsqueeze(-1)).squeeze(-1)


def dot(a, b):
    """sum(a * b) of two 1-d tensors, as torch.dot: one length and one dtype (no broadcasting,
    no promotion), a 0-d result."""
    if not is_tensor(b):
        raise TypeError(f"dot: expected a Tensor, got {describe(b)}")
    if a.ndim != 1 or b.ndim != 1:
        raise TensorError(f"dot: expected two 1-d tensors, got shapes {a.shape} and {b.shape} "
                          "(ta.matmul takes more dims)")
    if a.shape != b.shape:
        raise TensorError(f"dot: the tensors have lengths {a.shape[0]} and {b.shape[0]}; they must match")
    if a.dtype != b.dtype:
        raise DtypeError(f"dot: got {a.dtype} and {b.dtype} tensors; convert one so both match (dot does not "
                         "mix dtypes)")
    if a.dtype.kind == "b":
        raise DtypeError("dot: bool tensors are refused, as in PyTorch (convert with .long() first)")
    return to_dtype((a * b).sum(), a.dtype)                 # (an int32 sum would be int64)


# ---------------------------------------------------------------- elementwise
class Exp(Function):
    def forward(self, a):
        return self.xp.exp(a)

    def backward(self, g):
        return g * self.output


class Log(Function):
    def forward(self, a):
        return self.xp.log(a)

    def backward(self, g):
        return g / self.parents[0]


class Sqrt(Function):
    def forward(self, a):
        return self.xp.sqrt(a)

    def backward(self, g):
        return g * 0.5 / self.output


class Abs(Function):
    """|a|; at a == 0 the gradient is 0 (the sign)."""

    def forward(self, a):
        return self.xp.abs(a)

    def backward(self, g):
        return g * self.parents[0].sign()


class Tanh(Function):
    def forward(self, a):
        return self.xp.tanh(a)

    def backward(self, g):
        y = self.output
        return g * (1.0 - y * y)


class Sigmoid(Function):
    def forward(self, a):
        return 1.0 / (1.0 + self.xp.exp(-a))

    def backward(self, g):
        y = self.output
        return g * y * (1.0 - y)


class LogSigmoid(Function):
    """log sigmoid(a) = min(a, 0) - log(1 + exp(-|a|)): exp never overflows, so
    logsigmoid(-100) is -100, not log(0) = -inf. Its slope is sigmoid(-a) =
    exp(logsigmoid(-a)), written with this op again, so it differentiates twice."""

    def forward(self, a):
        xp = self.xp
        return xp.minimum(a, 0.0) - xp.log1p(xp.exp(-xp.abs(a)))

    def backward(self, g):
        return g * LogSigmoid.apply(-self.parents[0]).exp()


def logsigmoid(x):
    check_float("logsigmoid", x)
    return LogSigmoid.apply(x)


def softplus(x, beta=1.0, threshold=20.0):
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (as in PyTorch).

    log(1 + exp(u)) = -logsigmoid(-u), which stays finite for any u."""
    check_float("softplus", x)
    bx = x * beta
    return where(bx > threshold, x, -logsigmoid(-bx) / beta)


class Relu(Function):
    """max(a, 0); at a == 0 the gradient is 0, as in PyTorch."""

    def forward(self, a):
        mask = self.xp.logical_not(a <= 0)                 # (NaN passes, as in PyTorch)
        self.save(mask)
        return self.xp.where(mask, a, 0.0)

    def backward(self, g):
        (mask,) = self.saved
        return g * self.constant(self.xp.astype(mask, g.data.dtype))


class Erf(Function):
    def forward(self, a):
        return self.backend.erf(a)

    def backward(self, g):
        a = self.parents[0]
        return g * (2.0 / math.sqrt(math.pi)) * (-(a * a)).exp()


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


class Gelu(Function):
    """x * Phi(x), with Phi the standard normal CDF."""

    def forward(self, a):
        return 0.5 * a * (1.0 + self.backend.erf(a * (1.0 / math.sqrt(2.0))))

    def backward(self, g):
        a = self.parents[0]
        cdf = 0.5 * (1.0 + (a * (1.0 / math.sqrt(2.0))).erf())
        pdf = (-0.5 * a * a).exp() * (1.0 / math.sqrt(2.0 * math.pi))
        return g * (cdf + a * pdf)


def gelu_tanh_u(x):
    """u = sqrt(2/pi) (x + 0.044715 x^3), on arrays or Tensors."""
    return (x * x * 0.044715 + 1.0) * x * _SQRT_2_OVER_PI


def gelu_tanh_slope(x, t):
    """d/dx of 0.5 x (1 + t), t = tanh(u): 0.5 (1 + t) + 0.5 x (1 - t^2) du/dx, on arrays or Tensors."""
    du = (x * x * (3 * 0.044715) + 1.0) * _SQRT_2_OVER_PI           # du/dx
    return (1.0 + t) * 0.5 + x * (1.0 - t * t) * du * 0.5


class GeluTanh(Function):
    """0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3): GPT-2's approximation."""

    def forward(self, a):
        return 0.5 * a * (1.0 + self.xp.tanh(gelu_tanh_u(a)))

    def backward(self, g):
        a = self.parents[0]
        return gelu_tanh_slope(a, gelu_tanh_u(a).tanh()) * g


def gelu(x, approximate="none"):
    check_float("gelu", x)
    if approximate == "none":
        return Gelu.apply(x)
    if approximate == "tanh":
        return GeluTanh.apply(x)
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', not {approximate!r}")


class Sign(Function):
    """-1, 0 or 1; its gradient is 0 everywhere (PyTorch records it, so a graph passes through)."""

    def forward(self, a):
        return self.xp.sign(a) if a.dtype != bool else self.backend.copy(a)   # (numpy has no bool sign)

    def backward(self, g):
        return g * 0.0


class Clamp(Function):
    """Limit to [lo, hi]; the gradient passes where lo <= a <= hi (bounds included)."""

    def forward(self, a, lo=None, hi=None):
        inside = [a >= lo] if lo is not None else []
        inside += [a <= hi] if hi is not None else []
        mask = None
        for m in inside:
            mask = m if mask is None else mask & m
        self.save(mask)
        return self.xp.clip(a, lo, hi)

    def backward(self, g):
        (mask,) = self.saved
        if mask is None:
            return g
        return g * self.constant(self.xp.astype(mask, g.data.dtype))


class Clone(Function):
    """A copy with its own array; the gradient passes through."""

    def forward(self, a):
        return self.backend.copy(a)

    def backward(self, g):
        return g


class Cast(Function):
    def forward(self, a, dtype):
        return self.xp.astype(a, self.backend.native_dtype(dtype))

    def backward(self, g):
        return g.to(self.parents[0].dtype)


class ToDevice(Function):
    """Copy to another device through the host; the gradient goes back the same way."""

    def forward(self, a, backend):
        out = backend.asarray(self.backend.to_numpy(a))
        self.backend, self.xp = backend, backend.xp   # apply puts the output on the new device
        return out

    def backward(self, g):
        return g.to(self.parents[0].device)


# ---------------------------------------------------------------- reductions
class Sum(Function):
    def forward(self, a, dim, keepdim):
        self.kept = tuple(1 if i in dim else n for i, n in enumerate(a.shape))   # the shape with keepdim
        return self.xp.sum(a, axis=dim, keepdims=keepdim)

    def backward(self, g):
        return g.reshape(self.kept).expand(self.parents[0].shape)


class Max(Function):
    """Largest value along ``dim``; tied maxima share the gradient equally."""

    def forward(self, a, dim, keepdim):
        xp = self.xp
        out = xp.max(a, axis=dim, keepdims=True)
        hit = xp.astype(a == out, a.dtype)
        self.save(hit / xp.sum(hit, axis=dim, keepdims=True))              # each element's share
        self.kept = out.shape
        return out if keepdim else xp.reshape(out, tuple(n for i, n in enumerate(a.shape) if i not in dim))

    def backward(self, g):
        (weights,) = self.saved
        return g.reshape(self.kept) * self.constant(weights)


# ---------------------------------------------------------------- shape
class Reshape(Function):
    def forward(self, a, shape):
        return self.xp.reshape(a, shape)

    def backward(self, g):
        return g.reshape(self.parents[0].shape)


class Permute(Function):
    def forward(self, a, dims):
        self.dims = dims
        return self.xp.permute_dims(a, dims)

    def backward(self, g):
        inverse = tuple(sorted(range(len(self.dims)), key=self.dims.__getitem__))   # where each dim went
        return g.permute(inverse)


class Expand(Function):
    """Broadcast to ``shape`` without copying."""

    def forward(self, a, shape):
        return self.xp.broadcast_to(a, shape)

    def backward(self, g):
        return sum_to(g, self.parents[0].shape)


class Tril(Function):
    """Keep the lower (or, with upper=True, the upper) triangle of the last two dims."""

    def forward(self, a, k, upper):
        self.k, self.upper = k, upper
        return self.xp.triu(a, k=k) if upper else self.xp.tril(a, k=k)

    def backward(self, g):
        return g.triu(self.k) if self.upper else g.tril(self.k)


# ---------------------------------------------------------------- indexing
def _canonical_index(index, backend):
    """Tensors -> arrays, lists -> int arrays, boolean masks -> their nonzero positions.
    Returns (the index as a tuple, whether it is basic: no arrays)."""
    if not isinstance(index, tuple):
        index = (index,)
    out, basic = [], True
    for i in index:
        if is_tensor(i):
            if i.dtype.kind not in "biu":
                raise IndexError(f"index: a tensor used as an index must hold integers or booleans, got {i.dtype}")
            i = i.data
        elif isinstance(i, list):
            i = backend.asarray(i)
        if not backend.is_array(i):
            out.append(i)
            continue
        basic = False
        if backend.dtype_of(i).kind == "b":
            out.extend(backend.xp.nonzero(i))
        else:
            out.append(i)
    return tuple(out), basic


def _is_basic(index, backend):
    return not any(backend.is_array(i) for i in index)


class GetItem(Function):
    """a[index]: slices, ints, None, Ellipsis, integer arrays (repeats too), boolean masks."""

    def forward(self, a, index):
        self.save(index)
        return self.backend.getitem(a, index)

    def backward(self, g):
        (index,) = self.saved
        return IndexAdd.apply(g, index=index, shape=self.parents[0].shape)


class IndexAdd(Function):
    """zeros(shape) with g added at ``index``: GetItem's backward, repeats summed."""

    def forward(self, g, index, shape):
        self.save(index)
        out = self.backend.zeros(shape, self.backend.dtype_of(g))
        if _is_basic(index, self.backend) and self.backend.setitem_basic:
            out[index] = g
            return out
        return self.backend.index_add(out, index, g)

    def backward(self, gg):
        (index,) = self.saved
        return GetItem.apply(gg, index=index)


def getitem(x, index):
    index, basic = _canonical_index(index, x.backend)
    if basic:
        if Ellipsis not in index:
            index = index + (Ellipsis,)         # (x[1, 2] a 0-d view, as in PyTorch, not numpy's scalar copy)
        return GetItem.apply(x, index=index)
    first, index = _ints_first(index, x.backend)
    if first is not None:
        x = GetItem.apply(x, index=first)
    return GetItem.apply(x, index=index)


def _ints_first(index, backend):
    """PyTorch takes integer indices first, as plain selections, and only then the index arrays;
    numpy counts the integers among the advanced indices, which moves dims: for x (2, 3, 12, 5, 4),
    x[1, :, 3:11:2, d, 0:2] is (3, 4, len(d), 2) in PyTorch and (len(d), 3, 4, 2) in numpy. So
    with both kinds (``index`` holds arrays), split the index in two: (the ints, with the rest kept
    whole; the rest)."""
    is_int = [isinstance(i, int) and not isinstance(i, bool) for i in index]
    if not any(is_int):
        return None, index
    first = tuple(slice(None) if backend.is_array(i) else i for i in index)
    rest = tuple(i if backend.is_array(i) or i is Ellipsis else slice(None)
                 for i, integer in zip(index, is_int) if not integer)
    return first, rest


class Gather(Function):
    """Values picked along ``dim`` by an integer ``index`` of the same number of dims:
    out[i, j] = a[index[i, j], j] for dim 0, out[i, j] = a[i, index[i, j]] for dim 1.
    out is shaped like index. Backward adds each gradient back where its value came
    from (IndexAdd: a scatter-add, so an element picked twice gets both)."""

    def forward(self, a, index, dim):
        picks = _gather_index(self.backend, index, dim)       # one int array per dim of a
        self.save(picks)
        return self.backend.getitem(a, picks)

    def backward(self, g):
        (picks,) = self.saved
        return IndexAdd.apply(g, index=picks, shape=self.parents[0].shape), None


def _gather_index(backend, index, dim):
    """a[index] along dim as a numpy-style advanced index: ``index`` itself at dim, and at
    every other dim d an arange(index.shape[d]) shaped to broadcast against it."""
    full = []
    for d, n in enumerate(index.shape):
        if d == dim:
            full.append(index)
        else:
            shape = tuple(n if i == d else 1 for i in range(index.ndim))
            full.append(backend.xp.reshape(backend.arange(n), shape))
    return tuple(full)


def gather(x, dim, index):
    """``x.gather(dim, index)`` as in PyTorch: index holds integers in [0, x.shape[dim]), has
    x's number of dims, and is no longer than x along the others."""
    if not is_tensor(index):
        raise TypeError(f"gather: index must be a Tensor of integers, got {describe(index)}")
    if index.dtype.kind not in "iu":
        raise DtypeError(f"gather: index must be a Tensor of integers, got {describe(index)}")
    if x.ndim == 0 or index.ndim == 0:                        # a 0-d tensor counts as 1-d, as in PyTorch
        return gather(x.reshape(1) if x.ndim == 0 else x, dim, index.reshape(1) if index.ndim == 0 else index
                      ).reshape(index.shape)
    dim = normalize_dim(dim, x.ndim, "gather")
    if index.ndim != x.ndim or any(m > n for d, (m, n) in enumerate(zip(index.shape, x.shape)) if d != dim):
        raise TensorError(f"gather: index {index.shape} does not fit input {x.shape} along dim {dim} (same number "
                          "of dims, and no longer than the input along the others)")
    if index.backend.on_host and index.numel():                # (CuPy would wrap bad ids silently)
        lo, hi = int(index.data.min()), int(index.data.max())
        if lo < 0 or hi >= x.shape[dim]:
            raise IndexRangeError(f"gather: index must be in [0, {x.shape[dim]}) (dim {dim}'s size), got {lo}..{hi}")
    return Gather.apply(x, index, dim=dim)


TopK = collections.namedtuple("topk", ["values", "indices"])     # as PyTorch's torch.return_types.topk


def topk(x, k, dim=-1, largest=True, sorted=True):
    """The k largest (largest=False: smallest) entries of ``x`` along ``dim``: (values, indices).

    Ties: of equal values the one at the lower index comes first (a stable sort), and NaN
    counts as larger than any number, as in PyTorch. The values are ``x.gather(dim, indices)``,
    so the gradient flows to the picked elements only. ``sorted=False`` lets PyTorch return
    them in any order; here they come sorted all the same.
    """
    if x.dtype.kind == "b":
        raise DtypeError("topk: bool tensors are refused, as in PyTorch (convert with .long() first)")
    if not isinstance(k, int):
        raise TypeError(f"topk: k must be an int, got {describe(k)}")
    if x.ndim == 0:                                           # a 0-d tensor: its one value (k 0 or 1), as in PyTorch
        values, indices = topk(x.reshape(1), 1 if k == 0 else k, normalize_dim(dim, 0, "topk"), largest, sorted)
        return TopK(values.reshape(()), indices.reshape(()))
    dim = normalize_dim(dim, x.ndim, "topk")
    n = x.shape[dim]
    if not 0 <= k <= n:
        raise TensorError(f"topk: k={k} is out of range for dim {dim} of size {n} (shape {x.shape})")
    xp, backend = x.xp, x.backend
    if largest:                  # descending, and stable: sort the reversed row ascending, then reverse back
        order = (n - 1) - xp.flip(backend.argsort(xp.flip(x.data, axis=dim), dim), axis=dim)
    else:
        order = backend.argsort(x.data, dim)
    indices = constant(x, backend.getitem(order, (slice(None),) * dim + (slice(0, k),)))
    return TopK(gather(x, dim, indices), indices)


class Cat(Function):
    def forward(self, *arrays, dim):
        self.dim = dim
        return self.xp.concat(arrays, axis=dim)

    def backward(self, g):
        grads, start = [], 0
        lead = (slice(None),) * self.dim
        for p in self.parents:
            stop = start + p.shape[self.dim]
            piece = g[lead + (slice(start, stop),)]
            grads.append(piece if piece.dtype == p.dtype else piece.to(p.dtype))   # cat promotes dtypes
            start = stop
        return tuple(grads)


def cat(tensors, dim=0):
    tensors = list(tensors)
    if not tensors or not all(is_tensor(t) for t in tensors):
        raise TypeError("cat: expected a non-empty list of Tensors, got "
                        f"{[type(t).__name__ for t in tensors] or 'an empty list'}")
    for i, t in enumerate(tensors):
        if not t.ndim:
            raise TensorError(f"cat: tensor {i} is 0-d and has no dim to join along (use ta.stack, or t[None])")
    dim = normalize_dim(dim, tensors[0].ndim, "cat")
    for t in tensors[1:]:
        if t.ndim != tensors[0].ndim or any(
                n != m for i, (n, m) in enumerate(zip(t.shape, tensors[0].shape)) if i != dim):
            raise TensorError(f"cat: shapes {tensors[0].shape} and {t.shape} differ outside dim {dim}")
    dtype = tensors[0].dtype
    if any(t.dtype != dtype for t in tensors[1:]):
        dtype = functools.reduce(promote_types, [t.dtype for t in tensors])    # int64 with float32: float32
        tensors = [to_dtype(t, dtype) for t in tensors]
    return Cat.apply(*tensors, dim=dim)


def stack(tensors, dim=0):
    tensors = list(tensors)
    if not tensors:
        raise TypeError("stack: expected a non-empty list of Tensors")
    for t in tensors[1:]:
        if t.shape != tensors[0].shape:
            raise TensorError(f"stack: all shapes must match, got {tensors[0].shape} and {t.shape}")
    dim = normalize_dim(dim, tensors[0].ndim + 1, "stack")
    return cat([t.unsqueeze(dim) for t in tensors], dim)


class Split(Function):
    """Pieces of ``a`` along ``dim``, of the given sizes: one output each (views, no copy).

    Backward gets one gradient per piece and joins them with one concat, so
    attention's q/k/v split costs one copy, not three zero buffers added up.
    A piece that got no gradient contributes zeros.
    """

    def forward(self, a, dim, sizes):
        self.dim, lead, start, pieces = dim, (slice(None),) * dim, 0, []
        self.shapes = [a.shape[:dim] + (size,) + a.shape[dim + 1:] for size in sizes]
        for size in sizes:
            pieces.append(self.backend.getitem(a, lead + (slice(start, start + size),)))
            start += size
        return tuple(pieces)

    def backward(self, *grads):
        dtype = self.parents[0].dtype
        return Cat.apply(*[self.constant(self.backend.zeros(shape, dtype)) if g is None else g
                           for g, shape in zip(grads, self.shapes)], dim=self.dim)


def split(x, split_size_or_sections, dim=0):
    """Pieces along ``dim``: of one size (the last may be smaller) or of the listed sizes."""
    dim, sizes = split_sizes(x, split_size_or_sections, dim)
    return Split.apply(x, dim=dim, sizes=sizes)


def split_sizes(x, split_size_or_sections, dim):
    """(dim as an index, the pieces' sizes) for split's arguments; a ValueError when they do not fit."""
    dim = normalize_dim(dim, x.ndim, "split")
    n = x.shape[dim]
    if isinstance(split_size_or_sections, int):
        if split_size_or_sections < 1:
            raise TensorError(f"split: split_size must be at least 1, got {split_size_or_sections}")
        sizes = [min(split_size_or_sections, n - s) for s in range(0, n, split_size_or_sections)]
    else:
        sizes = list(split_size_or_sections)
        if sum(sizes) != n or any(s < 0 for s in sizes):
            raise TensorError(f"split: sections {sizes} do not add up to {n} (dim {dim} of shape {x.shape})")
    return dim, tuple(sizes)


class Where(Function):
    """cond ? a : b, broadcasting all three; cond takes no gradient."""

    broadcasts = True

    def forward(self, cond, a, b):
        return self.xp.where(cond, a, b)

    def backward(self, g):
        cond, a, b = self.parents
        _, da, db = self.needs_input_grad
        zero = self.constant(self.backend.zeros((), g.dtype))
        return (None,
                unbroadcast(where(cond, g, zero), a) if da else None,
                unbroadcast(where(cond, zero, g), b) if db else None)


def where(cond, a, b):
    """cond ? a : b, for a boolean Tensor ``cond``; a and b are Tensors or Python numbers, and
    the result's dtype follows the promotion rules (a number as a 0-d tensor of its kind:
    ``where(cond, 4, 2)`` is int64, ``where(cond, x, 0.0)`` keeps a float64 x float64)."""
    if not is_tensor(cond):
        raise TypeError(f"where: cond must be a boolean Tensor, got {describe(cond)}")
    if cond.dtype.kind != "b":
        raise DtypeError(f"where: cond must be a boolean Tensor, got {cond.dtype} (compare first: x > 0)")
    a, b = (x if is_tensor(x) else number_tensor(cond, x, "where") for x in (a, b))
    dtype = result_dtype(a, b)
    return Where.apply(cond, to_dtype(a, dtype), to_dtype(b, dtype))


_DEFAULT_DTYPES = {"b": "bool", "i": "int64", "u": "int64", "f": "float32"}


def number_tensor(like, value, op):
    """A Python number as a 0-d Tensor on like's device, in the default dtype of its kind
    (bool, int64 or float32), as PyTorch treats a number next to tensors."""
    kind = check_operand(value, op)
    return constant(like, like.backend.asarray(value, _DEFAULT_DTYPES[kind]))


# ---------------------------------------------------------------- softmax family
# Each is one Function with a stable forward (the row's max is subtracted
# first) and a backward written with Tensor ops, so it differentiates twice.
def stable_exp(xp, x, dim):
    """exp(x - max) along dim, and that max (kept), finite for any finite x."""
    m = xp.max(x, axis=dim, keepdims=True)
    return xp.exp(x - m), m


class Softmax(Function):
    """exp(x - max) / sum(exp(x - max)) along dim; backward y (g - sum(g y)), a Jacobian-vector product."""

    def forward(self, x, dim):
        self.dim = dim
        e, _ = stable_exp(self.xp, x, dim)
        return e / self.xp.sum(e, axis=dim, keepdims=True)

    def backward(self, g):
        y = self.output
        return y * (g - (g * y).sum(self.dim, keepdim=True))


class LogSoftmax(Function):
    def forward(self, x, dim):
        self.dim = dim
        e, m = stable_exp(self.xp, x, dim)
        return x - m - self.xp.log(self.xp.sum(e, axis=dim, keepdims=True))

    def backward(self, g):
        return g - self.output.exp() * g.sum(self.dim, keepdim=True)


class LogSumExp(Function):
    def forward(self, x, dim, keepdim):
        self.dim = dim
        e, m = stable_exp(self.xp, x, dim)
        out = m + self.xp.log(self.xp.sum(e, axis=dim, keepdims=True))
        return out if keepdim else self.xp.squeeze(out, axis=dim)

    def backward(self, g):
        x = self.parents[0]
        out = self.output if self.output.ndim == x.ndim else self.output.unsqueeze(self.dim)
        g = g if g.ndim == x.ndim else g.unsqueeze(self.dim)
        return g * (x - out).exp()


def check_float(op, x):
    """Float ops refuse integer tensors, as in PyTorch (numpy would silently give float64)."""
    if x.dtype.kind != "f":
        raise DtypeError(f"{op}: expected a float tensor, got {x.dtype} (convert with .float())")


def softmax(x, dim=-1):
    check_float("softmax", x)
    shape = x.shape
    if 0 in shape:                                     # no elements: nothing to normalise (no max to take)
        return x * 1.0
    return Softmax.apply(x, dim=normalize_dim(dim, len(shape), "softmax"))


def log_softmax(x, dim=-1):
    check_float("log_softmax", x)
    shape = x.shape
    if 0 in shape:
        return x * 1.0
    return LogSoftmax.apply(x, dim=normalize_dim(dim, len(shape), "log_softmax"))


def logsumexp(x, dim=-1, keepdim=False):
    x = x if x.dtype.kind == "f" else x.to(float32)    # integers give float32, as in PyTorch
    return LogSumExp.apply(x, dim=normalize_dim(dim, x.ndim, "logsumexp"), keepdim=keepdim)


class MaskedSoftmax(Function):
    """Softmax over the last dim of the allowed entries only (mask: True = take part).

    A row with nothing allowed gets all-zero weights and a zero gradient,
    not the NaN of exp(-inf) / 0.
    """

    def forward(self, x, allowed):                                 # x (..., T), allowed broadcasting to it
        return masked_softmax(self.xp, x, allowed)

    def backward(self, g):
        y = self.output
        return y * (g - (g * y).sum(-1, keepdim=True)), None


def masked_softmax(xp, x, allowed):
    """MaskedSoftmax's forward on arrays (attention's too): softmax over the last dim where allowed."""
    x = xp.where(allowed, x, -xp.inf)
    m = xp.max(x, axis=-1, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0.0)                            # fully masked rows
    e = xp.exp(x - m)                                               # exp(-inf) = 0 where masked
    total = xp.sum(e, axis=-1, keepdims=True)
    return e / xp.where(total > 0, total, 1.0)


def matrix_transpose(xp, a):
    """Swap the last two axes of an array: (..., n, d) -> (..., d, n), a view."""
    return xp.permute_dims(a, tuple(range(a.ndim - 2)) + (a.ndim - 1, a.ndim - 2))


@functools.lru_cache(maxsize=256)
def causal_mask(t_q, t_k, backend, offset=0):
    """(t_q, t_k) booleans on ``backend``: True where query i may see key j, i.e. j <= i + offset.

    offset 0 aligns the queries at the top left (as PyTorch's is_causal); with
    a KV cache the new queries sit at the end, offset = t_k - t_q.
    """
    ones = backend.full((t_q, t_k), 1, "float32")
    return backend.xp.tril(ones, k=offset) > 0


__all__ = ["sum_to", "constant", "lift", "matmul", "dot", "topk", "gelu", "getitem", "gather", "cat", "stack", "split", "where",
           "softmax", "log_softmax", "logsumexp", "logsigmoid", "softplus", "causal_mask"]
