"""Functional ops for networks: cross-entropy, embedding, layer norm, dropout,
GELU and attention; the softmax family comes from ``tinyattn/ops.py``.

Cross-entropy is fused: one Function with a stable forward (the max is
subtracted first) and a backward written with Tensor ops, so it can be
differentiated twice.
"""
import math

from ..autograd import Function, is_grad_enabled, is_tensor
from ..ops import (constant, gelu as _gelu, softmax, log_softmax, logsumexp, MaskedSoftmax, causal_mask,  # noqa: F401
                   stable_exp, check_float, check_same_kind, row_sums, leading_sums, blas_sums)

__all__ = ["softmax", "log_softmax", "logsumexp", "cross_entropy", "embedding", "layer_norm",
           "dropout", "gelu", "relu", "linear", "scaled_dot_product_attention",
           "flash_attention"]


class CrossEntropy(Function):
    """Mean over non-ignored rows of -log softmax(logits)[target]. logits (N, C), targets (N,).

    A fused kernel, where the device has one, does each pass (it keeps only
    the per-row log-sum-exp); the Tensor backward below is the formula.
    """

    def forward(self, logits, targets, ignore_index):
        xp = self.xp
        self.ignore_index = ignore_index
        fused = self.backend.run_kernel("cross_entropy", logits, targets, ignore_index)
        if fused is not None:
            loss, lse, scale = fused                                       # (), (N,), ()
            self.save(lse, scale)
            return loss
        weight, safe = self._weights(logits, targets)                      # (N,), (N,)
        e, m = stable_exp(xp, logits, 1)
        logp = logits - m - xp.log(xp.sum(e, axis=1, keepdims=True))       # (N, C)
        picked = xp.take_along_axis(logp, xp.reshape(safe, (-1, 1)), axis=1)[:, 0]
        return -xp.sum(picked * weight)

    def _weights(self, logits, targets):
        """Each row's share of the mean (0 if ignored), and the targets with ignored rows set to 0."""
        xp = self.xp
        valid = targets != self.ignore_index                               # (N,)
        count = xp.sum(xp.astype(valid, logits.dtype))
        weight = xp.astype(valid, logits.dtype) / xp.maximum(count, 1.0)   # (N,)
        return weight, xp.where(valid, targets, xp.zeros_like(targets))

    def backward(self, g):
        logits, targets = self.parents
        if self.saved and not is_grad_enabled():                           # the forward was fused
            dlogits = self.backend.run_kernel("cross_entropy_backward", g.data, logits.data, targets.data,
                                              *self.saved, self.ignore_index)
            if dlogits is not None:
                return self.constant(dlogits), None
        xp = self.xp
        weight, safe = self._weights(logits.data, targets.data)            # d loss / d logits =
        onehot = xp.astype(xp.reshape(safe, (-1, 1)) == self.backend.arange(logits.shape[1])[None, :],
                           logits.data.dtype)                              # weight * (softmax - onehot)
        return g * self.constant(xp.reshape(weight, (-1, 1))) * (softmax(logits, 1) - self.constant(onehot)), None


def cross_entropy(logits, targets, ignore_index=-100):
    """Mean cross-entropy of (N, C) logits against (N,) integer targets.

    Rows whose target is ``ignore_index`` count for nothing. As in nanoGPT,
    flatten (B, T, C) logits with ``logits.view(-1, C)`` first.
    """
    check_ids("cross_entropy", "targets", targets)
    if logits.ndim != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"cross_entropy: expected logits (N, C) and targets (N,), "
                         f"got logits {logits.shape} and targets {targets.shape}")
    check_float("cross_entropy", logits)
    _check_id_range("cross_entropy", "targets", targets, logits.shape[1], ignore_index)
    return CrossEntropy.apply(logits, targets, ignore_index=ignore_index)


