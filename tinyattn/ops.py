"""The primitive ops: one small Function each, forward and backward side by side.

``forward`` gets raw arrays and uses ``self.xp``; ``backward`` gets the output
gradient ``g`` as a Tensor and returns gradients built from Tensor ops, so
they can be differentiated again. Shapes in comments: a, b inputs; g like out.
"""
import math

from .tensor import Function, Tensor, is_grad_enabled, _dim


def sum_to(g, shape):
    """Sum ``g`` down to ``shape``: undoes broadcasting, for every binary op."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1)
    return g.sum(axes, keepdim=True).reshape(shape)


def _const(like, array):
    """A constant Tensor (no gradient) on ``like``'s device."""
    return Tensor._make(array, like._backend)


# ---------------------------------------------------------------- arithmetic
class Add(Function):
    broadcasts = True

    def forward(self, a, b):
        return a + b

    def backward(self, g):
        a, b = self.parents
        return sum_to(g, a.shape), sum_to(g, b.shape)


class Sub(Function):
    broadcasts = True

    def forward(self, a, b):
        return a - b

    def backward(self, g):
        a, b = self.parents
        return sum_to(g, a.shape), sum_to(-g, b.shape)


class Mul(Function):
    broadcasts = True

    def forward(self, a, b):
        return a * b

    def backward(self, g):
        a, b = self.parents
        da, db = self.needs_input_grad
        return (sum_to(g * b, a.shape) if da else None,
                sum_to(g * a, b.shape) if db else None)


class Div(Function):
    broadcasts = True

    def forward(self, a, b):
        return a / b

    def backward(self, g):
        a, b = self.parents
        da, db = self.needs_input_grad
        return (sum_to(g / b, a.shape) if da else None,
                sum_to(-g * a / (b * b), b.shape) if db else None)


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
        return g * self.p * a ** (self.p - 1)


class Pow(Function):
    """a ** b for two tensors; the gradient for b needs a > 0 (it uses log a)."""

    broadcasts = True

    def forward(self, a, b):
        return a ** b

    def backward(self, g):
        a, b = self.parents
        da, db = self.needs_input_grad
        return (sum_to(g * b * a ** (b - 1.0), a.shape) if da else None,
                sum_to(g * self.output * a.log(), b.shape) if db else None)


class MatMul(Function):
    """(..., n, k) @ (..., k, m) -> (..., n, m), batch dims broadcast.

    (..., n, k) @ (k, m), as in every Linear layer, runs as one 2-d matmul
    (B*T, k) @ (k, m): BLAS does one big product much faster than B small ones.
    """

    def forward(self, a, b):
        if b.ndim == 2 and a.ndim > 2:
            flat = self.xp.matmul(self.xp.reshape(a, (-1, a.shape[-1])), b)     # (B*T, m)
            return self.xp.reshape(flat, a.shape[:-1] + b.shape[-1:])
        return self.xp.matmul(a, b)

    def backward(self, g):
        a, b = self.parents
        da, db = self.needs_input_grad
        grad_a = sum_to(g @ b.mT, a.shape) if da else None
        if not db:
            return grad_a, None
        if b.ndim == 2 and a.ndim > 2:                        # sum over B and T in one matmul
            return grad_a, a.reshape(-1, a.shape[-1]).mT @ g.reshape(-1, g.shape[-1])
        return grad_a, sum_to(a.mT @ g, b.shape)


def check_same_kind(op, *tensors):
    """Layers and matmul do not mix integer (or boolean) and float tensors, as in PyTorch:
    ids fed to a Linear layer by mistake would otherwise give a float64 result silently."""
    floats = [t.dtype.kind == "f" for t in tensors]
    if any(floats) and not all(floats):
        dtypes = " and ".join(str(t.dtype) for t in tensors)
        raise TypeError(f"{op}: got {dtypes} tensors; convert the integer one with .float() "
                        "(token ids go through an Embedding first)")


def matmul(a, b):
    """numpy's matmul rules: a 1-d operand gains a dim of 1, which is dropped after."""
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul needs at least 1-d operands, got shapes {a.shape} and {b.shape}")
    check_same_kind("matmul", a, b)
    if a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not fit "
                         f"({a.shape[-1]} != {b.shape[-2 if b.ndim > 1 else 0]})")
    if a.ndim == 1 and b.ndim == 1:
        return (a * b).sum()
    if a.ndim == 1:
        return MatMul.apply(a.unsqueeze(0), b).squeeze(-2)
    if b.ndim == 1:
        return MatMul.apply(a, b.unsqueeze(-1)).squeeze(-1)
    return MatMul.apply(a, b)


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


class Relu(Function):
    """max(a, 0); at a == 0 the gradient is 0, as in PyTorch."""

    def forward(self, a):
        self.mask = a > 0
        return self.xp.where(self.mask, a, 0.0)

    def backward(self, g):
        return g * _const(g, self.xp.astype(self.mask, g.data.dtype))


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


