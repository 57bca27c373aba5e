"""Exercise 14 (EXERCISES.md, "Build the core"): attention's forward, tile by tile (online softmax).

    python -m exercises online_softmax
"""
import tinyattn as ta


def tiled_attention(q, k, v, block_size=16, is_causal=False, scale=None):
    """softmax(q k^T * scale [causal]) v without ever holding the (Tq, Tk) scores. Forward only.

    q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) Tensors -> a (B, H, Tq, Dv)
    Tensor of q's dtype and device. scale defaults to 1 / sqrt(D). Work on the
    raw arrays (``q.data``, ``q.xp``; ``q.backend.full(shape, value, q.dtype)``,
    ``.zeros(shape, q.dtype)`` and ``.arange(n)`` make arrays on q's device), one
    (block, block) tile of scores at a time. The last block may be shorter: keep
    slices inside the array (``min(i0 + block_size, T)``), as a GPU library wants.
    """
    raise NotImplementedError