class Embedding(Function):
    """weight[idx]: rows of a (V, C) table for integer ids of any shape."""

    def forward(self, weight, idx):
        flat = self.xp.reshape(idx, (-1,))                                      # (N,)
        return self.xp.reshape(self.xp.take(weight, flat, axis=0), tuple(idx.shape) + weight.shape[1:])

    def backward(self, g):
        weight, idx = self.parents
        g2 = g.reshape((-1,) + weight.shape[1:])                               # (N, C)
        return EmbeddingGrad.apply(g2, idx.reshape(-1), rows=weight.shape[0]), None


class EmbeddingGrad(Function):
    """Scatter-add (N, C) rows into a (rows, C) table: Embedding's backward."""

    def forward(self, g, idx, rows):
        out = self.backend.run_kernel("index_add_rows", rows, idx, g)
        return out if out is not None else self.backend.index_add_rows(rows, idx, g)

    def backward(self, gg):
        _, idx = self.parents
        return Embedding.apply(gg, idx), None


def check_ids(op, name, ids):
    """Token ids and class targets: a Tensor of integers (floats would index nothing)."""
    if not is_tensor(ids):
        raise TypeError(f"{op}: {name} must be a Tensor of integers, got {type(ids).__name__} "
                        "(wrap it: ta.tensor(...))")
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{op}: {name} must be integers, got {ids.dtype} (convert with .long())")


def _check_id_range(op, name, ids, n, ignore=None):
    """On the CPU, ids outside [0, n) are an error that says so (CuPy would wrap them silently;
    a device check would cost a sync, so the training program checks its data at the edge)."""
    if not ids.backend.on_host or not ids.numel():
        return
    data = ids.data if ignore is None else ids.data[ids.data != ignore]
    if data.size and (int(data.min()) < 0 or int(data.max()) >= n):
        also = "" if ignore is None else f" (or ignore_index {ignore})"
        raise IndexError(f"{op}: {name} must be in [0, {n}){also}, got {int(data.min())}..{int(data.max())}")


def embedding(idx, weight):
    check_ids("embedding", "ids", idx)
    _check_id_range("embedding", "ids", idx, weight.shape[0])
    return Embedding.apply(weight, idx)


class LayerNorm(Function):
    """Fused layer norm over the last dim: (x - mean) / sqrt(var + eps) * w + b.

    The backward works on raw arrays (fast); the composite ``layer_norm(...,
    fused=False)`` is the one to differentiate twice.
    """

    differentiable_backward = False

    def forward(self, x, weight, bias, eps):
        xp = self.xp
        fused = self.backend.run_kernel("layer_norm", x, weight, bias, eps)
        if fused is not None:
            y, xhat, rstd = fused
            self.save(xhat, rstd)
            return y
        mean = self._row_means
        xhat = x - mean(x)                                       # (..., C), centred
        rstd = 1.0 / xp.sqrt(mean(xhat * xhat) + eps)            # (..., 1)
        xhat *= rstd                                             # (..., C)
        self.save(xhat, rstd)
        y = xhat * weight
        y += bias
        return y

    def _row_means(self, a):
        """Means over the last axis, kept: a BLAS product where it can (see ops.row_sums)."""
        if blas_sums(self.backend, a):
            return row_sums(self.backend, a, 1.0 / a.shape[-1])
        return self.xp.mean(a, axis=-1, keepdims=True)

    def _lead_sums(self, a):
        """Sums over every axis but the last: the weight and bias gradients."""
        if blas_sums(self.backend, a):
            return leading_sums(self.backend, a, a.ndim - 1)
        return self.xp.sum(a, axis=tuple(range(a.ndim - 1)))

    def backward(self, g):
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
        wrap = lambda a, need=True: self.constant(a) if need and a is not None else None    # noqa: E731
        return wrap(dx), wrap(dw, weight.requires_grad), wrap(db, bias.requires_grad)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, fused=True):
    """Normalise over the last dim. ``normalized_shape`` must be (C,)."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) != 1 or x.shape[-1:] != shape:
        raise ValueError(f"layer_norm: normalized_shape {shape} does not match input shape {x.shape}")
    check_same_kind("layer_norm", x, *[t for t in (weight, bias) if t is not None])
    check_float("layer_norm", x)
    if weight is None:
        weight = constant(x, x.backend.full(shape, 1, x.dtype))
    if bias is None:
        bias = constant(x, x.backend.zeros(shape, x.dtype))
    if fused:
        return LayerNorm.apply(x, weight, bias, eps=eps)
    mu = x.mean(-1, keepdim=True)
    xc = x - mu
    var = (xc * xc).mean(-1, keepdim=True)
    return xc / (var + eps).sqrt() * weight + bias


def dropout(x, p=0.5, training=True):
    """Zero each element with probability p and scale the rest by 1/(1-p)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if p >= 1.0:
        return x * 0.0
    xp = x.xp
    keep = x.backend.uniform(x.shape, x.dtype) >= p
    return x * constant(x, xp.astype(keep, x.data.dtype) * (1.0 / (1.0 - p)))


