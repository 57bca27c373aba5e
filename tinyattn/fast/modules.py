"""Layers run fast in a compiled model: the runners, and MultiHeadAttention's forward on arrays.

Running a trained model (GPT.generate, ta.inference_mode) records no graph,
so the ops a layer's forward is made of need not be recorded one by one: a
MultiHeadAttention's projection, head split, cache write, attention and
output projection run here as a few array calls (and, in models.py, a GPT
block's layer norms and residual adds, its MLP's two products and GELU),
with the same arithmetic as the fast ops (backend.products, attention_arrays,
the gelu and layer norm kernels).

``ta.compile(model)`` gives each layer of the model that one of these knows a
``Runner`` (compiled.py), which Module.__call__ calls in place of forward while
the compiled model runs. The runner decides once, and again whenever an
attribute of any layer was set (``nn.modules.changes``), whether the layer is
the library's own with its own parts (``refuses``: None, or why not), and on
each call whether this call can run fast (``run``: None where not: a graph
that could be recorded, a profiler or anomaly detection watching, a dtype or
shape it does not take). Wherever it does not, the layer's own forward runs.
"""
import math
import weakref

from .. import autograd
from ..autograd import constant, is_grad_enabled
from ..nn import attention, modules
from ..ops import causal_mask
from .ops import attention_arrays


class Runner:
    """The fast version of one kind of layer. Subclasses name the teaching class they stand in
    for (``teaching``), and write ``refuses`` and ``run``."""

    teaching = None
    says = "on arrays where no graph is recorded"

    def __init__(self):
        self.decided = None                 # nn.modules.changes when ``why`` was decided
        self.why = None

    def __call__(self, module, args, kwargs):
        self._decide(module)
        if self.why is None:
            out = self.run(module, *args, **kwargs)
            if out is not None:
                return out
        return module.forward(*args, **kwargs)

    def _decide(self, module):
        """``why`` (check), decided again if a layer's attribute was set since."""
        if self.decided != modules.changes:
            self.why, self.decided = self.check(module), modules.changes

    def check(self, module):
        """Why ``module`` cannot run fast (its class, or a forward set on it, or refuses), or None."""
        if type(module) is not self.teaching:
            return f"{type(module).__name__} is not the library's {self.teaching.__name__}"
        if "forward" in module.__dict__:
            return "a forward of its own is set on it"
        return self.refuses(module)

    def refuses(self, module):
        return None

    def run(self, module, *args, **kwargs):
        return None

    def describe(self, module):
        """What print(model) shows: how this layer runs."""
        self._decide(module)
        return f"fused: {self.says}" if self.why is None else f"fused: off, {self.why}"


def no_graph(x, module):
    """True where running ``module`` on ``x`` records no graph and nothing watches the ops."""
    backend = x.backend
    if autograd.hooks is not None or not autograd.compiled.ops or not backend.on_host:   # (numpy arrays here)
        return False
    if not is_grad_enabled():
        return True
    return not x.requires_grad and not any(p.requires_grad for _, p in module.named_parameters())   # (lazily)


def not_library(layer, name, cls):
    """Why ``layer`` is not the library's ``cls`` itself (a subclass, a LoRA adapter, a forward set
    on it), or None."""
    if type(layer) is not cls:
        return f"{name} is {type(layer).__name__}, not the library's {cls.__name__}"
    if "forward" in layer.__dict__:
        return f"{name} has a forward of its own"
    return None


def first(*reasons):
    """The first reason that is not None."""
    return next((r for r in reasons if r is not None), None)


def linear_on_arrays(x2, layer):
    """x2 (N, in) @ W^T + b on arrays, as the fast Linear runs it."""
    weight = layer.weight
    return weight.backend.products.linear(x2, weight.data, None if layer.bias is None else layer.bias.data)


def idle(dropout):
    """The Dropout layer does nothing here (its own training flag off, or p = 0)."""
    return not dropout.training or dropout.p == 0.0


def attention_refuses(attn):
    """Why a MultiHeadAttention cannot run on arrays, whatever its input (its parts), or None."""
    if attn.keep_weights:
        return "keep_weights is on"
    if getattr(attn, "n_kv_head", attn.n_head) != attn.n_head:
        return f"grouped-query attention (n_kv_head {attn.n_kv_head} of n_head {attn.n_head}) runs op by op"
    if getattr(attn, "rope_theta", None) is not None:
        return "rotary position embedding runs op by op"
    if getattr(attn, "qk_norm", False):
        return "qk_norm runs op by op"
    return first(not_library(attn.c_attn, "c_attn", modules.Linear), not_library(attn.c_proj, "c_proj", modules.Linear),
                 not_library(attn.resid_dropout, "resid_dropout", modules.Dropout))


class MultiHeadAttention(Runner):
    """Without a graph: the qkv product, the heads as views, the library's KV cache written in
    place, the attention kernel and the output product, on arrays."""

    teaching = attention.MultiHeadAttention
    kernels = ("attention_one_query",)                  # (and the fast ops': attention, linear's products)

    def refuses(self, attn):
        return attention_refuses(attn)

    def run(self, attn, x, attn_mask=None, is_causal=False, kv_cache=None):
        if not (attn_mask is None and (is_causal or kv_cache is not None) and isinstance(x, autograd._Tensor)
                and (kv_cache is None or type(kv_cache) is attention.KVCache) and no_graph(x, attn)):
            return None
        a = x.data                                                       # (B, T, C): numpy (no_graph says so)
        if not (a.ndim == 3 and a.shape[-1] == attn.n_embd
                and attn.c_attn.weight.data.dtype == attn.c_proj.weight.data.dtype == a.dtype
                and idle(attn.resid_dropout) and (attn.dropout == 0.0 or not attn.training)
                and (attn.head_dropout == 0.0 or not attn.training)):
            return None
        B, T, C = a.shape
        H, D = attn.n_head, C // attn.n_head
        t_k = T + (len(kv_cache) if kv_cache is not None else 0)
        if attention.is_long(T, t_k, B * H, a.dtype.itemsize, True):
            return None                                                  # the tiled path: op by op
        qkv = linear_on_arrays(a.reshape(B * T, C), attn.c_attn).reshape(B, T, 3 * H, D)
        heads = qkv.transpose(0, 2, 1, 3)                                # (B, 3H, T, D): q's heads, k's, v's
        q, k, v = heads[:, :H], heads[:, H:2 * H], heads[:, 2 * H:]      # (B, H, T, D) each
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
        return constant(x, linear_on_arrays(y, attn.c_proj).reshape(B, T, C))


RUNNERS = [MultiHeadAttention]          # (models.py adds the GPT's layers)
