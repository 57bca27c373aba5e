"""Training utilities."""
from ..autograd import is_tensor
from ..ops import constant


def clip_grad_norm_(parameters, max_norm, norm_type=2.0):
    """Scale all gradients so that their global norm is at most ``max_norm``.

    ``parameters``: an iterable of tensors, or one tensor. ``norm_type``: the p of the
    p-norm over all gradients together (2 by default; ``float("inf")`` for the largest |g|).
    Returns the norm before clipping as a 0-d Tensor. Everything stays on the
    device: the scale is min(1, max_norm / norm), so no value is read back
    (on the CPU, where reading costs nothing, gradients under the limit are left as they are).
    """
    if is_tensor(parameters):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        raise ValueError("clip_grad_norm_: no parameter has a gradient")
    xp, backend = grads[0].xp, grads[0].backend
    norm_type = float(norm_type)
    if norm_type == 2.0:
        norm = xp.sqrt(sum(backend.sum_of_squares(g.data) for g in grads))
    elif norm_type == float("inf"):
        norm = xp.max(xp.stack([xp.max(xp.abs(g.data)) for g in grads if g.data.size] or [xp.zeros((), grads[0].data.dtype)]))
    elif norm_type > 0:
        norm = sum(xp.sum(xp.abs(g.data) ** norm_type) for g in grads) ** (1.0 / norm_type)
    else:
        raise ValueError(f"clip_grad_norm_: norm_type must be positive (2, 1, float('inf'), ...), got {norm_type}")
    coef = xp.minimum(max_norm / (norm + 1e-6), 1.0)
    if backend.on_host and float(coef) >= 1.0:      # on the host the read is free: no pass needed
        return constant(grads[0], norm)
    for g in grads:
        g.data = g.data * coef
    return constant(grads[0], norm)
