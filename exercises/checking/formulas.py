"""The plain numpy formula of each op that more than one check needs: what defines it.

The op table (tests/support/optable.py) checks the library's ops against these, and the
exercise checks check yours against the same ones. Arrays in, an array out, float64 in practice.
"""
import math

import numpy as np


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def log_softmax(x, axis=-1):
    m = x.max(axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis, keepdims=True))


def layer_norm(x, w, b, eps=1e-5):
    """(x - mean) / sqrt(var + eps) * w + b over the last axis (the biased variance)."""
    xc = x - x.mean(-1, keepdims=True)
    return xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + eps) * w + b


def cross_entropy(logits, targets, ignore_index=-100):
    """The mean of -log softmax(logits)[target] over the rows whose target is not ignored (0 if none is)."""
    valid = targets != ignore_index
    logp = log_softmax(logits, 1)
    picked = logp[np.arange(len(targets)), np.where(valid, targets, 0)]
    return -(picked * valid).sum() / max(valid.sum(), 1)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def attention(q, k, v, causal=False, mask=None, scale=None):
    """softmax(q k^T * scale, where allowed) v; causal at the top left (key j <= query i), mask True = may attend."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    return softmax(s) @ v
