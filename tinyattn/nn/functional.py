"""Functional ops for networks: softmax family, cross-entropy, embedding,
layer norm, dropout, GELU and attention.

Softmax, log-softmax, logsumexp and cross-entropy are fused: one Function
with a stable forward (the max is subtracted first) and a backward written
with Tensor ops, so they can be differentiated twice.
"""
import math

from ..tensor import Function, is_grad_enabled
from ..ops import gelu as _gelu, _const

__all__ = ["softmax", "log_softmax", "logsumexp", "cross_entropy", "embedding", "layer_norm",
           "dropout", "gelu", "relu", "linear", "scaled_dot_product_attention",
           "flash_attention"]


def _stable_exp(xp, x, dim):
    """exp(x - max) along dim, and that max (kept), finite for any finite x."""
    m = xp.max(x, axis=dim, keepdims=True)
    return xp.exp(x - m), m


class Softmax(Function):
    def forward(self, x, dim):
        self.dim = dim
        e, _ = _stable_exp(self.xp, x, dim)
        return e / self.xp.sum(e, axis=dim, keepdims=True)

    def backward(self, g):
        y = self.output                                      # dy_i = y_i (g_i - sum_j g_j y_j)
        return y * (g - (g * y).sum(self.dim, keepdim=True))


class LogSoftmax(Function):
    def forward(self, x, dim):
        self.dim = dim
        e, m = _stable_exp(self.xp, x, dim)
        return x - m - self.xp.log(self.xp.sum(e, axis=dim, keepdims=True))

    def backward(self, g):
        return g - self.output.exp() * g.sum(self.dim, keepdim=True)


class LogSumExp(Function):
    def forward(self, x, dim, keepdim):
        self.dim = dim
        e, m = _stable_exp(self.xp, x, dim)
        out = m + self.xp.log(self.xp.sum(e, axis=dim, keepdims=True))
        return out if keepdim else self.xp.squeeze(out, axis=dim)

    def backward(self, g):
        x = self.parents[0]
        out = self.output if self.output.ndim == x.ndim else self.output.unsqueeze(self.dim)
        g = g if g.ndim == x.ndim else g.unsqueeze(self.dim)
        return g * (x - out).exp()


def softmax(x, dim=-1):
    return Softmax.apply(x, dim=dim % x.ndim)


def log_softmax(x, dim=-1):
    return LogSoftmax.apply(x, dim=dim % x.ndim)


def logsumexp(x, dim=-1, keepdim=False):
    return LogSumExp.apply(x, dim=dim % x.ndim, keepdim=keepdim)


class CrossEntropy(Function):
    """Mean over non-ignored rows of -log softmax(logits)[target]. logits (N, C), targets (N,).

    On CUDA a fused kernel does each pass (it keeps only the per-row
    log-sum-exp); the Tensor backward below remains for create_graph=True.
    """

    def forward(self, logits, targets, ignore_index):
        xp = self.xp
        self.ignore_index = ignore_index
        fused = self.backend.fused_cross_entropy(logits, targets, ignore_index)
        if fused is not None:
            loss, self.lse, self.scale = fused                             # (), (N,), ()
            return loss
        self.lse = None
        weight, safe = self._weights(logits, targets)                      # (N,), (N,)
        e, m = _stable_exp(xp, logits, 1)
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
        if self.lse is not None and not is_grad_enabled():                 # the forward was fused
            dlogits = self.backend.fused_cross_entropy_backward(
                g.data, logits.data, targets.data, self.lse, self.scale, self.ignore_index)
            if dlogits is not None:
                return _const(g, dlogits), None
        xp = self.xp
        weight, safe = self._weights(logits.data, targets.data)            # d loss / d logits =
        onehot = xp.astype(xp.reshape(safe, (-1, 1)) == self.backend.arange(logits.shape[1])[None, :],
                           logits.data.dtype)                              # weight * (softmax - onehot)
        return g * _const(g, xp.reshape(weight, (-1, 1))) * (softmax(logits, 1) - _const(g, onehot)), None


def cross_entropy(logits, targets, ignore_index=-100):
    """Mean cross-entropy of (N, C) logits against (N,) integer targets.

    Rows whose target is ``ignore_index`` count for nothing. As in nanoGPT,
    flatten (B, T, C) logits with ``logits.view(-1, C)`` first.
    """
    if logits.ndim != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"cross_entropy: expected logits (N, C) and targets (N,), "
                         f"got logits {logits.shape} and targets {targets.shape}")
    return CrossEntropy.apply(logits, targets, ignore_index=ignore_index)


