"""The op table: every differentiable op, with sample inputs and a numpy formula.

The tests iterate over it: a gradient check for every entry, a second-order
check where ``gradgrad`` is True, the forward against ``reference``, and the
same entry on a stand-in device backend. A new op goes here, or the coverage
test fails.

``inputs(rng)`` returns host numpy arrays: float64 ones become tensors that
require grad, integer and boolean ones stay constants. Inputs keep away from
kinks: relu and abs at 0, clamp at its bounds, max ties, log and sqrt at 0.
"""
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from exercises.checking import formulas

from tinyattn import ops
from tinyattn.nn import functional as F


@dataclass
class OpSpec:
    name: str                  # the public name: "Tensor.exp", "F.softmax", "ta.cat", ...
    fn: Callable               # Tensors -> Tensor
    inputs: Callable           # rng -> list of numpy arrays
    reference: Callable        # numpy arrays -> numpy array (the plain formula)
    gradgrad: bool = True      # False: the backward is fused and cannot be differentiated again
    atol: float = 1e-7         # forward against the reference
    eps: float = 1e-6          # gradcheck's step
    keeps_dtype: bool = True   # False for a cast


def away_from_zero(rng, *shape, margin=0.1):
    """Normal samples with |x| >= margin: no sample sits on a kink at 0."""
    x = rng.standard_normal(shape)
    return np.where(np.abs(x) < margin, np.sign(x + 1e-12) * (margin + np.abs(x)), x)


def distinct(rng, *shape, gap=0.01):
    """Values at least ``gap`` apart, so a max never ties."""
    n = math.prod(shape)
    return (rng.permutation(n) * gap + rng.uniform(0, gap / 4, n) - n * gap / 2).reshape(shape)


def positive(rng, *shape):
    return rng.uniform(0.5, 2.0, shape)


def normal(rng, *shape):
    return rng.standard_normal(shape)


_erf = np.vectorize(math.erf)


def _smoothed_cross_entropy(logits, targets, eps, ignore_index=-1):
    """Per row: (1 - eps) (-log p[target]) + eps mean(-log p), 0 where the target is ignored."""
    valid = targets != ignore_index
    logp = formulas.log_softmax(logits, 1)
    nll = -logp[np.arange(len(targets)), np.where(valid, targets, 0)]
    return np.where(valid, (1 - eps) * nll - eps * logp.mean(1), 0.0)


def _weighted_cross_entropy(logits, targets, w, eps=0.0, ignore_index=-1):
    """Per row, with class weights w as PyTorch weighs them: (1 - eps) w[target] (-log p[target])
    + eps mean(-w log p), 0 where the target is ignored."""
    valid = targets != ignore_index
    logp = formulas.log_softmax(logits, 1)
    safe = np.where(valid, targets, 0)
    nll = -logp[np.arange(len(targets)), safe] * w[safe]
    return np.where(valid, (1 - eps) * nll - eps * (w * logp).mean(1), 0.0)


def _nll(logp, targets, w=None, ignore_index=-100):
    """Per row: -w[t] logp[n, t] (w 1 without class weights), 0 where the target is ignored;
    and each row's weight (0 where ignored), for a mean."""
    valid = targets != ignore_index
    safe = np.where(valid, targets, 0)
    weight = np.where(valid, 1.0 if w is None else w[safe], 0.0)
    return np.where(valid, -logp[np.arange(len(targets)), safe] * weight, 0.0), weight


def _kl_terms(logq, p):
    """p (log p - log q), 0 where p is 0."""
    return np.where(p == 0, 0.0, p * np.log(np.where(p == 0, 1.0, p))) - p * logq


def _rms_norm(x, w, eps, dims=1):
    """x / sqrt(mean(x^2) + eps) * w over the last ``dims`` dims."""
    axes = tuple(range(x.ndim - dims, x.ndim))
    return x / np.sqrt((x * x).mean(axes, keepdims=True) + eps) * w