class GeluTanh(Function):
    """0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3): GPT-2's approximation.

    d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) du/dx, with t = tanh(u).
    When no graph is recorded (the usual backward) the derivative is computed
    on raw arrays, in place, from the t kept by forward: GELU is the largest
    elementwise cost of a GPT step. On CUDA a fused kernel does each pass.
    With create_graph=True the same formula runs as Tensor ops.
    """

    def forward(self, a):
        fused = self.backend.fused_gelu_tanh(a)
        if fused is not None:
            self.t = None
            return fused
        u = a * a
        u *= 0.044715
        u += 1.0
        u *= a
        u *= _SQRT_2_OVER_PI                                     # u = sqrt(2/pi) (a + 0.044715 a^3)
        self.t = self.xp.tanh(u)
        out = self.t + 1.0
        out *= a
        out *= 0.5
        return out

    def backward(self, g):
        a = self.parents[0]
        if not is_grad_enabled():
            fused = self.backend.fused_gelu_tanh_backward(a.data, g.data)
            if fused is not None:
                return _const(g, fused)
            x, t = a.data, self.t
            du = x * x
            du *= 3 * 0.044715 * _SQRT_2_OVER_PI
            du += _SQRT_2_OVER_PI                                # du/dx
            d = t * t
            d -= 1.0
            d *= x
            d *= du                                              # -x (1 - t^2) du/dx
            d -= t
            d -= 1.0
            d *= -0.5                                            # 0.5 (1 + t) + 0.5 x (1 - t^2) du/dx
            d *= g.data
            return _const(g, d)
        t = (_SQRT_2_OVER_PI * (a + 0.044715 * a * a * a)).tanh()
        du = _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * a * a)
        return g * (0.5 * (1.0 + t) + 0.5 * a * (1.0 - t * t) * du)


def gelu(x, approximate="none"):
    if approximate == "none":
        return Gelu.apply(x)
    if approximate == "tanh":
        return GeluTanh.apply(x)
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', not {approximate!r}")


class Clamp(Function):
    """Limit to [lo, hi]; the gradient passes where lo <= a <= hi (bounds included)."""

    def forward(self, a, lo=None, hi=None):
        inside = [a >= lo] if lo is not None else []
        inside += [a <= hi] if hi is not None else []
        self.mask = None
        for m in inside:
            self.mask = m if self.mask is None else self.mask & m
        return self.xp.clip(a, lo, hi)

    def backward(self, g):
        if self.mask is None:
            return g
        return g * _const(g, self.xp.astype(self.mask, g.data.dtype))


class Cast(Function):
    def forward(self, a, dtype):
        return self.xp.astype(a, self.backend.native_dtype(dtype))

    def backward(self, g):
        return g.to(self.parents[0].dtype)


class ToDevice(Function):
    """Copy to another device through the host; the gradient goes back the same way."""

    def forward(self, a, backend):
        out = backend.asarray(self.backend.to_numpy(a))
        self.backend, self.xp = backend, backend.xp   # the output lives on the new device
        return out

    @classmethod
    def apply(cls, x, backend):
        out = super().apply(x, backend=backend)
        out._backend = backend
        return out

    def backward(self, g):
        return g.to(self.parents[0].device)


# ---------------------------------------------------------------- reductions
class Sum(Function):
    def forward(self, a, dim, keepdim):
        self.kept = tuple(1 if i in dim else n for i, n in enumerate(a.shape))
        return self.xp.sum(a, axis=dim, keepdims=keepdim)

    def backward(self, g):
        return g.reshape(self.kept).expand(self.parents[0].shape)


class Max(Function):
    """Largest value along ``dim``; tied maxima share the gradient equally."""

    def forward(self, a, dim, keepdim):
        xp = self.xp
        out = xp.max(a, axis=dim, keepdims=True)
        hit = xp.astype(a == out, a.dtype)
        self.weights = hit / xp.sum(hit, axis=dim, keepdims=True)
        self.kept = out.shape
        return out if keepdim else xp.reshape(out, tuple(n for i, n in enumerate(a.shape) if i not in dim))

    def backward(self, g):
        return g.reshape(self.kept) * _const(g, self.weights)


# ---------------------------------------------------------------- shape
class Reshape(Function):
    def forward(self, a, shape):
        return self.xp.reshape(a, shape)

    def backward(self, g):
        return g.reshape(self.parents[0].shape)


