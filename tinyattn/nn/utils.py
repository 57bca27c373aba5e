"""Training utilities: the norm of all gradients together, and clipping them to a limit.

``clip_grad_norm_`` is the two steps PyTorch also offers apart: ``get_total_norm`` of
the gradients, then ``clip_grads_with_norm_`` (so a norm can be reduced across
processes, or logged, between them).
"""
from ..autograd import is_tensor
from ..ops import constant
from ..tensor import tensor


def get_total_norm(tensors, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """The p-norm of ``tensors`` taken together, as if they were one flat vector: a 0-d Tensor
    (a float32 0 for no tensors, as in PyTorch).

    ``tensors``: an iterable of tensors (usually gradients), or one tensor. ``norm_type``: the p,
    2 by default, any p > 0, or ``float("inf")`` for the largest |x|. ``error_if_nonfinite``:
    refuse a NaN or infinite norm (reading it back costs a sync on a GPU). ``foreach`` picks
    one of PyTorch's kernels; there is one way here, and it is ignored. The norm stays on the
    device, computed on the arrays (no graph).
    """
    tensors = [tensors] if is_tensor(tensors) else list(tensors)
    if not tensors:
        return tensor(0.0)
    arrays = [t.data for t in tensors]
    xp, backend = tensors[0].xp, tensors[0].backend
    norm_type = float(norm_type)
    if norm_type == 2.0:
        norm = xp.sqrt(sum(backend.sum_of_squares(a) for a in arrays))
    elif norm_type == float("inf"):
        norm = xp.max(xp.stack([xp.max(xp.abs(a)) if a.size else xp.zeros((), a.dtype) for a in arrays]))
    elif norm_type > 0:
        norm = sum(xp.sum(xp.abs(a) ** norm_type) for a in arrays) ** (1.0 / norm_type)
    else:
        raise ValueError(f"get_total_norm: norm_type must be positive (2, 1, float('inf'), ...), got {norm_type}")
    if error_if_nonfinite and not bool(xp.isfinite(norm)):
        raise RuntimeError(f"get_total_norm: the total norm of order {norm_type} of the gradients is non-finite "
                           f"({float(norm)}), so they cannot be clipped; error_if_nonfinite=False scales them anyway")
    return constant(tensors[0], xp.asarray(norm))


def clip_grads_with_norm_(parameters, max_norm, total_norm, foreach=None):
    """Scale the gradients of ``parameters`` by min(1, max_norm / (total_norm + 1e-6)), in place:
    ``total_norm`` is their norm, from ``get_total_norm``. Returns None.

    Nothing is read back from the device (min is taken there); on the CPU, where reading costs
    nothing, gradients under the limit are left as they are.
    """
    grads = [p.grad for p in ([parameters] if is_tensor(parameters) else parameters) if p.grad is not None]
    if not grads:
        return
    xp, backend = grads[0].xp, grads[0].backend
    norm = total_norm.data if is_tensor(total_norm) else xp.asarray(float(total_norm))
    coef = xp.asarray(xp.minimum(max_norm / (norm + 1e-6), 1.0))
    if backend.on_host and float(coef) >= 1.0:
        return
    scale = {}                                                # coef in each gradient's dtype, made once
    for g in grads:
        dtype = g.data.dtype
        if dtype not in scale:
            scale[dtype] = xp.astype(coef, dtype)
        g.data = g.data * scale[dtype]                        # a new array: gradients that share one are scaled once


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Scale all gradients so that their global norm is at most ``max_norm``: ``get_total_norm``
    of the gradients, then ``clip_grads_with_norm_``. Returns the norm before clipping, a 0-d
    Tensor.

    ``parameters``: an iterable of tensors, or one tensor; no parameters give a norm of 0, as in
    PyTorch. Parameters of which none has a gradient are refused (PyTorch returns 0): that is a
    forgotten ``backward()``, and clipping nothing would hide it.
    """
    parameters = [parameters] if is_tensor(parameters) else list(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    if parameters and not grads:
        raise ValueError("clip_grad_norm_: no parameter has a gradient")
    norm = get_total_norm(grads, norm_type, error_if_nonfinite)
    clip_grads_with_norm_(parameters, max_norm, norm)
    return norm

