"""Memory-efficient ("flash-style") attention: softmax(q k^T * scale + mask) v, tile by tile.

Plain attention builds the whole (Tq, Tk) score matrix, and the weights, and
keeps them for backward: memory grows as T^2. Here the queries and keys are
cut into blocks of ``block_size`` and only one (block, block) tile of scores
exists at a time, so the extra memory is O(block_size^2) per head at work.

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

The loops are in Python, one tile at a time. What makes them fast on a CPU
(each measured with numpy on a 2-core machine):

- 256 x 256 tiles and one head per piece of work: the tiles stay in the L2
  cache, and each matmul is big enough for BLAS.
- The heads are shared out over threads (numpy's matmul and ufuncs release
  the GIL), with BLAS held at one thread each (threadpoolctl, if installed;
  without it the heads run one after another and BLAS uses its own threads).
- Scores in base 2: scale * log2(e) is folded into q once, and ``exp2`` is
  about 1.8x faster than ``exp`` in numpy.
- Tiles are computed transposed, keys x queries, so the reductions over keys
  (the row max, the row sum) run down the columns, which numpy does fast.
- In backward, L and D are subtracted inside the matmuls: q gets an extra
  column -L and k a column of ones, so k q^T comes out as s - L; likewise
  dO gets a column -D and v a column of ones.

On other devices (CuPy, the array-API stand-in) every head is done at once,
batched, in the same loops, with ``exp`` where there is no ``exp2``.
"""
import math
import os
from concurrent.futures import ThreadPoolExecutor

from ..tensor import Function
from ..ops import _const

BLOCK_SIZE = 256                     # tile side: (256, 256) float32 scores are 256 KiB, in L2
LOG2E = 1.4426950408889634           # exp(x) = exp2(x * log2(e))


def _mT(xp, a):
    """Swap the last two axes: (..., n, d) -> (..., d, n), a view."""
    axes = list(range(a.ndim))
    axes[-2], axes[-1] = axes[-1], axes[-2]
    return xp.permute_dims(a, tuple(axes))


def _blocks(n, size):
    """(start, stop) of consecutive blocks of ``size`` covering range(n); the last may be short."""
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def _mask_tile(m, item, i0, i1, j0, j1):
    """The (.., bq, bk) part of the 4-d mask m for these heads and positions; size-1 axes stay size 1."""
    index = tuple(i if n > 1 else (0 if isinstance(i, int) else slice(None))
                  for i, n in zip(item[:2], m.shape[:2]))
    rows = slice(i0, i1) if m.shape[2] > 1 else slice(None)
    cols = slice(j0, j1) if m.shape[3] > 1 else slice(None)
    return m[index + (rows, cols)]


# ---------------------------------------------------------------- threads
_pool = None                         # (ThreadPoolExecutor, its size), made on first use
_blas = None                         # threadpoolctl's controller; False when it is not installed


def _cpu_count():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                                         # not on Linux
        return os.cpu_count() or 1


def _one_blas_thread():
    """A context that holds BLAS at one thread, or None without threadpoolctl."""
    global _blas
    if _blas is None:
        try:
            from threadpoolctl import ThreadpoolController
            _blas = ThreadpoolController()
        except ImportError:
            _blas = False
    return _blas.limit(limits=1, user_api="blas") if _blas else None


