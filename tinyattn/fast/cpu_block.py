"""The GPT's transformer block as one fused kernel on the CPU: each thread runs the whole block on its
share of the batch (small blocks), or each product runs on the whole batch (large ones).

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

Three schedules (``schedule``; rows unless TINYATTN_BLOCK_SCHEDULE asks for another,
so a command gives the same numbers on every run):

    rows    each thread runs the whole block on its sequences, as above: one meeting
            of the threads a block. The fastest of the three on the machine of
            docs/benchmarks.md at every size, the mid config (C = 384, T = 256) included.
    whole   each of the four products (eight in backward) is one BLAS call on all
            B * T rows, with BLAS on get_num_threads() threads while the pool waits,
            and the rest (layer norms, biases, GELU, attention) split over the threads
            by rows or by (sequence, head) pairs between the products: for a machine
            whose BLAS runs one large product faster than the threads run its halves.
    pool    as whole, but each product runs on tinyattn's threads, one BLAS thread
            each: forward, its output columns split; backward, a weight's gradient
            beside its input's (BLAS's thread count never changes).

    block(x, params, n_head, eps_1, eps_2, head_keep)     -> (y, *saved)
    block_backward(g, saved, params, n_head, head_keep)   -> (dx, *dparams)

params: (ln_1 weight, ln_1 bias, c_attn weight, c_attn bias, attn.c_proj weight, attn.c_proj bias,
         ln_2 weight, ln_2 bias, c_fc weight, c_fc bias, mlp.c_proj weight, mlp.c_proj bias),
weights (out, in) as in nn.Linear.
"""
import math
import os

import numpy as np

from . import cpu_kernels as K
from . import threads
from .threads import laps, split

SCHEDULE_ENV = "TINYATTN_BLOCK_SCHEDULE"
"""A debugging knob, to time the schedules side by side in one checkout: rows, whole or pool
forces that schedule for every fused block; unset (the default), every block runs rows."""
SCHEDULES = ("rows", "whole", "pool")


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


def schedule(shape, n_threads):
    """The schedule of a block input of ``shape`` (B, T, C) on ``n_threads`` threads: "rows", unless
    TINYATTN_BLOCK_SCHEDULE says whole or pool (a debugging knob, to time one schedule against
    another). On the 2-core AVX-512 machine of docs/benchmarks.md, rows was the fastest of the three
    at every size measured, the mid config included (whole's products ran no faster there, and BLAS's
    spinning threads slowed the parts between them); the choice stays a function of the shapes and
    the thread count, so that a machine where whole wins can take it by a rule, never by a timing."""
    forced = os.environ.get(SCHEDULE_ENV, "").strip().lower()
    if forced and forced not in SCHEDULES:
        raise ValueError(f"{SCHEDULE_ENV} must be rows, whole or pool, got {forced!r}")
    return forced or "rows"