def _rotary(x, positions, base=10000.0):
    """RoPE by its pairs (i, i + D/2), Llama's convention: each pair turned by m * base^(-2i/D)."""
    D = x.shape[-1]
    angles = np.asarray(positions, dtype=np.float64)[:, None] * base ** (-np.arange(0, D, 2) / D)   # (T, D/2)
    cos, sin = np.cos(angles), np.sin(angles)
    a, b = x[..., :D // 2], x[..., D // 2:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)


INT_IDX = np.array([2, 0, 2, 3, 2])               # repeated ids: their gradients must add up
BOOL_MASK = np.array([[True, False, True, True], [False, False, True, False], [True, True, False, True]])

OPS = [
    # arithmetic, with broadcasting
    OpSpec("Tensor.__add__", lambda a, b: a + b, lambda r: [normal(r, 3, 4), normal(r, 4)], np.add),
    OpSpec("Tensor.__radd__", lambda a: 2.5 + a, lambda r: [normal(r, 3)], lambda a: 2.5 + a),
    OpSpec("Tensor.__sub__", lambda a, b: a - b, lambda r: [normal(r, 2, 1, 4), normal(r, 3, 1)], np.subtract),
    OpSpec("Tensor.__rsub__", lambda a: 1.5 - a, lambda r: [normal(r, 3)], lambda a: 1.5 - a),
    OpSpec("Tensor.__mul__", lambda a, b: a * b, lambda r: [normal(r, 3, 4), normal(r, 3, 1)], np.multiply),
    OpSpec("Tensor.__truediv__", lambda a, b: a / b, lambda r: [normal(r, 3, 4), positive(r, 4)], np.divide),
    OpSpec("Tensor.__rtruediv__", lambda a: 2.0 / a, lambda r: [positive(r, 5)], lambda a: 2.0 / a),
    OpSpec("Tensor.__pow__", lambda a: a ** 3, lambda r: [normal(r, 3, 4)], lambda a: a ** 3),
    OpSpec("Tensor.__pow__(square)", lambda a: a ** 2, lambda r: [normal(r, 3, 4)], lambda a: a ** 2),
    OpSpec("Tensor.__pow__(tensor)", lambda a, b: a ** b, lambda r: [positive(r, 3, 4), normal(r, 4)], np.power),
    OpSpec("Tensor.__rpow__", lambda a: 2.0 ** a, lambda r: [normal(r, 4)], lambda a: 2.0 ** a),
    OpSpec("Tensor.__neg__", lambda a: -a, lambda r: [normal(r, 3)], np.negative),
    OpSpec("Tensor.neg", lambda a: a.neg(), lambda r: [normal(r, 3)], np.negative),
    OpSpec("Tensor.__pow__(zero)", lambda a: a ** 0, lambda r: [normal(r, 3)], lambda a: a ** 0),
    OpSpec("Tensor.__matmul__", lambda a, b: a @ b, lambda r: [normal(r, 3, 4), normal(r, 4, 2)], np.matmul),
    OpSpec("Tensor.__matmul__(batched)", lambda a, b: a @ b,
           lambda r: [normal(r, 2, 1, 3, 4), normal(r, 3, 4, 2)], np.matmul),
    OpSpec("Tensor.__matmul__(1-d left)", lambda a, b: a @ b, lambda r: [normal(r, 4), normal(r, 2, 4, 3)], np.matmul),
    OpSpec("Tensor.__matmul__(1-d right)", lambda a, b: a @ b, lambda r: [normal(r, 2, 3, 4), normal(r, 4)], np.matmul),
    OpSpec("Tensor.__matmul__(1-d both)", lambda a, b: a @ b, lambda r: [normal(r, 4), normal(r, 4)], np.matmul),
    OpSpec("ta.dot", lambda a, b: ops.dot(a, b), lambda r: [normal(r, 5), normal(r, 5)], np.dot),
    OpSpec("Tensor.dot", lambda a, b: a.dot(b), lambda r: [normal(r, 3), normal(r, 3)], np.dot),
    # elementwise
    OpSpec("Tensor.exp", lambda a: a.exp(), lambda r: [normal(r, 3, 4)], np.exp),
    OpSpec("Tensor.log", lambda a: a.log(), lambda r: [positive(r, 3, 4)], np.log),
    OpSpec("Tensor.sqrt", lambda a: a.sqrt(), lambda r: [positive(r, 3, 4)], np.sqrt),
    OpSpec("Tensor.abs", lambda a: a.abs(), lambda r: [away_from_zero(r, 3, 4)], np.abs),
    OpSpec("Tensor.tanh", lambda a: a.tanh(), lambda r: [normal(r, 3, 4)], np.tanh),
    OpSpec("Tensor.sigmoid", lambda a: a.sigmoid(), lambda r: [normal(r, 3, 4)], lambda a: 1 / (1 + np.exp(-a))),
    OpSpec("Tensor.sign", lambda a: a.sign() * a, lambda r: [away_from_zero(r, 3, 4)], np.abs),
    OpSpec("F.logsigmoid", lambda a: F.logsigmoid(a), lambda r: [4 * normal(r, 3, 4)], lambda a: np.log(1 / (1 + np.exp(-a)))),
    OpSpec("F.softplus", lambda a: F.softplus(a), lambda r: [4 * normal(r, 3, 4)], lambda a: np.log(1 + np.exp(a))),
    OpSpec("F.softplus(beta, threshold)", lambda a: F.softplus(a, beta=2.0, threshold=3.0),    # x itself past x = 1.5
           lambda r: [1.5 + away_from_zero(r, 3, 4)], lambda a: np.where(2 * a > 3, a, np.log(1 + np.exp(2 * a)) / 2)),
    OpSpec("Tensor.relu", lambda a: a.relu(), lambda r: [away_from_zero(r, 3, 4)], lambda a: np.maximum(a, 0)),
    OpSpec("Tensor.erf", lambda a: a.erf(), lambda r: [2 * normal(r, 3, 4)], _erf),
    OpSpec("F.gelu", lambda a: F.gelu(a), lambda r: [2 * normal(r, 3, 4)], lambda a: 0.5 * a * (1 + _erf(a / math.sqrt(2)))),
    OpSpec("F.gelu(tanh)", lambda a: F.gelu(a, approximate="tanh"), lambda r: [2 * normal(r, 3, 4)], formulas.gelu_tanh),
    OpSpec("Tensor.clamp", lambda a: a.clamp(-0.5, 0.7), lambda r: [distinct(r, 4, 5, gap=0.05) + 0.013],
           lambda a: np.clip(a, -0.5, 0.7)),
    OpSpec("Tensor.clamp(min)", lambda a: a.clamp(min=0.1), lambda r: [distinct(r, 4, 5, gap=0.05) + 0.013],
           lambda a: np.maximum(a, 0.1)),
    OpSpec("Tensor.clip", lambda a: a.clip(max=0.3), lambda r: [distinct(r, 4, 5, gap=0.05) + 0.013],
           lambda a: np.minimum(a, 0.3)),
    OpSpec("Tensor.clone", lambda a: a.clone(), lambda r: [normal(r, 3, 4)], lambda a: a.copy()),
    OpSpec("Tensor.float", lambda a: a.float().double(), lambda r: [normal(r, 3)],
           lambda a: a.astype(np.float32).astype(np.float64), atol=1e-6, eps=1e-2, keeps_dtype=False),  # linear: a wide step is exact
    # reductions
    OpSpec("Tensor.sum", lambda a: a.sum(), lambda r: [normal(r, 3, 4)], np.sum),
    OpSpec("Tensor.sum(dims)", lambda a: a.sum((0, 2), keepdim=True), lambda r: [normal(r, 2, 3, 4)],
           lambda a: a.sum((0, 2), keepdims=True)),
    OpSpec("Tensor.sum(empty dim)", lambda a: a[:, :0].sum(1) + a.sum(1), lambda r: [normal(r, 3, 4)],
           lambda a: a.sum(1)),
    OpSpec("Tensor.mean", lambda a: a.mean(-1), lambda r: [normal(r, 3, 4)], lambda a: a.mean(-1)),
    OpSpec("Tensor.max", lambda a: a.max(1), lambda r: [distinct(r, 3, 4, 2)], lambda a: a.max(1)),
    OpSpec("Tensor.max(all)", lambda a: a.max(), lambda r: [distinct(r, 3, 4)], np.max),
    OpSpec("Tensor.min", lambda a: a.min((0, 1), keepdim=True), lambda r: [distinct(r, 3, 4, 2)],
           lambda a: a.min((0, 1), keepdims=True)),
    OpSpec("Tensor.var", lambda a: a.var(-1), lambda r: [normal(r, 3, 5)], lambda a: a.var(-1, ddof=1)),
    OpSpec("Tensor.var(biased)", lambda a: a.var((0, 1), correction=0), lambda r: [normal(r, 2, 3, 4)],
           lambda a: a.var((0, 1))),
    OpSpec("Tensor.std", lambda a: a.std(0), lambda r: [normal(r, 4, 3)], lambda a: a.std(0, ddof=1)),
    # shape
    OpSpec("Tensor.reshape", lambda a: a.reshape(4, 3), lambda r: [normal(r, 2, 6)], lambda a: a.reshape(4, 3)),
    OpSpec("Tensor.view", lambda a: a.view(-1), lambda r: [normal(r, 2, 3)], lambda a: a.reshape(-1)),
    OpSpec("Tensor.transpose", lambda a: a.transpose(0, 2), lambda r: [normal(r, 2, 3, 4)],
           lambda a: np.swapaxes(a, 0, 2)),
    OpSpec("Tensor.permute", lambda a: a.permute(2, 0, 1), lambda r: [normal(r, 2, 3, 4)],
           lambda a: a.transpose(2, 0, 1)),
    OpSpec("Tensor.T", lambda a: a.T, lambda r: [normal(r, 2, 3)], lambda a: a.T),
    OpSpec("Tensor.expand", lambda a: a.expand(2, 3, 4), lambda r: [normal(r, 3, 1)],
           lambda a: np.broadcast_to(a, (2, 3, 4))),
    OpSpec("Tensor.broadcast_to", lambda a: a.broadcast_to((3, 4)), lambda r: [normal(r, 4)],
           lambda a: np.broadcast_to(a, (3, 4))),
    OpSpec("Tensor.squeeze", lambda a: a.squeeze(1), lambda r: [normal(r, 3, 1, 2)], lambda a: a.squeeze(1)),
    OpSpec("Tensor.unsqueeze", lambda a: a.unsqueeze(-1), lambda r: [normal(r, 3, 2)], lambda a: a[..., None]),
    OpSpec("Tensor.flatten", lambda a: a.flatten(1), lambda r: [normal(r, 2, 3, 4)], lambda a: a.reshape(2, 12)),
    # indexing
    OpSpec("Tensor.__getitem__(slice)", lambda a: a[1:, ::2], lambda r: [normal(r, 3, 5)], lambda a: a[1:, ::2]),
    OpSpec("Tensor.__getitem__(int, None, ...)", lambda a: a[1, None, ..., -1], lambda r: [normal(r, 3, 4, 5)],
           lambda a: a[1, None, ..., -1]),
    OpSpec("Tensor.__getitem__(int array)", lambda a, i: a[i], lambda r: [normal(r, 4, 3), INT_IDX],
           lambda a, i: a[i]),
    OpSpec("Tensor.__getitem__(slice, int array)", lambda a, i: a[:, i], lambda r: [normal(r, 2, 4), INT_IDX],
           lambda a, i: a[:, i]),
    OpSpec("Tensor.__getitem__(int, slice, int array)", lambda a, i: a[1, 1:, i], lambda r: [normal(r, 2, 4, 6), INT_IDX],
           lambda a, i: a[1][1:, i]),
    OpSpec("Tensor.__getitem__(bool mask)", lambda a, m: a[m], lambda r: [normal(r, 3, 4), BOOL_MASK],
           lambda a, m: a[m]),
    # joining and selecting
    OpSpec("ta.gather", lambda a, i: ops.gather(a, 1, i),                   # index shorter than a along dim 0
           lambda r: [normal(r, 3, 5), np.array([[0, 4, 4, 1], [2, 2, 2, 2]])], lambda a, i: np.take_along_axis(a[:2], i, 1)),
    OpSpec("Tensor.gather", lambda a, i: a.gather(0, i), lambda r: [normal(r, 3, 2, 4), (np.arange(24) * 7 % 3).reshape(4, 2, 3)],
           lambda a, i: np.take_along_axis(a[:, :, :3], i, 0)),
    OpSpec("ta.cat", lambda a, b: ops.cat([a, b], 1), lambda r: [normal(r, 2, 3), normal(r, 2, 2)],
           lambda a, b: np.concatenate([a, b], 1)),
    OpSpec("ta.stack", lambda a, b: ops.stack([a, b], -1), lambda r: [normal(r, 2, 3), normal(r, 2, 3)],
           lambda a, b: np.stack([a, b], -1)),
    OpSpec("Tensor.split", lambda a: ops.cat(a.split([1, 3], 1)[::-1], 1), lambda r: [normal(r, 2, 4)],
           lambda a: np.concatenate([a[:, 1:], a[:, :1]], 1)),
    OpSpec("Tensor.split(one piece used)", lambda a: a.split(2, 1)[1] * 1.0, lambda r: [normal(r, 3, 5)],
           lambda a: a[:, 2:4]),
    OpSpec("Tensor.split(pieces used twice)", lambda a: ops.cat(a.split(1, 0) + a.split(1, 0)[:1], 1),
           lambda r: [normal(r, 2, 3)], lambda a: np.concatenate([a[:1], a[1:], a[:1]], 1)),
    OpSpec("Tensor.chunk", lambda a: a.chunk(2, 0)[1], lambda r: [normal(r, 4, 2)], lambda a: a[2:]),
    OpSpec("ta.where", lambda c, a, b: ops.where(c, a, b), lambda r: [BOOL_MASK, normal(r, 3, 4), normal(r, 4)],
           np.where),
    OpSpec("Tensor.masked_fill", lambda a, m: a.masked_fill(m, -2.0), lambda r: [normal(r, 3, 4), BOOL_MASK],
           lambda a, m: np.where(m, -2.0, a)),
    OpSpec("Tensor.masked_fill_", lambda a, m: (a * 1.0).masked_fill_(m, 0.5),     # recorded: a new node, as += is
           lambda r: [normal(r, 3, 4), BOOL_MASK], lambda a, m: np.where(m, 0.5, a)),
    OpSpec("Tensor.topk", lambda a: a.topk(2, dim=1).values, lambda r: [distinct(r, 3, 5, 2)],
           lambda a: -np.sort(-a, 1)[:, :2]),
    OpSpec("ta.topk(smallest, last dim)", lambda a: ops.topk(a, 3, largest=False)[0], lambda r: [distinct(r, 2, 6)],
           lambda a: np.sort(a, -1)[:, :3]),
    OpSpec("Tensor.tril", lambda a: a.tril(), lambda r: [normal(r, 2, 4, 4)], np.tril),
    OpSpec("Tensor.triu", lambda a: a.triu(1), lambda r: [normal(r, 3, 4)], lambda a: np.triu(a, 1)),
    # tinyattn.nn.functional
    OpSpec("F.softmax", lambda a: F.softmax(a, -1), lambda r: [normal(r, 3, 5)], formulas.softmax),
    OpSpec("F.softmax(dim 0)", lambda a: F.softmax(a, 0), lambda r: [normal(r, 3, 5)], lambda a: formulas.softmax(a, 0)),
    OpSpec("F.log_softmax", lambda a: F.log_softmax(a, -1), lambda r: [normal(r, 2, 3, 5)], formulas.log_softmax),
    OpSpec("F.logsumexp", lambda a: F.logsumexp(a, 1), lambda r: [normal(r, 3, 5, 2)],
           lambda a: np.log(np.exp(a).sum(1))),
    OpSpec("F.cross_entropy", lambda a, t: F.cross_entropy(a, t), lambda r: [normal(r, 5, 4), np.array([0, 3, 1, 3, 2])],
           formulas.cross_entropy),
    OpSpec("F.cross_entropy(ignore_index)", lambda a, t: F.cross_entropy(a, t, ignore_index=-1),
           lambda r: [normal(r, 5, 4), np.array([0, -1, 1, 3, -1])], lambda a, t: formulas.cross_entropy(a, t, -1)),
    OpSpec("F.cross_entropy(sum, label_smoothing)",
           lambda a, t: F.cross_entropy(a, t, ignore_index=-1, reduction="sum", label_smoothing=0.2),
           lambda r: [normal(r, 5, 4), np.array([0, -1, 1, 3, 3])], lambda a, t: _smoothed_cross_entropy(a, t, 0.2).sum()),
    OpSpec("F.cross_entropy(none)", lambda a, t: F.cross_entropy(a, t, reduction="none"),
           lambda r: [normal(r, 5, 4), np.array([0, 2, 1, 3, 3])], lambda a, t: _smoothed_cross_entropy(a, t, 0.0)),
    OpSpec("F.cross_entropy(mean, label_smoothing)", lambda a, t: F.cross_entropy(a, t, ignore_index=-1, label_smoothing=0.1),
           lambda r: [normal(r, 5, 4), np.array([0, -1, 1, 3, 3])],
           lambda a, t: _smoothed_cross_entropy(a, t, 0.1).sum() / 4),
    OpSpec("F.cross_entropy(probabilities)", lambda a, p: F.cross_entropy(a, p, label_smoothing=0.1),
           lambda r: [normal(r, 3, 4), positive(r, 3, 4)],
           lambda a, p: -(((1 - 0.1) * p + 0.1 / 4) * formulas.log_softmax(a, 1)).sum(1).mean()),
    OpSpec("F.cross_entropy(none, (N, C, d))", lambda a, t: F.cross_entropy(a, t, ignore_index=1, reduction="none"),
           lambda r: [normal(r, 2, 4, 3), np.array([[0, 1, 3], [2, 3, 3]])],
           lambda a, t: _smoothed_cross_entropy(np.moveaxis(a, 1, -1).reshape(6, 4), t.reshape(6), 0.0, 1).reshape(2, 3)),
    OpSpec("F.cross_entropy(mean, (N, C, d))", lambda a, t: F.cross_entropy(a, t, ignore_index=1),
           lambda r: [normal(r, 2, 4, 3), np.array([[0, 1, 3], [2, 3, 3]])],
           lambda a, t: _smoothed_cross_entropy(np.moveaxis(a, 1, -1).reshape(6, 4), t.reshape(6), 0.0, 1).sum() / 5),
    OpSpec("F.cross_entropy((C,), 0-d target)", lambda a, t: F.cross_entropy(a, t, reduction="none"),
           lambda r: [normal(r, 5), np.array(3)], lambda a, t: -formulas.log_softmax(a, 0)[t]),
    OpSpec("F.token_logprobs", lambda a, t: F.token_logprobs(a, t), lambda r: [normal(r, 2, 3, 5), np.array([[2, 0, 2], [4, 4, 1]])],
           lambda a, t: np.take_along_axis(formulas.log_softmax(a, -1), t[..., None], -1)[..., 0]),
    OpSpec("F.token_logprobs(ignore_index)", lambda a, t: F.token_logprobs(a, t, ignore_index=-1),
           lambda r: [normal(r, 2, 4, 3), np.array([[-1, -1, 2, 0], [1, 2, 2, -1]])],
           lambda a, t: np.where(t >= 0, np.take_along_axis(formulas.log_softmax(a, -1), np.maximum(t, 0)[..., None], -1)[..., 0], 0)),
    OpSpec("F.cross_entropy(weight, ignore_index)", lambda a, t, w: F.cross_entropy(a, t, weight=w, ignore_index=-1),
           lambda r: [normal(r, 5, 4), np.array([0, -1, 1, 3, 3]), positive(r, 4)],        # mean: over the weights
           lambda a, t, w: _weighted_cross_entropy(a, t, w).sum() / w[[0, 1, 3, 3]].sum()),
    OpSpec("F.cross_entropy(weight, none, label_smoothing)",
           lambda a, t, w: F.cross_entropy(a, t, weight=w, ignore_index=-1, reduction="none", label_smoothing=0.2),
           lambda r: [normal(r, 5, 4), np.array([2, -1, 1, 3, 0]), positive(r, 4)],
           lambda a, t, w: _weighted_cross_entropy(a, t, w, 0.2)),
    OpSpec("F.cross_entropy(probabilities, weight)", lambda a, p, w: F.cross_entropy(a, p, weight=w),
           lambda r: [normal(r, 3, 4), positive(r, 3, 4), positive(r, 4)],
           lambda a, p, w: -(w * p * formulas.log_softmax(a, 1)).sum(1).mean()),
    OpSpec("F.nll_loss", lambda a, t: F.nll_loss(a, t), lambda r: [normal(r, 5, 4), np.array([0, 3, 1, 3, 2])],
           lambda a, t: _nll(a, t)[0].mean()),
    OpSpec("F.nll_loss(weight, ignore_index)", lambda a, t, w: F.nll_loss(a, t, weight=w, ignore_index=-1),
           lambda r: [normal(r, 5, 4), np.array([0, -1, 1, 3, 3]), positive(r, 4)],
           lambda a, t, w: _nll(a, t, w, -1)[0].sum() / _nll(a, t, w, -1)[1].sum()),
    OpSpec("F.nll_loss(none, (N, C, d))", lambda a, t: F.nll_loss(a, t, ignore_index=1, reduction="none"),
           lambda r: [normal(r, 2, 4, 3), np.array([[0, 1, 3], [2, 3, 3]])],
           lambda a, t: _nll(np.moveaxis(a, 1, -1).reshape(6, 4), t.reshape(6), None, 1)[0].reshape(2, 3)),
    OpSpec("F.nll_loss(sum, (C,))", lambda a, t: F.nll_loss(a, t, reduction="sum"), lambda r: [normal(r, 5), np.array(2)],
           lambda a, t: -a[t]),
    OpSpec("F.kl_div", lambda q, p: F.kl_div(q, p, reduction="batchmean"), lambda r: [normal(r, 3, 4), positive(r, 3, 4)],
           lambda q, p: _kl_terms(q, p).sum() / 3),
    OpSpec("F.kl_div(none, log_target)", lambda q, p: F.kl_div(q, p, reduction="none", log_target=True),
           lambda r: [normal(r, 3, 4), normal(r, 3, 4)], lambda q, p: np.exp(p) * (p - q)),
    OpSpec("F.kl_div(mean, a target of 0)", lambda q, p: F.kl_div(q, p * np.array([1.0, 0.0, 1.0, 1.0])),
           lambda r: [normal(r, 2, 4), positive(r, 2, 4)], lambda q, p: _kl_terms(q, p * [1, 0, 1, 1]).mean()),
    OpSpec("F.rms_norm", lambda x, w: F.rms_norm(x, 4, w, eps=1e-5), lambda r: [normal(r, 2, 3, 4), normal(r, 4)],
           lambda x, w: _rms_norm(x, w, 1e-5)),
    OpSpec("F.rms_norm(two dims, eps None, no weight)", lambda x: F.rms_norm(x, (3, 4)), lambda r: [normal(r, 2, 3, 4)],
           lambda x: _rms_norm(x, 1.0, np.finfo(np.float64).eps, dims=2)),
    OpSpec("F.rotary_embedding", lambda x: F.rotary_embedding(x, [0, 3, 1, 9]), lambda r: [normal(r, 2, 3, 4, 6)],
           lambda x: _rotary(x, [0, 3, 1, 9])),
    OpSpec("F.rotary_embedding(base, offset)", lambda x: F.rotary_embedding(x, range(5, 8), base=500.0),
           lambda r: [normal(r, 3, 4)], lambda x: _rotary(x, [5, 6, 7], 500.0)),
    OpSpec("F.silu", lambda a: F.silu(a), lambda r: [normal(r, 3, 4)], lambda a: a / (1.0 + np.exp(-a))),
    OpSpec("F.embedding", lambda w, i: F.embedding(i, w), lambda r: [normal(r, 5, 3), np.array([[4, 0, 4], [1, 4, 2]])],
           lambda w, i: w[i]),
    OpSpec("F.layer_norm", lambda x, w, b: F.layer_norm(x, 4, w, b), lambda r: [normal(r, 2, 3, 4), normal(r, 4), normal(r, 4)],
           formulas.layer_norm, gradgrad=False),
    OpSpec("F.layer_norm(composite)", lambda x, w, b: F.layer_norm(x, 4, w, b, fused=False),
           lambda r: [normal(r, 2, 3, 4), normal(r, 4), normal(r, 4)], formulas.layer_norm),
    OpSpec("F.layer_norm(two dims)", lambda x, w, b: F.layer_norm(x, (3, 4), w, b),
           lambda r: [normal(r, 2, 3, 4), normal(r, 3, 4), normal(r, 3, 4)],
           lambda x, w, b: formulas.layer_norm(x.reshape(2, 12), w.reshape(12), b.reshape(12)).reshape(2, 3, 4), gradgrad=False),
    OpSpec("F.linear", lambda x, w, b: F.linear(x, w, b), lambda r: [normal(r, 2, 3), normal(r, 4, 3), normal(r, 4)],
           lambda x, w, b: x @ w.T + b),
    OpSpec("F.linear(3-d, no bias)", lambda x, w: F.linear(x, w), lambda r: [normal(r, 2, 3, 4), normal(r, 5, 4)],
           lambda x, w: x @ w.T),
    OpSpec("F.linear(1-d input)", lambda x, w, b: F.linear(x, w, b), lambda r: [normal(r, 3), normal(r, 2, 3), normal(r, 2)],
           lambda x, w, b: x @ w.T + b),
    OpSpec("F.relu", lambda a: F.relu(a), lambda r: [away_from_zero(r, 3, 4)], lambda a: np.maximum(a, 0)),
    OpSpec("F.dropout(p=0)", lambda a: F.dropout(a, 0.0), lambda r: [normal(r, 3)], lambda a: a),
    OpSpec("F.scaled_dot_product_attention", lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
           lambda r: [normal(r, 1, 2, 3, 4), normal(r, 1, 2, 5, 4), normal(r, 1, 2, 5, 4)], formulas.attention),
    OpSpec("F.scaled_dot_product_attention(causal)",
           lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
           lambda r: [normal(r, 2, 1, 4, 3), normal(r, 2, 1, 4, 3), normal(r, 2, 1, 4, 3)],
           lambda q, k, v: formulas.attention(q, k, v, causal=True)),
    OpSpec("F.scaled_dot_product_attention(mask)",
           lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
           lambda r: [normal(r, 1, 2, 3, 4), normal(r, 1, 2, 3, 4), normal(r, 1, 2, 3, 4),
                      np.array([[True, False, False], [False, True, False], [True, False, True]])],
           lambda q, k, v, m: formulas.attention(q, k, v, mask=m)),
    OpSpec("F.scaled_dot_product_attention(enable_gqa)",
           lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
           lambda r: [normal(r, 1, 4, 3, 2), normal(r, 1, 2, 3, 2), normal(r, 1, 2, 3, 3)],
           lambda q, k, v: formulas.attention(q, np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1), causal=True)),
    # flash attention: tiles of block_size that divide neither Tq nor Tk
    OpSpec("F.flash_attention", lambda q, k, v: F.flash_attention(q, k, v, block_size=2),
           lambda r: [normal(r, 1, 2, 3, 4), normal(r, 1, 2, 5, 4), normal(r, 1, 2, 5, 3)], formulas.attention, gradgrad=False),
    OpSpec("F.flash_attention(causal)", lambda q, k, v: F.flash_attention(q, k, v, is_causal=True, block_size=2),
           lambda r: [normal(r, 2, 1, 5, 3), normal(r, 2, 1, 7, 3), normal(r, 2, 1, 7, 3)],
           lambda q, k, v: formulas.attention(q, k, v, causal=True), gradgrad=False),
    OpSpec("F.flash_attention(causal, Tq > Tk, scale)",
           lambda q, k, v: F.flash_attention(q, k, v, is_causal=True, scale=0.7, block_size=3),
           lambda r: [normal(r, 1, 2, 7, 4), normal(r, 1, 2, 4, 4), normal(r, 1, 2, 4, 2)],
           lambda q, k, v: formulas.attention(q, k, v, causal=True, scale=0.7), gradgrad=False),
    OpSpec("F.flash_attention(causal, bool mask, Tq < Tk)",
           lambda q, k, v, m: F.flash_attention(q, k, v, is_causal=True, attn_mask=m, block_size=2),
           lambda r: [normal(r, 1, 2, 5, 3), normal(r, 1, 2, 7, 3), normal(r, 1, 2, 7, 2),
                      np.array([[True, False, True, True, False, True, True]] * 3 + [[True, True, False] * 2 + [False]] * 2)],
           lambda q, k, v, m: formulas.attention(q, k, v, causal=True, mask=m), gradgrad=False),
    OpSpec("F.scaled_dot_product_attention(impl='tiled')",
           lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, impl="tiled"),
           lambda r: [normal(r, 2, 1, 4, 3), normal(r, 2, 1, 4, 3), normal(r, 2, 1, 4, 3)],
           lambda q, k, v: formulas.attention(q, k, v, causal=True), gradgrad=False),
]