def _for_each(fn, items, threads):
    """fn(item) for every item, with BLAS held at one thread (a tile is too small to share out),
    over ``threads`` threads. Without threadpoolctl, in order, leaving BLAS as it is."""
    global _pool
    limit = _one_blas_thread() if threads else None
    threads = min(threads, len(items))
    if limit is None:
        for item in items:
            fn(item)
        return
    with limit:
        if threads == 1:
            for item in items:
                fn(item)
            return
        if _pool is None or _pool[1] < threads:
            _pool = (ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tinyattn-attention"), threads)
        for _ in _pool[0].map(fn, items):                         # re-raises a worker's error here
            pass


# ---------------------------------------------------------------- the op
class FlashAttention(Function):
    """softmax(q k^T * scale + mask [causal]) v without the (Tq, Tk) matrix.

    q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) -> (B, H, Tq, Dv).
    mask: None, or a boolean (True = may attend) or additive array
    broadcastable to (B, H, Tq, Tk); it gets no gradient.
    Causal is aligned at the top left, as in PyTorch: query i sees keys j <= i.
    A query that may see no key at all gets a zero output and zero gradients.
    """

    differentiable_backward = False      # backward works on raw arrays: use the naive path for that

    def forward(self, q, k, v, mask, scale, is_causal, block_size, threads):
        xp, backend = self.xp, self.backend
        B, H, t_q, _ = q.shape
        t_k, d_v = k.shape[-2], v.shape[-1]
        dtype = backend.dtype_of(q)
        self.scale, self.is_causal, self.block_size = scale, is_causal, block_size
        self.base2 = hasattr(xp, "exp2")                            # numpy and CuPy; the array API has no exp2
        self.log_unit = LOG2E if self.base2 else 1.0               # scores are kept in these units
        self.pos = backend.arange(max(t_q, t_k))                   # positions, for the causal mask
        if mask is not None and backend.dtype_of(mask).kind != "b":
            mask = xp.astype(mask, q.dtype) * self.log_unit        # additive: into the scores' units
        # numpy: one head per piece of work, shared over threads; elsewhere: all heads at once
        self.items = ([(b, h, ...) for b in range(B) for h in range(H)] if backend.name == "cpu"
                      else [(slice(None), slice(None), ...)])
        self.threads = threads if backend.name == "cpu" else 0    # 0: in order, BLAS left alone
        out = backend.zeros((B, H, t_q, d_v), dtype)               # (B, H, Tq, Dv)
        lse = backend.zeros((B, H, t_q), dtype)                    # (B, H, Tq) logsumexp per row

        def heads(item):
            out[item], lse[item] = self._forward_heads(q[item], k[item], v[item], mask, item)
        _for_each(heads, self.items, threads)
        self.saved = (q, k, v, out, lse, mask)
        return out

    def _forward_heads(self, q, k, v, mask, item):
        """Output (.., Tq, Dv) and logsumexp (.., Tq) of the heads in ``item``: '..' is () or (B, H)."""
        xp, backend = self.xp, self.backend
        q = q * (self.scale * self.log_unit)                       # (.., Tq, D) scores come out in log_unit
        lead, t_q, t_k, dtype = q.shape[:-2], q.shape[-2], k.shape[-2], backend.dtype_of(q)
        out = backend.zeros(lead + (t_q, v.shape[-1]), dtype)
        lse = backend.zeros(lead + (t_q,), dtype)
        for i0, i1 in _blocks(t_q, self.block_size):
            q_i = q[..., i0:i1, :]                                 # (.., bq, D)
            m = backend.full(lead + (1, i1 - i0), -math.inf, dtype)   # running max    (.., 1, bq)
            l = backend.zeros(lead + (1, i1 - i0), dtype)          # running sum      (.., 1, bq)
            acc = backend.zeros(lead + (i1 - i0, v.shape[-1]), dtype)  # running output (.., bq, Dv)
            for j0, j1 in self._key_blocks(i1, t_k):
                s = self._tile(k[..., j0:j1, :], q_i, i0, j0, mask, item)   # (.., bk, bq) keys x queries
                m_new = xp.maximum(m, xp.max(s, axis=-2, keepdims=True))
                shift = xp.where(xp.isfinite(m_new), m_new, 0.0)   # a row that has seen nothing yet: 0
                s -= shift
                p = self._exp_(s)                                  # (.., bk, bq), 0 where masked
                alpha = self._exp_(m - shift)                      # rescales the old sums; 0 at the start
                l = alpha * l + xp.sum(p, axis=-2, keepdims=True)
                acc = _mT(xp, alpha) * acc + _mT(xp, p) @ v[..., j0:j1, :]
                m = m_new
            seen = l > 0                                           # False only for a fully masked row
            l = xp.where(seen, l, 1.0)
            out[..., i0:i1, :] = acc / _mT(xp, l)                  # a fully masked row stays 0
            lse[..., i0:i1] = xp.where(seen, m + self._log(l), math.inf)[..., 0, :]  # +inf: P = 0
        return out, lse

    def backward(self, g):
        q, k, v, out, lse, mask = self.saved
        do = g.data                                                # (B, H, Tq, Dv)
        dq, dk, dv = (self.xp.zeros_like(a) for a in (q, k, v))

        def heads(item):
            dq[item], dk[item], dv[item] = self._backward_heads(q[item], k[item], v[item], out[item],
                                                                lse[item], do[item], mask, item)
        _for_each(heads, self.items, self.threads)
        need_q, need_k, need_v = self.needs_input_grad
        return (_const(g, dq) if need_q else None,
                _const(g, dk) if need_k else None,
                _const(g, dv) if need_v else None)

    def _backward_heads(self, q, k, v, out, lse, do, mask, item):
        """dq, dk, dv of the heads in ``item``, with the weights recomputed tile by tile."""
        xp, backend = self.xp, self.backend
        lse = lse[..., None]                                       # (.., Tq, 1)
        lead, t_q, t_k, dtype = q.shape[:-2], q.shape[-2], k.shape[-2], backend.dtype_of(q)
        ones = backend.full(lead + (t_k, 1), 1.0, dtype)           # (.., Tk, 1)
        d = xp.sum(do * out, axis=-1, keepdims=True)               # (.., Tq, 1) rowsum(dO * O)
        qx = xp.concat([q * (self.scale * self.log_unit), -lse], axis=-1)   # (.., Tq, D+1)
        kx = xp.concat([k, ones], axis=-1)                         # (.., Tk, D+1): kx qx^T = s - L
        dox = xp.concat([do, -d], axis=-1)                         # (.., Tq, Dv+1)
        vx = xp.concat([v, ones], axis=-1)                         # (.., Tk, Dv+1): vx dox^T = dP^T - D
        dq, dk, dv = (xp.zeros_like(a) for a in (q, k, v))
        for i0, i1 in _blocks(t_q, self.block_size):
            qx_i, dox_i = qx[..., i0:i1, :], dox[..., i0:i1, :]    # (.., bq, D+1), (.., bq, Dv+1)
            dq_i = xp.zeros_like(q[..., i0:i1, :])                 # (.., bq, D)
            for j0, j1 in self._key_blocks(i1, t_k):
                p = self._exp_(self._tile(kx[..., j0:j1, :], qx_i, i0, j0, mask, item))   # (.., bk, bq) P^T
                dv[..., j0:j1, :] += p @ do[..., i0:i1, :]         # (.., bk, Dv)
                ds = vx[..., j0:j1, :] @ _mT(xp, dox_i)            # (.., bk, bq) dP^T - D
                ds *= p                                            # dS^T = P^T * (dP^T - D)
                dk[..., j0:j1, :] += ds @ q[..., i0:i1, :]         # (.., bk, D)
                dq_i += _mT(xp, ds) @ k[..., j0:j1, :]             # (.., bq, D)
            dq[..., i0:i1, :] = dq_i
        dq *= self.scale
        dk *= self.scale
        return dq, dk, dv

    # --- one tile -----------------------------------------------------------
    def _key_blocks(self, i1, t_k):
        """Key blocks that queries < i1 can see: with causal, blocks starting at j0 >= i1 are skipped."""
        return _blocks(min(t_k, i1) if self.is_causal else t_k, self.block_size)

    def _tile(self, kx_j, qx_i, i0, j0, mask, item):
        """One tile of scores, transposed: (.., bk, bq) keys x queries, -inf where masked."""
        xp = self.xp
        s = kx_j @ _mT(xp, qx_i)                                   # (.., bk, bq)
        bk, bq = s.shape[-2], s.shape[-1]
        if self.is_causal and j0 + bk - 1 > i0:                    # the tile crosses the diagonal
            later = self.pos[j0:j0 + bk, None] > self.pos[None, i0:i0 + bq]   # (bk, bq) key after query
            s = xp.where(later, -math.inf, s)
        if mask is not None:
            part = _mT(xp, _mask_tile(mask, item, i0, i0 + bq, j0, j0 + bk))  # (.., bk, bq)
            s = xp.where(part, s, -math.inf) if self.backend.dtype_of(part).kind == "b" else s + part
        return s

    def _exp_(self, s):
        """exp2(s) (or exp(s)), in place where the library allows it: s is a temporary."""
        if self.base2:
            return self.xp.exp2(s, out=s)
        return self.xp.exp(s)

    def _log(self, x):
        return self.xp.log2(x) if self.base2 else self.xp.log(x)


def flash_attention(q, k, v, is_causal=False, scale=None, block_size=None, attn_mask=None, threads=None):
    """softmax(q k^T * scale + mask) v, computed in (block_size, block_size) tiles (default 256).

    q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) -> (B, H, Tq, Dv).
    The same numbers as ``scaled_dot_product_attention(q, k, v, attn_mask, is_causal)``
    but the (Tq, Tk) scores are never built, so memory grows as T, not T^2.
    scale defaults to 1/sqrt(D). is_causal: query i sees keys j <= i (top left).
    attn_mask: boolean (True = may attend) or float (added to the scores),
    broadcastable to (B, H, Tq, Tk), with no gradient. threads: how many
    threads share the heads on the CPU (default: one per core).
    Its backward is fused: it cannot be differentiated twice.
    """
    if (q.ndim != 4 or k.ndim != 4 or v.ndim != 4 or q.shape[:2] != k.shape[:2]
            or k.shape[:2] != v.shape[:2] or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]):
        raise ValueError(f"flash_attention: expected q (B, H, Tq, D), k (B, H, Tk, D) and v (B, H, Tk, Dv), "
                         f"got q {q.shape}, k {k.shape} and v {v.shape}")
    block_size = BLOCK_SIZE if block_size is None else block_size
    if int(block_size) < 1:
        raise ValueError(f"flash_attention: block_size must be at least 1, got {block_size}")
    mask = None
    if attn_mask is not None:
        if attn_mask.requires_grad:
            raise ValueError("flash_attention: the mask gets no gradient here; for a learned additive "
                             "mask use scaled_dot_product_attention(..., impl='naive')")
        full = q.shape[:2] + (q.shape[2], k.shape[2])
        shape = (1,) * (4 - attn_mask.ndim) + attn_mask.shape
        if attn_mask.ndim > 4 or any(m not in (1, n) for m, n in zip(shape, full)):
            raise ValueError(f"flash_attention: attn_mask {attn_mask.shape} does not broadcast to "
                             f"(B, H, Tq, Tk) = {full}")
        mask = attn_mask.xp.reshape(attn_mask.data, shape)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    threads = _cpu_count() if threads is None else max(1, int(threads))
    return FlashAttention.apply(q, k, v, mask=mask, scale=scale, is_causal=bool(is_causal),
                                block_size=int(block_size), threads=threads)