class Permute(Function):
    def forward(self, a, dims):
        self.inverse = tuple(sorted(range(len(dims)), key=dims.__getitem__))
        return self.xp.permute_dims(a, dims)

    def backward(self, g):
        return g.permute(self.inverse)


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
    """Tensors -> arrays, lists -> int arrays, boolean masks -> their nonzero positions."""
    if not isinstance(index, tuple):
        index = (index,)
    out = []
    for i in index:
        if isinstance(i, Tensor):
            if i.dtype.kind not in "biu":
                raise IndexError(f"index: a tensor used as an index must hold integers or booleans, got {i.dtype}")
            i = i.data
        elif isinstance(i, list):
            i = backend.asarray(i)
        if backend.is_array(i) and backend.dtype_of(i).kind == "b":
            out.extend(backend.xp.nonzero(i))
        else:
            out.append(i)
    return tuple(out)


def _is_basic(index, backend):
    return not any(backend.is_array(i) for i in index)


class GetItem(Function):
    """a[index]: slices, ints, None, Ellipsis, integer arrays (repeats too), boolean masks."""

    def forward(self, a, index):
        self.index = index
        return self.backend.getitem(a, index)

    def backward(self, g):
        return IndexAdd.apply(g, index=self.index, shape=self.parents[0].shape)


class IndexAdd(Function):
    """zeros(shape) with g added at ``index``: GetItem's backward, repeats summed."""

    def forward(self, g, index, shape):
        self.index = index
        out = self.backend.zeros(shape, self.backend.dtype_of(g))
        if _is_basic(index, self.backend) and self.backend.name != "strict":
            out[index] = g
            return out
        return self.backend.index_add(out, index, g)

    def backward(self, gg):
        return GetItem.apply(gg, index=self.index)


def getitem(x, index):
    return GetItem.apply(x, index=_canonical_index(index, x._backend))


class Cat(Function):
    def forward(self, *arrays, dim):
        self.dim = dim
        return self.xp.concat(arrays, axis=dim)

    def backward(self, g):
        grads, start = [], 0
        lead = (slice(None),) * self.dim
        for p in self.parents:
            stop = start + p.shape[self.dim]
            grads.append(g[lead + (slice(start, stop),)])
            start = stop
        return tuple(grads)


def cat(tensors, dim=0):
    tensors = list(tensors)
    if not tensors or not all(isinstance(t, Tensor) for t in tensors):
        raise TypeError("cat: expected a non-empty list of Tensors, got "
                        f"{[type(t).__name__ for t in tensors] or 'an empty list'}")
    dim = _dim(dim, tensors[0].ndim, "cat")
    for t in tensors[1:]:
        if t.ndim != tensors[0].ndim or any(
                n != m for i, (n, m) in enumerate(zip(t.shape, tensors[0].shape)) if i != dim):
            raise ValueError(f"cat: shapes {tensors[0].shape} and {t.shape} differ outside dim {dim}")
    return Cat.apply(*tensors, dim=dim)


def stack(tensors, dim=0):
    tensors = list(tensors)
    if not tensors:
        raise TypeError("stack: expected a non-empty list of Tensors")
    for t in tensors[1:]:
        if t.shape != tensors[0].shape:
            raise ValueError(f"stack: all shapes must match, got {tensors[0].shape} and {t.shape}")
    dim = _dim(dim, tensors[0].ndim + 1, "stack")
    return cat([t.unsqueeze(dim) for t in tensors], dim)


def split(x, split_size_or_sections, dim=0):
    """Pieces along ``dim``: of one size (the last may be smaller) or of the listed sizes."""
    dim = _dim(dim, x.ndim, "split")
    n = x.shape[dim]
    if isinstance(split_size_or_sections, int):
        sizes = [min(split_size_or_sections, n - s) for s in range(0, n, split_size_or_sections)]
    else:
        sizes = list(split_size_or_sections)
        if sum(sizes) != n:
            raise ValueError(f"split: sections {sizes} do not add up to {n} (dim {dim} of shape {x.shape})")
    pieces, start, lead = [], 0, (slice(None),) * dim
    for size in sizes:
        pieces.append(x[lead + (slice(start, start + size),)])
        start += size
    return tuple(pieces)


class Where(Function):
    """cond ? a : b, broadcasting all three; cond takes no gradient."""

    broadcasts = True

    def forward(self, cond, a, b):
        self.cond = cond
        return self.xp.where(cond, a, b)

    def backward(self, g):
        _, a, b = self.parents
        _, da, db = self.needs_input_grad
        cond = _const(g, self.cond)
        zero = _const(g, self.backend.zeros((), g.dtype))
        return (None,
                sum_to(where(cond, g, zero), a.shape) if da else None,
                sum_to(where(cond, zero, g), b.shape) if db else None)


def where(cond, a, b):
    like = next((t for t in (a, b) if isinstance(t, Tensor)), None)
    if like is None:
        raise TypeError("where: a or b must be a Tensor")
    cond = cond if isinstance(cond, Tensor) else like._lift(cond)
    return Where.apply(cond, like._lift(a), like._lift(b))


__all__ = ["sum_to", "matmul", "gelu", "getitem", "cat", "stack", "split", "where"]
