"""Fast versions of the ops: each a subclass of the teaching op in ops.py or nn/functional.py.

Each runs the same arithmetic as its teaching op, faster: a fused kernel
(``backend.run_kernel``, numba on the CPU, CuPy's on the GPU; ``kernels`` names
the ones it asks for), tinyattn's threads (``backend.products``: on the CPU, split
over the threads, threads.py), a BLAS product
in place of a slow reduction, or arrays where the formula builds Tensors, in
its ``forward`` and ``fast_backward``. Where it cannot (a kernel declines a
dtype it is not compiled for, a mask shape it does not take), its forward calls
the teaching op's (``super().forward``: the formula it subclasses), and its
fast_backward returns ``NotImplemented``, so that the formula's backward runs;
the formula's backward also runs wherever a graph of the backward is recorded
(``create_graph=True``), which only Tensor ops can give. ``FastOp`` holds the
backward's two rules, once for every fast op.

The op table (tests/support/optable.py) runs every op with the fast layer on and
off, and checks every kernel against its formula.
"""
import math

from .. import ops
from ..autograd import is_grad_enabled
from ..nn import attention, flash, functional as F
from . import threads


class FastOp:
    """The base of every fast op (the first base; the teaching op is the second), and the rules
    of its backward, in one place: where the fast version declines (``fast_backward`` returns
    NotImplemented: no kernel for these inputs), the teaching op's backward runs; and so it does
    wherever a graph of the backward is recorded (create_graph=True), since only a backward
    written with Tensor ops can be differentiated again. (Forward is each op's own: where it
    declines, it calls ``super().forward``, the formula, directly; a call through a generic
    forward here would cost every small op a frame and its arguments packed twice.)
    ``kernels`` names the kernels the op asks for (the op table checks each against the formula)."""

    formula = None          # the teaching op (set by _speeding_up below)
    kernels = ()

    def backward(self, *grads):
        if is_grad_enabled():
            return self.formula.backward(self, *grads)
        out = self.fast_backward(*grads)
        return self.formula.backward(self, *grads) if out is NotImplemented else out

    def fast_backward(self, *grads):
        return NotImplemented


def kernel(ctx, name, *args):
    """The kernel ``name`` run on ``args`` by ctx's backend, or NotImplemented where it declines."""
    out = ctx.backend.run_kernel(name, *args)
    return NotImplemented if out is None else out


# ---------------------------------------------------------------- sums as BLAS products
def row_sums(backend, x, scale=1.0):
    """``x`` summed over its last axis, times ``scale``, kept as (..., 1).

    A matrix-vector product with a ones vector: BLAS does it several times faster
    than numpy's reduction over a short last axis (48 to 384 channels, float32).
    """
    n = x.shape[-1]
    ones = backend.full((n, 1), scale, backend.dtype_of(x))
    return backend.xp.reshape(backend.xp.reshape(x, (-1, n)) @ ones, tuple(x.shape[:-1]) + (1,))


def leading_sums(backend, x, lead):
    """``x`` summed over its first ``lead`` axes, as (1, N) @ (N, rest): a bias gradient."""
    rest = tuple(x.shape[lead:])
    m = math.prod(x.shape[:lead])
    ones = backend.full((1, m), 1, backend.dtype_of(x))
    return backend.xp.reshape(ones @ backend.xp.reshape(x, (m, math.prod(rest))), rest)


def can_sum_by_blas(backend, a):
    """True for float32 and float64 arrays with elements, whose sums can run as BLAS products."""
    dtype = backend.dtype_of(a)
    return dtype.kind == "f" and dtype.itemsize >= 4 and a.ndim >= 2 and a.size > 0