def gelu(x, approximate="none"):
    return _gelu(x, approximate)


def relu(x):
    return x.relu()


class Linear(Function):
    """x @ weight.T + bias as one op: x (..., in), weight (out, in), bias (out,) -> (..., out).

    One 2-d BLAS product over the flattened leading dims with the bias added in
    place: no transposed-weight op, no separate add and its output array. The
    backward is three Tensor ops, so it can be differentiated again.
    """

    def forward(self, x, weight, bias=None):
        xp = self.xp
        x2 = xp.reshape(x, (-1, x.shape[-1]))                     # (N, in)
        out = self.backend.matmul(x2, xp.permute_dims(weight, (1, 0)), add=bias)    # (N, out)
        return xp.reshape(out, tuple(x.shape[:-1]) + (weight.shape[0],))

    def backward(self, g):                                         # g (..., out)
        x, weight = self.parents[:2]
        need = self.needs_input_grad
        if not is_grad_enabled():                                  # on arrays (no graph is recorded)
            return self._backward_arrays(g.data, x.data, weight.data, need)
        g2 = g.reshape(-1, g.shape[-1])                            # (N, out)
        dx = g @ weight if need[0] else None                       # (..., in)
        dw = g2.mT @ x.reshape(-1, x.shape[-1]) if need[1] else None   # (out, in)
        if len(self.parents) == 2:
            return dx, dw
        return dx, dw, g2.sum(0) if need[2] else None              # (out,)

    def _backward_arrays(self, g, x, weight, need):
        """The same products on arrays, in one split over the CPU's threads (backend.matmuls):
        on two threads, dx and db on one and dW on the other (dx and dW cost the same)."""
        backend, xp = self.backend, self.xp
        g2 = xp.reshape(g, (-1, g.shape[-1]))                      # (N, out)
        x2 = xp.reshape(x, (-1, x.shape[-1]))                      # (N, in)
        products = {0: (g2, weight)}                               # dx (N, in)
        if len(self.parents) == 3 and need[2]:                     # db (1, out): the sum over rows
            products[2] = (backend.full((1, g2.shape[0]), 1, backend.dtype_of(g2)), g2)
        products[1] = (xp.permute_dims(g2, (1, 0)), x2)            # dW (out, in): last, a thread of its own
        wanted = [i for i in products if need[i]]
        results = dict(zip(wanted, backend.matmuls([products[i] for i in wanted])))
        if 0 in results:
            results[0] = xp.reshape(results[0], x.shape)           # (..., in)
        if 2 in results:
            results[2] = xp.reshape(results[2], (g2.shape[1],))   # (out,)
        return tuple(self.constant(results[i]) if i in results else None for i in range(len(self.parents)))


