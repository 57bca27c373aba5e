"""Typical wrong answers to the exercises (each of "Build the core", LoRA's and RMSNorm's), as a learner would write them.

test_exercise_messages.py runs each exercise's checks on them and asserts
that the first failure says what is wrong in the exercise's terms. Each
answer is a small module: the reference solution with one piece replaced.
"""
import math
import types

import numpy as np

import tinyattn as ta
import tinyattn.nn.functional as F

from exercise_solutions import (adamw, attention, cross_entropy, dpo, elementwise, embedding, engine, gqa, kv_cache,
                                layernorm, lora, matmul, online_softmax, rmsnorm, rope, softmax, sum_to, swiglu)


def answer(base, **pieces):
    """A module: the solution ``base`` with some names replaced."""
    module = types.ModuleType(f"wrong_{base.__name__.rsplit('.', 1)[-1]}")
    module.__dict__.update({k: v for k, v in vars(base).items() if not k.startswith("__")})
    module.__dict__.update(pieces)
    return module


# ---------------------------------------------------------------- 1. RMSNorm
def rms_norm_without_eps(x, weight=None, eps=1e-6):
    y = x / (x * x).mean(-1, keepdim=True).sqrt()
    return y if weight is None else y * weight


def rms_norm_eps_outside(x, weight=None, eps=1e-6):
    y = x / ((x * x).mean(-1, keepdim=True).sqrt() + eps)
    return y if weight is None else y * weight


def rms_norm_rms_from_numpy(x, weight=None, eps=1e-6):
    """The root mean square taken with numpy: right values, but a constant to autodiff (x's gradient
    keeps only the 1 / rms part)."""
    rms = np.sqrt((x.numpy() ** 2).mean(-1, keepdims=True) + eps)
    y = x / ta.tensor(rms, dtype=x.dtype)
    return y if weight is None else y * weight


class RMSNormDefaultEps(rmsnorm.RMSNorm):
    """Keeps eps, but calls rms_norm with its default."""

    def forward(self, x):
        return rmsnorm.rms_norm(x, self.weight)


# ---------------------------------------------------------------- 2. RoPE
def apply_rotary_partner_from_numpy(x, positions, base=10000.0):
    """x * cos + partner * sin, the partner (-b, a) of each pair (a, b) built with numpy: right values,
    but the sin half of the rotation is a constant to autodiff."""
    *lead, T, D = x.shape
    cos, sin = (ta.tensor(np.repeat(t, 2, -1), dtype=x.dtype) for t in rope.rotary_tables(positions, D, base))
    pairs = x.numpy().reshape(*lead, T, D // 2, 2)
    partner = np.stack([-pairs[..., 1], pairs[..., 0]], -1).reshape(x.shape)
    return x * cos + ta.tensor(partner, dtype=x.dtype) * sin


# ---------------------------------------------------------------- 3. GQA
def gqa_repeat_with_numpy(q, k, v, is_causal=False):
    """Each k/v group repeated with np.repeat: right values, but k and v get no gradient."""
    r = q.shape[1] // k.shape[1]
    k, v = (ta.tensor(np.repeat(t.numpy(), r, axis=1), dtype=t.dtype) for t in (k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


# ---------------------------------------------------------------- 4. SwiGLU
def silu_sigmoid_from_numpy(x):
    """x * sigmoid(x) with the sigmoid from numpy: right values, but its share of the gradient is lost."""
    return x * ta.tensor(1.0 / (1.0 + np.exp(-x.numpy())), dtype=x.dtype)


# ---------------------------------------------------------------- 5. sum_to
def sum_leading_only(g, shape):
    """Sums the dims added in front, forgets the size-1 dims."""
    lead = g.ndim - len(shape)
    return g.sum(tuple(range(lead))) if lead else g


class MulWithoutSumTo(ta.Function):
    def forward(self, a, b):
        return a * b

    def backward(self, g):
        a, b = self.parents
        return g * b, g * a


class MulSwapped(sum_to.Mul):
    def backward(self, g):
        a, b = self.parents
        return sum_to.sum_to(g * a, a.shape), sum_to.sum_to(g * b, b.shape)


# ---------------------------------------------------------------- 6. matmul
class MatMulNoTranspose(matmul.MatMul):
    def backward(self, g):
        a, b = self.parents
        return ta.sum_to(g @ b, a.shape), ta.sum_to(a.mT @ g, b.shape)


class MatMulNoSumTo(matmul.MatMul):
    def backward(self, g):
        a, b = self.parents
        return g @ b.mT, a.mT @ g


# ---------------------------------------------------------------- 7. exp, log, tanh
class TanhFromInput(elementwise.Tanh):
    def backward(self, g):
        x = self.parents[0]
        return g * (1.0 - x * x)


class ExpOnRawArrays(elementwise.Exp):
    def backward(self, g):
        return ta.tensor(g.data * self.output.data, dtype=g.dtype, device=g.device)


class LogWithNumpy(elementwise.Log):
    def forward(self, x):
        return np.log(x)


# ---------------------------------------------------------------- 8. softmax
def softmax_from(cls):
    return lambda x, dim=-1: cls.apply(x, dim=dim % x.ndim)


class SoftmaxDiagonal(softmax.Softmax):
    def backward(self, g):
        y = self.output
        return g * y * (1.0 - y)


class SoftmaxOfSum(softmax.Softmax):
    """The gradient of sum(y): g is left out, and every row's gradient is zero."""

    def backward(self, g):
        y = self.output
        return y * (1.0 - y.sum(self.dim, keepdim=True))


class SoftmaxJacobian(softmax.Softmax):
    """Right values, through the full (C, C) Jacobian diag(y) - y y^T of every row."""

    def backward(self, g):
        last = g.ndim - 1
        perm = list(range(g.ndim))
        perm[self.dim], perm[last] = last, self.dim
        y, gl = self.output.permute(perm), g.permute(perm)                  # softmax dim last
        eye = ta.tensor(np.eye(y.shape[-1]), dtype=y.dtype)
        jac = y.unsqueeze(-1) * eye - y.unsqueeze(-1) * y.unsqueeze(-2)      # (..., C, C)
        return (jac @ gl.unsqueeze(-1)).squeeze(-1).permute(perm)


class SoftmaxOverflows(softmax.Softmax):
    def forward(self, x, dim):
        self.dim = dim
        e = self.xp.exp(x)
        return e / self.xp.sum(e, axis=dim, keepdims=True)


class SoftmaxGlobalMax(softmax.Softmax):
    """Subtracts the max of the whole tensor: a row far below it underflows to 0 / 0."""

    def forward(self, x, dim):
        self.dim = dim
        e = self.xp.exp(x - self.xp.max(x))
        return e / self.xp.sum(e, axis=dim, keepdims=True)


class SoftmaxInPlace(softmax.Softmax):
    """x -= max writes into the array forward was handed: the caller's tensor."""

    def forward(self, x, dim):
        self.dim = dim
        x -= self.xp.max(x, axis=dim, keepdims=True)
        e = self.xp.exp(x)
        return e / self.xp.sum(e, axis=dim, keepdims=True)


class SoftmaxSubtractsFromG(softmax.Softmax):
    """Right gradient, but g -= sum(g * y) changes the gradient it was given (under no_grad, in place)."""

    def backward(self, g):
        y = self.output
        g -= (g * y).sum(self.dim, keepdim=True)
        return y * g


# ---------------------------------------------------------------- 9. LayerNorm
def layer_norm_from(cls):
    return lambda x, weight, bias, eps=1e-5: cls.apply(x, weight, bias, eps=eps)


class LayerNormConstantVariance(layernorm.LayerNorm):
    def backward(self, g):
        xp, (xhat, rstd) = self.xp, self.saved
        gx = g.data * self.parents[1].data
        dx = rstd * (gx - xp.mean(gx, axis=-1, keepdims=True))
        dw = xp.sum(g.data * xhat, axis=tuple(range(g.ndim - 1)))
        db = xp.sum(g.data, axis=tuple(range(g.ndim - 1)))
        return tuple(ta.tensor(a, dtype=g.dtype, device=g.device) for a in (dx, dw, db))


class LayerNormSumsDimZero(layernorm.LayerNorm):
    def backward(self, g):
        dx, _, _ = super().backward(g)
        dw = ta.tensor(self.xp.sum(g.data * self.saved[0], axis=0), dtype=g.dtype, device=g.device)
        db = ta.tensor(self.xp.sum(g.data, axis=0), dtype=g.dtype, device=g.device)
        return dx, dw, db


class LayerNormNumpy(layernorm.LayerNorm):
    def forward(self, x, weight, bias, eps):
        mu = np.mean(x, axis=-1, keepdims=True)
        rstd = 1.0 / np.sqrt(np.var(x, axis=-1, keepdims=True) + eps)
        xhat = (x - mu) * rstd
        self.save(xhat, rstd)
        return xhat * weight + bias


class LayerNormInPlace(layernorm.LayerNorm):
    """x -= mean, x *= rstd: right values, but the caller's x is now xhat."""

    def forward(self, x, weight, bias, eps):
        xp = self.xp
        x -= xp.mean(x, axis=-1, keepdims=True)
        rstd = 1.0 / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + eps)
        x *= rstd
        self.save(x, rstd)
        return x * weight + bias


class LayerNormScalesGInPlace(layernorm.LayerNorm):
    """Right gradients, but g *= weight writes into the gradient it was given (which other ops share)."""

    def backward(self, g):
        xp, (xhat, rstd) = self.xp, self.saved
        gd = g.data
        lead = tuple(range(gd.ndim - 1))
        dw, db = xp.sum(gd * xhat, axis=lead), xp.sum(gd, axis=lead)
        gd *= self.parents[1].data
        dx = rstd * (gd - xp.mean(gd, axis=-1, keepdims=True) - xhat * xp.mean(gd * xhat, axis=-1, keepdims=True))
        return tuple(self.constant(a) for a in (dx, dw, db))


class LayerNormBackwardDefaultEps(layernorm.LayerNorm):
    """Backward recomputes rstd with eps = 1e-5, whatever eps forward was given."""

    def backward(self, g):
        x = self.parents[0].data
        xhat, _ = self.saved
        self.saved = (xhat, 1.0 / self.xp.sqrt(self.xp.var(x, axis=-1, keepdims=True) + 1e-5))
        return super().backward(g)


class LayerNormOnePassVariance(layernorm.LayerNorm):
    """var = mean(x^2) - mean^2: right for small means, cancels when the mean is large next to the spread."""

    def forward(self, x, weight, bias, eps):
        xp = self.xp
        mu = xp.mean(x, axis=-1, keepdims=True)
        rstd = 1.0 / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) - mu * mu + eps)
        xhat = (x - mu) * rstd
        self.save(xhat, rstd)
        return xhat * weight + bias


