"""Train on your own code: swap every passing piece of yours into the library, for one run.

    with use_exercises() as swapped:      # what ``python -m train --use_exercises`` does
        ...                               # tinyattn now runs your softmax, LayerNorm, AdamW, ...

Each passing exercise of "Build the core" names the library attributes it
replaces. They are patched on entry and restored on exit.
"""
import contextlib
import importlib

from .progress import check_all, extend


def _attention(module):
    """The library's attention signature, running yours when no mask, dropout or weights are asked for."""
    import tinyattn.nn.functional as F
    library = F.scaled_dot_product_attention

    def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False, dropout_p=0.0, scale=None,
                                     return_weights=False, impl="auto"):
        if attn_mask is None and dropout_p == 0.0 and not return_weights and impl != "tiled":
            return module.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)
        return library(q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p, scale=scale,
                       return_weights=return_weights, impl=impl)
    return scaled_dot_product_attention


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


def _yours(name):
    return lambda module: getattr(module, name)


# exercise: [(library module, attribute, your replacement from your module), ...]
SWAPS = {
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
    "attention": [("tinyattn.nn.functional", "scaled_dot_product_attention", _attention)],
    "adamw": [("tinyattn.optim", "AdamW", _yours("AdamW"))],
    "kv_cache": [("tinyattn.nn", "KVCache", _yours("KVCache"))],
}
NOT_SWAPPED = {"online_softmax": "the GPT's training does not run tiled attention"}


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
        for name in passing:
            module = extend.load_exercise(name, package)
            for path, attr, replacement in SWAPS[name]:
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
    for name, why in NOT_SWAPPED.items():
        if name in [r.exercise.name for r in results if r.passing]:
            lines.append(f"  {name} passes but is not swapped in: {why}")
    return "\n".join(lines)