def linear(x, weight, bias=None):
    """x @ weight.T + bias, with weight (out, in) as in PyTorch."""
    check_same_kind("linear", x, weight, *([] if bias is None else [bias]))
    if x.ndim == 0 or weight.ndim != 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: input {x.shape} and weight {weight.shape} do not fit "
                         "(expected (..., in) and (out, in))")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"linear: bias {bias.shape} does not fit weight {weight.shape} (expected ({weight.shape[0]},))")
    return Linear.apply(x, weight) if bias is None else Linear.apply(x, weight, bias)


# ---------------------------------------------------------------- attention
# When scaled_dot_product_attention(impl="auto") takes the tiled path (flash.py):
TILED_MIN_SCORES = 1024 * 1024       # Tq * Tk from which it is faster on a CPU (measured: causal, D=64)
TILED_MIN_SCORES_DEVICE = 2048 ** 2  # elsewhere (GPU): batched naive matmuls are fast there; not measured
TILED_MAX_SCORE_BYTES = 2 ** 28      # and always when B * H * Tq * Tk scores would take more (256 MiB)


def attention_impl(q, k, attn_mask=None, dropout_p=0.0, return_weights=False, impl="auto"):
    """Which path scaled_dot_product_attention takes with these arguments: "naive" or "tiled".

    "auto" is naive for the attention weights (return_weights=True), for a
    mask that needs a gradient, and for short
    sequences; tiled when Tq * Tk reaches TILED_MIN_SCORES (TILED_MIN_SCORES_DEVICE
    off the CPU) or when the scores would take more than TILED_MAX_SCORE_BYTES.
    Double backward is not knowable here: it needs impl="naive". dropout_p does not
    change the choice: both paths take dropout.
    """
    if impl not in ("auto", "naive", "tiled"):
        raise ValueError(f"scaled_dot_product_attention: impl must be 'auto', 'naive' or 'tiled', got {impl!r}")
    if impl != "auto":
        return impl
    if return_weights or (attn_mask is not None and attn_mask.requires_grad):
        return "naive"
    t_q, t_k = q.shape[-2], k.shape[-2]
    heads = math.prod(q.shape[:-2])
    score_bytes = heads * t_q * t_k * q.dtype.itemsize
    long = TILED_MIN_SCORES if q.backend.on_host else TILED_MIN_SCORES_DEVICE
    return "tiled" if t_q * t_k >= long or score_bytes > TILED_MAX_SCORE_BYTES else "naive"


def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False, dropout_p=0.0,
                                 scale=None, return_weights=False, impl="auto"):
    """softmax(q k^T / sqrt(d_k) + mask) v.

    q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) -> (B, H, Tq, Dv).
    attn_mask: boolean (True = may attend) or float (added to the scores),
    broadcastable to (B, H, Tq, Tk). is_causal: query i sees keys j <= i
    (aligned at the top left, as in PyTorch). With return_weights=True the
    (B, H, Tq, Tk) attention weights come back too, for visualisation.

    impl: "naive" builds the (Tq, Tk) scores and weights; "tiled" is
    flash_attention (tiles, memory O(T)); "auto" (the default) picks, see
    attention_impl. The tiled backward cannot be differentiated again: for
    gradients of gradients (create_graph=True) pass impl="naive".
    """
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"scaled_dot_product_attention: q {q.shape}, k {k.shape} and v {v.shape} do not fit")
    check_same_kind("scaled_dot_product_attention", q, k, v)
    if attention_impl(q, k, attn_mask, dropout_p, return_weights, impl) == "tiled":
        if return_weights:
            raise ValueError("scaled_dot_product_attention: impl='tiled' never builds the weights, so it "
                             "cannot return them; use impl='naive'")
        return flash_attention(q, k, v, is_causal=is_causal, scale=scale, attn_mask=attn_mask, dropout_p=dropout_p)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    allowed = None
    if is_causal:
        allowed = causal_mask(q.shape[-2], k.shape[-2], q.backend)
    if attn_mask is not None and attn_mask.dtype.kind == "b":
        allowed = attn_mask.data if allowed is None else allowed & attn_mask.data
    if allowed is not None and allowed.ndim <= 2:                  # (Tk,) or (1, Tk): one (Tq, Tk) table
        allowed = q.xp.broadcast_to(allowed, (q.shape[-2], k.shape[-2]))
    if _fused_attention_fits(q, k, v, allowed, attn_mask, dropout_p, return_weights):
        return Attention.apply(q, k, v, constant(q, allowed), scale=scale)
    scores = (q * scale) @ k.mT                                    # (B, H, Tq, Tk); scaling q is cheaper
    if attn_mask is not None and attn_mask.dtype.kind != "b":
        scores = scores + attn_mask
    if allowed is None:
        weights = softmax(scores, -1)
    else:
        shape = tuple(max(a, b) for a, b in zip((1,) * (scores.ndim - allowed.ndim) + tuple(allowed.shape), scores.shape))
        if shape != scores.shape:
            scores = scores.expand(shape)
        weights = MaskedSoftmax.apply(scores, constant(scores, allowed))
    if dropout_p > 0.0:
        weights_used = dropout(weights, dropout_p)
    else:
        weights_used = weights
    out = weights_used @ v                                          # (B, H, Tq, Dv)
    return (out, weights) if return_weights else out