# ---------------------------------------------------------------- fused kernels
# Every kernel that a backend registers (``backend.kernels``) is checked against
# the op's own formula: the same case runs with ``backend.use_kernels`` off and
# on. A registered kernel with no case here fails the suite.
@dataclass
class KernelCase:
    name: str
    kernels: set               # the kernel names that this case must run
    inputs: Callable           # rng -> list of numpy arrays
    fn: Callable = None        # Tensors -> Tensor: the op (run is then its forward and backward)
    run: Callable = None       # (arrays, device, dtype) -> list of host arrays to compare

    def __post_init__(self):
        if self.run is None:
            self.run = forward_backward(self.fn)


def forward_backward(fn):
    """A case runner: fn's output and the gradient of every float input, for a fixed random cotangent."""
    import tinyattn as ta

    def run(arrays, device, dtype):
        inputs = [ta.tensor(a, dtype=dtype, device=device, requires_grad=True) if a.dtype.kind == "f"
                  else ta.tensor(a, device=device) for a in arrays]
        out = fn(*inputs)
        cotangent = np.random.default_rng(5).standard_normal(out.shape)
        out.backward(ta.tensor(cotangent, dtype=dtype, device=device))
        return [out.numpy()] + [t.grad.numpy() for t in inputs if t.requires_grad]
    return run


