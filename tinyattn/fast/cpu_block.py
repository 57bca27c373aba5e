"""The GPT's transformer block as one fused kernel on the CPU: each thread runs the whole block on its share of the batch.

    y = x2 + c_proj(gelu(c_fc(ln_2(x2)))),  x2 = x + attn(ln_1(x))       (tinyattn/models/gpt.py)

Every step of the block works on rows, or on whole sequences (attention), so
nothing forces the threads to wait for each other between the steps: one
thread takes sequences 0..B/2, another the rest, and each runs the two layer
norms, the four products, causal attention and the GELU on its own rows while
they sit in its cache. Op by op, the threads would meet and part again about
ten times a block, and the rows would move between their caches. Backward does
the same, and each part sums its rows' share of the weight gradients, which
are added at the end, in order. The parts are the same whether the threads or
the calling thread run them (threads.split's same_parts), so the sums are too.

The arithmetic is that of the ops, with their kernels (cpu_kernels.py): the
outputs are the same numbers, and the gradients the same up to the order of the
sums over rows. The op-table tests check both against the layers op by op.

    block(x, params, n_head, eps_1, eps_2, head_keep)     -> (y, *saved)
    block_backward(g, saved, params, n_head, head_keep)   -> (dx, *dparams)

params: (ln_1 weight, ln_1 bias, c_attn weight, c_attn bias, attn.c_proj weight, attn.c_proj bias,
         ln_2 weight, ln_2 bias, c_fc weight, c_fc bias, mlp.c_proj weight, mlp.c_proj bias),
weights (out, in) as in nn.Linear.
"""
import math

import numpy as np

from . import cpu_kernels as K
from .threads import split


def block_fits(x, params):
    """True for x (B, T, C) and the block's parameters (in the order of fast/models.py's
    Block._one_op_parameters), all float32 or all float64, of the GPT's shapes (an MLP 4 C wide)."""
    if x.ndim != 3 or x.dtype.char not in "fd" or x.size == 0 or any(p.dtype != x.dtype for p in params):
        return False
    C = x.shape[2]
    return [p.shape for p in params] == [(C,), (C,), (3 * C, C), (3 * C,), (C, C), (C,),
                                         (C,), (C,), (4 * C, C), (4 * C,), (C, 4 * C), (C,)]


@K.kernel
def _add_bias(out, b, residual):                   # out (n, m) = out + b (m,) on each row, + residual (n, m) if any
    n, m = out.shape                               # (in the order of the layers: the bias, then the residual add)
    for i in range(n):
        for j in range(m):
            out[i, j] = out[i, j] + b[j] if residual is None else (out[i, j] + b[j]) + residual[i, j]


def block_work(shape):
    """The block's four products on an input of ``shape`` (B, T, C), in threads' units of work
    (n * k * m / 32): 12 C^2 per row."""
    B, T, C = shape
    return B * T * 12 * C * C // 32


