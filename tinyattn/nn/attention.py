"""Attention: scaled dot-product attention (the formula first), multi-head attention and the
KV cache. The tiled ("flash") path for long sequences is beside it, in flash.py.

    softmax(q k^T / sqrt(d_k) + mask) v

``scaled_dot_product_attention`` builds it from ops: the scores, the masked
softmax (``ops.MaskedSoftmax``: a fully masked row gives zeros, not NaN) and
the weighted sum; a boolean or causal mask with nothing else asked for runs
as one op, ``Attention``, with its backward by hand. ``MultiHeadAttention``
splits the channels into heads around it; ``KVCache`` keeps the keys and
values of the tokens generated so far.
"""
import math

from ..autograd import Function
from ..errors import TensorError
from ..ops import MaskedSoftmax, cat, causal_mask, check_same_dtype, constant, masked_softmax, matrix_transpose, softmax
from ..tensor import ones
from .flash import flash_attention
from .functional import dropout, rotary_embedding
from .modules import Dropout, Linear, Module, RMSNorm, expect_shape


# When scaled_dot_product_attention(impl="auto") takes the tiled path (flash.py):
TILED_MIN_SCORES = 1024 * 1024       # Tq * Tk from which it is faster on a CPU (measured: causal, D=64)
TILED_MIN_SCORES_DEVICE = 2048 ** 2  # elsewhere (GPU): batched naive matmuls are fast there; not measured
TILED_MAX_SCORE_BYTES = 2 ** 28      # and always when B * H * Tq * Tk scores would take more (256 MiB)


def attention_impl(q, k, attn_mask=None, dropout_p=0.0, return_weights=False, impl="auto"):
    """Which path scaled_dot_product_attention takes with these arguments: "naive" or "tiled".

    "auto" is naive for the attention weights (return_weights=True), for a
    mask that needs a gradient, and for short
    sequences; tiled when Tq * Tk reaches TILED_MIN_SCORES (TILED_MIN_SCORES_DEVICE
    off the CPU) or when the scores would take more than TILED_MAX_SCORE_BYTES.
    Double backward is not knowable here: it needs impl="naive". dropout_p does not
    change the choice: both paths take dropout.
    """
    if impl not in ("auto", "naive", "tiled"):
        raise ValueError(f"scaled_dot_product_attention: impl must be 'auto', 'naive' or 'tiled', got {impl!r}")
    if impl != "auto":
        return impl
    if return_weights or (attn_mask is not None and attn_mask.requires_grad):
        return "naive"
    long = is_long(q.shape[-2], k.shape[-2], math.prod(q.shape[:-2]), q.dtype.itemsize, q.backend.on_host)
    return "tiled" if long else "naive"


def is_long(t_q, t_k, heads, itemsize, on_host):
    """Whether attention_impl's "auto" takes the tiled path for these sizes (masks and weights aside):
    Tq * Tk from TILED_MIN_SCORES (TILED_MIN_SCORES_DEVICE off the CPU), or scores over TILED_MAX_SCORE_BYTES."""
    least = TILED_MIN_SCORES if on_host else TILED_MIN_SCORES_DEVICE
    return t_q * t_k >= least or heads * t_q * t_k * itemsize > TILED_MAX_SCORE_BYTES