def adamw_steps(arrays, device, dtype):
    """Three AdamW steps with and without weight decay: the parameters and both moments after them."""
    import tinyattn as ta
    start, grads = arrays[:2], [arrays[2:4], arrays[4:6], arrays[6:8]]
    params = [ta.tensor(a, dtype=dtype, device=device, requires_grad=True) for a in start]
    opt = ta.optim.AdamW([{"params": params[:1], "weight_decay": 0.1},
                          {"params": params[1:], "weight_decay": 0.0}], lr=1e-2, betas=(0.9, 0.99), fused=True)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = ta.tensor(g, dtype=dtype, device=device)
        opt.step()
    state = opt.state_dict()["state"]
    return [p.numpy() for p in params] + [np.asarray(s[k]) for s in state.values() for k in ("exp_avg", "exp_avg_sq")]


def gpt_block_steps(n_head, head_dropout=0.0):
    """A case runner for the whole-block kernels: a GPT Block (training) with the given weights, its
    output and the gradients of its input and of every parameter, for a fixed random cotangent."""
    def run(arrays, device, dtype):
        import tinyattn as ta
        from tinyattn.models import GPTConfig, gpt
        x = ta.tensor(arrays[0], dtype=dtype, device=device, requires_grad=True)
        B, T, C = x.shape
        block = ta.compile(gpt.Block(GPTConfig(n_layer=1, n_head=n_head, n_embd=C, block_size=T, dropout=0.0,
                                               head_dropout=head_dropout)))
        params = list(block.parameters())          # ln_1, c_attn, attn.c_proj, ln_2, c_fc, mlp.c_proj: weight, bias
        for p, a in zip(params, arrays[1:], strict=True):
            p.set_(ta.tensor(a, dtype=dtype, device=device))
        ta.manual_seed(7)                          # the same heads dropped both ways
        out = block(x)
        out.backward(ta.tensor(np.random.default_rng(5).standard_normal(out.shape), dtype=dtype, device=device))
        return [out.numpy(), x.grad.numpy()] + [p.grad.numpy() for p in params]
    return run