# ---------------------------------------------------------------- ops.py
class MatMul(FastOp, ops.MatMul):
    """(..., n, k) @ (k, m), as in every Linear layer, runs as one 2-d product (B*T, k) @ (k, m)
    split over the threads; stacked products (attention's) split their stack."""

    def forward(self, a, b):
        if b.ndim == 2 and a.ndim > 2:
            flat = self.backend.products.matmul(self.xp.reshape(a, (-1, a.shape[-1])), b)     # (B*T, m)
            return self.xp.reshape(flat, a.shape[:-1] + b.shape[-1:])
        return self.backend.products.matmul(a, b)

    def fast_backward(self, g):
        a, b = self.parents
        da, db = self.needs_input_grad
        if a.ndim == b.ndim > 2 and a.shape[:-2] == b.shape[:-2]:   # stacks of the same shape
            mT, xp, mm = ops.matrix_transpose, self.xp, self.backend.products.matmul
            return (self.constant(mm(g.data, mT(xp, b.data))) if da else None,
                    self.constant(mm(mT(xp, a.data), g.data)) if db else None)
        if b.ndim == 2 and a.ndim > 2:                              # sum over B and T in one product
            return (ops.sum_to(g @ b.mT, a.shape) if da else None,
                    a.reshape(-1, a.shape[-1]).mT @ g.reshape(-1, g.shape[-1]) if db else None)
        return NotImplemented


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu_tanh_denominator(xp, x):
    """1 + exp(-2u) for an array x: 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / this.

    One exp instead of a tanh (numpy's float32 tanh takes about four times as
    long as its exp); -2u is capped at 80 so exp stays finite (below x = -10
    the output is then about 1e-34 instead of a smaller number).
    """
    d = x * x
    d *= -2 * 0.044715 * _SQRT_2_OVER_PI
    d += -2 * _SQRT_2_OVER_PI
    d *= x                                                       # -2u
    d = xp.exp(xp.clip(d, None, 80.0))
    d += 1.0
    return d


def gelu_tanh_slope_from_denominator(x, d):
    """The slope s + 2 x u' s (1 - s), with s = sigmoid(2u) = 1 / d: on arrays, few temporaries."""
    s = 1.0 / d
    slope = x * x
    slope *= 3 * 0.044715 * _SQRT_2_OVER_PI * 2
    slope += _SQRT_2_OVER_PI * 2
    slope *= x                                                   # 2 x u'
    slope *= s
    slope *= 1.0 - s
    slope += s
    return slope


class Erf(FastOp, ops.Erf):
    """The kernel (numpy has no erf)."""

    kernels = ("erf",)

    def forward(self, a):
        out = self.backend.run_kernel("erf", a)
        return super().forward(a) if out is None else out


class Gelu(FastOp, ops.Gelu):
    """x Phi(x), forward and backward each one kernel (numpy has no erf)."""

    kernels = ("gelu_erf", "gelu_erf_backward")

    def forward(self, a):
        out = self.backend.run_kernel("gelu_erf", a)
        return super().forward(a) if out is None else out

    def fast_backward(self, g):
        dx = kernel(self, "gelu_erf_backward", self.parents[0].data, g.data)
        return dx if dx is NotImplemented else self.constant(dx)


class GeluTanh(FastOp, ops.GeluTanh):
    """The kernel, else x sigmoid(2u) = x / (1 + exp(-2u)): the same function with one exp,
    keeping d = 1 + exp(-2u) for backward."""

    kernels = ("gelu_tanh", "gelu_tanh_backward")

    def forward(self, a):
        out = self.backend.run_kernel("gelu_tanh", a)
        if out is not None:
            return out
        d = gelu_tanh_denominator(self.xp, a)
        self.save(d)
        return a / d

    def fast_backward(self, g):
        a = self.parents[0]
        dx = self.backend.run_kernel("gelu_tanh_backward", a.data, g.data)
        if dx is None:
            d = self.saved[0] if self.saved else gelu_tanh_denominator(self.xp, a.data)   # fused forward: no d
            dx = gelu_tanh_slope_from_denominator(a.data, d)
            dx *= g.data
        return self.constant(dx)


class Sum(FastOp, ops.Sum):
    """Sums over the last axis, or over the leading ones, as BLAS products."""

    def forward(self, a, dim, keepdim):
        if can_sum_by_blas(self.backend, a) and 0 < len(dim) < a.ndim:
            self.kept = tuple(1 if i in dim else n for i, n in enumerate(a.shape))
            if dim == (a.ndim - 1,):                                   # over the last axis
                out = row_sums(self.backend, a)
                return out if keepdim else self.xp.reshape(out, a.shape[:-1])
            if dim == tuple(range(len(dim))):                          # over the leading axes
                out = leading_sums(self.backend, a, len(dim))
                return self.xp.reshape(out, self.kept) if keepdim else out
        return super().forward(a, dim, keepdim)


