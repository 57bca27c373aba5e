"""Typical wrong answers to the exercises of "Build the core", as a learner would write them.

test_exercise_messages.py runs each exercise's checks on them and asserts
that the first failure says what is wrong in the exercise's terms. Each
answer is a small module: the reference solution with one piece replaced.
"""
import math
import types

import numpy as np

import tinyattn as ta

from exercise_solutions import (adamw, attention, cross_entropy, elementwise, embedding, engine, kv_cache,
                                layernorm, matmul, online_softmax, softmax, sum_to)


def answer(base, **pieces):
    """A module: the solution ``base`` with some names replaced."""
    module = types.ModuleType(f"wrong_{base.__name__.rsplit('.', 1)[-1]}")
    module.__dict__.update({k: v for k, v in vars(base).items() if not k.startswith("__")})
    module.__dict__.update(pieces)
    return module


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


# ---------------------------------------------------------------- 11. embedding
class EmbeddingAssigns(embedding.Embedding):
    """dw[idx] += g: numpy buffers the writes, so a repeated id keeps one of its rows."""

    def backward(self, g):
        weight = self.parents[0]
        dw = np.zeros(weight.shape)
        dw[self.saved[0]] += g.data.reshape(-1, weight.shape[1])
        return ta.tensor(dw, dtype=g.dtype), None


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


# exercise: [(what the learner did, the wrong module, words the first failure must contain), ...]
# (several words: a tuple, each of them in the message)
WRONG = {
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
    ],
    "layernorm": [
        ("the variance treated as a constant", answer(layernorm, layer_norm=layer_norm_from(LayerNormConstantVariance)),
         "check the term that subtracts xhat * mean(gx * xhat)"),
        ("dweight summed over dim 0 only", answer(layernorm, layer_norm=layer_norm_from(LayerNormSumsDimZero)),
         "the sums over every leading dim"),
        ("np.mean in forward", answer(layernorm, layer_norm=layer_norm_from(LayerNormNumpy)), "works only on numpy"),
    ],
    "cross_entropy": [
        ("no 1/N in backward", answer(cross_entropy, cross_entropy=cross_entropy_from(CrossEntropySum)),
         "N times too large"),
        ("g left out", answer(cross_entropy, cross_entropy=cross_entropy_from(CrossEntropyIgnoresG)), "ignores g"),
        ("ignored rows get a gradient",
         answer(cross_entropy, cross_entropy=cross_entropy_from(CrossEntropyKeepsIgnoredRows)),
         "rows whose target is ignore_index"),
    ],
    "embedding": [
        ("dw[idx] += g", answer(embedding, embedding=lambda idx, w: EmbeddingAssigns.apply(w, idx)),
         "id 3 is looked up three times"),
    ],
    "engine": [
        ("toposort without a visited set", answer(engine, toposort=toposort_without_visited),
         "mark the tensors you have visited"),
        ("gradients overwritten, not summed", answer(engine, backward=backward_overwrites),
         "kept one path's gradient"),
        (".grad replaced across calls", answer(engine, backward=backward_resets_grad), "adds up across backward calls"),
    ],
    "attention": [
        ("dS = P * dP", answer(attention, scaled_dot_product_attention=attention_from(AttentionNoSubtraction)),
         "your dS is P * dP"),
        ("no scale in dQ, dK", answer(attention, scaled_dot_product_attention=attention_from(AttentionNoScale)),
         "miss the scale"),
        ("numpy causal mask", answer(attention, scaled_dot_product_attention=attention_from(AttentionNumpyMask)),
         "works only on numpy"),
    ],
    "online_softmax": [
        ("l and acc never rescaled", answer(online_softmax, tiled_attention=tiled_without_rescale),
         "multiply them by exp(m - m_new)"),
        ("the whole score matrix", answer(online_softmax, tiled_attention=tiled_all_at_once),
         "keep one (block, block) tile"),
    ],
    "adamw": [
        ("weight decay added to the gradient", answer(adamw, AdamW=AdamL2), "Adam with L2"),
        ("no bias correction", answer(adamw, AdamW=AdamWNoBiasCorrection), "no bias correction"),
        ("the learning rate read once", answer(adamw, AdamW=AdamWFirstLr), "read group['lr'] at every step"),
    ],
    "kv_cache": [
        ("append returns the new keys only", answer(kv_cache, KVCache=CacheReturnsNewOnly), "returned only the new one"),
        ("concatenated along the heads", answer(kv_cache, KVCache=CacheOnHeads), "along the time dim"),
        ("the mask aligned at the top left", answer(kv_cache, KVCache=CacheTopLeftMask), "at the top left"),
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


WRONG["bpe"] = [
    ("pairs counted across words", answer(bpe, pair_counts=pair_counts_across_words), "never across two words"),
    ("overlapping merges", answer(bpe, merge=merge_without_skipping), "skip both ids"),
    ("ties to the smallest pair", answer(bpe, train=train_ties_to_smallest_pair), "met first"),
    ("encode joins the leftmost pair", answer(bpe, encode=encode_leftmost_first), "not the leftmost"),
]
