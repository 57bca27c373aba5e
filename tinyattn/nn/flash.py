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

The loops are in Python, one tile at a time: on the CPU one head at a time
(a (256, 256) tile of one head stays in the L2 cache, and each product is
big enough for BLAS to run at full speed), elsewhere all heads at once,
batched. Tiles are computed transposed, keys x queries, so the reductions
over keys (the row max, the row sum) run down the columns, which numpy does
fast. In a compiled model (``ta.compile``), the fast layer (``tinyattn/fast``)
shares the heads over the CPU's threads and runs each tile's elementwise work
as one fused kernel, around these loops.
"""
import math

from ..autograd import Function
from ..backend import host_rng
from ..errors import TensorError
from ..ops import causal_mask, check_same_dtype, matrix_transpose

BLOCK_SIZE = 256                     # tile side: (256, 256) float32 scores are 256 KiB, in L2


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


# ---------------------------------------------------------------- the op
ALL_HEADS = (slice(None), slice(None), ...)


class FlashAttention(Function):
    """softmax(q k^T * scale + mask [causal]) v without the (Tq, Tk) matrix.

    q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) -> (B, H, Tq, Dv).
    mask: None, or a boolean (True = may attend) or additive array
    broadcastable to (B, H, Tq, Tk); it gets no gradient.
    Causal is aligned at the top left, as in PyTorch: query i sees keys j <= i.
    A query that may see no key at all gets a zero output and zero gradients.
    """

    differentiable_backward = False      # backward works on raw arrays: use the naive path for that

    def forward(self, q, k, v, mask, scale, is_causal, block_size, dropout_p=0.0, seed=0):
        backend = self.backend
        B, H, t_q, _ = q.shape
        self.scale, self.is_causal, self.block_size = scale, is_causal, block_size
        self.dropout_p, self.seed, self.dtype = dropout_p, seed, backend.dtype_of(q)
        self.in_place = backend.ufunc_out                          # numpy and CuPy take out=
        if mask is not None and backend.dtype_of(mask).kind != "b":
            mask = self.xp.astype(mask, q.dtype)                   # additive, in q's dtype
        # numpy: one head per piece of work, shared over threads; elsewhere all heads at once, in order
        on_cpu = backend.on_host
        self.items = [(b, h, ...) for b in range(B) for h in range(H)] if on_cpu else [ALL_HEADS]
        out = backend.zeros((B, H, t_q, v.shape[-1]), backend.dtype_of(q))   # (B, H, Tq, Dv)
        lse = backend.zeros((B, H, t_q), backend.dtype_of(q))      # (B, H, Tq) logsumexp per row
        self.for_each_item(lambda item: self._forward_heads(*_parts(item, q, k, v, out, lse), mask, item))
        self.save(q, k, v, out, lse, mask)
        return out

    def for_each_item(self, fn):
        """fn(item) for each piece of work: one head on the CPU, all heads at once elsewhere."""
        for item in self.items:
            fn(item)

    def _forward_heads(self, q, k, v, out, lse, mask, item):
        """Fill out (.., Tq, Dv) and lse (.., Tq) for the heads in ``item``; '..' is () or (B, H)."""
        xp, backend = self.xp, self.backend
        lead, dtype = q.shape[:-2], backend.dtype_of(q)
        for i0, i1 in _blocks(q.shape[-2], self.block_size):
            q_i = q[..., i0:i1, :] * self.scale                    # (.., bq, D)
            m = backend.full(lead + (i1 - i0,), -math.inf, dtype)  # running max            (.., bq)
            l = backend.zeros(lead + (i1 - i0,), dtype)            # running sum of exp     (.., bq)
            acc = backend.zeros(lead + (i1 - i0, v.shape[-1]), dtype)   # running output (.., bq, Dv)
            for j0, j1 in self._key_blocks(i1, k.shape[-2]):
                s = self._tile(k[..., j0:j1, :], q_i, i0, j0, mask, item)   # (.., bk, bq) keys x queries
                p, alpha, m, l = self._softmax_tile(s, m, l, j0 - i0)      # P~ = exp(s - m_new), in place
                keep = self._keep(item, i0, j0, p.shape)           # dropout: l counts every weight, acc the kept
                if keep is not None:
                    p *= keep
                acc = alpha[..., None] * acc + matrix_transpose(xp, p) @ v[..., j0:j1, :]
            self._finish_rows(out[..., i0:i1, :], lse[..., i0:i1], acc, m, l)

    def _finish_rows(self, out, lse, acc, m, l):
        """A block of query rows is done: out = acc / l and lse = m + log(l) (.., bq), written in place."""
        xp = self.xp
        seen = l > 0                                               # False only for a fully masked row
        l = xp.where(seen, l, 1.0)
        out[...] = acc / l[..., None]                              # a fully masked row stays 0
        lse[...] = xp.where(seen, m + xp.log(l), math.inf)        # +inf: P = 0 in backward

    def backward(self, g):
        q, k, v, out, lse, mask = self.saved
        do = g.data                                                # (B, H, Tq, Dv)
        dq, dk, dv = (self.xp.zeros_like(a) for a in (q, k, v))
        self.for_each_item(lambda item: self._backward_heads(*_parts(item, q, k, v, out, lse, do, dq, dk, dv),
                                                             mask, item))
        need_q, need_k, need_v = self.needs_input_grad
        return (self.constant(dq) if need_q else None,
                self.constant(dk) if need_k else None,
                self.constant(dv) if need_v else None)

    def _backward_heads(self, q, k, v, out, lse, do, dq, dk, dv, mask, item):
        """Add the gradients of the heads in ``item`` into dq, dk, dv, recomputing the weights tile by tile."""
        xp = self.xp
        for i0, i1 in _blocks(q.shape[-2], self.block_size):
            do_i = do[..., i0:i1, :]                               # (.., bq, Dv)
            q_i = q[..., i0:i1, :] * self.scale                    # (.., bq, D)
            d_i = xp.sum(do_i * out[..., i0:i1, :], axis=-1)       # (.., bq) D = rowsum(dO * O)
            dq_i = xp.zeros_like(q_i)                              # (.., bq, D)
            for j0, j1 in self._key_blocks(i1, k.shape[-2]):
                s = self._tile(k[..., j0:j1, :], q_i, i0, j0, mask, item)   # (.., bk, bq) S^T
                dp = v[..., j0:j1, :] @ matrix_transpose(xp, do_i)              # (.., bk, bq) dP^T = (dO V^T)^T
                keep = self._keep(item, i0, j0, s.shape)
                if keep is not None:                               # dropout: out = (P * Z) V
                    dp *= keep
                p, ds = self._softmax_grad_tile(s, dp, lse[..., i0:i1], d_i, j0 - i0)   # P^T, dS^T
                dv[..., j0:j1, :] += (p if keep is None else p * keep) @ do_i   # (.., bk, Dv)
                dk[..., j0:j1, :] += ds @ q_i                      # (.., bk, D), q already scaled
                dq_i += matrix_transpose(xp, ds) @ k[..., j0:j1, :]             # (.., bq, D)
            dq[..., i0:i1, :] = dq_i * self.scale

    # --- one tile -----------------------------------------------------------
    # "first" = j0 - i0: key j0 + r may be seen by query i0 + c when c >= first + r (causal).
    def _key_blocks(self, i1, t_k):
        """Key blocks that queries < i1 can see: with causal, blocks starting at j0 >= i1 are skipped."""
        return _blocks(min(t_k, i1) if self.is_causal else t_k, self.block_size)

    def _tile(self, k_j, q_i, i0, j0, mask, item):
        """One tile of scaled scores, transposed: (.., bk, bq) keys x queries, -inf where ``mask`` says
        (the causal mask comes later, in the softmax of the tile)."""
        xp = self.xp
        s = k_j @ matrix_transpose(xp, q_i)                                     # (.., bk, bq)
        if mask is not None:
            bk, bq = s.shape[-2], s.shape[-1]
            part = matrix_transpose(xp, _mask_tile(mask, item, i0, i0 + bq, j0, j0 + bk))  # (.., bk, bq)
            s = xp.where(part, s, -math.inf) if self.backend.dtype_of(part).kind == "b" else s + part
        return s

    def _causal(self, s, first):
        """s with -inf where the key comes after the query (causal), for a tile that crosses the diagonal."""
        bk, bq = s.shape[-2], s.shape[-1]
        if not self.is_causal or first + bk - 1 <= 0:              # every key here is before every query
            return s
        allowed = causal_mask(bq, bk, self.backend, offset=-first)   # (bq, bk): key j0 + c <= query i0 + r
        return self.xp.where(self.xp.permute_dims(allowed, (1, 0)), s, -math.inf)

    def _softmax_tile(self, s, m, l, first):
        """One key block of the online softmax. s (.., bk, bq) scores; m, l (.., bq) the running max and sum.

        Returns P~ = exp(s - m_new) (0 where masked; s itself, overwritten, where it can be),
        alpha = exp(m - m_new) to rescale the old sums, m_new, and l_new = alpha l + colsum(P~)."""
        first = first if self.is_causal else -s.shape[-2]
        xp = self.xp
        s = self._causal(s, first)
        m_new = xp.maximum(m, xp.max(s, axis=-2))
        shift = xp.where(xp.isfinite(m_new), m_new, 0.0)           # a query that has seen nothing yet: 0
        s -= shift[..., None, :]
        p = self._exp_(s)                                          # (.., bk, bq), 0 where masked
        alpha = self._exp_(m - shift)                              # 0 at the start (m = -inf)
        return p, alpha, m_new, alpha * l + xp.sum(p, axis=-2)

    def _softmax_grad_tile(self, s, dp, lse, d, first):
        """P^T = exp(s - L) and dS^T = P^T * (dP^T - D) for one tile (.., bk, bq); lse = L, d = D (.., bq).
        Overwrites s and dp where it can."""
        first = first if self.is_causal else -s.shape[-2]
        s = self._causal(s, first)
        s -= lse[..., None, :]
        p = self._exp_(s)                                          # 0 where masked or L = +inf
        dp -= d[..., None, :]
        dp *= p
        return p, dp

    def _keep(self, item, i0, j0, shape):
        """Dropout's mask for one tile, scaled by 1/(1-p): the same numbers in forward and backward,
        drawn from a generator seeded by (seed, the heads, the tile). None without dropout."""
        if not self.dropout_p:
            return None
        heads = tuple(i for i in item[:2] if isinstance(i, int))     # (b, h), or () for all heads at once
        rng = host_rng((self.seed,) + heads + (i0, j0))
        keep = rng.random(shape, dtype="float32") >= self.dropout_p
        return self.backend.asarray(keep.astype(self.dtype) / (1.0 - self.dropout_p), self.dtype)

    def _exp_(self, s):
        """exp(s), in place where the library allows it: s is a temporary."""
        return self.xp.exp(s, out=s) if self.in_place else self.xp.exp(s)


def _parts(item, *arrays):
    """The heads ``item`` of each (B, H, ...) array: views on numpy, the arrays themselves for ALL_HEADS."""
    return arrays if item is ALL_HEADS else tuple(a[item] for a in arrays)


def flash_attention(q, k, v, is_causal=False, scale=None, block_size=None, attn_mask=None, dropout_p=0.0):
    """softmax(q k^T * scale + mask) v, computed in (block_size, block_size) tiles (default 256).

    q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) -> (B, H, Tq, Dv).
    The same numbers as ``scaled_dot_product_attention(q, k, v, attn_mask, is_causal)``
    but the (Tq, Tk) scores are never built, so memory grows as T, not T^2.
    scale defaults to 1/sqrt(D). is_causal: query i sees keys j <= i (top left).
    attn_mask: boolean (True = may attend) or float (added to the scores),
    broadcastable to (B, H, Tq, Tk), with no gradient. dropout_p: dropout
    on the weights, each tile's mask drawn again in backward from a seed.
    Its backward is fused: it cannot be differentiated twice.
    """
    if (q.ndim != 4 or k.ndim != 4 or v.ndim != 4 or q.shape[:2] != k.shape[:2]
            or k.shape[:2] != v.shape[:2] or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]):
        raise TensorError(f"flash_attention: expected q (B, H, Tq, D), k (B, H, Tk, D) and v (B, H, Tk, Dv), "
                          f"got q {q.shape}, k {k.shape} and v {v.shape}")
    check_same_dtype("flash_attention", q, k, v)
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
            raise TensorError(f"flash_attention: attn_mask {attn_mask.shape} does not broadcast to "
                              f"(B, H, Tq, Tk) = {full}")
        mask = attn_mask.xp.reshape(attn_mask.data, shape)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"flash_attention: dropout_p must be in [0, 1), got {dropout_p}")
    seed = 0
    if dropout_p > 0.0:                                            # from the device's generator (ta.manual_seed)
        seed = int(q.backend.to_numpy(q.backend.uniform((1,), "float64"))[0] * 2 ** 53)
    return FlashAttention.apply(q, k, v, mask=mask, scale=scale, is_causal=bool(is_causal),
                                block_size=int(block_size), dropout_p=float(dropout_p), seed=seed)