class Embedding(Function):
    """weight[idx]: rows of a (V, C) table for integer ids of any shape."""

    def forward(self, weight, idx):
        self.flat = self.xp.reshape(idx, (-1,))                                 # (N,)
        return self.xp.reshape(self.xp.take(weight, self.flat, axis=0), tuple(idx.shape) + weight.shape[1:])

    def backward(self, g):
        weight, idx = self.parents
        g2 = g.reshape((-1,) + weight.shape[1:])                               # (N, C)
        return EmbeddingGrad.apply(g2, idx.reshape(-1), rows=weight.shape[0]), None


class EmbeddingGrad(Function):
    """Scatter-add (N, C) rows into a (rows, C) table: Embedding's backward."""

    def forward(self, g, idx, rows):
        return self.backend.index_add_rows(rows, idx, g)

    def backward(self, gg):
        _, idx = self.parents
        return Embedding.apply(gg, idx), None


def embedding(idx, weight):
    if weight._backend.name == "cpu" and idx.numel():
        lo, hi = int(idx.data.min()), int(idx.data.max())
        if lo < 0 or hi >= weight.shape[0]:
            raise IndexError(f"embedding: ids must be in [0, {weight.shape[0]}), got {lo}..{hi}")
    return Embedding.apply(weight, idx)


class LayerNorm(Function):
    """Fused layer norm over the last dim: (x - mean) / sqrt(var + eps) * w + b.

    The backward works on raw arrays (fast); the composite ``layer_norm(...,
    fused=False)`` is the one to differentiate twice.
    """

    differentiable_backward = False

    def forward(self, x, weight, bias, eps):
        xp = self.xp
        fused = self.backend.fused_layer_norm(x, weight, bias, eps)       # a CUDA kernel, or None
        if fused is not None:
            y, self.xhat, self.rstd = fused
            return y
        mu = xp.mean(x, axis=-1, keepdims=True)
        xc = x - mu
        var = xp.mean(xc * xc, axis=-1, keepdims=True)
        self.rstd = 1.0 / xp.sqrt(var + eps)                     # (..., 1)
        self.xhat = xc * self.rstd                               # (..., C)
        return self.xhat * weight + bias

    def backward(self, g):
        xp, xhat, rstd = self.xp, self.xhat, self.rstd
        x, weight, bias = self.parents
        gd = g.data
        lead = tuple(range(gd.ndim - 1))
        dw = xp.sum(gd * xhat, axis=lead) if weight.requires_grad else None
        db = xp.sum(gd, axis=lead) if bias.requires_grad else None
        dx = self.backend.fused_layer_norm_backward(gd, xhat, weight.data, rstd)   # a CUDA kernel, or None
        if dx is None:
            gx = gd * weight.data                                # d loss / d xhat
            dx = rstd * (gx - xp.mean(gx, axis=-1, keepdims=True)
                         - xhat * xp.mean(gx * xhat, axis=-1, keepdims=True))
        wrap = lambda a: None if a is None else _const(g, a)    # noqa: E731
        return wrap(dx), wrap(dw), wrap(db)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, fused=True):
    """Normalise over the last dim. ``normalized_shape`` must be (C,)."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) != 1 or x.shape[-1:] != shape:
        raise ValueError(f"layer_norm: normalized_shape {shape} does not match input shape {x.shape}")
    if weight is None:
        weight = _const(x, x._backend.full(shape, 1, x.dtype))
    if bias is None:
        bias = _const(x, x._backend.zeros(shape, x.dtype))
    if fused:
        return LayerNorm.apply(x, weight, bias, eps=eps)
    mu = x.mean(-1, keepdim=True)
    xc = x - mu
    var = (xc * xc).mean(-1, keepdim=True)
    return xc / (var + eps).sqrt() * weight + bias


def dropout(x, p=0.5, training=True):
    """Zero each element with probability p and scale the rest by 1/(1-p)."""
    if not training or p == 0.0:
        return x
    if p >= 1.0:
        return x * 0.0
    xp = x.xp
    keep = x._backend.uniform(x.shape, x.dtype) >= p
    return x * _const(x, xp.astype(keep, x.data.dtype) * (1.0 / (1.0 - p)))


def gelu(x, approximate="none"):
    return _gelu(x, approximate)


def relu(x):
    return x.relu()


def linear(x, weight, bias=None):
    """x @ weight.T + bias, with weight (out, in) as in PyTorch."""
    out = x @ weight.mT
    return out if bias is None else out + bias



# ---------------------------------------------------------------- attention
class MaskedSoftmax(Function):
    """Softmax over the last dim of the allowed entries only (mask: True = take part).

    A row with nothing allowed gets all-zero weights and a zero gradient,
    not the NaN of exp(-inf) / 0.
    """

    def forward(self, x, allowed):
        xp = self.xp
        x = xp.where(allowed, x, -xp.inf)
        m = xp.max(x, axis=-1, keepdims=True)
        m = xp.where(xp.isfinite(m), m, 0.0)                        # fully masked rows
        e = xp.exp(x - m)                                           # exp(-inf) = 0 where masked
        total = xp.sum(e, axis=-1, keepdims=True)
        return e / xp.where(total > 0, total, 1.0)

    def backward(self, g):
        y = self.output
        return y * (g - (g * y).sum(-1, keepdim=True)), None


_causal_cache = {}


def causal_mask(t_q, t_k, like):
    """(t_q, t_k) booleans, True where query i may see key j (j <= i), on like's device."""
    key = (t_q, t_k, like._backend.name)
    if key not in _causal_cache:
        xp = like.xp
        ones = like._backend.full((t_q, t_k), 1, "float32")
        _causal_cache[key] = xp.tril(ones) > 0
    return _causal_cache[key]