# ---------------------------------------------------------------- 10. cross-entropy
def cross_entropy_from(cls):
    return lambda logits, targets, ignore_index=-100: cls.apply(logits, targets, ignore_index=ignore_index)


class CrossEntropySum(cross_entropy.CrossEntropy):
    """The backward forgets the 1/N of the mean."""

    def backward(self, g):
        dlogits, _ = super().backward(g)
        weight = self.saved[0]
        count = float(self.xp.sum(self.xp.astype(weight > 0, weight.dtype)))
        return dlogits * count, None


class CrossEntropyIgnoresG(cross_entropy.CrossEntropy):
    def backward(self, g):
        return super().backward(ta.ones_like(g))


class CrossEntropyKeepsIgnoredRows(cross_entropy.CrossEntropy):
    def backward(self, g):
        xp, logits, (weight, targets) = self.xp, self.parents[0], self.saved
        count = xp.sum(xp.astype(weight > 0, logits.data.dtype))
        onehot = xp.astype(xp.reshape(targets, (-1, 1)) == self.backend.arange(logits.shape[1])[None, :],
                           logits.data.dtype)
        return g * (logits.softmax(1) - ta.tensor(onehot, dtype=g.dtype)) * (1.0 / float(count)), None


class CrossEntropyIgnoresMinus100(cross_entropy.CrossEntropy):
    """Compares the targets with -100, whatever ignore_index it is given."""

    def forward(self, logits, targets, ignore_index):
        return super().forward(logits, targets, -100)


class CrossEntropyGlobalMax(cross_entropy.CrossEntropy):
    """Subtracts the max of all the logits: a row far below it gives log(0)."""

    def forward(self, logits, targets, ignore_index):
        xp = self.xp
        valid = xp.astype(targets != ignore_index, logits.dtype)
        weight = valid / xp.maximum(xp.sum(valid), 1.0)
        targets = xp.where(targets != ignore_index, targets, xp.zeros_like(targets))
        self.save(weight, targets)
        m = xp.max(logits)
        logp = logits - m - xp.log(xp.sum(xp.exp(logits - m), axis=1, keepdims=True))
        picked = xp.take_along_axis(logp, xp.reshape(targets, (-1, 1)), axis=1)[:, 0]
        return -xp.sum(picked * weight)


# ---------------------------------------------------------------- 11. embedding
class EmbeddingAssigns(embedding.Embedding):
    """dw[idx] += g: numpy buffers the writes, so a repeated id keeps one of its rows."""

    def backward(self, g):
        weight = self.parents[0]
        dw = np.zeros(weight.shape)
        dw[self.saved[0]] += g.data.reshape(-1, weight.shape[1])
        return ta.tensor(dw, dtype=g.dtype), None


class EmbeddingFloat64Grad(embedding.Embedding):
    """A one-hot made in float64: the gradient of a float32 table comes back float64."""

    def backward(self, g):
        xp, weight, (flat,) = self.xp, self.parents[0], self.saved
        onehot = xp.astype(self.backend.arange(weight.shape[0])[:, None] == flat[None, :], xp.float64)
        return self.constant(onehot) @ g.reshape(-1, weight.shape[1]), None


class EmbeddingTakeNd(embedding.Embedding):
    """take with the (B, T) ids as they are: numpy accepts it, the array API wants 1-d indices."""

    def forward(self, weight, idx):
        self.save(self.xp.reshape(idx, (-1,)))
        return self.xp.take(weight, idx, axis=0)


