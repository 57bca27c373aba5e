"""Fast versions of the GPT's own layers (tinyattn/models/gpt.py): see modules.py.

They sit above the models, as the models sit above nn; tinyattn's __init__ imports this
module last, which adds them to FAST_MODULES.
"""
from .. import autograd
from ..autograd import constant
from ..models import gpt
from ..nn import functional as F, modules
from .modules import FAST_MODULES, idle, is_linear, linear_on_arrays, no_graph
from .ops import linear_rows


class MLP(gpt.MLP):
    """Without a graph: c_fc, the GELU kernel and c_proj on arrays."""

    def forward(self, x):
        if not (isinstance(x, autograd._Tensor) and x.ndim >= 1 and is_linear(self.c_fc, x)
                and is_linear(self.c_proj, x) and type(self.gelu) is modules.GELU
                and self.gelu.approximate == "tanh" and x.shape[-1] == self.c_fc.in_features
                and idle(self.dropout) and no_graph(x, self)
                and x.backend.kernel("gelu_tanh") is not None):
            return super().forward(x)
        h = linear_on_arrays(x.data.reshape(-1, x.shape[-1]), self.c_fc)         # (N, 4C)
        h = x.backend.run_kernel("gelu_tanh", h)
        if h is None:                                                    # (a dtype the kernel declines)
            return super().forward(x)
        return constant(x, linear_on_arrays(h, self.c_proj).reshape(x.shape[:-1] + (self.c_proj.out_features,)))


def _layer_norm(x, layer):
    """LayerNorm on an array by the kernel (None where it declines)."""
    if type(layer) is not modules.LayerNorm or "forward" in layer.__dict__ or layer.bias is None or layer.weight.dtype != x.dtype:
        return None
    out = layer.weight.backend.run_kernel("layer_norm", x, layer.weight.data, layer.bias.data, layer.eps, False)
    return None if out is None else out[0]


class Block(gpt.Block):
    """Without a graph: both layer norms by the kernel and both residual adds on arrays, around
    the fast attention and MLP."""

    def forward(self, x, kv_cache=None):
        if not (isinstance(x, autograd._Tensor) and x.ndim == 3 and no_graph(x, self)
                and x.shape[-1] == self.ln_1.weight.shape[0]):
            return super().forward(x, kv_cache)
        h = _layer_norm(x.data, self.ln_1)
        if h is None:
            return super().forward(x, kv_cache)
        x1 = x.data + self.attn(constant(x, h), is_causal=kv_cache is None, kv_cache=kv_cache).data
        h = _layer_norm(x1, self.ln_2)
        if h is None:                                                    # (cannot happen after ln_1 took it)
            return constant(x, x1) + self.mlp(self.ln_2(constant(x, x1)))
        x1 += self.mlp(constant(x, h)).data                              # (x1 is ours: a new array)
        return constant(x, x1)


class GPT(gpt.GPT):
    """Without a graph and without targets (decoding, logits for a prompt): the embeddings, the
    final layer norm and the head on arrays, around the fast blocks."""

    def forward(self, idx, targets=None, kv_caches=None):
        table = self.wte.weight
        if not (targets is None and isinstance(idx, autograd._Tensor) and idx.ndim == 2
                and idx.dtype.kind in "iu" and idx.backend is table.backend
                and _is_embedding(self.wte) and _is_embedding(self.wpe)
                and idle(self.drop) and is_linear(self.lm_head, table) and no_graph(table, self)):
            return super().forward(idx, targets, kv_caches)
        B, T = idx.shape
        start = len(kv_caches[0]) if kv_caches else 0
        if start + T > min(self.config.block_size, self.wpe.weight.shape[0]):
            return super().forward(idx, targets, kv_caches)                # (its error)
        F._check_id_range("embedding", "ids", idx, table.shape[0])          # (the teaching path's error)
        x = table.data.take(idx.data, axis=0) + self.wpe.weight.data[start:start + T]   # (B, T, C)
        x = constant(table, x)
        for i, block in enumerate(self.h):
            x = block(x, kv_caches[i] if kv_caches else None)
        logits = _logits(x.data, self)
        if logits is None:                                                  # (the layer norm kernel declined)
            return self.lm_head(self.ln_f(x)), None
        return constant(x, logits), None


def _logits(x, model):
    """The final layer norm and the head on an array x (B, T, C): (B, T, V), or None where the
    layer norm kernel declines."""
    h = _layer_norm(x, model.ln_f)
    if h is None:
        return None
    head = model.lm_head
    out = linear_rows(h.reshape(-1, h.shape[-1]), head.weight.data, None if head.bias is None else head.bias.data)
    return out.reshape(x.shape[:-1] + (head.out_features,))


def _is_embedding(layer):
    return type(layer) is modules.Embedding and "forward" not in layer.__dict__


FAST_MODULES.update({cls.__mro__[1]: cls for cls in (MLP, Block, GPT)})
