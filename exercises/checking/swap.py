"""Train on your own code: swap every passing piece of yours into the library, for one run.

    with use_exercises() as swapped:      # what ``python -m train --use_exercises`` does
        ...                               # tinyattn now runs your softmax, LayerNorm, AdamW, ...

Each passing exercise of "Build the core" names the library attributes it
replaces. They are patched on entry and restored on exit. The training program
compiles its model (``--compile``, on by default): the compiled model finds your
functions in place of the library's and its fast paths step aside, so your pieces
run, with one line on stderr naming what is not the library's.
"""
import contextlib
import importlib
import math


from .common import load_exercise
from .progress import check_all


def _attention(module):
    """The library's attention signature, running yours when no mask, dropout or weights are asked for."""
    from tinyattn.nn import attention
    library = attention.scaled_dot_product_attention

    def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False, dropout_p=0.0, scale=None,
                                     return_weights=False, impl="auto", enable_gqa=False):
        if enable_gqa:                            # (grouped-query: the library's, or your GQA, which calls yours)
            return library(q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p, scale=scale,
                           return_weights=return_weights, impl=impl, enable_gqa=True)
        if attn_mask is None and dropout_p == 0.0 and not return_weights and impl != "tiled":
            return module.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)
        return library(q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p, scale=scale,
                       return_weights=return_weights, impl=impl)
    return scaled_dot_product_attention


def _rms_norm(module):
    """The library's rms_norm signature, running yours over the last dim (float32 and float64)."""
    from tinyattn.nn import functional as F
    library = F.rms_norm

    def rms_norm(x, normalized_shape, weight=None, eps=None):
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        if len(shape) != 1 or x.ndim < 1 or x.shape[-1:] != shape or x.dtype.kind != "f" or x.dtype.itemsize < 4:
            return library(x, normalized_shape, weight, eps)           # (its error, or several dims, or float16)
        return module.rms_norm(x, weight, float(x.xp.finfo(x.data.dtype).eps) if eps is None else eps)
    return rms_norm


