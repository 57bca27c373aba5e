"""Fast versions of the GPT's own layers (tinyattn/models/gpt.py): see modules.py.

They sit above the models, as the models sit above nn; tinyattn's __init__ imports this
module last, which adds them to FAST_MODULES.

In training on the CPU, a Block records one op, BlockOp, whose forward and backward are
one kernel each (cpu_block.py): a quarter less time a step for the small GPTs than op by
op (bench/BENCHMARKS.md). Wherever it could differ from the layers op by op (a profiler
or anomaly detection watching, dropout at work other than DropHead's, a layer of the
learner's own, the tiled attention, a batch that does not share evenly over the threads),
the block runs op by op; so does its backward under a profiler or anomaly detection, or
when it is to be differentiated again (block_op_by_op).
"""
import numpy as np

from .. import autograd
from ..autograd import Function, constant, is_grad_enabled
from ..models import gpt
from ..nn import attention, functional as F, modules
from . import threads
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


def _is_layer_norm(layer, x):
    """An nn.LayerNorm itself (no forward of its own set on it), with a bias, of x's dtype."""
    return (type(layer) is modules.LayerNorm and "forward" not in layer.__dict__ and layer.bias is not None
            and layer.weight.dtype == x.dtype)


def _layer_norm(x, layer):
    """LayerNorm on an array by the kernel (None where it declines)."""
    if not _is_layer_norm(layer, x):
        return None
    out = layer.weight.backend.run_kernel("layer_norm", x, layer.weight.data, layer.bias.data, layer.eps, False)
    return None if out is None else out[0]


class BlockOp(Function):
    """A whole block, y = x2 + mlp(ln_2(x2)), x2 = x + attn(ln_1(x)) with causal attention, as
    one op: forward and backward are one kernel each (cpu_block.py), each thread running the
    block on its share of the batch. Inputs: x (B, T, C) and the block's parameters
    (Block.fused_parameters); head_keep: DropHead's draw (B, H), or None."""

    def forward(self, x, *params, n_head, eps_1, eps_2, module, head_keep=None, rng_state=None):   # (B, T, C)
        y, *saved = self.backend.run_kernel("block", x, params, n_head, eps_1, eps_2, head_keep)
        self.save(*saved)
        self.n_head, self.eps, self.head_keep, self.rng_state = n_head, (eps_1, eps_2), head_keep, rng_state
        self.module, self.modes = module, [m.training for m in module.modules()]
        return y                                                            # (B, T, C)

    def backward(self, g):                                                  # g (B, T, C)
        """The kernel; op by op where that backward is to be differentiated again (create_graph),
        or a profiler or anomaly detection is watching the ops, or there is no kernel now."""
        create_graph = is_grad_enabled()
        grads = None if create_graph or autograd.hooks is not None else self.backend.run_kernel(
            "block_backward", g.data, self.saved, [p.data for p in self.parents[1:]], self.n_head, self.head_keep)
        if grads is not None:
            return tuple(self.constant(d) for d in grads)                  # dx, then each parameter's
        inputs = self.parents                      # (to differentiate again: the graph must reach them)
        if not create_graph:                       # else the block's own graph, so that backward stops at it
            inputs = [p.detach().requires_grad_(p.requires_grad) for p in inputs]
        with autograd.enable_grad():
            y = block_op_by_op(*inputs, n_head=self.n_head, eps=self.eps, head_keep=self.head_keep)
        return autograd.grad(y, inputs, g, create_graph=create_graph, allow_unused=True)

    def unfused(self):
        """The block's output computed again by the module's layers, in the modes they had, from
        the same input, with its graph: what ta.viz.graph draws for this op. (DropHead draws the
        same heads: the device's generator is set back to where it stood for this op.)"""
        backend, modules_now = self.backend, list(self.module.modules())
        modes_now, state_now = [m.training for m in modules_now], backend.get_rng_state()
        try:
            for m, mode in zip(modules_now, self.modes):
                object.__setattr__(m, "training", mode)
            if self.head_keep is not None:
                backend.set_rng_state(self.rng_state)
            with autograd.enable_grad():
                return gpt.Block.forward(self.module, self.parents[0])
        finally:
            for m, mode in zip(modules_now, modes_now):
                object.__setattr__(m, "training", mode)
            backend.set_rng_state(state_now)


