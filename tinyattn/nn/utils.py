"""Training utilities."""
from ..ops import constant


def clip_grad_norm_(parameters, max_norm):
    """Scale all gradients so that their global L2 norm is at most ``max_norm``.

    Returns the norm before clipping as a 0-d Tensor. Everything stays on the
    device: the scale is min(1, max_norm / norm), so no value is read back
    (on the CPU, where reading costs nothing, gradients under the limit are left as they are).
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        raise ValueError("clip_grad_norm_: no parameter has a gradient")
    xp, backend = grads[0].xp, grads[0].backend
    total_sq = sum(backend.sum_of_squares(g.data) for g in grads)
    norm = xp.sqrt(total_sq)
    coef = xp.minimum(max_norm / (norm + 1e-6), 1.0)
    if backend.on_host and float(coef) >= 1.0:      # on the host the read is free: no pass needed
        return constant(grads[0], norm)
    for g in grads:
        g.data = g.data * coef
    return constant(grads[0], norm)
