"""The GPT's own layers run fast (tinyattn/models/gpt.py): their runners, for ta.compile.

They sit above the models, as the models sit above nn.

In training on the CPU, a Block records one op, BlockOp, whose forward and backward are
one kernel each (cpu_block.py): a quarter less time a step for the small GPTs than op by
op (docs/benchmarks.md). Wherever it could differ from the layers op by op (a profiler
or anomaly detection watching, dropout at work other than DropHead's, a layer of the
learner's own, the tiled attention, a batch that does not share evenly over the threads),
the block runs op by op; so does its backward under a profiler or anomaly detection, or
when it is to be differentiated again (block_op_by_op). Without a graph (decoding), the
GPT, its blocks and their MLPs run as a few array calls each, as MultiHeadAttention does
in modules.py.
"""
import numpy as np

from .. import autograd
from ..autograd import Function, constant, is_grad_enabled
from ..models import gpt
from ..nn import attention, functional as F, modules
from . import threads
from .modules import RUNNERS, Runner, attention_refuses, first, idle, linear_on_arrays, no_graph, not_library


def _mlp_refuses(mlp):
    if type(mlp.gelu) is not modules.GELU or mlp.gelu.approximate != "tanh":
        return "its activation is not the library's GELU(approximate='tanh')"
    return first(not_library(mlp.c_fc, "c_fc", modules.Linear), not_library(mlp.c_proj, "c_proj", modules.Linear),
                 not_library(mlp.gelu, "gelu", modules.GELU), not_library(mlp.dropout, "dropout", modules.Dropout))


class MLP(Runner):
    """Without a graph: c_fc, the GELU kernel and c_proj on arrays."""

    teaching = gpt.MLP

    def refuses(self, mlp):
        return _mlp_refuses(mlp)

    def run(self, mlp, x):
        if not (isinstance(x, autograd._Tensor) and idle(mlp.dropout) and no_graph(x, mlp)):
            return None
        a = x.data                                                       # (..., C): numpy (no_graph says so)
        if not (a.ndim >= 1 and a.shape[-1] == mlp.c_fc.in_features
                and mlp.c_fc.weight.data.dtype == mlp.c_proj.weight.data.dtype == a.dtype
                and x.backend.kernel("gelu_tanh") is not None):
            return None
        h = linear_on_arrays(a.reshape(-1, a.shape[-1]), mlp.c_fc)      # (N, 4C)
        h = x.backend.run_kernel("gelu_tanh", h)
        if h is None:                                                    # (a dtype the kernel declines)
            return None
        return constant(x, linear_on_arrays(h, mlp.c_proj).reshape(a.shape[:-1] + (mlp.c_proj.out_features,)))


def _layer_norm_refuses(layer, name):
    why = not_library(layer, name, modules.LayerNorm)
    if why is not None:
        return why
    if len(layer.normalized_shape) != 1:
        return f"{name} normalizes over {len(layer.normalized_shape)} dims"
    return f"{name} has no bias" if layer.bias is None else None


def _layer_norm(x, layer):
    """LayerNorm on an array by the kernel (None where it declines, or for another dtype)."""
    weight = layer.weight.data
    if weight.dtype != x.dtype:
        return None
    out = layer.weight.backend.run_kernel("layer_norm", x, weight, layer.bias.data, layer.eps, False)
    return None if out is None else out[0]


class BlockOp(Function):
    """A whole block, y = x2 + mlp(ln_2(x2)), x2 = x + attn(ln_1(x)) with causal attention, as
    one op: forward and backward are one kernel each (cpu_block.py), each thread running the
    block on its share of the batch. Inputs: x (B, T, C) and the block's parameters
    (in the order of Block._one_op_parameters); head_keep: DropHead's draw (B, H), or None."""

    kernels = ("block", "block_backward")

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


