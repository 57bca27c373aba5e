"""Functional ops for networks: cross-entropy, NLL and KL losses, token log-probabilities,
embedding, layer norm, RMS norm, rotary position embedding, linear, dropout, GELU, SiLU and attention;
the softmax family, logsigmoid and softplus come from ``tinyattn/ops.py``.

Cross-entropy, layer norm, linear and attention are each one Function with
its backward written by hand, in Tensor ops, so it can be differentiated
twice. As in ops.py, each is only its formula: the fast layer
(``tinyattn/fast``) runs faster versions of them in a compiled model (``ta.compile``).
"""
import math

from ..autograd import Function, describe, is_tensor
from ..backend import get_backend
from ..errors import DtypeError, TensorError
from ..ops import (cat, constant, gelu as _gelu, softmax, log_softmax, logsumexp,  # noqa: F401 (softmax family: F.*)
                   logsigmoid, softplus, stable_exp, check_float, check_same_dtype, where, to_dtype)

__all__ = ["softmax", "log_softmax", "logsumexp", "logsigmoid", "softplus", "cross_entropy", "nll_loss", "kl_div",
           "token_logprobs", "embedding", "layer_norm", "rms_norm", "rotary_embedding", "dropout", "gelu", "relu",
           "silu", "linear", "scaled_dot_product_attention", "flash_attention"]


class CrossEntropy(Function):
    """Mean over non-ignored rows of -log softmax(logits)[target]. logits (N, C), targets (N,)."""

    def forward(self, logits, targets, ignore_index):
        xp = self.xp
        self.ignore_index = ignore_index
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
        xp = self.xp
        weight, safe = self._weights(logits.data, targets.data)            # d loss / d logits =
        onehot = xp.astype(xp.reshape(safe, (-1, 1)) == self.backend.arange(logits.shape[1])[None, :],
                           logits.data.dtype)                              # weight * (softmax - onehot)
        return g * self.constant(xp.reshape(weight, (-1, 1))) * (softmax(logits, 1) - self.constant(onehot)), None