class EmbeddingFancyIndex(embedding.Embedding):
    """weight[idx], numpy's fancy indexing."""

    def forward(self, weight, idx):
        self.save(self.xp.reshape(idx, (-1,)))
        return weight[idx]


class EmbeddingTwoDimIds(embedding.Embedding):
    """Right for (B, T) ids only: B, T = idx.shape."""

    def forward(self, weight, idx):
        B, T = idx.shape
        flat = self.xp.reshape(idx, (-1,))
        self.save(flat)
        return self.xp.reshape(self.xp.take(weight, flat, axis=0), (B, T, weight.shape[1]))


# ---------------------------------------------------------------- 12. the engine
def toposort_without_visited(roots):
    """Depth-first, post-order, but without remembering what was visited."""
    order = []

    def visit(t):
        if t.grad_fn is not None:
            for p in t.grad_fn.parents:
                if p.requires_grad:
                    visit(p)
        order.append(t)
    for r in roots:
        visit(r)
    return order[::-1]


def backward_overwrites(root, gradient=None):
    """Keeps the last gradient that reaches a tensor instead of adding them up."""
    pending = {id(root): ta.ones_like(root) if gradient is None else gradient}
    with ta.no_grad():
        for t in engine.toposort([root]):
            g = pending.pop(id(t), None)
            if g is None:
                continue
            if t.grad_fn is None:
                t.grad = g if t.grad is None else t.grad + g
                continue
            grads = t.grad_fn.backward(g)
            grads = grads if isinstance(grads, tuple) else (grads,)
            for parent, pg in zip(t.grad_fn.parents, grads):
                if pg is not None and parent.requires_grad:
                    pending[id(parent)] = pg


def backward_resets_grad(root, gradient=None):
    """Right within one call, but .grad is replaced, not added to, across calls."""
    leaves = [t for t in engine.toposort([root]) if t.grad_fn is None]
    for t in leaves:
        t.grad = None
    engine.backward(root, gradient)


def backward_in_place(first, add):
    """A backward that keeps the first gradient as first(g) (no copy) and then adds to it with add(t, g)."""
    def backward(root, gradient=None):
        pending = {id(root): ta.ones_like(root) if gradient is None else gradient}
        with ta.no_grad():
            for t in engine.toposort([root]):
                g = pending.pop(id(t), None)
                if g is None:
                    continue
                if t.grad_fn is None:
                    if t.grad is None:
                        t.grad = first(g)
                    else:
                        add(t, g)
                    continue
                grads = t.grad_fn.backward(g)
                grads = grads if isinstance(grads, tuple) else (grads,)
                for parent, pg in zip(t.grad_fn.parents, grads):
                    if pg is not None and parent.requires_grad:
                        pending[id(parent)] = pg if id(parent) not in pending else pending[id(parent)] + pg
    return backward


def backward_adds_pending_in_place(root, gradient=None):
    """pending[k] += g: the in-place add also changes every tensor that was handed the same g."""
    pending = {id(root): ta.ones_like(root) if gradient is None else gradient}
    with ta.no_grad():
        for t in engine.toposort([root]):
            g = pending.pop(id(t), None)
            if g is None:
                continue
            if t.grad_fn is None:
                t.grad = ta.tensor(g, dtype=g.dtype) if t.grad is None else t.grad + g
                continue
            grads = t.grad_fn.backward(g)
            grads = grads if isinstance(grads, tuple) else (grads,)
            for parent, pg in zip(t.grad_fn.parents, grads):
                if pg is not None and parent.requires_grad:
                    if id(parent) in pending:
                        pending[id(parent)] += pg
                    else:
                        pending[id(parent)] = pg


def _add_to_array(t, g):
    t.grad.data += g.data               # writes into the array .grad holds


def _add_to_tensor(t, g):
    t.grad += g                         # under no_grad: the same Tensor object takes the new values


# ---------------------------------------------------------------- 13. attention
def attention_from(cls):
    return lambda q, k, v, is_causal=False, scale=None: cls.apply(
        q, k, v, scale=1.0 / math.sqrt(q.shape[-1]) if scale is None else scale, is_causal=is_causal)


class AttentionNoSubtraction(attention.Attention):
    def backward(self, g):
        xp, (_, p) = self.xp, self.saved
        q, k, v = (t.data for t in self.parents)
        dv = xp.matmul(xp.matrix_transpose(p), g.data)
        ds = p * xp.matmul(g.data, xp.matrix_transpose(v))                  # forgot - rowsum(dP * P)
        dq, dk = xp.matmul(ds, k) * self.scale, xp.matmul(xp.matrix_transpose(ds), q) * self.scale
        return tuple(ta.tensor(a, dtype=g.dtype, device=g.device) for a in (dq, dk, dv))


class AttentionNoScale(attention.Attention):
    def backward(self, g):
        dq, dk, dv = super().backward(g)
        return dq * (1.0 / self.scale), dk * (1.0 / self.scale), dv


class AttentionNumpyMask(attention.Attention):
    def forward(self, q, k, v, scale, is_causal):
        self.scale, q_scaled = scale, q * scale
        s = q_scaled @ np.swapaxes(k, -1, -2)
        if is_causal:
            s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
        e = np.exp(s - s.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
        self.save(q_scaled, p)
        return p @ v


class AttentionMaskByProduct(attention.Attention):
    """The causal mask as a product with booleans: numpy casts them, the array API refuses."""

    def forward(self, q, k, v, scale, is_causal):
        xp = self.xp
        self.scale, q_scaled = scale, q * scale
        s = xp.matmul(q_scaled, xp.matrix_transpose(k))
        e = xp.exp(s - xp.max(s, axis=-1, keepdims=True))
        if is_causal:
            e = e * (self.backend.arange(k.shape[-2])[None, :] <= self.backend.arange(q.shape[-2])[:, None])
        p = e / xp.sum(e, axis=-1, keepdims=True)
        self.save(q_scaled, p)
        return xp.matmul(p, v)


class AttentionDefaultScale(attention.Attention):
    """Forward and backward with 1 / sqrt(D), whatever scale they are given."""

    def forward(self, q, k, v, scale, is_causal):
        return super().forward(q, k, v, 1.0 / math.sqrt(q.shape[-1]), is_causal)


class AttentionBackwardDefaultScale(attention.Attention):
    """Forward with the scale it is given, backward with 1 / sqrt(D)."""

    def backward(self, g):
        self.scale = 1.0 / math.sqrt(self.parents[0].shape[-1])
        return super().backward(g)


class AttentionBottomRight(attention.Attention):
    """The causal mask aligned at the bottom right (j <= i + Tk - Tq): right only when Tq = Tk."""

    def forward(self, q, k, v, scale, is_causal):
        xp = self.xp
        self.scale, q_scaled = scale, q * scale
        s = xp.matmul(q_scaled, xp.matrix_transpose(k))
        if is_causal:
            rows = self.backend.arange(q.shape[-2])[:, None]
            cols = self.backend.arange(k.shape[-2])[None, :]
            s = xp.where(cols <= rows + (k.shape[-2] - q.shape[-2]), s, -math.inf)
        e = xp.exp(s - xp.max(s, axis=-1, keepdims=True))
        p = e / xp.sum(e, axis=-1, keepdims=True)
        self.save(q_scaled, p)
        return xp.matmul(p, v)


# ---------------------------------------------------------------- 14. online softmax
def tiled_without_rescale(q, k, v, block_size=16, is_causal=False, scale=None):
    xp, backend = q.xp, q.backend
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    qd, kd, vd = q.data, k.data, v.data
    t_k = kd.shape[-2]
    m = backend.full(qd.shape[:-1] + (1,), -math.inf, q.dtype)
    l = backend.zeros(qd.shape[:-1] + (1,), q.dtype)
    acc = backend.zeros(qd.shape[:-1] + (vd.shape[-1],), q.dtype)
    for j0 in range(0, t_k, block_size):
        j1 = min(j0 + block_size, t_k)
        s = xp.matmul(qd, xp.matrix_transpose(kd[..., j0:j1, :])) * scale
        if is_causal:
            rows = backend.arange(qd.shape[-2])[:, None]
            s = xp.where(backend.arange(j1 - j0)[None, :] + j0 <= rows, s, -math.inf)
        m = xp.maximum(m, xp.max(s, axis=-1, keepdims=True))                # l and acc are not rescaled
        p = xp.exp(s - m)
        l = l + xp.sum(p, axis=-1, keepdims=True)
        acc = acc + xp.matmul(p, vd[..., j0:j1, :])
    return ta.tensor(acc / l, dtype=q.dtype, device=q.device)


def tiled_all_at_once(q, k, v, block_size=16, is_causal=False, scale=None):
    """Right values, but with the whole (T, T) score matrix."""
    with ta.no_grad():
        return attention.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)