class Block(Runner):
    """In training, the whole block as one op (BlockOp). Without a graph: both layer norms by
    the kernel and both residual adds on arrays, around the fast attention and MLP."""

    teaching = gpt.Block

    def check(self, block):
        """Why the block cannot run on arrays (its layer norms), or None; and, kept in ``one_op``, why
        it cannot run as one op in training (any of its parts), or None."""
        why = super().check(block)
        self.one_op = why or self._whole_block_refuses(block)
        return why

    @staticmethod
    def _whole_block_refuses(block):
        why = first(not_library(block.attn, "attn", attention.MultiHeadAttention),
                    not_library(block.mlp, "mlp", gpt.MLP))
        why = why or first(attention_refuses(block.attn), _mlp_refuses(block.mlp))
        if why is None and any(layer.bias is None for layer in (block.attn.c_attn, block.attn.c_proj,
                                                                block.mlp.c_fc, block.mlp.c_proj)):
            why = "a Linear has no bias"
        if why is None and block.mlp.c_fc.out_features != 4 * block.mlp.c_fc.in_features:
            why = "its MLP is not 4 n_embd wide"
        return why

    def refuses(self, block):
        return first(_layer_norm_refuses(block.ln_1, "ln_1"), _layer_norm_refuses(block.ln_2, "ln_2"))

    def describe(self, block):
        text = super().describe(block)
        if text.startswith("fused: off"):
            return text
        why = self.one_op
        if why is None and block.ln_1.weight.backend.kernel("block") is None:
            why = "no block kernel here (on the CPU it needs numba: pip install numba)"
        return f"fused: one op in training, {self.says}" if why is None else f"{text}; one op in training: off, {why}"

    def run(self, block, x, kv_cache=None):
        if not (isinstance(x, autograd._Tensor) and x.data.ndim == 3
                and x.data.shape[-1] == block.ln_1.weight.data.shape[0]):
            return None
        if kv_cache is None and is_grad_enabled():
            params = None if self.one_op is not None else self._one_op_parameters(block, x)
            if params is None:
                return None
            attn, keep, state = block.attn, None, None
            if attn.head_dropout > 0.0 and attn.training:               # DropHead's draw, as attn would make it
                state = x.backend.get_rng_state()
                keep = attn.head_keep(x.shape[0], x.dtype, x.device).data.reshape(x.shape[0], attn.n_head)
            return BlockOp.apply(x, *params, n_head=attn.n_head, eps_1=block.ln_1.eps,
                                 eps_2=block.ln_2.eps, module=block, head_keep=keep, rng_state=state)
        if not (no_graph(x, block) and block.ln_1.weight.data.dtype == block.ln_2.weight.data.dtype == x.data.dtype):
            return None
        h = _layer_norm(x.data, block.ln_1)                             # (None: no kernel; then none for ln_2)
        if h is None:
            return None
        x1 = x.data + block.attn(constant(x, h), is_causal=kv_cache is None, kv_cache=kv_cache).data
        h = _layer_norm(x1, block.ln_2)
        x1 += block.mlp(constant(x, h)).data                             # (x1 is ours: a new array)
        return constant(x, x1)

    def _one_op_parameters(self, block, x):
        """The block's parameters, in BlockOp's order, where this call runs as one op, else None: a
        graph is recorded on the CPU with the block kernel loaded, nothing watches the ops, no
        dropout is at work but DropHead's, and the
        attention is the naive (not tiled) one over a batch that shares evenly over the threads (or
        over a block whose products run on the whole batch: cpu_block.schedule)."""
        attn, mlp = block.attn, block.mlp
        if not (autograd.hooks is None and autograd.compiled.ops and 0 not in x.shape
                and x.dtype in _FLOATS and x.backend.kernel("block") is not None
                and (not attn.training or attn.dropout == 0.0) and idle(attn.resid_dropout) and idle(mlp.dropout)):
            return None
        params = (block.ln_1.weight, block.ln_1.bias, attn.c_attn.weight, attn.c_attn.bias, attn.c_proj.weight,
                  attn.c_proj.bias, block.ln_2.weight, block.ln_2.bias, mlp.c_fc.weight, mlp.c_fc.bias,
                  mlp.c_proj.weight, mlp.c_proj.bias)
        if any(p is None or p.dtype != x.dtype for p in params):
            return None
        from .cpu_block import block_fits, block_work, schedule   # (importable: the block kernel is loaded, numba too)
        if (not (x.requires_grad or any(p.requires_grad for p in params))
                or not block_fits(x.data, [p.data for p in params])):
            return None
        B, T, _ = x.shape
        n = threads.get_num_threads()                                   # the threads take whole sequences:
        even = B % n == 0 or B >= 4 * n or block_work(x.shape) < threads.FLOOR   # each about as many
        even = even or schedule(x.shape, n) != "rows"                   # (or rows and (sequence, head) pairs)
        # (FLOOR, not the measured MIN_WORK: whether the block runs as one op changes the numbers)
        return params if even and not attention.is_long(T, T, B * attn.n_head, x.dtype.itemsize, True) else None