class Split(FastOp, ops.Split):
    """When the pieces' gradients are already the slices of one array (the attention kernel
    writes dq, dk and dv so), that array is the gradient: no concat at all."""

    def fast_backward(self, *grads):
        if all(g is not None for g in grads):
            whole = threads.joined([g.data for g in grads], self.parents[0].shape, self.dim)
            if whole is not None:
                return self.constant(whole)
        return NotImplemented


def softmax_backward(ctx, g):
    """y (g - sum(g y)) over the last axis on arrays, for ctx's output y: the kernel, else the
    sum as a BLAS product. NotImplemented where neither applies (the formula runs)."""
    y = ctx.output
    if not can_sum_by_blas(ctx.backend, y.data):
        return NotImplemented
    dx = ctx.backend.run_kernel("softmax_backward", y.data, g.data)
    if dx is None:
        dx = g.data - row_sums(ctx.backend, g.data * y.data)
        dx *= y.data
    return ctx.constant(dx)


class Softmax(FastOp, ops.Softmax):
    """The kernel, else the sum as a BLAS product; over the last dim only."""

    kernels = ("softmax", "softmax_backward")

    def forward(self, x, dim):
        self.dim = dim
        if dim != x.ndim - 1:
            return super().forward(x, dim)
        out = self.backend.run_kernel("softmax", x)
        if out is not None:
            return out
        if not can_sum_by_blas(self.backend, x):
            return super().forward(x, dim)
        e, _ = ops.stable_exp(self.xp, x, dim)
        e /= row_sums(self.backend, e)                                 # in place: e is ours
        return e

    def fast_backward(self, g):
        return softmax_backward(self, g) if self.dim == g.ndim - 1 else NotImplemented


class MaskedSoftmax(FastOp, ops.MaskedSoftmax):
    kernels = ("masked_softmax", "softmax_backward")

    def forward(self, x, allowed):
        out = self.backend.run_kernel("masked_softmax", x, allowed)
        return super().forward(x, allowed) if out is None else out

    def fast_backward(self, g):
        dx = softmax_backward(self, g)
        return dx if dx is NotImplemented else (dx, None)


# ---------------------------------------------------------------- nn/functional.py
class CrossEntropy(FastOp, F.CrossEntropy):
    """The kernel does each pass, keeping only the per-row log-sum-exp."""

    kernels = ("cross_entropy", "cross_entropy_backward")

    def forward(self, logits, targets, ignore_index):
        fused = self.backend.run_kernel("cross_entropy", logits, targets, ignore_index)
        if fused is None:
            return super().forward(logits, targets, ignore_index)
        self.ignore_index = ignore_index
        loss, lse, scale = fused                                       # (), (N,), ()
        self.save(lse, scale)
        return loss

    def fast_backward(self, g):
        logits, targets = self.parents
        if not self.saved:                                             # the forward was the formula
            return NotImplemented
        dlogits = kernel(self, "cross_entropy_backward", g.data, logits.data, targets.data, *self.saved,
                         self.ignore_index)
        return dlogits if dlogits is NotImplemented else (self.constant(dlogits), None)


def rows_added(backend, rows, idx, g):
    """(rows, C) zeros with g's rows (N, C) added at idx (N,), repeats added up: the kernel (one
    pass over the rows), else a one-hot product, exact and for the small vocabularies here several
    times faster than np.add.at on a CPU; None where neither applies."""
    out = backend.run_kernel("index_add_rows", rows, idx, g)
    if out is None and rows * idx.shape[0] <= 1 << 24:
        onehot = idx[None, :] == backend.arange(rows)[:, None]                   # (V, N)
        out = backend.xp.astype(onehot, g.dtype) @ g                              # (V, C)
    return out


class EmbeddingGrad(FastOp, F.EmbeddingGrad):
    """The rows added by rows_added."""

    kernels = ("index_add_rows",)

    def forward(self, g, idx, rows):
        out = rows_added(self.backend, rows, idx, g)
        return super().forward(g, idx, rows) if out is None else out


class Embedding(FastOp, F.Embedding):
    """Backward on arrays, by rows_added. (A backward runs once the compiled call that recorded the
    graph has ended, so the EmbeddingGrad op that the formula's backward makes would run its own
    formula, np.add.at: a quarter of the default model's step.)"""

    kernels = ("index_add_rows",)

    def fast_backward(self, g):
        weight, idx = self.parents
        if weight.ndim != 2:
            return NotImplemented
        rows = rows_added(self.backend, weight.shape[0], self.xp.reshape(idx.data, (-1,)),
                          self.xp.reshape(g.data, (-1, weight.shape[1])))                 # (V, C)
        return NotImplemented if rows is None else (self.constant(rows), None)