def tiled_query_blocks_only(q, k, v, block_size=16, is_causal=False, scale=None):
    """Blocks of queries, each against every key at once: no online softmax, a (block, Tk) strip of scores."""
    xp, backend = q.xp, q.backend
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    qd, kd, vd = q.data, k.data, v.data
    rows = []
    for i0 in range(0, qd.shape[-2], block_size):
        q_i = qd[..., i0:min(i0 + block_size, qd.shape[-2]), :]
        s = xp.matmul(q_i, xp.matrix_transpose(kd)) * scale                # (B, H, bq, Tk): every key at once
        if is_causal:
            query = backend.arange(q_i.shape[-2])[:, None] + i0
            s = xp.where(backend.arange(kd.shape[-2])[None, :] <= query, s, -math.inf)
        p = xp.exp(s - xp.max(s, axis=-1, keepdims=True))
        rows.append(xp.matmul(p / xp.sum(p, axis=-1, keepdims=True), vd))
    return ta.tensor(xp.concat(rows, axis=-2), dtype=q.dtype, device=q.device)


def tiled_unclipped_slices(q, k, v, block_size=16, is_causal=False, scale=None):
    """The online softmax, with key blocks sliced k[..., j:j + block]: numpy cuts the last one short."""
    xp, backend = q.xp, q.backend
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    qd, kd, vd = q.data, k.data, v.data
    m = backend.full(qd.shape[:-1] + (1,), -math.inf, q.dtype)
    l = backend.zeros(qd.shape[:-1] + (1,), q.dtype)
    acc = backend.zeros(qd.shape[:-1] + (vd.shape[-1],), q.dtype)
    rows = backend.arange(qd.shape[-2])[:, None]
    for j0 in range(0, kd.shape[-2], block_size):
        s = xp.matmul(qd, xp.matrix_transpose(kd[..., j0:j0 + block_size, :])) * scale
        if is_causal:
            s = xp.where(backend.arange(s.shape[-1])[None, :] + j0 <= rows, s, -math.inf)
        m_new = xp.maximum(m, xp.max(s, axis=-1, keepdims=True))
        p = xp.exp(s - m_new)
        l = l * xp.exp(m - m_new) + xp.sum(p, axis=-1, keepdims=True)
        acc = acc * xp.exp(m - m_new) + xp.matmul(p, vd[..., j0:j0 + block_size, :])
        m = m_new
    return ta.tensor(acc / l, dtype=q.dtype, device=q.device)


def tiled_default_scale(q, k, v, block_size=16, is_causal=False, scale=None):
    return online_softmax.tiled_attention(q, k, v, block_size=block_size, is_causal=is_causal)


# ---------------------------------------------------------------- 15. AdamW
class AdamVariant(adamw.AdamW):
    """The solution's walk over the parameters, with another update rule."""

    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    state = self.state.setdefault(id(p), {"step": 0, "exp_avg": 0.0, "exp_avg_sq": 0.0})
                    state["step"] += 1
                    p.data = self.update(p.data, p.grad.data, state, group, p.xp)


class AdamL2(AdamVariant):
    """Adam with weight_decay * p added to the gradient: not decoupled."""

    def update(self, p, g, state, group, xp):
        lr, (b1, b2), eps, t = group["lr"], group["betas"], group["eps"], state["step"]
        g = g + group["weight_decay"] * p
        state["exp_avg"] = m = b1 * state["exp_avg"] + (1 - b1) * g
        state["exp_avg_sq"] = v = b2 * state["exp_avg_sq"] + (1 - b2) * g * g
        return p - lr * (m / (1 - b1 ** t)) / (xp.sqrt(v / (1 - b2 ** t)) + eps)


class AdamWNoBiasCorrection(AdamVariant):
    def update(self, p, g, state, group, xp):
        lr, (b1, b2), eps = group["lr"], group["betas"], group["eps"]
        state["exp_avg"] = m = b1 * state["exp_avg"] + (1 - b1) * g
        state["exp_avg_sq"] = v = b2 * state["exp_avg_sq"] + (1 - b2) * g * g
        return p * (1 - lr * group["weight_decay"]) - lr * m / (xp.sqrt(v) + eps)


class AdamWFirstLr(adamw.AdamW):
    """Reads the learning rate once, when it is made."""

    def step(self):
        if not hasattr(self, "first_lr"):
            self.first_lr = [group["lr"] for group in self.param_groups]
        now = [group["lr"] for group in self.param_groups]
        for group, lr in zip(self.param_groups, self.first_lr):
            group["lr"] = lr
        super().step()
        for group, lr in zip(self.param_groups, now):
            group["lr"] = lr


class AdamWOneStepCount(adamw.AdamW):
    """One step count for the optimizer, not one per parameter: a parameter skipped before starts at t > 1."""

    def step(self):
        self.t = getattr(self, "t", 0) + 1
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g, xp = p.grad.data, p.xp
                state = self.state.setdefault(id(p), {"m": xp.zeros_like(p.data), "v": xp.zeros_like(p.data)})
                state["m"] = m = b1 * state["m"] + (1 - b1) * g
                state["v"] = v = b2 * state["v"] + (1 - b2) * g * g
                p.data = p.data * (1 - lr * wd)
                p.data = p.data - lr * (m / (1 - b1 ** self.t)) / (xp.sqrt(v / (1 - b2 ** self.t)) + eps)


