"""Memory-efficient ("flash-style") attention: softmax(q k^T * scale) v, tile by tile.

Plain attention builds the whole (Tq, Tk) score matrix, and the weights, and
keeps them for backward: memory grows as T^2. Here the queries and keys are
cut into blocks of ``block_size`` and only one (block, block) tile of scores
exists at a time, so the extra memory is O(block_size^2 * B * H).

The trick is the online softmax (FlashAttention, Dao et al. 2022). For each
query row we keep, over the key blocks seen so far,

    m    the largest score,
    l    the sum of exp(score - m),
    acc  the sum of exp(score - m) * v.

When a new key block raises the max from m to m_new, the old sums are
rescaled by exp(m - m_new), and at the end out = acc / l. Backward keeps only
q, k, v, the output and the per-row logsumexp L = m + log(l); it recomputes
each tile's weights as P = exp(s - L) and uses

    dV += P^T dO        dP = dO V^T        dS = P * (dP - D),  D = rowsum(dO * O)
    dQ += dS K * scale  dK += dS^T Q * scale

The loops are in Python, one tile at a time: on a CPU this trades speed for
memory. On a GPU the same loops would be one fused kernel.
"""
import math

from ..autograd import Function
from ..ops import causal_mask


def _mT(xp, a):
    """Swap the last two axes of a 4-d array: (B, H, n, d) -> (B, H, d, n)."""
    return xp.permute_dims(a, (0, 1, 3, 2))


def _blocks(n, size):
    """(start, stop) of consecutive blocks of ``size`` covering range(n); the last may be short."""
    return [(s, min(s + size, n)) for s in range(0, n, size)]


