"""Fast versions of layers: a layer's forward on arrays, in one call, where no graph is recorded.

Running a trained model (GPT.generate, ta.inference_mode) records no graph,
so the ops a layer's forward is made of need not be recorded one by one: a
MultiHeadAttention's projection, head split, cache write, attention and
output projection run here as a few array calls (and, in models.py, a GPT
block's layer norms and residual adds, its MLP's two products and GELU),
with the same arithmetic as the fast ops (linear_rows, attention_arrays,
the gelu and layer norm kernels). Each subclass runs
the teaching forward (``super().forward``) whenever a graph could be
recorded (grad on and a parameter or input that requires it), when a
profiler or anomaly detection watches the ops, when the fast layer is off,
or whenever the layer holds anything but the library's own parts (a LoRA
adapter in place of a Linear, a learner's KV cache), so what runs is always
what the teaching code says. ``Module.__new__`` makes these in place of the
teaching classes while the fast layer is on.
"""
import math

import numpy as np

from .. import autograd
from ..autograd import constant, is_grad_enabled
from ..nn import attention, modules
from ..ops import causal_mask
from .ops import attention_arrays, linear_rows


def no_graph(x, module):
    """True where running ``module`` on ``x`` records no graph and nothing watches the ops."""
    if autograd.hooks is not None or not x.backend.fast_ops or x.xp is not np:
        return False
    if not is_grad_enabled():
        return True
    return not x.requires_grad and not any(p.requires_grad for _, p in module.named_parameters())   # (lazily)


def is_linear(layer, x):
    """An nn.Linear itself (not a subclass, no forward of its own set on it) of x's dtype."""
    return type(layer) is modules.Linear and "forward" not in layer.__dict__ and layer.weight.dtype == x.dtype


def linear_on_arrays(x2, layer):
    """x2 (N, in) @ W^T + b on arrays, as the fast Linear runs it."""
    return linear_rows(x2, layer.weight.data, None if layer.bias is None else layer.bias.data)


def idle(dropout):
    """The Dropout layer does nothing here (its own training flag off, or p = 0)."""
    return type(dropout) is modules.Dropout and (not dropout.training or dropout.p == 0.0)


class MultiHeadAttention(attention.MultiHeadAttention):
    """Without a graph: the qkv product, the heads as views, the library's KV cache written in
    place, the attention kernel and the output product, on arrays."""

    def forward(self, x, attn_mask=None, is_causal=False, kv_cache=None):
        if not self._on_arrays(x, attn_mask, is_causal, kv_cache):
            return super().forward(x, attn_mask, is_causal, kv_cache)
        B, T, C = x.shape
        H, D = self.n_head, C // self.n_head
        qkv = linear_on_arrays(x.data.reshape(B * T, C), self.c_attn).reshape(B, T, 3 * H, D)
        heads = qkv.transpose(0, 2, 1, 3)                                # (B, 3H, T, D): q's heads, k's, v's
        q, k, v = heads[:, :H], heads[:, H:2 * H], heads[:, 2 * H:]      # (B, H, T, D) each
        t_k = T
        if kv_cache is not None:
            k_t, v_t = kv_cache.append(constant(x, k), constant(x, v))   # (B, H, T_past + T, D)
            k, v, t_k = k_t.data, v_t.data, k_t.shape[2]
        out = None
        if T == 1:                                                       # decoding: the new token sees every key
            out = x.backend.run_kernel("attention_one_query", q[:, :, 0], k, v, 1.0 / math.sqrt(D))   # (B, H, D)
        if out is None:
            allowed = causal_mask(T, t_k, x.backend, offset=t_k - T)
            out, _ = attention_arrays(x.backend, q, k, v, allowed, 1.0 / math.sqrt(D))
            out = out.transpose(0, 2, 1, 3)                              # (B, T, H, D)
        y = out.reshape(B * T, C)                                        # merge heads: (B*T, C)
        return constant(x, linear_on_arrays(y, self.c_proj).reshape(B, T, C))

    def _on_arrays(self, x, attn_mask, is_causal, kv_cache):
        if not (attn_mask is None and (is_causal or kv_cache is not None) and not self.keep_weights
                and isinstance(x, autograd._Tensor) and x.ndim == 3 and x.shape[-1] == self.n_embd
                and (kv_cache is None or type(kv_cache) is attention.KVCache)
                and is_linear(self.c_attn, x) and is_linear(self.c_proj, x)
                and idle(self.resid_dropout) and (self.dropout == 0.0 or not self.training)
                and (self.head_dropout == 0.0 or not self.training) and no_graph(x, self)):
            return False
        B, T, _ = x.shape                                                # the naive path, not the tiled one
        t_k = T + (len(kv_cache) if kv_cache is not None else 0)
        return not attention.is_long(T, t_k, B * self.n_head, x.dtype.itemsize, x.backend.on_host)


FAST_MODULES = {attention.MultiHeadAttention: MultiHeadAttention}    # (fast/models.py adds the GPT's layers)