class AdamWFloat64State(AdamVariant):
    """m and v made in float64: a float32 parameter comes out float64."""

    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    zeros = p.xp.zeros_like(p.data, dtype=p.xp.float64)
                    state = self.state.setdefault(id(p), {"step": 0, "exp_avg": zeros, "exp_avg_sq": zeros})
                    state["step"] += 1
                    p.data = self.update(p.data, p.grad.data, state, group, p.xp)

    def update(self, p, g, state, group, xp):
        lr, (b1, b2), eps, t = group["lr"], group["betas"], group["eps"], state["step"]
        state["exp_avg"] = m = b1 * state["exp_avg"] + (1 - b1) * g
        state["exp_avg_sq"] = v = b2 * state["exp_avg_sq"] + (1 - b2) * g * g
        return p * (1 - lr * group["weight_decay"]) - lr * (m / (1 - b1 ** t)) / (xp.sqrt(v / (1 - b2 ** t)) + eps)


class AdamWFloat64Moments(AdamWFloat64State):
    """Casts the parameter back to its dtype, but keeps m and v in float64 (twice the memory, slower)."""

    def update(self, p, g, state, group, xp):
        return xp.astype(super().update(p, g, state, group, xp), p.dtype)


# ---------------------------------------------------------------- 16. KV cache
class CacheReturnsNewOnly(kv_cache.KVCache):
    def append(self, k, v):
        super().append(k, v)
        return k, v


class CacheOnHeads(kv_cache.KVCache):
    def append(self, k, v):
        if self.k is not None:
            k, v = ta.cat([self.k, k], dim=1), ta.cat([self.v, v], dim=1)
        self.k, self.v = k.detach(), v.detach()
        return k, v


class CacheTopLeftMask(kv_cache.KVCache):
    @staticmethod
    def causal_mask(t_new, t_total, like):
        rows = ta.arange(t_new, device=like.device).reshape(t_new, 1)
        return ta.arange(t_total, device=like.device).reshape(1, t_total) <= rows


class CacheFloatMask(kv_cache.KVCache):
    @staticmethod
    def causal_mask(t_new, t_total, like):
        return kv_cache.KVCache.causal_mask(t_new, t_total, like).to(like.dtype)


# exercise: [(what the learner did, the wrong module, words the first failure must contain), ...]
# (every exercise of part two, and those of part one whose mistakes once passed)
# (several words: a tuple, each of them in the message)
# ---------------------------------------------------------------- 17. LoRA
class LoRAUnfrozen(lora.LoRALinear):
    """The base layer left trainable: its weight gets a gradient and moves."""

    def __init__(self, base, r, alpha=None):
        super().__init__(base, r, alpha)
        for p in base.parameters():
            p.requires_grad = True


class LoRANoScale(lora.LoRALinear):
    """The update added without alpha / r."""

    def __init__(self, base, r, alpha=None):
        super().__init__(base, r, alpha)
        self.scale = 1.0


class LoRABaseUnderNoGrad(lora.LoRALinear):
    """base(x) under ta.no_grad(), "because the base is frozen": right values, and A and B get their
    gradients, but x's gradient loses the base's path, which every layer below trains through."""

    def forward(self, x):
        with ta.no_grad():
            plain = self.base(x)
        return plain + (x @ self.A.T) @ self.B.T * self.scale


class LoRAMergeNoScale(lora.LoRALinear):
    """forward scales the update, merge forgets to."""

    @ta.no_grad()
    def merge(self):
        merged = super().merge()
        merged.weight.data = (self.base.weight + self.B @ self.A).data
        return merged