class FlashAttention(Function):
    """softmax(q k^T * scale [causal]) v without the (Tq, Tk) matrix.

    q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) -> (B, H, Tq, Dv).
    Causal is aligned at the top left, as in PyTorch: query i sees keys j <= i.
    """

    differentiable_backward = False      # backward works on raw arrays

    def _tile_scores(self, q_i, k_j, i0, j0):
        """Scaled scores of one tile, (B, H, bq, bk), with -inf above the diagonal when causal."""
        xp = self.xp
        s = (q_i @ _mT(xp, k_j)) * self.scale                          # (B, H, bq, bk)
        bq, bk = s.shape[-2], s.shape[-1]
        if self.is_causal and j0 + bk - 1 > i0:                        # the tile crosses the diagonal
            allowed = causal_mask(bq, bk, self.backend, offset=i0 - j0)   # key j0 + c <= query i0 + r
            s = xp.where(allowed, s, -math.inf)
        return s

    def _key_blocks(self, i1, t_k):
        """Key blocks that queries < i1 can see: with causal, blocks starting at j0 >= i1 are skipped."""
        return _blocks(min(t_k, i1) if self.is_causal else t_k, self.block_size)

    def forward(self, q, k, v, scale, is_causal, block_size):
        xp, backend = self.xp, self.backend
        self.scale, self.is_causal, self.block_size = scale, is_causal, block_size
        B, H, t_q, _ = q.shape
        t_k, d_v = k.shape[-2], v.shape[-1]
        dtype = backend.dtype_of(q)
        out = backend.zeros((B, H, t_q, d_v), dtype)                   # (B, H, Tq, Dv)
        lse = backend.zeros((B, H, t_q, 1), dtype)                     # (B, H, Tq, 1) logsumexp per row
        for i0, i1 in _blocks(t_q, block_size):
            q_i = q[..., i0:i1, :]                                     # (B, H, bq, D)
            m = backend.full((B, H, i1 - i0, 1), -math.inf, dtype)     # running max      (B, H, bq, 1)
            l = backend.zeros((B, H, i1 - i0, 1), dtype)               # running sum      (B, H, bq, 1)
            acc = backend.zeros((B, H, i1 - i0, d_v), dtype)           # running output   (B, H, bq, Dv)
            for j0, j1 in self._key_blocks(i1, t_k):
                s = self._tile_scores(q_i, k[..., j0:j1, :], i0, j0)   # (B, H, bq, bk)
                m_new = xp.maximum(m, xp.max(s, axis=-1, keepdims=True))
                m_new = xp.where(xp.isfinite(m_new), m_new, 0.0)       # a row with nothing seen yet
                p = xp.exp(s - m_new)                                  # (B, H, bq, bk), 0 where masked
                alpha = xp.exp(m - m_new)                              # rescales the old sums; 0 at the start
                l = alpha * l + xp.sum(p, axis=-1, keepdims=True)
                acc = alpha * acc + p @ v[..., j0:j1, :]
                m = m_new
            seen = l > 0                                               # False only for a fully masked row
            l = xp.where(seen, l, 1.0)
            out[..., i0:i1, :] = acc / l                               # a fully masked row stays 0
            lse[..., i0:i1, :] = xp.where(seen, m + xp.log(l), math.inf)   # +inf: P = exp(s - L) = 0
        self.save(q, k, v, out, lse)
        return out

    def backward(self, g):
        xp = self.xp
        q, k, v, out, lse = self.saved
        do = g.data                                                    # (B, H, Tq, Dv)
        t_q, t_k = q.shape[-2], k.shape[-2]
        d = xp.sum(do * out, axis=-1, keepdims=True)                   # (B, H, Tq, 1) rowsum(dO * O)
        dq, dk, dv = xp.zeros_like(q), xp.zeros_like(k), xp.zeros_like(v)
        for i0, i1 in _blocks(t_q, self.block_size):
            q_i, do_i = q[..., i0:i1, :], do[..., i0:i1, :]            # (B, H, bq, D), (B, H, bq, Dv)
            lse_i, d_i = lse[..., i0:i1, :], d[..., i0:i1, :]          # (B, H, bq, 1) each
            dq_i = xp.zeros_like(q_i)                                  # (B, H, bq, D)
            for j0, j1 in self._key_blocks(i1, t_k):
                k_j, v_j = k[..., j0:j1, :], v[..., j0:j1, :]          # (B, H, bk, D), (B, H, bk, Dv)
                p = xp.exp(self._tile_scores(q_i, k_j, i0, j0) - lse_i)   # (B, H, bq, bk) the weights
                dv[..., j0:j1, :] += _mT(xp, p) @ do_i                 # (B, H, bk, Dv)
                dp = do_i @ _mT(xp, v_j)                               # (B, H, bq, bk)
                ds = p * (dp - d_i)                                    # (B, H, bq, bk) d loss / d scores
                dq_i += ds @ k_j                                       # (B, H, bq, D)
                dk[..., j0:j1, :] += _mT(xp, ds) @ q_i                 # (B, H, bk, D)
            dq[..., i0:i1, :] = dq_i * self.scale
        dk = dk * self.scale
        need_q, need_k, need_v = self.needs_input_grad
        return (self.constant(dq) if need_q else None,
                self.constant(dk) if need_k else None,
                self.constant(dv) if need_v else None)


def flash_attention(q, k, v, is_causal=False, scale=None, block_size=64):
    """softmax(q k^T * scale) v, computed in (block_size, block_size) tiles.

    q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) -> (B, H, Tq, Dv).
    The same numbers as ``scaled_dot_product_attention(q, k, v, is_causal=...)``
    but the (Tq, Tk) scores are never built, so memory grows as T, not T^2.
    scale defaults to 1/sqrt(D). is_causal: query i sees keys j <= i (top left).
    Its backward is fused: it cannot be differentiated twice.
    """
    if (q.ndim != 4 or k.ndim != 4 or v.ndim != 4 or q.shape[:2] != k.shape[:2]
            or k.shape[:2] != v.shape[:2] or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]):
        raise ValueError(f"flash_attention: expected q (B, H, Tq, D), k (B, H, Tk, D) and v (B, H, Tk, Dv), "
                         f"got q {q.shape}, k {k.shape} and v {v.shape}")
    if int(block_size) < 1:
        raise ValueError(f"flash_attention: block_size must be at least 1, got {block_size}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return FlashAttention.apply(q, k, v, scale=scale, is_causal=bool(is_causal), block_size=int(block_size))