class LayerNorm(FastOp, F.LayerNorm):
    """The kernels, else the formula with its means as BLAS products; forward keeps xhat and
    rstd, so backward on arrays recomputes nothing."""

    kernels = ("layer_norm", "layer_norm_backward")

    def forward(self, x, weight, bias, eps):
        self.eps = eps
        keep = is_grad_enabled()                                 # (no grad mode: no backward, nothing to keep)
        fused = self.backend.run_kernel("layer_norm", x, weight, bias, eps, keep)
        if fused is not None:
            y, xhat, rstd = fused
            if keep:
                self.save(xhat, rstd)
            return y
        xhat = x - self._row_means(x)                            # (..., C), centred
        rstd = 1.0 / self.xp.sqrt(self._row_means(xhat * xhat) + eps)   # (..., 1)
        xhat *= rstd                                             # (..., C)
        self.save(xhat, rstd)
        y = xhat * weight
        y += bias
        return y

    def _row_means(self, a):
        """Means over the last axis, kept: a BLAS product where it can (row_sums)."""
        if can_sum_by_blas(self.backend, a):
            return row_sums(self.backend, a, 1.0 / a.shape[-1])
        return self.xp.mean(a, axis=-1, keepdims=True)

    def _lead_sums(self, a):
        """Sums over every axis but the last: the weight and bias gradients."""
        if can_sum_by_blas(self.backend, a):
            return leading_sums(self.backend, a, a.ndim - 1)
        return self.xp.sum(a, axis=tuple(range(a.ndim - 1)))

    def fast_backward(self, g):
        xhat, rstd = self.saved
        x, weight, bias = self.parents
        gd = g.data
        fused = self.backend.run_kernel("layer_norm_backward", gd, xhat, weight.data, rstd)
        if fused is not None:
            dx, dw, db = fused
        else:                                                    # rstd (gx - mean(gx) - xhat mean(gx xhat))
            dw = self._lead_sums(gd * xhat) if weight.requires_grad else None
            db = self._lead_sums(gd) if bias.requires_grad else None
            gx = gd * weight.data                                # d loss / d xhat
            dx = gx - self._row_means(gx)
            dx -= xhat * self._row_means(gx * xhat)
            dx *= rstd
        kept = lambda a, need=True: self.constant(a) if need and a is not None else None    # noqa: E731
        return kept(dx), kept(dw, weight.requires_grad), kept(db, bias.requires_grad)


class Linear(FastOp, F.Linear):
    """One 2-d product over the flattened leading dims (on the CPU split over the threads, and
    inside ta.inference_mode with W^T laid out by layouts.py), the bias added in place;
    backward's products in one split (products.matmuls)."""

    def forward(self, x, weight, bias=None):
        if x.ndim == 2:                                                  # (N, in) already
            return self.backend.products.linear(x, weight, bias)
        out = self.backend.products.linear(self.xp.reshape(x, (-1, x.shape[-1])), weight, bias)   # (N, out)
        return self.xp.reshape(out, tuple(x.shape[:-1]) + (weight.shape[0],))

    def fast_backward(self, g):                                         # g (..., out)
        return self._backward_arrays(g.data, self.parents[0].data, self.parents[1].data, self.needs_input_grad)

    def _backward_arrays(self, g, x, weight, need):
        """On two threads, dx and db on one and dW on the other (dx and dW cost the same)."""
        backend, xp = self.backend, self.xp
        g2 = xp.reshape(g, (-1, g.shape[-1]))                      # (N, out)
        x2 = xp.reshape(x, (-1, x.shape[-1]))                      # (N, in)
        products = {0: (g2, weight)}                               # dx (N, in)
        if len(self.parents) == 3 and need[2]:                     # db (1, out): the sum over rows
            products[2] = (backend.full((1, g2.shape[0]), 1, backend.dtype_of(g2)), g2)
        products[1] = (xp.permute_dims(g2, (1, 0)), x2)            # dW (out, in): last, a thread of its own
        wanted = [i for i in products if need[i]]
        results = dict(zip(wanted, backend.products.matmuls([products[i] for i in wanted])))
        if 0 in results:
            results[0] = xp.reshape(results[0], x.shape)           # (..., in)
        if 2 in results:
            results[2] = xp.reshape(results[2], (g2.shape[1],))   # (out,)
        return tuple(self.constant(results[i]) if i in results else None for i in range(len(self.parents)))