def _heads(a, n_head):
    """(b, T, 3C) q, k, v channels -> three (b, H, T, D) views, as MultiHeadAttention cuts them."""
    b, T, three_c = a.shape
    heads = a.reshape(b, T, 3 * n_head, three_c // (3 * n_head)).transpose(0, 2, 1, 3)   # (b, 3H, T, D)
    return heads[:, :n_head], heads[:, n_head:2 * n_head], heads[:, 2 * n_head:]


def block(x, params, n_head, eps_1, eps_2, head_keep=None):
    """(y, *saved): the block's output (B, T, C), then what its backward reads. None for inputs it does not take.
    head_keep: DropHead's draw (B, H), each head's output is scaled by (0 or 1/(1-p)); None: no DropHead."""
    if not block_fits(x, params) or not (head_keep is None or head_keep.shape == (x.shape[0], n_head)):
        return None
    ln1_w, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_w, ln2_b, w_fc, b_fc, w_proj, b_proj = params
    x = np.ascontiguousarray(x)
    B, T, C = x.shape
    dtype, real = x.dtype, x.dtype.type
    new = lambda *shape: np.empty(shape, dtype)                              # noqa: E731
    h1, xhat1, h2, xhat2, att, x2, y = (new(B, T, C) for _ in range(7))      # (B, T, C) each
    rstd1, rstd2 = new(B, T, 1), new(B, T, 1)
    qkv, f, gelu = new(B, T, 3 * C), new(B, T, 4 * C), new(B, T, 4 * C)
    weights = new(B, n_head, T, T)                                            # (B, H, T, T)
    allowed = np.tril(np.ones((T, T), np.bool_))                             # causal: query i sees keys j <= i
    first, stop, dense = K._row_bounds(allowed)
    scale, eps_1, eps_2 = real(1.0 / math.sqrt(C // n_head)), real(eps_1), real(eps_2)
    gelu_a, gelu_b = (real(c) for c in K.GELU_CONSTANTS[:2])

    def rows(i, j):                                                           # sequences i..j, all on this thread
        def flat(t):
            return t[i:j].reshape(-1, t.shape[-1])                            # (n, ...) rows of these sequences
        K._layer_norm_fwd(flat(x), ln1_w, ln1_b, flat(h1), flat(xhat1), flat(rstd1), eps_1)
        np.matmul(flat(h1), w_qkv.T, out=flat(qkv))                           # qkv = ln_1(x) W^T + b
        _add_bias(flat(qkv), b_qkv, None)
        q, k, v = _heads(qkv[i:j], n_head)                                    # (n, H, T, D) each
        w = weights[i:j]
        np.matmul(q, np.matrix_transpose(k), out=w)                           # scores (n, H, T, T)
        w3 = w.reshape(-1, T, T)
        K._masked_softmax_fwd(w3, allowed, first, stop, dense, scale, w3)     # weights, in place
        heads = att[i:j].reshape(j - i, T, n_head, -1)                        # (n, T, H, D): heads merged
        np.matmul(w, v, out=heads.transpose(0, 2, 1, 3))
        if head_keep is not None:
            heads *= head_keep[i:j, None, :, None]                            # DropHead
        np.matmul(flat(att), w_o.T, out=flat(x2))                            # x2 = x + att W_o^T + b_o
        _add_bias(flat(x2), b_o, flat(x))
        K._layer_norm_fwd(flat(x2), ln2_w, ln2_b, flat(h2), flat(xhat2), flat(rstd2), eps_2)
        np.matmul(flat(h2), w_fc.T, out=flat(f))                             # f = ln_2(x2) W_fc^T + b_fc
        _add_bias(flat(f), b_fc, None)
        K._gelu_tanh_fwd(f[i:j].reshape(-1), gelu[i:j].reshape(-1), gelu_a, gelu_b)
        np.matmul(flat(gelu), w_proj.T, out=flat(y))                         # y = x2 + gelu(f) W_proj^T + b_proj
        _add_bias(flat(y), b_proj, flat(x2))

    split(rows, B, work=block_work(x.shape), same_parts=True)
    return y, h1, xhat1, rstd1, qkv, weights, att, h2, xhat2, rstd2, f, gelu


def block_backward(g, saved, params, n_head, head_keep=None):
    """(dx, *dparams) for the output gradient g (B, T, C); dparams in the order of params."""
    ln1_w, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_w, ln2_b, w_fc, b_fc, w_proj, b_proj = params
    h1, xhat1, rstd1, qkv, weights, att, h2, xhat2, rstd2, f, gelu = saved
    g = np.ascontiguousarray(g, dtype=h1.dtype)
    B, T, C = g.shape
    real = g.dtype.type
    scale = real(1.0 / math.sqrt(C // n_head))
    consts = [real(c) for c in K.GELU_CONSTANTS]
    dx, dqkv = np.empty_like(g), np.empty_like(qkv)
    sums = {}                                                                # first row -> its part's dparams

    def rows(i, j):
        def flat(t):
            return t[i:j].reshape(-1, t.shape[-1])
        dy = flat(g)                                                          # (n, C)
        mine = [None] * len(params)                                           # this thread's share of dparams
        # the MLP: y = x2 + gelu(f) W_proj^T + b_proj
        mine[10], mine[11] = dy.T @ flat(gelu), dy.sum(axis=0)                # dW_proj (C, 4C), db_proj
        dgelu = dy @ w_proj                                                   # (n, 4C)
        df = np.empty_like(dgelu)
        K._gelu_tanh_bwd(flat(f).reshape(-1), dgelu.reshape(-1), df.reshape(-1), *consts)
        mine[8], mine[9] = df.T @ flat(h2), df.sum(axis=0)                    # dW_fc (4C, C), db_fc
        dh2 = df @ w_fc                                                       # (n, C)
        dx2 = np.empty_like(dh2)
        mine[6], mine[7] = np.zeros_like(ln2_w), np.zeros_like(ln2_b)         # (the kernel adds into them)
        K._layer_norm_bwd(dh2, flat(xhat2), ln2_w, flat(rstd2).reshape(-1), dx2, mine[6], mine[7])
        dx2 += dy                                                             # the residual
        # attention: x2 = x + att W_o^T + b_o
        mine[4], mine[5] = dx2.T @ flat(att), dx2.sum(axis=0)                 # dW_o (C, C), db_o
        d_att = (dx2 @ w_o).reshape(j - i, T, n_head, -1)                    # (n, T, H, D)
        if head_keep is not None:
            d_att *= head_keep[i:j, None, :, None]                            # DropHead
        d_att = d_att.transpose(0, 2, 1, 3)                                   # dO (n, H, T, D)
        q, k, v = _heads(qkv[i:j], n_head)
        dq, dk, dv = _heads(dqkv[i:j], n_head)                                # views of dqkv
        w = weights[i:j]
        np.matmul(np.matrix_transpose(w), d_att, out=dv)                      # dV = P^T dO
        ds = np.matmul(d_att, np.matrix_transpose(v))                         # dP = dO V^T
        ds2 = ds.reshape(-1, T)
        K._softmax_bwd(w.reshape(ds2.shape), ds2, scale, ds2)                 # dS = P (dP - rowsum(dP P)) scale
        np.matmul(ds, k, out=dq)                                              # dQ = dS K
        np.matmul(np.matrix_transpose(ds), q, out=dk)                         # dK = dS^T Q
        mine[2], mine[3] = flat(dqkv).T @ flat(h1), flat(dqkv).sum(axis=0)    # dW_qkv (3C, C), db_qkv
        dh1 = flat(dqkv) @ w_qkv                                              # (n, C)
        mine[0], mine[1] = np.zeros_like(ln1_w), np.zeros_like(ln1_b)
        K._layer_norm_bwd(dh1, flat(xhat1), ln1_w, flat(rstd1).reshape(-1), flat(dx), mine[0], mine[1])
        flat(dx)[...] += dx2                                                  # the residual
        sums[i] = mine

    split(rows, B, work=2 * block_work(g.shape), same_parts=True)
    first, *others = [sums[i] for i in sorted(sums)]                         # (in order: the same sums every run)
    dparams = first
    for more in others:
        for total, part in zip(dparams, more):
            total += part
    return (dx, *dparams)


KERNELS = {"block": block, "block_backward": block_backward}