def _rotary(module):
    """The library's rotary_embedding, running your apply_rotary. The library pairs channels i and
    i + D/2 (Llama's); yours may pair neighbours (2i, 2i + 1): then the channels are put in your order
    and back, so your rotation computes the library's and a checkpoint means the same to both."""
    import tinyattn as ta
    from tinyattn.nn import functional as F
    library = F.rotary_embedding
    probe = ta.tensor([[1.0, 0.0, 0.0, 0.0]], dtype="float64")               # channel 0 at position 1:
    turned = module.apply_rotary(probe, [1]).numpy()[0]                      # where does it turn to?
    neighbours = abs(turned[1]) > 1e-6 and abs(turned[2]) < 1e-12

    def rotary_embedding(x, positions, base=10000.0):
        if base != 10000.0 or x.ndim < 2 or x.shape[-1] % 2:
            return library(x, positions, base)                           # (its error, or another base)
        positions = list(positions.numpy() if isinstance(positions, ta.Tensor) else positions)
        if not neighbours:
            return module.apply_rotary(x, positions)
        *lead, T, D = x.shape
        pairs = ta.stack([x[..., :D // 2], x[..., D // 2:]], dim=-1).reshape(x.shape)    # (i, i + D/2) side by side
        y = module.apply_rotary(pairs, positions).reshape(*lead, T, D // 2, 2)
        return ta.cat([y[..., 0], y[..., 1]], dim=-1)                    # back to the library's halves
    return rotary_embedding


def _gqa(module):
    """The library's attention with enable_gqa running your grouped_query_attention (no mask, dropout,
    scale or weights asked for: training; decoding's cache passes a mask, and runs the library's)."""
    from tinyattn.nn import attention
    library = attention.scaled_dot_product_attention

    def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False, dropout_p=0.0, scale=None,
                                     return_weights=False, impl="auto", enable_gqa=False):
        if enable_gqa and attn_mask is None and dropout_p == 0.0 and scale is None and not return_weights \
                and impl != "tiled" and q.ndim == 4:
            return module.grouped_query_attention(q, k, v, is_causal=is_causal)
        return library(q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p, scale=scale,
                       return_weights=return_weights, impl=impl, **({"enable_gqa": True} if enable_gqa else {}))
    return scaled_dot_product_attention


def _swiglu(module):
    """The GPT's SwiGLU with your SwiGLU's forward: your module's w1, v and w2 are the model's c_gate,
    c_fc and c_proj, so the checkpoint keeps the library's names."""
    from tinyattn.backend import host_rng
    from tinyattn.models import gpt

    class SwiGLU(gpt.SwiGLU):
        def __init__(self, config):
            super().__init__(config)
            rng = host_rng()
            drawn = rng.bit_generator.state
            yours = module.SwiGLU(config.n_embd, config.hidden, bias=config.bias)
            rng.bit_generator.state = drawn             # (its layers' draws undone: the init is the library's)
            yours.w1, yours.v, yours.w2 = self.c_gate, self.c_fc, self.c_proj
            object.__setattr__(self, "yours", yours)                    # (not a layer of its own: no new names)

        def forward(self, x):                                           # (B, T, C)
            return self.dropout(self.yours(x))
    return SwiGLU


def _backward(module):
    """Tensor.backward running your engine (the library's keeps retain_graph and create_graph)."""
    from tinyattn import Tensor
    library = Tensor.backward

    def backward(self, gradient=None, retain_graph=False, create_graph=False):
        if retain_graph or create_graph:
            return library(self, gradient, retain_graph, create_graph)
        module.backward(self, gradient)
    return backward


def _split_piece_by_piece(module):
    """ta.split as one GetItem per piece: your engine calls backward once per output Tensor, so it
    runs no op with several outputs (the library's Split makes all the pieces in one op)."""
    from tinyattn.ops import split_sizes

    def split(x, split_size_or_sections, dim=0):
        dim, sizes = split_sizes(x, split_size_or_sections, dim)
        pieces, start = [], 0
        for size in sizes:
            pieces.append(x[(slice(None),) * dim + (slice(start, start + size),)])
            start += size
        return tuple(pieces)
    return split


def _taking_fused(adamw):
    """Your AdamW, taking the library's ``fused=`` (GPT.configure_optimizer passes it) and leaving it aside."""
    class AdamW(adamw):
        def __init__(self, params, *args, fused=False, **kwargs):
            super().__init__(params, *args, **kwargs)
    return AdamW


def _yours(name):
    return lambda module: getattr(module, name)


# exercise: [(library module, attribute, your replacement from your module), ...]
SWAPS = {
    "rmsnorm": [("tinyattn.nn.functional", "rms_norm", _rms_norm)],
    "rope": [("tinyattn.nn.attention", "rotary_embedding", _rotary)],
    "gqa": [("tinyattn.nn.attention", "scaled_dot_product_attention", _gqa)],
    "swiglu": [("tinyattn.models.gpt", "SwiGLU", _swiglu)],
    "sum_to": [("tinyattn.ops", "sum_to", _yours("sum_to")), ("tinyattn", "sum_to", _yours("sum_to"))],
    "matmul": [("tinyattn.ops", "MatMul", _yours("MatMul"))],
    "elementwise": [("tinyattn.ops", op, _yours(op)) for op in ("Exp", "Log", "Tanh")],
    "softmax": [("tinyattn.ops", "softmax", _yours("softmax")), ("tinyattn.nn.functional", "softmax", _yours("softmax"))],
    "layernorm": [("tinyattn.nn.functional", "LayerNorm", _yours("LayerNorm"))],
    "cross_entropy": [("tinyattn.nn.functional", "cross_entropy", _yours("cross_entropy"))],
    "embedding": [("tinyattn.nn.functional", "embedding", _yours("embedding"))],
    # your engine runs one backward per output Tensor: split then makes one op per piece
    "engine": [("tinyattn.autograd", "_toposort", _yours("toposort")), ("tinyattn.tensor:Tensor", "backward", _backward),
               ("tinyattn.ops", "split", _split_piece_by_piece)],
    "attention": [("tinyattn.nn.attention", "scaled_dot_product_attention", _attention),
                  ("tinyattn.nn.functional", "scaled_dot_product_attention", _attention)],
    "adamw": [("tinyattn.optim", "AdamW", lambda module: _taking_fused(module.AdamW))],
    "kv_cache": [("tinyattn.nn", "KVCache", _yours("KVCache"))],
}
NOT_SWAPPED = {"online_softmax": "the GPT's training does not run tiled attention"}


def _attention_through_softmax(module):
    """Attention as the library writes it, scores, softmax and the weighted sum, with the softmax
    the library's softmax is now (yours): the library's one-op attention has a softmax of its own."""
    from tinyattn import ops
    from tinyattn.nn import attention
    library = attention.scaled_dot_product_attention

    def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False, dropout_p=0.0, scale=None,
                                     return_weights=False, impl="auto", enable_gqa=False):
        if enable_gqa:
            return library(q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p, scale=scale,
                           return_weights=return_weights, impl=impl, enable_gqa=True)
        additive = attn_mask is not None and attn_mask.dtype.kind != "b"
        if additive or dropout_p or return_weights or impl == "tiled":
            return library(q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p, scale=scale,
                           return_weights=return_weights, impl=impl)
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        scores = (q @ k.mT) * scale                                          # (B, H, Tq, Tk)
        for mask in ([ops.constant(scores, ops.causal_mask(q.shape[-2], k.shape[-2], q.backend))] if is_causal
                     else []) + ([attn_mask] if attn_mask is not None else []):
            scores = scores.masked_fill(~mask, float("-inf"))                # True = may attend
        return ops.softmax(scores, -1) @ v
    return scaled_dot_product_attention


def _cross_entropy_through_exp_log(module):
    """Cross-entropy written with Tensor ops: -(x[target] - max - log(sum(exp(x - max)))), so that
    the library's Exp and Log (yours) run: the library's one-op cross-entropy does its own."""
    from tinyattn.nn import functional as F
    library = F.cross_entropy

    def cross_entropy(logits, targets, ignore_index=-100):
        F.check_ids("cross_entropy", "targets", targets)
        if logits.ndim != 2 or targets.shape != logits.shape[:1]:
            return library(logits, targets, ignore_index)                    # its error, naming the shapes
        xp, backend = logits.xp, logits.backend
        m = logits.detach().max(1, keepdim=True)                             # (N, 1), a constant
        logp = logits - m - (logits - m).exp().sum(1, keepdim=True).log()    # (N, C)
        keep = targets.data != ignore_index
        picked = xp.astype((backend.arange(logits.shape[1])[None, :] == xp.reshape(targets.data, (-1, 1)))
                           & xp.reshape(keep, (-1, 1)), logits.data.dtype)   # (N, C): one 1 per counted row
        count = max(int(xp.sum(xp.astype(keep, xp.int64))), 1) if backend.on_host else xp.sum(keep)
        return -(logp * F.constant(logits, picked)).sum() * (1.0 / count)
    return cross_entropy


# when your piece is in and the one that would call it is the library's: the library's op, rewritten
# to call it. -> (exercise, the one it needs to be the library's, [(module, attribute, replacement)])
THROUGH_YOURS = [("softmax", "attention", [("tinyattn.nn.attention", "scaled_dot_product_attention",
                                            _attention_through_softmax)]),
                 ("elementwise", "cross_entropy", [("tinyattn.nn.functional", "cross_entropy",
                                                     _cross_entropy_through_exp_log)])]


def _where_yours_run(passing):
    """Where the GPT calls your softmax, Exp, Log and Tanh (pieces that no op of the GPT is made
    of directly), or why it does not: one line each."""
    lines = []
    modern = [f"{name} ({flag})" for name, flag in (("rmsnorm", "--norm rmsnorm"), ("rope", "--pos rope"),
                                                    ("gqa", "--n_kv_head below --n_head"), ("swiglu", "--mlp swiglu"))
              if name in passing]
    if modern:
        lines.append(f"{', '.join(modern)}: run{'s' if len(modern) == 1 else ''} in a model with "
                     f"{'that choice' if len(modern) == 1 else 'those choices'}")
    if "softmax" in passing:
        if "attention" not in passing:
            lines.append("attention runs as scores, your softmax, and the weighted sum")
        elif "cross_entropy" not in passing and "elementwise" not in passing:
            lines.append("your softmax runs in cross-entropy's backward")
        else:
            lines.append("softmax passes, but this GPT does not call it: your attention computes its own, and "
                         + ("your cross-entropy too" if "cross_entropy" in passing else "cross-entropy runs on "
                            "your Exp and Log"))
    if "elementwise" in passing:
        lines.append("your Tanh runs in GELU's backward (GPT-2's tanh approximation)")
        lines.append("cross-entropy runs as -(x[target] - max - log(sum(exp(x - max)))), with your Exp and Log"
                     if "cross_entropy" not in passing else
                     "Exp and Log pass, but this GPT does not call them: your cross-entropy computes its own")
    return lines


def _owner(path):
    """'tinyattn.tensor:Tensor' -> the Tensor class; 'tinyattn.ops' -> the module."""
    module, _, attr = path.partition(":")
    owner = importlib.import_module(module)
    return getattr(owner, attr) if attr else owner


@contextlib.contextmanager
def use_exercises(package="exercises", say=print):
    """Check every exercise of ``package``, then patch the library with the passing ones.

    Yields the names of the exercises swapped in; everything is restored on exit.
    """
    results = [r for r in check_all(package) if r.exercise.name in SWAPS or r.exercise.name in NOT_SWAPPED]
    passing = [r.exercise.name for r in results if r.passing and r.exercise.name in SWAPS]
    saved = []
    try:
        patches = [(path, attr, replacement, load_exercise(name, package))
                   for name in passing for path, attr, replacement in SWAPS[name]]
        patches += [(path, attr, replacement, None) for yours, needs, swaps in THROUGH_YOURS
                    if yours in passing and needs not in passing for path, attr, replacement in swaps]
        for path, attr, replacement, module in patches:
            owner = _owner(path)
            saved.append((owner, attr, owner.__dict__[attr]))
            setattr(owner, attr, replacement(module))
        say(describe(results, passing, package))
        yield passing
    finally:
        for owner, attr, value in reversed(saved):
            setattr(owner, attr, value)


def describe(results, passing, package):
    """Two or three lines: what runs on the learner's code, what stays the library's, and why."""
    folder = "exercises" if package == "exercises" else package
    lines = [f"--use_exercises: {len(passing)} of {len(SWAPS)} pieces are yours ({folder}/): "
             + (", ".join(passing) if passing else "none yet")]
    waiting = [f"{r.exercise.name} ({r.status})" for r in results if r.exercise.name in SWAPS and not r.passing]
    if waiting:
        lines.append("  still the library's: " + ", ".join(waiting))
    lines += [f"  {line}" for line in _where_yours_run(set(passing))]
    for name, why in NOT_SWAPPED.items():
        if name in [r.exercise.name for r in results if r.passing]:
            lines.append(f"  {name} passes but is not swapped in: {why}")
    return "\n".join(lines)
