"""Reference solution: attention's forward, tile by tile, with the online softmax (exercise 14 of EXERCISES.md)."""
import math

import tinyattn as ta


def tiled_attention(q, k, v, block_size=16, is_causal=False, scale=None):
    """softmax(q k^T * scale [causal]) v, one (block, block) tile of scores at a time. Forward only.

    q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) Tensors -> (B, H, Tq, Dv) Tensor.
    """
    xp, backend = q.xp, q.backend
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    dtype, device = q.dtype, q.device
    q, k, v = q.data, k.data, v.data                                        # raw arrays: no graph needed
    t_q, t_k = q.shape[-2], k.shape[-2]
    rows_out = []
    for i0 in range(0, t_q, block_size):
        q_i = q[..., i0:min(i0 + block_size, t_q), :]                                 # (B, H, bq, D)
        bq = q_i.shape[-2]
        m = backend.full(q_i.shape[:-1] + (1,), -math.inf, dtype)       # running max   (B, H, bq, 1)
        l = backend.zeros(q_i.shape[:-1] + (1,), dtype)                 # running sum   (B, H, bq, 1)
        acc = backend.zeros(q_i.shape[:-1] + (v.shape[-1],), dtype)     # running out   (B, H, bq, Dv)
        last_key = min(t_k, i0 + bq) if is_causal else t_k                  # causal: later keys are hidden
        for j0 in range(0, last_key, block_size):
            j1 = min(j0 + block_size, t_k)
            k_j, v_j = k[..., j0:j1, :], v[..., j0:j1, :]
            s = xp.matmul(q_i, xp.matrix_transpose(k_j)) * scale           # (B, H, bq, bk) one tile
            if is_causal:
                rows = backend.arange(bq)[:, None] + i0
                cols = backend.arange(k_j.shape[-2])[None, :] + j0
                s = xp.where(cols <= rows, s, -math.inf)
            m_new = xp.maximum(m, xp.max(s, axis=-1, keepdims=True))
            rescale = xp.exp(m - m_new)                                     # old sums were relative to m
            p = xp.exp(s - m_new)
            l = l * rescale + xp.sum(p, axis=-1, keepdims=True)
            acc = acc * rescale + xp.matmul(p, v_j)
            m = m_new
        rows_out.append(acc / l)
    return ta.tensor(xp.concat(rows_out, axis=-2), dtype=dtype, device=device)