def cross_entropy(logits, targets, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """Cross-entropy of (N, C) logits against (N,) integer targets, or against (N, C) class
    probabilities (float targets, each row summing to 1).

    Rows whose target is ``ignore_index`` count for nothing. ``reduction``: "mean" (over
    the rows that count), "sum" or "none" (one loss per target, shaped like the targets;
    0 where ignored). ``label_smoothing`` ε mixes each target with the uniform
    distribution: (1 - ε) target + ε / C. ``weight``, a (C,) tensor, scales each class's
    terms, and then "mean" divides by the weights of the rows' targets, not their count
    (as in PyTorch; with probability targets, by the count of rows).

    The other shapes PyTorch takes work too: (C,) logits with a 0-d target, and
    (N, C, d1, ...) logits with (N, d1, ...) targets, the classes along dim 1. So
    (B, T, C) logits from a language model are flattened first, as in nanoGPT:
    ``cross_entropy(logits.view(-1, C), targets.view(-1))``.
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    if logits.ndim != 2:
        rows = _as_rows(logits, targets)
        if rows is not None:                                               # (N * d1 * ..., C), their targets
            flat_logits, flat_targets, shape = rows
            loss = cross_entropy(flat_logits, flat_targets, weight=weight, ignore_index=ignore_index,
                                 reduction=reduction, label_smoothing=label_smoothing)
            return loss.reshape(shape) if reduction == "none" else loss
    if is_tensor(targets) and targets.dtype.kind == "f":
        return _cross_entropy_probabilities(logits, targets, weight, reduction, label_smoothing)
    check_ids("cross_entropy", "targets", targets)
    if logits.ndim != 2 or targets.shape != logits.shape[:1]:
        raise TensorError(f"cross_entropy: expected logits (N, C) with targets (N,), (C,) with a 0-d target, or "
                          f"(N, C, d1, ...) with targets (N, d1, ...), the classes along dim 1 as in PyTorch "
                          f"(flatten (B, T, C) logits: logits.view(-1, C)), got logits {logits.shape} "
                          f"and targets {targets.shape}")
    check_float("cross_entropy", logits)
    _check_id_range("cross_entropy", "targets", targets, logits.shape[1], ignore_index)
    if weight is not None:
        _check_class_weight(logits, weight)
    if reduction == "mean" and not label_smoothing and weight is None:
        return CrossEntropy.apply(logits, targets, ignore_index=ignore_index)
    # the other reductions, label smoothing and class weights, composed from log_softmax
    # (so twice differentiable)
    logp = log_softmax(logits, 1)                                          # (N, C)
    valid = targets != ignore_index                                        # (N,)
    safe = where(valid, targets, 0)
    rows = constant(logits, logits.backend.arange(logits.shape[0]))
    loss = -logp[rows, safe]                                               # (N,), -log p[target]
    if weight is not None:
        loss = loss * weight[safe]
    if label_smoothing:
        spread = logp if weight is None else logp * weight                 # (N, C)
        loss = loss * (1.0 - label_smoothing) - spread.mean(1) * label_smoothing
    loss = where(valid, loss, 0.0)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if weight is None:
        return loss.sum() / valid.to(loss.dtype).sum().clamp(min=1.0)      # as CrossEntropy: 0 if none counts
    total = where(valid, weight[safe], 0.0).sum()                          # the weights of the rows that count
    return loss.sum() / where(total > 0, total, 1.0)


def _check_class_weight(logits, weight, op="cross_entropy"):
    """The weight of cross_entropy or nll_loss for (N, C) logits: a tensor of one weight per class, (C,),
    in their dtype."""
    if not is_tensor(weight):
        raise TypeError(f"{op}: weight must be a Tensor of one weight per class, got {describe(weight)}")
    if weight.shape != logits.shape[1:]:
        raise TensorError(f"{op}: weight must hold one weight per class, {logits.shape[1:]}, "
                          f"got {weight.shape}")
    check_same_dtype(op, logits, weight)


def nll_loss(input, target, weight=None, ignore_index=-100, reduction="mean"):
    """The negative log-likelihood of class targets, from log-probabilities: (N, C) ``input``
    (log_softmax's output) and (N,) integer targets; row n's loss is -weight[t] input[n, t],
    t = target[n] (weight 1 without ``weight``). cross_entropy(x, t) is nll_loss(log_softmax(x, 1), t).

    The shapes are cross_entropy's: also (C,) with a 0-d target, and (N, C, d1, ...) with
    (N, d1, ...) targets, the classes along dim 1. Rows whose target is ``ignore_index`` count
    for nothing. ``reduction``: "none" (one loss per target, 0 where ignored), "sum", or "mean",
    the sum divided by the weights of the rows that count (their number, without ``weight``);
    when no row counts that is 0, as cross_entropy gives, where PyTorch gives NaN (0 / 0).
    PyTorch's deprecated size_average and reduce are not taken.
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"nll_loss: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    check_ids("nll_loss", "targets", target)
    if input.ndim == 0:
        raise TensorError("nll_loss: expected input of 1 or more dims, (C,) or (N, C, ...), got a 0-d tensor")
    if input.ndim != 2:
        rows = _as_rows(input, target)
        if rows is not None:                                              # (N * d1 * ..., C), their targets
            flat_input, flat_target, shape = rows
            loss = nll_loss(flat_input, flat_target, weight, ignore_index, reduction)
            return loss.reshape(shape) if reduction == "none" else loss
    if input.ndim != 2 or target.shape != input.shape[:1]:
        raise TensorError(f"nll_loss: expected input (N, C) with targets (N,), (C,) with a 0-d target, or "
                          f"(N, C, d1, ...) with targets (N, d1, ...), got input {input.shape} and targets {target.shape}")
    check_float("nll_loss", input)
    _check_id_range("nll_loss", "targets", target, input.shape[1], ignore_index)
    if weight is not None:
        _check_class_weight(input, weight, "nll_loss")
    valid = target != ignore_index                                        # (N,)
    safe = where(valid, target, 0)                                        # (N,), ignored rows read class 0
    picked = -input.gather(1, safe.unsqueeze(1)).squeeze(1)               # (N,), -input[n, t]
    w = valid.to(input.dtype) if weight is None else where(valid, weight[safe], 0.0)   # (N,), each row's weight
    loss = where(valid, picked * w, 0.0)                                  # (N,), (0, not 0 * inf, where ignored)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    total = w.sum()
    return loss.sum() / where(total > 0, total, 1.0)


def kl_div(input, target, reduction="mean", log_target=False):
    """The Kullback-Leibler divergence KL(p || q) of a target distribution p from a model's q, given
    as log-probabilities ``input`` = log q (log_softmax's output), term by term:

        p (log p - log q), taken as 0 where p is 0 (0 log 0 = 0),
        or, with ``log_target`` (the target as log p too): exp(log p) (log p - log q).

    ``reduction``: "none" (the terms, input and target broadcast), "sum", "batchmean" (the sum
    divided by input.shape[0], the batch size: the KL divergence per example, as the math
    defines it) or "mean", PyTorch's default, which divides by the number of terms, and so is
    not the KL divergence (PyTorch warns about it). The deprecated size_average and reduce are not taken.
    """
    if reduction not in ("mean", "sum", "none", "batchmean"):
        raise ValueError(f"kl_div: reduction must be 'mean', 'batchmean', 'sum' or 'none', got {reduction!r}")
    check_float("kl_div", input)
    check_float("kl_div", target)
    if log_target:
        loss = target.exp() * (target - input)
    else:                                          # p log p - p log q, with p log p as 0 at p = 0 (and its gradient
        p_log_p = target * where(target == 0, 1.0, target).log()         # finite there: log 1, not log 0)
        loss = p_log_p - target * input
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "batchmean":
        return loss.sum() / input.shape[0] if input.ndim else loss.sum()
    return loss.mean()


def _as_rows(logits, targets):
    """(C,) or (N, C, d1, ...) logits as (rows, C), the classes last; their targets as (rows,)
    class indices or (rows, C) probabilities; and the shape of one loss per target, (N, d1, ...)
    or (). None where the shapes do not fit."""
    if not is_tensor(targets) or logits.ndim == 0:
        return None
    C = logits.shape[0] if logits.ndim == 1 else logits.shape[1]
    per_target = logits.shape[:1] + logits.shape[2:] if logits.ndim > 1 else ()
    probabilities = targets.dtype.kind == "f"
    if targets.shape != (logits.shape if probabilities else per_target):
        return None
    if logits.ndim == 1:                                                   # one row
        return logits.reshape(1, C), targets.reshape(1, C) if probabilities else targets.reshape(1), per_target
    classes_last = (0,) + tuple(range(2, logits.ndim)) + (1,)              # (N, d1, ..., C)
    flat = targets.permute(*classes_last).reshape(-1, C) if probabilities else targets.reshape(-1)
    return logits.permute(*classes_last).reshape(-1, C), flat, per_target


def token_logprobs(logits, targets, ignore_index=None):
    """log p(target) at each position: (..., V) logits and (...) integer targets -> (...).

    PyTorch users write ``log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)``,
    and this is that. It is -cross_entropy(reduction="none") without the flattening. Sum over
    T for the log-probability of a whole sequence (DPO and RL compare those). With
    ``ignore_index``, positions whose target is it (a prompt, padding) give 0.
    """
    check_ids("token_logprobs", "targets", targets)
    if logits.ndim < 1 or targets.shape != logits.shape[:-1]:
        raise ValueError(f"token_logprobs: expected logits (..., V) and targets (...), "
                         f"got logits {logits.shape} and targets {targets.shape}")
    check_float("token_logprobs", logits)
    _check_id_range("token_logprobs", "targets", targets, logits.shape[-1], ignore_index)
    if ignore_index is None:
        return log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    valid = targets != ignore_index                                        # (...)
    picked = log_softmax(logits, -1).gather(-1, where(valid, targets, 0).unsqueeze(-1)).squeeze(-1)
    return where(valid, picked, 0.0)


def _cross_entropy_probabilities(logits, targets, weight, reduction, label_smoothing):
    """cross_entropy against (N, C) class probabilities: -sum(w p log softmax(logits)) per row."""
    if targets.ndim == 1:                                   # class indices, as floats by mistake
        raise DtypeError(f"cross_entropy: targets must be integers, got {targets.dtype} (convert with .long()), "
                         f"or class probabilities shaped like the logits {logits.shape}")
    if logits.ndim != 2 or targets.shape != logits.shape:
        raise TensorError(f"cross_entropy: class-probability targets must have the logits' shape (N, C), "
                          f"got logits {logits.shape} and targets {targets.shape}")
    check_float("cross_entropy", logits)
    check_same_dtype("cross_entropy", logits, targets)
    if weight is not None:
        _check_class_weight(logits, weight)
    if label_smoothing:
        targets = targets * (1.0 - label_smoothing) + label_smoothing / logits.shape[1]
    if weight is not None:
        targets = targets * weight
    loss = -(targets * log_softmax(logits, 1)).sum(1)                      # (N,)
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.mean()


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

    def forward(self, g, idx, rows):                                            # g (N, C), idx (N,)
        return self.backend.index_add_rows(rows, idx, g)                       # (rows, C), repeats added

    def backward(self, gg):
        _, idx = self.parents
        return Embedding.apply(gg, idx), None


def check_ids(op, name, ids):
    """Token ids and class targets: a Tensor of integers (floats would index nothing)."""
    if not is_tensor(ids):
        raise TypeError(f"{op}: {name} must be a Tensor of integers, got {type(ids).__name__} "
                        "(wrap it: ta.tensor(...))")
    if ids.dtype.kind not in "iu":
        raise DtypeError(f"{op}: {name} must be integers, got {ids.dtype} (convert with .long())")


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
    """(x - mean) / sqrt(var + eps) * w + b over the last dim, with its backward by hand:

        xhat = (x - mean) rstd,  rstd = 1 / sqrt(var + eps),  gx = g w
        dx = rstd (gx - mean(gx) - xhat mean(gx xhat)),  dw = sum of g xhat,  db = sum of g

    (means over the last dim, sums over every other). Backward recomputes xhat
    and rstd from x with Tensor ops, so it differentiates twice.
    """

    def forward(self, x, weight, bias, eps):                     # x (..., C), weight and bias (C,)
        xp = self.xp
        self.eps = eps
        xc = x - xp.mean(x, axis=-1, keepdims=True)              # (..., C), centred
        rstd = 1.0 / xp.sqrt(xp.mean(xc * xc, axis=-1, keepdims=True) + eps)   # (..., 1)
        return xc * rstd * weight + bias

    def backward(self, g):                                       # g (..., C)
        x, weight, bias = self.parents
        xc = x - x.mean(-1, keepdim=True)
        rstd = ((xc * xc).mean(-1, keepdim=True) + self.eps) ** -0.5
        xhat = xc * rstd
        gx = g * weight                                          # d loss / d xhat
        dx = (gx - gx.mean(-1, keepdim=True) - xhat * (gx * xhat).mean(-1, keepdim=True)) * rstd
        lead = tuple(range(x.ndim - 1))
        _, need_w, need_b = self.needs_input_grad
        return dx, (g * xhat).sum(lead) if need_w else None, g.sum(lead) if need_b else None


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, fused=True):
    """Normalise over the last dims, those of ``normalized_shape``: (C,) or, as in PyTorch,
    several, (H, W), whose elements are normalised together (as one dim of H * W)."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    x_shape = x.shape
    if not shape or x_shape[-len(shape):] != shape:          # (fewer dims than shape: never equal)
        raise TensorError(f"layer_norm: normalized_shape {shape} does not match input shape {x_shape}")
    if len(shape) > 1:                                       # (..., H, W) as (..., H * W), and back
        n = math.prod(shape)
        flat = [None if t is None else t.reshape(n) for t in (weight, bias)]
        out = layer_norm(x.reshape(*x.shape[:x.ndim - len(shape)], n), n, *flat, eps=eps, fused=fused)
        return out.reshape(x.shape)
    dtype = x.dtype
    if dtype.kind != "f":
        check_float("layer_norm", x)
    if weight is None:
        weight = constant(x, x.backend.full(shape, 1, dtype))
    if bias is None:
        bias = constant(x, x.backend.zeros(shape, dtype))
    if weight.dtype != dtype or bias.dtype != dtype:          # (one dtype, the usual case: checked at once)
        check_same_dtype("layer_norm", x, weight, bias)
    if fused:
        return LayerNorm.apply(x, weight, bias, eps=eps)
    mu = x.mean(-1, keepdim=True)
    xc = x - mu
    var = (xc * xc).mean(-1, keepdim=True)
    return xc / (var + eps).sqrt() * weight + bias


def rms_norm(x, normalized_shape, weight=None, eps=None):
    """x / sqrt(mean(x^2) + eps) * weight, the mean over the last dims, those of ``normalized_shape``
    (an int or a tuple, as for layer_norm). RMSNorm (Zhang and Sennrich, 2019; LLaMA's norm) is
    layer norm without taking out the mean and without a bias.

    ``eps=None`` is the machine epsilon of the dtype it is computed in, as in PyTorch: x's dtype,
    but float32 for float16 (there x * x would overflow past 256). Built from Tensor ops, so its
    backward is theirs, and it differentiates twice. The result has x's dtype (a weight of
    another float dtype is converted, as in PyTorch).
    """
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or x.ndim < len(shape) or x.shape[x.ndim - len(shape):] != shape:
        raise TensorError(f"rms_norm: normalized_shape {shape} does not match input shape {x.shape}")
    check_float("rms_norm", x)
    if weight is not None and weight.shape != shape:
        raise TensorError(f"rms_norm: weight {weight.shape} must have the normalized_shape {shape}")
    dtype = x.dtype
    if dtype.itemsize < 4:
        x = x.float()
    if eps is None:
        eps = float(x.xp.finfo(x.data.dtype).eps)
    dims = tuple(range(x.ndim - len(shape), x.ndim))                       # the normalized dims
    y = x * ((x * x).mean(dims, keepdim=True) + eps) ** -0.5                # (..., C), unit root mean square
    if weight is not None:
        y = y * to_dtype(weight, x.dtype)
    return to_dtype(y, dtype)


def rotary_tables(positions, dim, base=10000.0):
    """cos and sin of the angles m * theta_i (RoPE), on the host in float64: two (T, dim // 2) arrays.

    positions: T integer positions m; theta_i = base^(-2i / dim) for i < dim / 2, so theta_0 = 1
    turns fastest and the last pair slowest."""
    np = get_backend("cpu").xp
    pos = np.asarray(positions.numpy() if is_tensor(positions) else list(positions), dtype=np.float64)   # (T,)
    if pos.ndim != 1:
        raise TensorError(f"rotary_embedding: positions must be one position per row, (T,), got shape {pos.shape}")
    theta = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)              # (dim/2,)
    angles = pos[:, None] * theta[None, :]                                       # (T, dim/2)
    return np.cos(angles), np.sin(angles)


def rotary_embedding(x, positions, base=10000.0):
    """Rotary position embedding (RoPE; Su et al., 2021), as Llama and transformers write it:
    x (..., T, D) -> (..., T, D), each row t turned by its position m = positions[t].

    Channel i and channel i + D/2 form a pair, turned by the angle m * theta_i,
    theta_i = base^(-2i / D) (``base`` is Llama's rope_theta):

        out[i]       = x[i] cos(m theta_i) - x[i + D/2] sin(m theta_i)
        out[i + D/2] = x[i + D/2] cos(m theta_i) + x[i] sin(m theta_i)

    that is x * cos + rotate_half(x) * sin. Turned queries and keys give scores
    q_m . k_n that depend on m - n only. (EXERCISES.md's exercise pairs neighbours,
    (2i, 2i + 1): the same rotation with the channels in another order.)
    ``positions``: T integers (a range, a list, or an integer Tensor). Built from Tensor
    ops, so its backward is theirs (the same turn, by -m theta_i), and it differentiates twice.
    """
    check_float("rotary_embedding", x)
    if x.ndim < 2 or x.shape[-1] % 2:
        raise TensorError(f"rotary_embedding: x must be (..., T, D) with D even, got shape {x.shape}")
    T, D = x.shape[-2:]
    cos, sin = rotary_tables(positions, D, base)                                 # (T', D/2) each
    if cos.shape[0] != T:
        raise TensorError(f"rotary_embedding: {cos.shape[0]} positions for x {x.shape} with T = {T}")
    both = get_backend("cpu").xp.concatenate                                     # the table for each half
    cos = constant(x, x.backend.asarray(both([cos, cos], -1), x.dtype))          # (T, D), a constant
    sin = constant(x, x.backend.asarray(both([sin, sin], -1), x.dtype))
    first, second = x[..., :D // 2], x[..., D // 2:]                             # (..., T, D/2) each
    rotated = cat([-second, first], dim=-1)                                      # rotate_half(x): (..., T, D)
    return x * cos + rotated * sin


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


def silu(x):
    """x * sigmoid(x) (also called swish): the gate of SwiGLU. Float tensors only, as in PyTorch."""
    check_float("silu", x)
    return x * x.sigmoid()


class Linear(Function):
    """x @ weight.T + bias as one op: x (..., in), weight (out, in), bias (out,) -> (..., out)."""

    def forward(self, x, weight, bias=None):
        out = self.xp.matmul(x, self.xp.permute_dims(weight, (1, 0)))   # (..., out)
        return out if bias is None else out + bias

    def backward(self, g):                                         # g (..., out)
        x, weight = self.parents[:2]
        need = self.needs_input_grad
        g2 = g.reshape(-1, g.shape[-1])                            # (N, out)
        dx = g @ weight if need[0] else None                       # (..., in)
        dw = g2.mT @ x.reshape(-1, x.shape[-1]) if need[1] else None   # (out, in)
        if len(self.parents) == 2:
            return dx, dw
        return dx, dw, g2.sum(0) if need[2] else None              # (out,)


def linear(x, weight, bias=None):
    """x @ weight.T + bias, with weight (out, in) as in PyTorch."""
    dtype = x.dtype
    if weight.dtype != dtype or (bias is not None and bias.dtype != dtype):   # (one dtype: checked at once)
        check_same_dtype("linear", *((x, weight) if bias is None else (x, weight, bias)))
    x_shape, w_shape = x.shape, weight.shape
    if not x_shape or len(w_shape) != 2 or x_shape[-1] != w_shape[1]:
        raise TensorError(f"linear: input {x_shape} and weight {w_shape} do not fit "
                          "(expected (..., in) and (out, in))")
    if bias is not None and bias.shape != w_shape[:1]:
        raise TensorError(f"linear: bias {bias.shape} does not fit weight {w_shape} (expected ({w_shape[0]},))")
    return Linear.apply(x, weight) if bias is None else Linear.apply(x, weight, bias)


# ---------------------------------------------------------------- attention (nn/attention.py)
from .attention import scaled_dot_product_attention  # noqa: E402,F401 (F.scaled_dot_product_attention)
from .flash import flash_attention  # noqa: E402