def decode_steps(n_head, prompt):
    """A case runner for decoding: a MultiHeadAttention with a KV cache reads the first ``prompt``
    tokens of x (B, T, C) at once, then the others one at a time, without a graph; its outputs,
    every token's, as one (B, T, C) array."""
    def run(arrays, device, dtype):
        import tinyattn as ta
        x = ta.tensor(arrays[0], dtype=dtype, device=device)
        attn = ta.compile(ta.nn.MultiHeadAttention(x.shape[-1], n_head))
        for p, a in zip(attn.parameters(), arrays[1:], strict=True):   # c_attn, c_proj: weight, bias
            p.set_(ta.tensor(a, dtype=dtype, device=device))
        cache, outs = ta.nn.KVCache(), []
        with ta.no_grad():
            outs.append(attn(x[:, :prompt], kv_cache=cache))
            for t in range(prompt, x.shape[1]):
                outs.append(attn(x[:, t:t + 1], kv_cache=cache))
        return [np.concatenate([o.numpy() for o in outs], axis=1)]
    return run


def gpt_block_inputs(B, T, C):
    """x (B, T, C), then a GPT block's parameters in its order, at the scales of a trained one."""
    def inputs(rng):
        ln = lambda: [1 + 0.1 * normal(rng, C), 0.1 * normal(rng, C)]           # noqa: E731
        linear = lambda n_out, n_in: [normal(rng, n_out, n_in) / math.sqrt(n_in), 0.1 * normal(rng, n_out)]   # noqa: E731
        return ([normal(rng, B, T, C)] + ln() + linear(3 * C, C) + linear(C, C) + ln() + linear(4 * C, C)
                + linear(C, 4 * C))
    return inputs


