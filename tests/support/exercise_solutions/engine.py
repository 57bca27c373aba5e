"""Reference solution: the engine's topological sort and backward pass (exercise 12 of EXERCISES.md)."""
import tinyattn as ta


def toposort(roots):
    """Every tensor that requires grad and is reachable from ``roots``, each one before
    the tensors it was computed from (so the roots come first, the leaves last)."""
    order, visited = [], set()
    for root in roots:
        stack = [(root, False)]                                 # (tensor, its inputs are done)
        while stack:
            t, inputs_done = stack.pop()
            if inputs_done:
                order.append(t)                                 # after everything it was made from
                continue
            if id(t) in visited or not t.requires_grad:
                continue
            visited.add(id(t))
            stack.append((t, True))
            if t.grad_fn is not None:
                stack.extend((p, False) for p in t.grad_fn.parents)
    return order[::-1]


def backward(root, gradient=None):
    """Add d root / d leaf into ``leaf.grad`` for every leaf that requires grad."""
    if gradient is None:
        gradient = ta.ones_like(root)
    pending = {id(root): gradient}                              # gradients summed so far, per tensor
    with ta.no_grad():                                          # the backward pass records no graph
        for t in toposort([root]):
            g = pending.pop(id(t), None)
            if g is None:
                continue
            if t.grad_fn is None:                               # a leaf: accumulate, as PyTorch does
                # g may be another leaf's gradient too (a + b) or the caller's: the leaf gets a copy
                t.grad = g.clone() if t.grad is None else t.grad + g
                continue
            grads = t.grad_fn.backward(g)
            grads = grads if isinstance(grads, tuple) else (grads,)
            for parent, pg in zip(t.grad_fn.parents, grads):
                if pg is not None and parent.requires_grad:
                    pending[id(parent)] = pg if id(parent) not in pending else pending[id(parent)] + pg