def block_op_by_op(x, ln1_w, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_w, ln2_b, w_fc, b_fc, w_proj, b_proj, *,
                   n_head, eps, head_keep=None):
    """What BlockOp computes, with the functional ops one by one, from its inputs alone (x (B, T, C)
    -> (B, T, C)): as gpt.Block, MultiHeadAttention and MLP compute it, without their modules."""
    B, T, C = x.shape
    H = n_head
    qkv = F.linear(F.layer_norm(x, (C,), ln1_w, ln1_b, eps[0]), w_qkv, b_qkv).view(B, T, 3 * H, C // H)
    q, k, v = qkv.transpose(1, 2).split(H, dim=1)                           # 3 x (B, H, T, D)
    y = attention.scaled_dot_product_attention(q, k, v, is_causal=True)
    if head_keep is not None:
        y = y * constant(x, head_keep.reshape(B, H, 1, 1))                  # DropHead's draw
    x2 = x + F.linear(y.transpose(1, 2).reshape(B, T, C), w_o, b_o)
    h = F.gelu(F.linear(F.layer_norm(x2, (C,), ln2_w, ln2_b, eps[1]), w_fc, b_fc), approximate="tanh")
    return x2 + F.linear(h, w_proj, b_proj)


class Block(gpt.Block):
    """In training, the whole block as one op (BlockOp). Without a graph: both layer norms by
    the kernel and both residual adds on arrays, around the fast attention and MLP."""

    def forward(self, x, kv_cache=None):
        params = self._one_op_parameters(x) if kv_cache is None else None
        if params is not None:
            attn, keep, state = self.attn, None, None
            if attn.head_dropout > 0.0 and attn.training:               # DropHead's draw, as attn would make it
                state = x.backend.get_rng_state()
                keep = attn.head_keep(x.shape[0], x.dtype, x.device).data.reshape(x.shape[0], attn.n_head)
            return BlockOp.apply(x, *params, n_head=attn.n_head, eps_1=self.ln_1.eps,
                                 eps_2=self.ln_2.eps, module=self, head_keep=keep, rng_state=state)
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

    def fused_parameters(self):
        """The parameters BlockOp takes, in its order."""
        attn, mlp = self.attn, self.mlp
        return (self.ln_1.weight, self.ln_1.bias, attn.c_attn.weight, attn.c_attn.bias, attn.c_proj.weight,
                attn.c_proj.bias, self.ln_2.weight, self.ln_2.bias, mlp.c_fc.weight, mlp.c_fc.bias,
                mlp.c_proj.weight, mlp.c_proj.bias)

    def _one_op_parameters(self, x):
        """The block's fused_parameters() where it runs as one op, else None. It does where a graph
        is recorded on the CPU with the block kernel loaded, nothing watches the ops, and the block
        is the library's own: its layers and their forwards, biases, the GELU's tanh form, no
        dropout at work but DropHead's, the naive (not tiled) attention."""
        if not (isinstance(x, autograd._Tensor) and autograd.hooks is None and is_grad_enabled()
                and x.backend.fast_ops and x.xp is np and x.ndim == 3 and 0 not in x.shape and x.dtype in _FLOATS
                and x.backend.kernel("block") is not None):
            return None
        attn, mlp, C = self.attn, self.mlp, x.shape[-1]
        if not (_is_layer_norm(self.ln_1, x) and _is_layer_norm(self.ln_2, x)
                and type(attn) in (attention.MultiHeadAttention, FAST_MODULES[attention.MultiHeadAttention])
                and "forward" not in attn.__dict__ and attn.n_embd == C and not attn.keep_weights
                and (not attn.training or attn.dropout == 0.0) and idle(attn.resid_dropout)
                and type(mlp) in (gpt.MLP, MLP) and "forward" not in mlp.__dict__ and idle(mlp.dropout)
                and type(mlp.gelu) is modules.GELU and mlp.gelu.approximate == "tanh"
                and all(is_linear(layer, x) and layer.bias is not None
                        for layer in (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj))):
            return None
        from .cpu_block import block_fits, block_work   # (importable here: the block kernel is loaded, numba too)
        params = self.fused_parameters()
        if (not (x.requires_grad or any(p.requires_grad for p in params))
                or not block_fits(x.data, [p.data for p in params])):
            return None
        B, T, _ = x.shape
        n = threads.get_num_threads()                                   # the threads take whole sequences:
        even = B % n == 0 or B >= 4 * n or threads.too_small(block_work(x.shape))   # each about as many
        return params if even and not attention.is_long(T, T, B * attn.n_head, x.dtype.itemsize, True) else None


_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


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