def _fused_attention_fits(q, k, v, allowed, attn_mask, dropout_p, return_weights):
    """Whether the naive path can run as one Attention op: a backend with the "attention"
    kernel, stacked q, k, v over the same leading dims, float32 or float64, and a boolean
    (Tq, Tk) mask (causal, or given); no additive mask, dropout or returned weights."""
    if allowed is None or allowed.ndim != 2 or dropout_p > 0.0 or return_weights:
        return False
    if attn_mask is not None and attn_mask.dtype.kind != "b":
        return False
    if q.backend.kernel("attention") is None or not q.dtype == k.dtype == v.dtype or q.dtype.itemsize < 4:
        return False
    return q.ndim >= 3 and q.shape[:-2] == k.shape[:-2] == v.shape[:-2]


class Attention(Function):
    """softmax(q k^T * scale where allowed) v as one op, where the backend has an "attention"
    kernel (the CPU's: backend/cpu_kernels.py). The naive path's scores, weights and two
    products, without a graph node and a pass over memory for each. Recorded
    (create_graph=True), the backward is the same formulas in Tensor ops, so it
    differentiates twice.
    """

    def forward(self, q, k, v, allowed, scale):                    # (B, H, Tq, D), (B, H, Tk, D), (B, H, Tk, Dv)
        self.scale = scale
        fused = self.backend.run_kernel("attention", q, k, v, allowed, scale)
        if fused is None:                                          # the kernel declined: the formula
            xp = self.xp
            scores = xp.matmul(q * scale, xp.matrix_transpose(k))  # (B, H, Tq, Tk)
            weights = MaskedSoftmax().forward_arrays(self.backend, scores, allowed)
            fused = xp.matmul(weights, v), weights
        out, weights = fused
        self.save(weights)                                         # (B, H, Tq, Tk)
        return out

    def backward(self, g):                                         # g (B, H, Tq, Dv)
        q, k, v, allowed = self.parents
        if not is_grad_enabled():
            (weights,) = self.saved
            grads = self.backend.run_kernel("attention_backward", g.data, q.data, k.data, v.data, weights, self.scale)
            if grads is not None:
                return tuple(self.constant(a) for a in grads) + (None,)
        p = MaskedSoftmax.apply((q * self.scale) @ k.mT, allowed)  # the weights again, recorded
        dp = g @ v.mT
        ds = p * (dp - (dp * p).sum(-1, keepdim=True))             # softmax's backward
        return ds @ k * self.scale, ds.mT @ q * self.scale, p.mT @ g, None


from .flash import flash_attention  # noqa: E402