def attention_arrays(backend, q, k, v, allowed, scale):
    """(out, weights) of softmax(q k^T scale where allowed) v on arrays: the kernel, else the formula."""
    fused = backend.run_kernel("attention", q, k, v, allowed, scale)
    if fused is not None:
        return fused
    xp, mm = backend.xp, backend.products.matmul
    scores = mm(q, ops.matrix_transpose(xp, k)) * scale                   # (B, H, Tq, Tk)
    weights = ops.masked_softmax(xp, scores, allowed)
    return mm(weights, v), weights


class Attention(FastOp, attention.Attention):
    """The kernel (both products and the softmax of a part of the batch in one thread, outputs
    and gradients in their inputs' memory order), else the formula; forward keeps the weights,
    so backward on arrays recomputes nothing."""

    kernels = ("attention", "attention_backward")

    def forward(self, q, k, v, allowed, scale):
        self.scale = scale
        out, weights = attention_arrays(self.backend, q, k, v, allowed, scale)
        self.save(weights)                                         # (B, H, Tq, Tk)
        return out

    def fast_backward(self, g):
        q, k, v, _ = self.parents
        (p,) = self.saved
        grads = self.backend.run_kernel("attention_backward", g.data, q.data, k.data, v.data, p, self.scale)
        if grads is None:                                          # the same formulas on arrays
            xp, mT, mm = self.xp, ops.matrix_transpose, self.backend.products.matmul
            do = g.data
            dp = mm(do, mT(xp, v.data))                            # (B, H, Tq, Tk)
            ds = p * (dp - xp.sum(dp * p, axis=-1, keepdims=True))
            grads = (mm(ds, k.data) * self.scale, mm(mT(xp, ds), q.data) * self.scale, mm(mT(xp, p), do))
        return tuple(self.constant(a) for a in grads) + (None,)


class FlashAttention(FastOp, flash.FlashAttention):
    """The heads shared over tinyattn's threads (BLAS at one thread: a tile is too small to
    share), and each tile's elementwise work as one kernel: in forward the causal mask, the
    new row max, exp and the row sum in two passes over the tile; in backward P = exp(s - L)
    and dS = P * (dP - D) in one. The loops over the tiles are the teaching op's."""

    kernels = ("attention_tile_softmax_", "attention_tile_backward_")

    def for_each_item(self, fn):
        items = self.items
        n = threads.get_num_threads()
        if not self.backend.on_host or len(items) < 2 or n < 2:
            return super().for_each_item(fn)
        threads.warn_without_threadpoolctl(len(items), n)

        def some(start, stop):
            threads.wake_blas()
            for item in items[start:stop]:
                fn(item)

        threads.split(some, len(items), work=math.inf, n_threads=n)

    def _softmax_tile(self, s, m, l, first):
        alpha = self.backend.run_kernel("attention_tile_softmax_", s, m, l,
                                        first if self.is_causal else -s.shape[-2])   # m, l updated in place
        return (s, alpha, m, l) if alpha is not None else super()._softmax_tile(s, m, l, first)

    def _softmax_grad_tile(self, s, dp, lse, d, first):
        done = self.backend.run_kernel("attention_tile_backward_", s, dp, lse, d,
                                       first if self.is_causal else -s.shape[-2])   # s, dp in place
        return done if done is not None else super()._softmax_grad_tile(s, dp, lse, d, first)


def _speeding_up(*fast_ops):
    """{teaching op: its fast op}, each fast op told which formula runs where it declines."""
    for fast in fast_ops:
        fast.formula = fast.__bases__[1]
    return {fast.formula: fast for fast in fast_ops}


FAST_OPS = _speeding_up(MatMul, Erf, Gelu, GeluTanh, Sum, Split, Softmax, MaskedSoftmax, CrossEntropy, EmbeddingGrad,
                        Embedding, LayerNorm, Linear, Attention, FlashAttention)