def _targets(rng, n, classes):
    t = rng.integers(0, classes, n)
    t[::5] = -1                                                   # some ignored rows
    return t


def _with_minus_inf(x):
    """x (N, 5, 7) with row 1 all -inf (an additive mask that hides every key) and one -inf in row 3."""
    x[:, 1, :] = -np.inf
    x[:, 3, 2] = -np.inf
    return x


def _heads_attention(x, n_head):
    """Causal attention over heads that are views of one (B, T, 3C) qkv buffer, as in a GPT."""
    B, T, C = x.shape[0], x.shape[1], x.shape[2] // 3
    q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in x.split(C, dim=2))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _heads_attention_transposed(x, n_head):
    """The same, with the heads cut as nn.MultiHeadAttention cuts them: (B, T, 3H, D) seen as
    (B, 3H, T, D), then split into q, k, v (their gradients join without a copy: fast Split)."""
    B, T, C = x.shape[0], x.shape[1], x.shape[2] // 3
    q, k, v = x.view(B, T, 3 * n_head, C // n_head).transpose(1, 2).split(n_head, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _flash_mask(rng, t_q, t_k):
    m = rng.random((t_q, t_k)) > 0.3
    m[4] = False                                                  # a query that may see no key
    return m


KERNEL_CASES = [
    KernelCase("gelu_tanh", {"gelu_tanh", "gelu_tanh_backward"}, lambda r: [3 * normal(r, 64, 100)],
               fn=lambda a: F.gelu(a, approximate="tanh")),
    KernelCase("the exact gelu, both erf branches", {"gelu_erf", "gelu_erf_backward"},
               lambda r: [2 * normal(r, 64, 100)], fn=lambda a: F.gelu(a)),
    KernelCase("erf, far into both tails", {"erf"}, lambda r: [np.linspace(-7.0, 7.0, 301)], fn=lambda a: a.erf()),
    KernelCase("layer_norm C=384", {"layer_norm", "layer_norm_backward"},
               lambda r: [2 * normal(r, 4, 7, 384) + 0.5, normal(r, 384), normal(r, 384)],
               fn=lambda x, w, b: F.layer_norm(x, 384, w, b)),
    KernelCase("layer_norm C=1000", {"layer_norm", "layer_norm_backward"},          # > 256 threads a row
               lambda r: [normal(r, 5, 1000), normal(r, 1000), normal(r, 1000)],
               fn=lambda x, w, b: F.layer_norm(x, 1000, w, b)),
    KernelCase("layer_norm C=5", {"layer_norm", "layer_norm_backward"},
               lambda r: [normal(r, 9, 5), normal(r, 5), normal(r, 5)],
               fn=lambda x, w, b: F.layer_norm(x, 5, w, b)),
    KernelCase("cross_entropy V=65", {"cross_entropy", "cross_entropy_backward"},
               lambda r: [3 * normal(r, 300, 65), _targets(r, 300, 65)],
               fn=lambda a, t: F.cross_entropy(a, t, ignore_index=-1)),
    KernelCase("cross_entropy V=1000", {"cross_entropy", "cross_entropy_backward"},
               lambda r: [normal(r, 37, 1000), _targets(r, 37, 1000)],
               fn=lambda a, t: F.cross_entropy(a, t, ignore_index=-1)),
    KernelCase("embedding backward, ids repeated and some rows never used", {"index_add_rows"},
               lambda r: [normal(r, 11, 6), r.integers(0, 9, size=(4, 25)) * (r.random((4, 25)) < 0.7)],
               fn=lambda w, i: F.embedding(i, w)),
    KernelCase("masked_softmax causal T=64", {"masked_softmax", "softmax_backward"},
               lambda r: [4 * normal(r, 2, 3, 64, 64), np.tril(np.ones((64, 64), bool))],
               fn=lambda x, m: ops.MaskedSoftmax.apply(x, m)),
    KernelCase("attention causal T=64, heads read from one qkv buffer", {"attention", "attention_backward"},
               lambda r: [normal(r, 3, 64, 3 * 4 * 16)], fn=lambda x: _heads_attention(x, 4)),
    KernelCase("attention Tq != Tk, Dv != D, a boolean mask with a fully masked row", {"attention",
                                                                                     "attention_backward"},
               lambda r: [3 * normal(r, 2, 3, 20, 8), normal(r, 2, 3, 37, 8), normal(r, 2, 3, 37, 5),
                          _flash_mask(r, 20, 37)],
               fn=lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.6)),
    KernelCase("masked_softmax, rows fully masked", {"masked_softmax", "softmax_backward"},
               lambda r: [4 * normal(r, 2, 5, 7), np.array([[True] * 7, [False] * 7, [True, False] * 3 + [True],
                                                            [False] * 6 + [True], [False] * 7])],
               fn=lambda x, m: ops.MaskedSoftmax.apply(x, m)),
    KernelCase("masked_softmax, -inf scores: a row of them, and one among finite ones", {"masked_softmax",
                                                                                       "softmax_backward"},
               lambda r: [_with_minus_inf(4 * normal(r, 2, 5, 7)), np.array([[True] * 7] * 3 + [[True] * 6 + [False]] * 2)],
               fn=lambda x, m: ops.MaskedSoftmax.apply(x, m)),
    KernelCase("softmax over the last dim", {"softmax", "softmax_backward"},
               lambda r: [5 * normal(r, 6, 4, 33)], fn=lambda a: F.softmax(a, -1)),
    KernelCase("softmax, -inf among finite scores", {"softmax", "softmax_backward"},
               lambda r: [_with_minus_inf(3 * normal(r, 2, 5, 7))[:, [0, 2, 3, 4]]], fn=lambda a: F.softmax(a, -1)),
    KernelCase("softmax over rows of one", {"softmax", "softmax_backward"},
               lambda r: [normal(r, 3, 7, 1)], fn=lambda a: F.softmax(a, -1)),
    KernelCase("attention causal T=40, heads cut from a transposed qkv buffer", {"attention", "attention_backward"},
               lambda r: [normal(r, 2, 40, 3 * 2 * 8)], fn=lambda x: _heads_attention_transposed(x, 2)),
    KernelCase("flash attention, causal, T not a multiple of the tile", {"attention_tile_softmax_",
                                                                          "attention_tile_backward_"},
               lambda r: [normal(r, 2, 2, 45, 8), normal(r, 2, 2, 45, 8), normal(r, 2, 2, 45, 8)],
               fn=lambda q, k, v: F.flash_attention(q, k, v, is_causal=True, block_size=16)),
    KernelCase("flash attention, Tq != Tk, a boolean mask with a fully masked row", {"attention_tile_softmax_",
                                                                                     "attention_tile_backward_"},
               lambda r: [3 * normal(r, 1, 2, 20, 8), normal(r, 1, 2, 37, 8), normal(r, 1, 2, 37, 4),
                          _flash_mask(r, 20, 37)],
               fn=lambda q, k, v, m: F.flash_attention(q, k, v, attn_mask=m, block_size=16)),
    KernelCase("flash attention, causal with an additive mask", {"attention_tile_softmax_", "attention_tile_backward_"},
               lambda r: [normal(r, 1, 1, 33, 8), normal(r, 1, 1, 33, 8), normal(r, 1, 1, 33, 8)],
               fn=lambda q, k, v: F.flash_attention(q, k, v, is_causal=True, block_size=8,
                                                    attn_mask=k.detach()[0, 0, :, :1].mT * 2.0)),   # (1, Tk): a bias per key
    KernelCase("a GPT block, B3 T10 C16 H4", {"block", "block_backward"}, gpt_block_inputs(3, 10, 16),
               run=gpt_block_steps(4)),
    KernelCase("a GPT block of one sequence, T7 C12 H3", {"block", "block_backward"}, gpt_block_inputs(1, 7, 12),
               run=gpt_block_steps(3)),
    KernelCase("a GPT block with DropHead, B6 T5 C16 H4", {"block", "block_backward"}, gpt_block_inputs(6, 5, 16),
               run=gpt_block_steps(4, head_dropout=0.5)),
    KernelCase("decoding with a KV cache: a prompt, then one token at a time, B2 T9 C12 H3",
               {"attention_one_query", "attention"},
               lambda r: [normal(r, 2, 9, 12), normal(r, 36, 12) / 3, 0.1 * normal(r, 36), normal(r, 12, 12) / 3,
                          0.1 * normal(r, 12)],
               run=decode_steps(3, prompt=3)),
    KernelCase("adamw_", {"adamw_"},
               lambda r: [normal(r, 33, 17), normal(r, 17)] + [normal(r, *s) for _ in range(3) for s in ((33, 17), (17,))],
               run=adamw_steps),
]