WRONG = {
    "rmsnorm": [
        ("rms_norm without eps", answer(rmsnorm, rms_norm=rms_norm_without_eps), "eps under the square root"),
        ("eps added to the root mean square", answer(rmsnorm, rms_norm=rms_norm_eps_outside),
         "goes under the square root"),
        ("RMSNorm calls rms_norm without self.eps", answer(rmsnorm, RMSNorm=RMSNormDefaultEps), "self.eps"),
        ("the rms from numpy", answer(rmsnorm, rms_norm=rms_norm_rms_from_numpy),
         ("the gradient of x differs", "a constant to autodiff")),
    ],
    "rope": [
        ("the rotated partner built with numpy", answer(rope, apply_rotary=apply_rotary_partner_from_numpy),
         ("the gradient of x differs", "a constant to autodiff")),
    ],
    "gqa": [
        ("k and v repeated with numpy", answer(gqa, grouped_query_attention=gqa_repeat_with_numpy),
         ("k and v get no gradient", "raw arrays")),
    ],
    "swiglu": [
        ("the sigmoid from numpy", answer(swiglu, silu=silu_sigmoid_from_numpy),
         ("the gradient of x differs", "a constant to autodiff")),
    ],
    "sum_to": [
        ("sum_to sums only the dims added in front", answer(sum_to, sum_to=sum_leading_only),
         "not the dims where shape has 1"),
        ("Mul's backward returns g * b without sum_to", answer(sum_to, Mul=MulWithoutSumTo),
         "then sum_to(..., that input's shape)"),
        ("Mul's backward swaps a and b", answer(sum_to, Mul=MulSwapped), "swaps the inputs"),
    ],
    "matmul": [
        ("dA = g @ B, without the transpose", answer(matmul, MatMul=MatMulNoTranspose), "dA = g @ B^T"),
        ("no sum_to over broadcast batch dims", answer(matmul, MatMul=MatMulNoSumTo),
         ("a gradient of shape (2, 4, 5)", "ta.sum_to(..., shape) for batch dims that were broadcast")),
    ],
    "elementwise": [
        ("tanh backward with 1 - x^2", answer(elementwise, Tanh=TanhFromInput), "1 - tanh(x)^2 = 1 - y^2"),
        ("exp backward on raw arrays", answer(elementwise, Exp=ExpOnRawArrays), "returns a constant"),
        ("log forward with np.log", answer(elementwise, Log=LogWithNumpy), "works only on numpy"),
    ],
    "softmax": [
        ("the Jacobian's diagonal only", answer(softmax, softmax=softmax_from(SoftmaxDiagonal)),
         "keeps only the Jacobian's diagonal"),
        ("the gradient of sum(y)", answer(softmax, softmax=softmax_from(SoftmaxOfSum)),
         "returns the gradient of sum(y)"),
        ("the full Jacobian", answer(softmax, softmax=softmax_from(SoftmaxJacobian)), "builds the (C, C) Jacobian"),
        ("no max subtracted", answer(softmax, softmax=softmax_from(SoftmaxOverflows)), "exp(1000) overflows"),
        ("the max of the whole tensor", answer(softmax, softmax=softmax_from(SoftmaxGlobalMax)),
         "each row's max along dim"),
        ("x -= max, in place", answer(softmax, softmax=softmax_from(SoftmaxInPlace)),    # the engine stops it
         ("wrote into one of its input arrays", "x = x - m")),
        ("g -= sum(g * y), in place", answer(softmax, softmax=softmax_from(SoftmaxSubtractsFromG)),
         ("changed g", "in place")),
    ],
    "layernorm": [
        ("the variance treated as a constant", answer(layernorm, layer_norm=layer_norm_from(LayerNormConstantVariance)),
         "check the term that subtracts xhat * mean(gx * xhat)"),
        ("dweight summed over dim 0 only", answer(layernorm, layer_norm=layer_norm_from(LayerNormSumsDimZero)),
         "the sums over every leading dim"),
        ("np.mean in forward", answer(layernorm, layer_norm=layer_norm_from(LayerNormNumpy)), "works only on numpy"),
        ("x -= mean, x *= rstd, in place", answer(layernorm, layer_norm=layer_norm_from(LayerNormInPlace)),
         ("wrote into one of its input arrays", "x = x - m")),
        ("g *= weight, in place", answer(layernorm, layer_norm=layer_norm_from(LayerNormScalesGInPlace)),
         ("changed g", "in place")),
        ("backward with eps = 1e-5", answer(layernorm, layer_norm=layer_norm_from(LayerNormBackwardDefaultEps)),
         ("eps=0.5", "the eps given to forward")),
        ("var = mean(x^2) - mean^2", answer(layernorm, layer_norm=layer_norm_from(LayerNormOnePassVariance)),
         "mean((x - mean)^2)"),
    ],
    "cross_entropy": [
        ("no 1/N in backward", answer(cross_entropy, cross_entropy=cross_entropy_from(CrossEntropySum)),
         "N times too large"),
        ("g left out", answer(cross_entropy, cross_entropy=cross_entropy_from(CrossEntropyIgnoresG)), "ignores g"),
        ("ignored rows get a gradient",
         answer(cross_entropy, cross_entropy=cross_entropy_from(CrossEntropyKeepsIgnoredRows)),
         "rows whose target is ignore_index"),
        ("ignore_index taken as -100",
         answer(cross_entropy, cross_entropy=cross_entropy_from(CrossEntropyIgnoresMinus100)),
         "the ignore_index you are given"),
        ("the max of all the logits", answer(cross_entropy, cross_entropy=cross_entropy_from(CrossEntropyGlobalMax)),
         "each row's own max"),
    ],
    "embedding": [
        ("dw[idx] += g", answer(embedding, embedding=lambda idx, w: EmbeddingAssigns.apply(w, idx)),
         "id 3 is looked up three times"),
        ("take with (B, T) ids", answer(embedding, embedding=lambda idx, w: EmbeddingTakeNd.apply(w, idx)),
         ("1-d", "reshape")),
        ("weight[idx]", answer(embedding, embedding=lambda idx, w: EmbeddingFancyIndex.apply(w, idx)),
         ("xp.take", "1-d")),
        ("(B, T) ids only", answer(embedding, embedding=lambda idx, w: EmbeddingTwoDimIds.apply(w, idx)),
         "may have any shape"),
        ("a float64 gradient for a float32 table",
         answer(embedding, embedding=lambda idx, w: EmbeddingFloat64Grad.apply(w, idx)), ("float64", "dtype")),
    ],
    "engine": [
        ("toposort without a visited set", answer(engine, toposort=toposort_without_visited),
         "mark the tensors you have visited"),
        ("gradients overwritten, not summed", answer(engine, backward=backward_overwrites),
         "kept one path's gradient"),
        (".grad replaced across calls", answer(engine, backward=backward_resets_grad), "adds up across backward calls"),
        ("t.grad = g, then t.grad.data += g.data",
         answer(engine, backward=backward_in_place(lambda g: g, _add_to_array)), "its own array"),
        ("t.grad = g, then t.grad += g", answer(engine, backward=backward_in_place(lambda g: g, _add_to_tensor)),
         "its own array"),
        ("t.grad = g.detach(), then t.grad.data += g.data",
         answer(engine, backward=backward_in_place(lambda g: g.detach(), _add_to_array)), "its own array"),
        ("pending[k] += g", answer(engine, backward=backward_adds_pending_in_place), ("in-place +=", "x = x + ...")),
    ],
    "attention": [
        ("dS = P * dP", answer(attention, scaled_dot_product_attention=attention_from(AttentionNoSubtraction)),
         "your dS is P * dP"),
        ("no scale in dQ, dK", answer(attention, scaled_dot_product_attention=attention_from(AttentionNoScale)),
         "miss the scale"),
        ("numpy causal mask", answer(attention, scaled_dot_product_attention=attention_from(AttentionNumpyMask)),
         "works only on numpy"),
        ("causal mask at the bottom right", answer(attention, scaled_dot_product_attention=attention_from(AttentionBottomRight)),
         "counted from the top left"),
        ("mask times booleans", answer(attention, scaled_dot_product_attention=attention_from(AttentionMaskByProduct)),
         ("booleans", "xp.where")),
        ("1 / sqrt(D) whatever the scale",
         answer(attention, scaled_dot_product_attention=attention_from(AttentionDefaultScale)),
         ("scale=0.3", "Use the scale forward is given")),
        ("backward with 1 / sqrt(D)",
         answer(attention, scaled_dot_product_attention=attention_from(AttentionBackwardDefaultScale)),
         ("scale=0.3", "Use self.scale")),
    ],
    "online_softmax": [
        ("l and acc never rescaled", answer(online_softmax, tiled_attention=tiled_without_rescale),
         "multiply them by exp(m - m_new)"),
        ("the whole score matrix", answer(online_softmax, tiled_attention=tiled_all_at_once),
         "keep one (block, block) tile"),
        ("1 / sqrt(D) whatever the scale", answer(online_softmax, tiled_attention=tiled_default_scale),
         ("scale=0.3", "Use the scale you are given")),
        ("blocks of queries against all keys", answer(online_softmax, tiled_attention=tiled_query_blocks_only),
         "go through the keys one block at a time too"),
        ("k[..., j:j + block] past the end", answer(online_softmax, tiled_attention=tiled_unclipped_slices),
         "min(i + block, T)"),
    ],
    "adamw": [
        ("weight decay added to the gradient", answer(adamw, AdamW=AdamL2), "Adam with L2"),
        ("no bias correction", answer(adamw, AdamW=AdamWNoBiasCorrection), "no bias correction"),
        ("the learning rate read once", answer(adamw, AdamW=AdamWFirstLr), "read group['lr'] at every step"),
        ("one step count for all parameters", answer(adamw, AdamW=AdamWOneStepCount), "Count steps per parameter"),
        ("float64 moments for float32 parameters", answer(adamw, AdamW=AdamWFloat64State), ("float32", "float64")),
        ("float64 moments, the parameter cast back", answer(adamw, AdamW=AdamWFloat64Moments),
         ("float32", "moments")),
    ],
    "kv_cache": [
        ("append returns the new keys only", answer(kv_cache, KVCache=CacheReturnsNewOnly), "returned only the new one"),
        ("concatenated along the heads", answer(kv_cache, KVCache=CacheOnHeads), "along the time dim"),
        ("the mask aligned at the top left", answer(kv_cache, KVCache=CacheTopLeftMask), "at the top left"),
        ("a float mask", answer(kv_cache, KVCache=CacheFloatMask), "not boolean"),
    ],
    "lora": [
        ("the base weight left trainable", answer(lora, LoRALinear=LoRAUnfrozen), "set requires_grad = False"),
        ("no alpha / r", answer(lora, LoRALinear=LoRANoScale), "leaves out the scale alpha / r = 4"),
        ("base(x) under ta.no_grad()", answer(lora, LoRALinear=LoRABaseUnderNoGrad),
         ("the gradient of x differs", "needs no ta.no_grad()")),
        ("merge without alpha / r", answer(lora, LoRALinear=LoRAMergeNoScale),
         ("every adapter merged", "W + (alpha / r) B A")),
    ],
}