def _heads(a, n_head):
    """(b, T, 3C) q, k, v channels -> three (b, H, T, D) views, as MultiHeadAttention cuts them."""
    b, T, three_c = a.shape
    heads = a.reshape(b, T, 3 * n_head, three_c // (3 * n_head)).transpose(0, 2, 1, 3)   # (b, 3H, T, D)
    return heads[:, :n_head], heads[:, n_head:2 * n_head], heads[:, 2 * n_head:]


def _pairs(i, j, n_head):
    """The (sequence, head) pairs i..j (pair p = sequence p // H, head p % H) as (b, slice of heads)."""
    for b in range(i // n_head, (j - 1) // n_head + 1):
        yield b, slice(max(i - b * n_head, 0), min(j - b * n_head, n_head))


def _products(products, on_pool=False):
    """out = a @ b for each (a, b, out) of ``products``, on the whole batch. The whole schedule:
    one BLAS call each, with BLAS's threads. The pool schedule (on_pool): over tinyattn's threads,
    one BLAS thread each, the threads taking the products' output columns in order, each column
    weighted by its cost (a's size): two products of equal cost on two threads run one on each,
    whole (a weight's gradient beside its input's), and one product is cut by its columns.
    Always the same parts (split's same_parts), so the same numbers every run."""
    if not on_pool:
        for a, b, out in products:
            lap = laps()
            with threads.blas_threads():
                np.matmul(a, b, out=out)
            lap("products")
        return
    costs = [a.size for a, _, _ in products]                                 # of one output column
    firsts = np.cumsum([0] + [b.shape[1] * cost for (_, b, _), cost in zip(products, costs)]).tolist()

    def columns(start, stop):                      # a column goes to the part that holds its first unit
        lap = laps()
        for (a, b, out), cost, first in zip(products, costs, firsts):
            i, j = max(0, -((first - start) // cost)), min(b.shape[1], -((first - stop) // cost))
            if i < j:
                np.matmul(a, b[:, i:j], out=out[:, i:j])
        lap("products")

    split(columns, firsts[-1], work=firsts[-1] // 32, same_parts=True)


def _sums_in_parts(fn, n, work):
    """fn(i, j) -> a list of sums over rows i..j, on the threads' parts of n rows (always the same
    parts: ``split``'s same_parts); the parts' sums added in order, so the same numbers every run."""
    sums = {}

    def part(i, j):
        sums[i] = fn(i, j)

    split(part, n, work=work, same_parts=True)
    first, *others = [sums[i] for i in sorted(sums)]
    for more in others:
        for total, add in zip(first, more):
            total += add
    return first


def _attention_work(B, n_head, T, C):
    return B * n_head * T * T * 2 * (C // n_head) // 32          # q k^T and P v, in threads' units


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

    def attention(q, k, v, w, heads, keep):
        """softmax(q k^T scale, causal) v for (..., T, D) heads into heads (..., T, D); w (..., T, T)."""
        np.matmul(q, np.matrix_transpose(k), out=w)                           # scores
        w3 = w.reshape(-1, T, T)
        K._masked_softmax_fwd(w3, allowed, first, stop, dense, scale, w3)     # weights, in place
        np.matmul(w, v, out=heads)
        if keep is not None:
            heads *= keep                                                     # DropHead

    def rows(i, j):                                                           # sequences i..j, all on this thread
        def flat(t):
            return t[i:j].reshape(-1, t.shape[-1])                            # (n, ...) rows of these sequences
        lap = laps()
        K._layer_norm_fwd(flat(x), ln1_w, ln1_b, flat(h1), flat(xhat1), flat(rstd1), eps_1)
        lap("elementwise")
        np.matmul(flat(h1), w_qkv.T, out=flat(qkv))                           # qkv = ln_1(x) W^T + b
        lap("products")
        _add_bias(flat(qkv), b_qkv, None)
        lap("elementwise")
        q, k, v = _heads(qkv[i:j], n_head)                                    # (n, H, T, D) each
        heads = att[i:j].reshape(j - i, T, n_head, -1).transpose(0, 2, 1, 3)  # (n, H, T, D): heads merged
        attention(q, k, v, weights[i:j], heads, None if head_keep is None else head_keep[i:j, :, None, None])
        lap("attention")
        np.matmul(flat(att), w_o.T, out=flat(x2))                            # x2 = x + att W_o^T + b_o
        lap("products")
        _add_bias(flat(x2), b_o, flat(x))
        K._layer_norm_fwd(flat(x2), ln2_w, ln2_b, flat(h2), flat(xhat2), flat(rstd2), eps_2)
        lap("elementwise")
        np.matmul(flat(h2), w_fc.T, out=flat(f))                             # f = ln_2(x2) W_fc^T + b_fc
        lap("products")
        _add_bias(flat(f), b_fc, None)
        K._gelu_tanh_fwd(f[i:j].reshape(-1), gelu[i:j].reshape(-1), gelu_a, gelu_b)
        lap("elementwise")
        np.matmul(flat(gelu), w_proj.T, out=flat(y))                         # y = x2 + gelu(f) W_proj^T + b_proj
        lap("products")
        _add_bias(flat(y), b_proj, flat(x2))
        lap("elementwise")

    def whole(on_pool):                                                       # the products on all n = B T rows
        n = B * T
        X, H1, XH1, R1, QKV, ATT, X2, H2, XH2, R2, Fc, GELU, Y = (t.reshape(n, -1) for t in (
            x, h1, xhat1, rstd1, qkv, att, x2, h2, xhat2, rstd2, f, gelu, y))     # (n, C), (n, 3C), (n, 4C) ...

        def on_rows(fn, width):                                               # fn(i, j) on rows i..j, in parts
            def part(i, j):
                lap = laps()
                fn(i, j)
                lap("elementwise")
            split(part, n, work=n * width)

        on_rows(lambda i, j: K._layer_norm_fwd(X[i:j], ln1_w, ln1_b, H1[i:j], XH1[i:j], R1[i:j], eps_1), C)
        _products([(H1, w_qkv.T, QKV)], on_pool)                              # qkv = ln_1(x) W^T + b
        D = C // n_head

        def head_pairs(i, j):                                                 # (sequence, head) pairs i..j
            lap = laps()
            for b, hs in _pairs(i, j, n_head):
                for first in (0, C, 2 * C):                                   # + b: these heads' q, k, v columns
                    cols = slice(first + hs.start * D, first + hs.stop * D)
                    _add_bias(qkv[b, :, cols], b_qkv[cols], None)
                lap("elementwise")
                q, k, v = (t[0, hs] for t in _heads(qkv[b:b + 1], n_head))   # (h, T, D) each
                heads = att[b].reshape(T, n_head, -1).transpose(1, 0, 2)[hs]  # (h, T, D)
                attention(q, k, v, weights[b, hs], heads, None if head_keep is None else head_keep[b, hs, None, None])
                lap("attention")

        split(head_pairs, B * n_head, work=_attention_work(B, n_head, T, C))
        _products([(ATT, w_o.T, X2)], on_pool)                                # x2 = x + att W_o^T + b_o

        def bias_and_ln_2(i, j):
            _add_bias(X2[i:j], b_o, X[i:j])
            K._layer_norm_fwd(X2[i:j], ln2_w, ln2_b, H2[i:j], XH2[i:j], R2[i:j], eps_2)

        on_rows(bias_and_ln_2, 2 * C)
        _products([(H2, w_fc.T, Fc)], on_pool)                                # f = ln_2(x2) W_fc^T + b_fc

        def bias_and_gelu(i, j):
            _add_bias(Fc[i:j], b_fc, None)
            K._gelu_tanh_fwd(Fc[i:j].reshape(-1), GELU[i:j].reshape(-1), gelu_a, gelu_b)

        on_rows(bias_and_gelu, 8 * C)
        _products([(GELU, w_proj.T, Y)], on_pool)                             # y = x2 + gelu(f) W_proj^T + b_proj
        on_rows(lambda i, j: _add_bias(Y[i:j], b_proj, X2[i:j]), C)

    n_threads = threads.get_num_threads()
    chosen = schedule(x.shape, n_threads)
    if chosen != "rows":
        if n_threads > 1:
            threads.hold_blas()                    # one BLAS thread in each part (all of them in whole's products)
        whole(on_pool=chosen == "pool")
    else:
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

    def attention(q, k, v, w, d_out, dq, dk, dv):
        """The gradients of softmax(q k^T scale, causal) v for (..., T, D) heads, given dO d_out."""
        np.matmul(np.matrix_transpose(w), d_out, out=dv)                      # dV = P^T dO
        ds = np.matmul(d_out, np.matrix_transpose(v))                         # dP = dO V^T
        ds2 = ds.reshape(-1, T)
        K._softmax_bwd(w.reshape(ds2.shape), ds2, scale, ds2)                 # dS = P (dP - rowsum(dP P)) scale
        np.matmul(ds, k, out=dq)                                              # dQ = dS K
        np.matmul(np.matrix_transpose(ds), q, out=dk)                         # dK = dS^T Q

    def rows(i, j):                                                           # sequences i..j, all on this thread
        def flat(t):
            return t[i:j].reshape(-1, t.shape[-1])
        lap = laps()
        dy = flat(g)                                                          # (n, C)
        mine = [None] * len(params)                                           # this thread's share of dparams
        # the MLP: y = x2 + gelu(f) W_proj^T + b_proj
        mine[10], mine[11] = dy.T @ flat(gelu), dy.sum(axis=0)                # dW_proj (C, 4C), db_proj
        dgelu = dy @ w_proj                                                   # (n, 4C)
        lap("products")
        df = np.empty_like(dgelu)
        K._gelu_tanh_bwd(flat(f).reshape(-1), dgelu.reshape(-1), df.reshape(-1), *consts)
        lap("elementwise")
        mine[8], mine[9] = df.T @ flat(h2), df.sum(axis=0)                    # dW_fc (4C, C), db_fc
        dh2 = df @ w_fc                                                       # (n, C)
        lap("products")
        dx2 = np.empty_like(dh2)
        mine[6], mine[7] = np.zeros_like(ln2_w), np.zeros_like(ln2_b)         # (the kernel adds into them)
        K._layer_norm_bwd(dh2, flat(xhat2), ln2_w, flat(rstd2).reshape(-1), dx2, mine[6], mine[7])
        dx2 += dy                                                             # the residual
        lap("elementwise")
        # attention: x2 = x + att W_o^T + b_o
        mine[4], mine[5] = dx2.T @ flat(att), dx2.sum(axis=0)                 # dW_o (C, C), db_o
        d_att = (dx2 @ w_o).reshape(j - i, T, n_head, -1)                    # (n, T, H, D)
        lap("products")
        if head_keep is not None:
            d_att *= head_keep[i:j, None, :, None]                            # DropHead
        attention(*_heads(qkv[i:j], n_head), weights[i:j], d_att.transpose(0, 2, 1, 3),   # dO (n, H, T, D)
                  *_heads(dqkv[i:j], n_head))                                 # into views of dqkv
        lap("attention")
        mine[2], mine[3] = flat(dqkv).T @ flat(h1), flat(dqkv).sum(axis=0)    # dW_qkv (3C, C), db_qkv
        dh1 = flat(dqkv) @ w_qkv                                              # (n, C)
        lap("products")
        mine[0], mine[1] = np.zeros_like(ln1_w), np.zeros_like(ln1_b)
        K._layer_norm_bwd(dh1, flat(xhat1), ln1_w, flat(rstd1).reshape(-1), flat(dx), mine[0], mine[1])
        flat(dx)[...] += dx2                                                  # the residual
        lap("elementwise")
        return mine

    def whole(on_pool):                                                       # the products on all n = B T rows
        n = B * T
        dY, GELU, Fc, H2, XH2, R2, ATT, QKV, dQKV, H1, XH1, R1, dX = (t.reshape(n, -1) for t in (
            g, gelu, f, h2, xhat2, rstd2, att, qkv, dqkv, h1, xhat1, rstd1, dx))
        dparams = [None] * len(params)

        def in_parts(fn, width):                                              # fn's sums over rows, in parts
            def part(i, j):
                lap = laps()
                sums = fn(i, j)
                lap("elementwise")
                return sums
            return _sums_in_parts(part, n, work=n * width)

        # the MLP: y = x2 + gelu(f) W_proj^T + b_proj
        dparams[10], dgelu = np.empty_like(w_proj), np.empty_like(GELU)
        _products([(dY.T, GELU, dparams[10]), (dY, w_proj, dgelu)], on_pool)  # dW_proj (C, 4C), dgelu (n, 4C)
        df = np.empty_like(dgelu)

        def gelu_backward(i, j):
            K._gelu_tanh_bwd(Fc[i:j].reshape(-1), dgelu[i:j].reshape(-1), df[i:j].reshape(-1), *consts)
            return [dY[i:j].sum(axis=0), df[i:j].sum(axis=0)]                 # db_proj, db_fc

        dparams[11], dparams[9] = in_parts(gelu_backward, 12 * C)
        dparams[8], dh2 = np.empty_like(w_fc), np.empty_like(dY)
        _products([(df.T, H2, dparams[8]), (df, w_fc, dh2)], on_pool)         # dW_fc (4C, C), dh2 (n, C)
        dx2 = np.empty_like(dh2)

        def ln_2_backward(i, j):
            dw, db = np.zeros_like(ln2_w), np.zeros_like(ln2_b)               # (the kernel adds into them)
            K._layer_norm_bwd(dh2[i:j], XH2[i:j], ln2_w, R2[i:j].reshape(-1), dx2[i:j], dw, db)
            dx2[i:j] += dY[i:j]                                               # the residual
            return [dw, db, dx2[i:j].sum(axis=0)]                             # dln_2, db_o

        dparams[6], dparams[7], dparams[5] = in_parts(ln_2_backward, 4 * C)
        # attention: x2 = x + att W_o^T + b_o
        dparams[4], d_att = np.empty_like(w_o), np.empty_like(dY)
        _products([(dx2.T, ATT, dparams[4]), (dx2, w_o, d_att)], on_pool)     # dW_o (C, C), d_att (n, C)
        d_att = d_att.reshape(B, T, n_head, -1)                               # (B, T, H, D)

        def head_pairs(i, j):                                                 # (sequence, head) pairs i..j
            lap = laps()
            for b, hs in _pairs(i, j, n_head):
                d_out = d_att[b, :, hs]                                       # (T, h, D)
                if head_keep is not None:
                    d_out *= head_keep[b, hs, None]                           # DropHead
                attention(*(t[0, hs] for t in _heads(qkv[b:b + 1], n_head)), weights[b, hs],
                          d_out.transpose(1, 0, 2), *(t[0, hs] for t in _heads(dqkv[b:b + 1], n_head)))
            lap("attention")

        split(head_pairs, B * n_head, work=2 * _attention_work(B, n_head, T, C))
        dparams[2], dh1 = np.empty_like(w_qkv), np.empty_like(dY)
        _products([(dQKV.T, H1, dparams[2]), (dQKV, w_qkv, dh1)], on_pool)    # dW_qkv (3C, C), dh1 (n, C)

        def ln_1_backward(i, j):
            dw, db = np.zeros_like(ln1_w), np.zeros_like(ln1_b)
            K._layer_norm_bwd(dh1[i:j], XH1[i:j], ln1_w, R1[i:j].reshape(-1), dX[i:j], dw, db)
            dX[i:j] += dx2[i:j]                                               # the residual
            return [dw, db, dQKV[i:j].sum(axis=0)]                            # dln_1, db_qkv

        dparams[0], dparams[1], dparams[3] = in_parts(ln_1_backward, 6 * C)
        return dparams

    n_threads = threads.get_num_threads()
    chosen = schedule(g.shape, n_threads)
    if chosen != "rows":
        if n_threads > 1:
            threads.hold_blas()
        dparams = whole(on_pool=chosen == "pool")
    else:
        dparams = _sums_in_parts(rows, B, work=2 * block_work(g.shape))
    return (dx, *dparams)


KERNELS = {"block": block, "block_backward": block_backward}