def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False, dropout_p=0.0,
                                 scale=None, return_weights=False, impl="auto", enable_gqa=False):
    """softmax(q k^T / sqrt(d_k) + mask) v.

    q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) -> (B, H, Tq, Dv).
    attn_mask: boolean (True = may attend) or float (added to the scores),
    broadcastable to (B, H, Tq, Tk). is_causal: query i sees keys j <= i
    (aligned at the top left, as in PyTorch); as in PyTorch, give one or the
    other, not both. enable_gqa: k and v may have fewer heads, Hkv, with H a
    multiple of Hkv; each serves H / Hkv consecutive query heads. With
    return_weights=True the (B, H, Tq, Tk) attention weights come back too,
    for visualisation.

    impl: "naive" builds the (Tq, Tk) scores and weights; "tiled" is
    flash_attention (tiles, memory O(T)); "auto" (the default) picks, see
    attention_impl. The tiled backward cannot be differentiated again: for
    gradients of gradients (create_graph=True) pass impl="naive".
    """
    if is_causal and attn_mask is not None:
        raise TensorError("scaled_dot_product_attention: attn_mask and is_causal=True together are refused, "
                          "as in PyTorch; join them into one mask (causal & yours) and pass that")
    if enable_gqa:
        k, v = repeat_heads(q, k, "k"), repeat_heads(q, v, "v")
    return attend(q, k, v, attn_mask, is_causal, dropout_p, scale, return_weights, impl)