# ---------------------------------------------------------------- 17. write BPE
from exercise_solutions import bpe  # noqa: E402


def pair_counts_across_words(words):
    """Counts the pairs of all words run together, so a word's last id pairs with the next word's first."""
    flat = [i for ids in words for i in ids]
    return bpe.pair_counts([flat])


def merge_without_skipping(ids, pair, new_id):
    """Replaces each position where the pair starts, overlapping: [1, 1, 1] -> [300, 300]."""
    out = []
    for i in range(len(ids)):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
        elif not (i > 0 and (ids[i - 1], ids[i]) == pair):
            out.append(ids[i])
    return out


def train_ties_to_smallest_pair(pieces, vocab_size):
    """Breaks ties by the pair's ids, not by where it is met first."""
    module = answer(bpe, pair_counts=lambda words: dict(sorted(bpe.pair_counts(words).items())))
    return _train_with(module, pieces, vocab_size)


def _train_with(module, pieces, vocab_size):
    words = [list(p) for p in pieces]
    vocab = [bytes([b]) for b in range(256)]
    while len(vocab) < vocab_size:
        counts = module.pair_counts(words)
        if not counts:
            break
        pair = max(counts, key=counts.get)
        vocab.append(vocab[pair[0]] + vocab[pair[1]])
        words = [bpe.merge(ids, pair, len(vocab) - 1) for ids in words]
    return {tok: i for i, tok in enumerate(vocab)}


def encode_leftmost_first(piece, ranks):
    """Joins the leftmost pair that makes a token, not the one of lowest id."""
    parts = [bytes([b]) for b in piece]
    while True:
        i = next((i for i in range(len(parts) - 1) if parts[i] + parts[i + 1] in ranks), None)
        if i is None:
            return [ranks[p] for p in parts]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


def encode_rightmost_of_equals(piece, ranks):
    """Joins the pair of lowest id, but the rightmost of equal ones: b"aaa" with aa ranked gives [97, 256]."""
    parts = [bytes([b]) for b in piece]
    while len(parts) > 1:
        known = [(ranks[a + b], i) for i, (a, b) in enumerate(zip(parts, parts[1:])) if a + b in ranks]
        if not known:
            break
        _, i = min(known, key=lambda ri: (ri[0], -ri[1]))
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return [ranks[p] for p in parts]


WRONG["bpe"] = [
    ("encode joins the rightmost of equal pairs", answer(bpe, encode=encode_rightmost_of_equals), "join the leftmost"),
    ("pairs counted across words", answer(bpe, pair_counts=pair_counts_across_words), "never across two words"),
    ("overlapping merges", answer(bpe, merge=merge_without_skipping), "skip both ids"),
    ("ties to the smallest pair", answer(bpe, train=train_ties_to_smallest_pair), "met first"),
    ("encode joins the leftmost pair", answer(bpe, encode=encode_leftmost_first), "not the leftmost"),
]


# ---------------------------------------------------------------- 19. the loss mask
from exercise_solutions import loss_mask  # noqa: E402


def render_with(trained_user=0, role_token=0, end=1, shift=False):
    """The solution's render with one thing changed: the user's mask, the role token's, the
    assistant's <|end|>, or every mask moved one position to the right."""
    def render(tokenizer, messages):
        ids, mask = [], []
        for m in messages:
            text = tokenizer.encode(m["content"])
            role = tokenizer.special_tokens[loss_mask.ROLES[m["role"]]]
            ids += [role, *text, tokenizer.special_tokens[loss_mask.END]]
            on = 1 if m["role"] == "assistant" else trained_user
            mask += [role_token if m["role"] == "assistant" else 0] + [on] * len(text) + [on * end]
        return ids, ([0] + mask[:-1] if shift else mask)
    return render


def targets_with_zero(ids, mask):
    """Writes 0 (a real token id) where the mask is 0."""
    return list(ids[:-1]), [i if m == 1 else 0 for i, m in zip(ids[1:], mask[1:])]


def targets_unshifted_mask(ids, mask):
    """Reads the mask at t, not at t + 1, for the target ids[t + 1]."""
    return list(ids[:-1]), [i if m == 1 else -1 for i, m in zip(ids[1:], mask[:-1])]


WRONG["loss_mask"] = [
    ("the user's turn trained on too", answer(loss_mask, render=render_with(trained_user=1)), "the user's turn"),
    ("<|assistant|> in the mask", answer(loss_mask, render=render_with(role_token=1)), "the role's token is given"),
    ("the assistant's <|end|> left out", answer(loss_mask, render=render_with(end=0)), "must learn to stop"),
    ("the mask one position late", answer(loss_mask, render=render_with(shift=True)), "shifted by one"),
    ("0 for no target", answer(loss_mask, targets=targets_with_zero), "write -1 there"),
    ("the mask read at t", answer(loss_mask, targets=targets_unshifted_mask), "use mask[t + 1]"),
]


# ---------------------------------------------------------------- 20. the DPO loss
def sequence_logprobs_with_the_prompt(model, x, y):
    """log p of the whole sequence, prompt included: every next token of x, not the answer's only."""
    logits, _ = model(x)
    return F.token_logprobs(logits[:, :-1], x[:, 1:]).sum(-1)