# When scaled_dot_product_attention(impl="auto") takes the tiled path (flash.py):
TILED_MIN_SCORES = 256 * 256         # Tq * Tk from which it is faster on a CPU (measured: causal, D=64)
TILED_MIN_SCORES_DEVICE = 2048 ** 2  # elsewhere (GPU): batched naive matmuls are fast there; not measured
TILED_MAX_SCORE_BYTES = 2 ** 28      # and always when B * H * Tq * Tk scores would take more (256 MiB)


def attention_impl(q, k, attn_mask=None, dropout_p=0.0, return_weights=False, impl="auto"):
    """Which path scaled_dot_product_attention takes with these arguments: "naive" or "tiled".

    "auto" is naive for the attention weights (return_weights=True), for a
    mask that needs a gradient, and for short
    sequences; tiled when Tq * Tk reaches TILED_MIN_SCORES (TILED_MIN_SCORES_DEVICE
    off the CPU) or when the scores would take more than TILED_MAX_SCORE_BYTES.
    Double backward is not knowable here: it needs impl="naive".
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
    long = TILED_MIN_SCORES if q.device == "cpu" else TILED_MIN_SCORES_DEVICE
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
    if attention_impl(q, k, attn_mask, dropout_p, return_weights, impl) == "tiled":
        if return_weights:
            raise ValueError("scaled_dot_product_attention: impl='tiled' never builds the weights, so it "
                             "cannot return them; use impl='naive'")
        return flash_attention(q, k, v, is_causal=is_causal, scale=scale, attn_mask=attn_mask, dropout_p=dropout_p)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q * scale) @ k.mT                                    # (B, H, Tq, Tk); scaling q is cheaper
    allowed = None
    if is_causal:
        allowed = causal_mask(q.shape[-2], k.shape[-2], q)
    if attn_mask is not None:
        if attn_mask.dtype.kind == "b":
            allowed = attn_mask.data if allowed is None else allowed & attn_mask.data
        else:
            scores = scores + attn_mask
    if allowed is None:
        weights = softmax(scores, -1)
    else:
        shape = tuple(max(a, b) for a, b in zip((1,) * (scores.ndim - allowed.ndim) + tuple(allowed.shape), scores.shape))
        if shape != scores.shape:
            scores = scores.expand(shape)
        weights = MaskedSoftmax.apply(scores, _const(scores, allowed))
    if dropout_p > 0.0:
        weights_used = dropout(weights, dropout_p)
    else:
        weights_used = weights
    out = weights_used @ v                                          # (B, H, Tq, Dv)
    return (out, weights) if return_weights else out


from .flash import flash_attention  # noqa: E402