_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


class GPT(Runner):
    """Without a graph and without targets (decoding, logits for a prompt): the embeddings, the
    final layer norm and the head on arrays, around the fast blocks."""

    teaching = gpt.GPT

    def refuses(self, model):
        if model.wpe is None:
            return "rotary positions (no wpe) run op by op"
        return first(not_library(model.wte, "wte", modules.Embedding), not_library(model.wpe, "wpe", modules.Embedding),
                     not_library(model.drop, "drop", modules.Dropout),
                     not_library(model.lm_head, "lm_head", modules.Linear),
                     _layer_norm_refuses(model.ln_f, "ln_f"))

    def run(self, model, idx, targets=None, kv_caches=None):
        table = model.wte.weight
        if not (targets is None and isinstance(idx, autograd._Tensor) and idx.backend is table.backend
                and idle(model.drop) and no_graph(table, model)):
            return None
        if not (idx.data.ndim == 2 and idx.data.dtype.kind in "iu"
                and model.lm_head.weight.data.dtype == table.data.dtype):
            return None
        B, T = idx.data.shape
        start = len(kv_caches[0]) if kv_caches else 0
        if start + T > min(model.config.block_size, model.wpe.weight.shape[0]):
            return None                                                     # (the teaching path's error)
        F._check_id_range("embedding", "ids", idx, table.shape[0])          # (the teaching path's error)
        x = table.data.take(idx.data, axis=0) + model.wpe.weight.data[start:start + T]   # (B, T, C)
        x = constant(table, x)
        for i, block in enumerate(model.h):
            x = block(x, kv_caches[i] if kv_caches else None)
        logits = _logits(x.data, model)
        if logits is None:                                                  # (the layer norm kernel declined)
            return model.lm_head(model.ln_f(x)), None
        return constant(x, logits), None


def _logits(x, model):
    """The final layer norm and the head on an array x (B, T, C): (B, T, V), or None where the
    layer norm kernel declines."""
    h = _layer_norm(x, model.ln_f)
    if h is None:
        return None
    head = model.lm_head                                               # (tied to wte: no bias)
    out = head.weight.backend.products.linear(h.reshape(-1, h.shape[-1]), head.weight.data,
                                              None if head.bias is None else head.bias.data)
    return out.reshape(x.shape[:-1] + (head.out_features,))


RUNNERS.extend([MLP, Block, GPT])
RUNNERS_BY_CLASS = {runner.teaching: runner for runner in RUNNERS}


def runners(model):
    """{layer: its runner} for each layer of ``model`` that is, or derives from, one the fast layer
    knows (MultiHeadAttention and the GPT's MLP, Block and GPT): ta.compile's layers. (A layer of a
    class derived from one runs its own forward: the runner says why.)"""
    out = {}
    for module in model.modules():
        runner = next((RUNNERS_BY_CLASS[cls] for cls in type(module).__mro__ if cls in RUNNERS_BY_CLASS), None)
        if runner is not None:
            out[module] = runner()
    return out