def dpo_loss_beta_on_one_side(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    """beta scales the chosen answer's log-ratio only."""
    return -F.logsigmoid(beta * (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)).mean()


def dpo_batch_loss_reference_not_frozen(policy, reference, batch, beta):
    """The reference's log-probabilities computed with gradients on: the reference trains along."""
    x_chosen, y_chosen, x_rejected, y_rejected = batch
    return dpo.dpo_loss(dpo.sequence_logprobs(policy, x_chosen, y_chosen),
                        dpo.sequence_logprobs(policy, x_rejected, y_rejected),
                        dpo.sequence_logprobs(reference, x_chosen, y_chosen),
                        dpo.sequence_logprobs(reference, x_rejected, y_rejected), beta)


def sequence_logprobs_numpy_normalizer(model, x, y):
    """log softmax with its log-sum-exp taken on raw arrays: right values, but a constant to autodiff,
    so the gradient keeps only the picked logit's share (the softmax's is lost)."""
    logits, _ = model(x)                                                              # (B, T, V)
    z = logits.numpy()
    m = z.max(-1, keepdims=True)
    lse = ta.tensor(m + np.log(np.exp(z - m).sum(-1, keepdims=True)), dtype=logits.dtype)
    yn = y.numpy()
    picked = np.eye(logits.shape[-1])[np.maximum(yn, 0)] * (yn >= 0)[..., None]      # one-hot, 0 off the answer
    return ((logits - lse) * ta.tensor(picked, dtype=logits.dtype)).sum((-2, -1))


def dpo_batch_loss_rejected_under_no_grad(policy, reference, batch, beta):
    """The policy's log-probability of the rejected answer indented into the reference's no_grad block:
    the values are right, but the rejected answer is never pushed down."""
    x_chosen, y_chosen, x_rejected, y_rejected = batch
    with ta.no_grad():
        ref_chosen = dpo.sequence_logprobs(reference, x_chosen, y_chosen)
        ref_rejected = dpo.sequence_logprobs(reference, x_rejected, y_rejected)
        policy_rejected = dpo.sequence_logprobs(policy, x_rejected, y_rejected)
    return dpo.dpo_loss(dpo.sequence_logprobs(policy, x_chosen, y_chosen), policy_rejected,
                        ref_chosen, ref_rejected, beta)


WRONG["dpo"] = [
    ("a sum over the prompt's tokens", answer(dpo, sequence_logprobs=sequence_logprobs_with_the_prompt),
     "sums over the prompt's tokens too"),
    ("beta on one side only", answer(dpo, dpo_loss=dpo_loss_beta_on_one_side), "beta multiplies only the chosen"),
    ("the reference not frozen", answer(dpo, dpo_batch_loss=dpo_batch_loss_reference_not_frozen),
     ("the reference got a gradient", "ta.no_grad()")),
    ("the policy's rejected log-probability under no_grad",
     answer(dpo, dpo_batch_loss=dpo_batch_loss_rejected_under_no_grad),
     ("rejected answer carries no gradient", "Only the reference's")),
    ("the log-sum-exp on raw arrays", answer(dpo, sequence_logprobs=sequence_logprobs_numpy_normalizer),
     ("the gradient of", "a constant to autodiff")),
]


# ---------------------------------------------------------------- 21. the group-mean advantage
from exercise_solutions import group_advantages as advantage  # noqa: E402


def advantages_batch_mean(rewards, normalize=False):
    """The baseline is the mean over the whole batch, not over each question's answers."""
    rewards = np.asarray(rewards, dtype=np.float64)
    return rewards - rewards.mean()


def advantages_not_subtracted(rewards, normalize=False):
    """The rewards themselves: REINFORCE without a baseline."""
    return np.asarray(rewards, dtype=np.float64)


def advantages_over_questions(rewards, normalize=False):
    """The mean over axis 0, the questions, instead of each question's answers."""
    rewards = np.asarray(rewards, dtype=np.float64)
    return rewards - rewards.mean(0, keepdims=True)


def advantages_integer_mean(rewards, normalize=False):
    """Integer arithmetic: the group's mean floored."""
    rewards = np.asarray(rewards)
    return rewards - rewards.sum(1, keepdims=True) // rewards.shape[1]


def advantages_std_unguarded(rewards, normalize=False):
    """Divides by the std everywhere: 0 / 0 in a group whose answers all scored the same."""
    rewards = np.asarray(rewards, dtype=np.float64)
    out = rewards - rewards.mean(1, keepdims=True)
    return out / rewards.std(1, keepdims=True) if normalize else out


def advantages_std_plus_large_eps(rewards, normalize=False):
    """Divides by std + 0.01: an eps large enough to shrink each group's advantages by 2%."""
    rewards = np.asarray(rewards, dtype=np.float64)
    out = rewards - rewards.mean(1, keepdims=True)
    return out / (rewards.std(1, keepdims=True) + 0.01) if normalize else out


def advantages_float32(rewards, normalize=False):
    """Works in float32: 7 digits, so 1 - 0.4 is 0.600000024."""
    rewards = np.asarray(rewards, dtype=np.float32)
    out = rewards - rewards.mean(1, keepdims=True)
    std = rewards.std(1, keepdims=True)
    return out / np.where(std > 0, std, np.float32(1.0)) if normalize else out


WRONG["group_advantages"] = [
    ("an eps of 0.01 added to the std", answer(advantage, group_advantages=advantages_std_plus_large_eps),
     ("you give 1.95122, expected 2", "shrinks each group's advantages by less than 0.1%")),
    ("float32 arithmetic", answer(advantage, group_advantages=advantages_float32), ("float64", "0.600000024")),
    ("the mean over the whole batch", answer(advantage, group_advantages=advantages_batch_mean),
     "mean over the whole batch"),
    ("no baseline subtracted", answer(advantage, group_advantages=advantages_not_subtracted),
     "are the rewards themselves"),
    ("the mean over the questions", answer(advantage, group_advantages=advantages_over_questions), "axis 0"),
    ("an integer mean", answer(advantage, group_advantages=advantages_integer_mean), "work in floats"),
    ("the std unguarded", answer(advantage, group_advantages=advantages_std_unguarded), "std 0"),
]


# ---------------------------------------------------------------- of the gradient kind
# The wrong answers whose values are right and whose gradient is not (or whose hand-written backward is
# wrong), by exercise. Every exercise whose answer is differentiable has at least one, so that its checks
# are seen to compare gradients and not values only; the others say why they have none.
GRADIENT_KIND = {
    "rmsnorm": ["the rms from numpy"],
    "rope": ["the rotated partner built with numpy"],
    "gqa": ["k and v repeated with numpy"],
    "swiglu": ["the sigmoid from numpy"],
    "sum_to": ["Mul's backward returns g * b without sum_to", "Mul's backward swaps a and b"],
    "matmul": ["dA = g @ B, without the transpose", "no sum_to over broadcast batch dims"],
    "elementwise": ["tanh backward with 1 - x^2", "exp backward on raw arrays"],
    "softmax": ["the Jacobian's diagonal only", "the gradient of sum(y)", "g -= sum(g * y), in place"],
    "layernorm": ["the variance treated as a constant", "dweight summed over dim 0 only", "backward with eps = 1e-5"],
    "cross_entropy": ["no 1/N in backward", "g left out", "ignored rows get a gradient"],
    "embedding": ["dw[idx] += g"],
    "engine": ["gradients overwritten, not summed", ".grad replaced across calls"],
    "attention": ["dS = P * dP", "no scale in dQ, dK", "backward with 1 / sqrt(D)"],
    "lora": ["base(x) under ta.no_grad()"],
    "dpo": ["the policy's rejected log-probability under no_grad", "the log-sum-exp on raw arrays"],
}
NOT_DIFFERENTIABLE = {
    "online_softmax": "tiled_attention is forward only, on raw arrays (the library's flash.py has the backward)",
    "adamw": "an optimizer step reads gradients; nothing differentiates through it",
    "kv_cache": "the cache serves generation, which runs under ta.no_grad()",
    "bpe": "a tokenizer: bytes and integer ids",
    "loss_mask": "integer ids and a 0/1 mask",
    "group_advantages": "numpy arrays of rewards, not Tensors: the loss's gradient is the library's",
}