def repeat_heads(q, kv, name):
    """kv (..., Hkv, Tk, D) -> (..., H, Tk, D), each of its heads repeated H / Hkv times in a row
    (grouped-query attention: key and value head j serves query heads j * H / Hkv onwards)."""
    if q.ndim < 3 or kv.ndim != q.ndim:
        raise TensorError(f"scaled_dot_product_attention: enable_gqa needs q and {name} with heads, "
                          f"(..., H, T, D), got q {q.shape} and {name} {kv.shape}")
    H, Hkv = q.shape[-3], kv.shape[-3]
    if Hkv == 0 or H % Hkv:
        raise TensorError(f"scaled_dot_product_attention: enable_gqa needs q's heads ({H}) to be a multiple "
                          f"of {name}'s ({Hkv}); got q {q.shape} and {name} {kv.shape}")
    if H == Hkv:
        return kv
    lead, (Tk, D) = kv.shape[:-3], kv.shape[-2:]
    grouped = kv.unsqueeze(-3).expand(*lead, Hkv, H // Hkv, Tk, D)           # (..., Hkv, H/Hkv, Tk, D)
    return grouped.reshape(*lead, H, Tk, D)


def attend(q, k, v, attn_mask=None, is_causal=False, dropout_p=0.0, scale=None, return_weights=False,
           impl="auto"):
    """scaled_dot_product_attention's work, where a mask and is_causal may come together (the
    allowed keys are both's); the tests of its two paths call it."""
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise TensorError(f"scaled_dot_product_attention: q {q.shape}, k {k.shape} and v {v.shape} do not fit")
    check_same_dtype("scaled_dot_product_attention", q, k, v)
    if attention_impl(q, k, attn_mask, dropout_p, return_weights, impl) == "tiled":
        if return_weights:
            raise ValueError("scaled_dot_product_attention: impl='tiled' never builds the weights, so it "
                             "cannot return them; use impl='naive'")
        return flash_attention(q, k, v, is_causal=is_causal, scale=scale, attn_mask=attn_mask, dropout_p=dropout_p)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    allowed = None
    if is_causal:
        allowed = causal_mask(q.shape[-2], k.shape[-2], q.backend)
    if attn_mask is not None and attn_mask.dtype.kind == "b":
        allowed = attn_mask.data if allowed is None else allowed & attn_mask.data
    if allowed is not None and allowed.ndim <= 2:                  # (Tk,) or (1, Tk): one (Tq, Tk) table
        allowed = q.xp.broadcast_to(allowed, (q.shape[-2], k.shape[-2]))
    if _fused_attention_fits(q, k, v, allowed, attn_mask, dropout_p, return_weights):
        return Attention.apply(q, k, v, constant(q, allowed), scale=scale)
    scores = (q * scale) @ k.mT                                    # (B, H, Tq, Tk); scaling q is cheaper
    if attn_mask is not None and attn_mask.dtype.kind != "b":
        scores = scores + attn_mask
    if allowed is None:
        weights = softmax(scores, -1)
    else:
        shape = tuple(max(a, b) for a, b in zip((1,) * (scores.ndim - allowed.ndim) + tuple(allowed.shape), scores.shape))
        if shape != scores.shape:
            scores = scores.expand(shape)
        weights = MaskedSoftmax.apply(scores, constant(scores, allowed))
    if dropout_p > 0.0:
        weights_used = dropout(weights, dropout_p)
    else:
        weights_used = weights
    out = weights_used @ v                                          # (B, H, Tq, Dv)
    return (out, weights) if return_weights else out


def _fused_attention_fits(q, k, v, allowed, attn_mask, dropout_p, return_weights):
    """Whether the naive path can run as one Attention op: stacked q, k, v over the same leading
    dims and a boolean (Tq, Tk) mask (causal, or given); no additive mask, dropout or returned
    weights (those need the weights as a tensor of their own)."""
    if allowed is None or allowed.ndim != 2 or dropout_p > 0.0 or return_weights:
        return False
    if attn_mask is not None and attn_mask.dtype.kind != "b":
        return False
    return q.ndim >= 3 and q.shape[:-2] == k.shape[:-2] == v.shape[:-2]


class Attention(Function):
    """softmax(q k^T * scale where allowed) v as one op: the naive path's scores, masked
    softmax and weighted sum, with the backward by hand (exercise 13):

        P = softmax(S),  S = q k^T * scale      dV = P^T dO      dP = dO V^T
        dS = P * (dP - rowsum(dP * P))          dQ = dS K * scale      dK = dS^T Q * scale

    Backward recomputes P from q and k with Tensor ops, so it differentiates twice.
    """

    def forward(self, q, k, v, allowed, scale):                    # (B, H, Tq, D), (B, H, Tk, D), (B, H, Tk, Dv)
        xp = self.xp
        self.scale = scale
        scores = xp.matmul(q, matrix_transpose(xp, k)) * scale      # (B, H, Tq, Tk)
        return xp.matmul(masked_softmax(xp, scores, allowed), v)   # (B, H, Tq, Dv)

    def backward(self, g):                                         # g (B, H, Tq, Dv)
        q, k, v, allowed = self.parents
        p = MaskedSoftmax.apply((q @ k.mT) * self.scale, allowed)  # the weights again, as Tensors
        dp = g @ v.mT                                              # (B, H, Tq, Tk)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True))             # softmax's backward
        return ds @ k * self.scale, ds.mT @ q * self.scale, p.mT @ g, None


class MultiHeadAttention(Module):
    """Self-attention with n_head heads: one fused qkv projection, heads split,
    scaled dot-product attention, heads merged, an output projection.

    forward(x (B, T, C), attn_mask=None, is_causal=False, kv_cache=None) -> (B, T, C).
    With ``keep_weights = True`` the last (B, H, T, T) attention weights stay in
    ``self.last_weights``, for visualisation. ``head_dropout`` p: while training,
    each head's output is zeroed for a whole sequence with probability p and the
    kept heads scaled by 1/(1-p) (DropHead), so no head can lean on another to
    do half of its job.

    The modern block's choices (Llama, Mistral, Qwen, nanochat):
    ``n_kv_head``: fewer key/value heads than query heads, each serving n_head / n_kv_head
    query heads (grouped-query attention; 1 is multi-query); the KV cache then holds
    n_kv_head heads. ``rope_theta``: rotary position embedding of the queries and keys
    with that base (None: none), positions counted on from the cache's length.
    ``qk_norm``: an RMSNorm over each head's queries and keys (with ``norm_eps``),
    before the rotation.
    """

    def __init__(self, n_embd, n_head, bias=True, dropout=0.0, head_dropout=0.0, n_kv_head=None,
                 rope_theta=None, qk_norm=False, norm_eps=1e-5):
        super().__init__()
        if n_head < 1 or n_embd < 1:
            raise ValueError(f"MultiHeadAttention needs n_embd >= 1 and n_head >= 1, got {n_embd} and {n_head}")
        if n_embd % n_head:
            raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        n_kv_head = n_head if n_kv_head is None else n_kv_head
        if n_kv_head < 1 or n_head % n_kv_head:
            raise ValueError(f"MultiHeadAttention: n_kv_head ({n_kv_head}) must divide n_head ({n_head})")
        if rope_theta is not None and (n_embd // n_head) % 2:
            raise ValueError(f"MultiHeadAttention: rotary embedding needs an even head size, got "
                             f"n_embd / n_head = {n_embd // n_head}")
        if not 0.0 <= head_dropout < 1.0:
            raise ValueError(f"MultiHeadAttention: head_dropout must be in [0, 1), got {head_dropout}")
        self.n_embd, self.n_head, self.dropout, self.head_dropout = n_embd, n_head, dropout, head_dropout
        self.n_kv_head, self.rope_theta = n_kv_head, rope_theta
        head_size = n_embd // n_head
        self.c_attn = Linear(n_embd, (n_head + 2 * n_kv_head) * head_size, bias=bias)   # q, k, v in one matmul
        self.c_proj = Linear(n_embd, n_embd, bias=bias)
        if qk_norm:
            self.q_norm = RMSNorm(head_size, eps=norm_eps)
            self.k_norm = RMSNorm(head_size, eps=norm_eps)
        self.qk_norm = qk_norm
        self.resid_dropout = Dropout(dropout)
        self.keep_weights = False
        self.last_weights = None

    def forward(self, x, attn_mask=None, is_causal=False, kv_cache=None):
        expect_shape(self, x, (None, None, self.n_embd), "(B, T, C)")
        B, T, C = x.shape
        H, Hkv, D = self.n_head, self.n_kv_head, C // self.n_head
        qkv = self.c_attn(x).view(B, T, H + 2 * Hkv, D)             # channels: q's H heads, k's Hkv, v's Hkv
        if Hkv == H:
            q, k, v = qkv.transpose(1, 2).split(H, dim=1)            # 3 x (B, H, T, D)
        else:
            q, k, v = qkv.transpose(1, 2).split([H, Hkv, Hkv], dim=1)   # (B, H, T, D), 2 x (B, Hkv, T, D)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)                    # each head's vectors to unit RMS
        if self.rope_theta is not None:                              # turned by their positions
            start = len(kv_cache) if kv_cache is not None else 0     # (after the cached tokens)
            positions = range(start, start + T)
            q = rotary_embedding(q, positions, self.rope_theta)
            k = rotary_embedding(k, positions, self.rope_theta)
        if kv_cache is not None:                                     # the keys and values so far
            k, v = kv_cache.append(k, v)                             # (B, Hkv, T_past + T, D)
            attn_mask = kv_cache.causal_mask(T, k.shape[2], x)       # the new queries sit at the end
            is_causal = False
        y = scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0, return_weights=self.keep_weights,
            **({"enable_gqa": True} if Hkv != H else {}))           # (B, H, T, D)
        if self.keep_weights:
            y, weights = y
            self.last_weights = weights.detach()
        if self.head_dropout > 0.0 and self.training:                # whole heads, per sequence
            y = y * self.head_keep(B, y.dtype, y.device)             # (B, H, T, D)
        y = y.transpose(1, 2).reshape(B, T, C)                      # merge heads: (B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def extra_repr(self):
        extra = [f"n_kv_head={self.n_kv_head}"] if self.n_kv_head != self.n_head else []
        extra += [f"rope_theta={self.rope_theta:g}"] if self.rope_theta is not None else []
        return ", ".join(extra)

    def head_keep(self, B, dtype, device):
        """DropHead's draw: (B, H, 1, 1), each head of each sequence 0 or 1/(1-p)."""
        return dropout(ones(B, self.n_head, 1, 1, dtype=dtype, device=device), self.head_dropout)


class KVCache:
    """Keys and values of the tokens seen so far, for one attention layer.

    They live in two buffers, (B, H, capacity, D), that double in length when
    full: appending a token writes its position and returns views of the filled
    part, so a token costs as much at position 1000 as at position 10 (a cat per
    token would copy the whole cache each time). H is the layer's key/value heads:
    with grouped-query attention n_kv_head, so the cache takes n_kv_head / n_head
    of the memory. Stored without a graph; new
    keys or values that need a gradient come back joined to the past ones with
    ``cat``, so gradients still reach them.
    """

    def __init__(self):
        self.k_buffer = self.v_buffer = None                         # (B, H, capacity, D) arrays
        self.length = 0

    def __len__(self):
        return self.length

    @property
    def k(self):
        """The cached keys, (B, H, len, D) (None before the first append)."""
        return None if self.k_buffer is None else self._filled(self.k_buffer)

    @property
    def v(self):
        return None if self.v_buffer is None else self._filled(self.v_buffer)

    def append(self, k, v):                                          # (B, H, T, D) each
        if k.shape != v.shape or k.ndim != 4:
            raise ValueError(f"KVCache.append: keys {k.shape} and values {v.shape} must share one (B, H, T, D) shape")
        past, end = self.length, self.length + k.shape[2]
        if self.k_buffer is not None:
            self._check_fits(k)
        if self.k_buffer is None or end > self.k_buffer.shape[2]:
            self._grow(k, end)
        self.k_buffer[:, :, past:end] = k.data
        self.v_buffer[:, :, past:end] = v.data
        self.length = end
        if k.requires_grad or v.requires_grad:                      # keep the new tokens' graph
            return (cat([self._filled(self.k_buffer, past), k], dim=2),
                    cat([self._filled(self.v_buffer, past), v], dim=2))
        return self.k, self.v

    def _filled(self, buffer, length=None):
        """The first ``length`` (default: all cached) positions of a buffer, as a Tensor view."""
        return constant(self.like, buffer[:, :, :self.length if length is None else length])

    def _check_fits(self, k):
        """New keys must match the cached ones in B, H, D, dtype and device (else an error naming both)."""
        B, H, _, D = self.k_buffer.shape
        if (k.shape[0], k.shape[1], k.shape[3]) != (B, H, D) or k.dtype != self.like.dtype \
                or k.device != self.like.device:
            raise ValueError(f"KVCache.append: keys of shape {k.shape} ({k.dtype}, {k.device}) do not fit the "
                             f"cached (B, H, T, D) = {self.k.shape} ({self.like.dtype}, {self.like.device})")

    def _grow(self, k, needed):
        """New buffers with room for ``needed`` positions (at least double the old), the cache copied in."""
        B, H, _, D = k.shape
        capacity = max(needed, 2 * (0 if self.k_buffer is None else self.k_buffer.shape[2]), 16)
        buffers = [k.backend.zeros((B, H, capacity, D), k.dtype) for _ in range(2)]
        if self.k_buffer is not None:
            for new, old in zip(buffers, (self.k_buffer, self.v_buffer)):
                new[:, :, :self.length] = old[:, :, :self.length]
        self.k_buffer, self.v_buffer = buffers
        self.like = constant(k, buffers[0][:, :, :0])                # the cache's device and dtype (an empty view)

    def crop(self, length):
        """Keep only the last ``length`` positions."""
        if self.length > length:
            for buffer in (self.k_buffer, self.v_buffer):
                buffer[:, :, :length] = self.like.backend.copy(buffer[:, :, self.length - length:self.length])
            self.length = length

    @staticmethod
    def causal_mask(t_new, t_total, like):
        """(t_new, t_total): query i (at absolute position t_total - t_new + i) sees keys <= it."""
        return constant(like, causal_mask(t_new, t_total, like.backend, offset=t_total - t_new))
