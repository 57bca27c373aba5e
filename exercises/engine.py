"""Exercise 12 (EXERCISES.md, "Build the core"): the engine, topological sort and backward.

    python -m exercises engine

What a Tensor t knows: ``t.requires_grad``; ``t.grad_fn``, the Function
that made it (None for a leaf, such as a parameter); ``t.grad_fn.parents``,
its input Tensors; ``t.grad_fn.backward(g)``, the gradients for those inputs
(one Tensor or None each; a single one may come without a tuple).
"""
import tinyattn as ta


def toposort(roots):
    """Every tensor that requires grad and is reachable from the list ``roots``, each exactly
    once, and each one before the tensors it was computed from: roots first, leaves last."""
    raise NotImplementedError


def backward(root, gradient=None):
    """Add d root / d leaf into ``leaf.grad`` for every leaf (requires_grad, no grad_fn) under root.

    ``gradient`` is d loss / d root (default: ones, for a scalar root). A tensor
    used by several ops gets the sum of their gradients; ``.grad`` adds up
    across calls, as in PyTorch, and is the leaf's own array (not shared with
    another leaf, nor with ``gradient``). Run it under ``with ta.no_grad():``.
    """
    raise NotImplementedError
