"""Fused CPU kernels for the "cpu" backend, compiled with numba, registered by name in ``KERNELS``.

Optional: they need numba (``pip install "tinyattn[fast]"``). Only the CPU
backend imports this module, on first use, and not at all without numba or
with ``TINYATTN_CPU_KERNELS=0``; the ops then run their numpy formulas, with
the same results up to float32 rounding. The op-table tests check every
kernel here against that formula.

Each kernel does in one or two passes over memory what its numpy formula
does in five to fifteen, and each compiles on its first call for the dtype it
meets (float32 in training, float64 in the gradient checks), about a second
a kernel; ``cache=True`` keeps the machine code on disk, so that happens
once per machine. Every function returns its result, an array or a tuple of
arrays (the in-place ones, the arrays they updated), and None for inputs it
does not take (a dtype other than float32 or float64, an empty array): the op
then runs its own formula.

    gelu_tanh, gelu_tanh_backward          elementwise, one pass
    erf, gelu_erf, gelu_erf_backward       elementwise, one pass (the exact GELU; float32 erf by polynomials)
    layer_norm, layer_norm_backward        one row at a time
    softmax, masked_softmax                one row at a time (the row's max, exp, sum in the row)
    softmax_backward                       one row at a time
    index_add_rows                         embedding's backward: one pass over the rows
    cross_entropy, cross_entropy_backward  one row at a time
    adamw_                                 elementwise: p, m, v updated in place
    attention, attention_backward          softmax(q k^T scale, masked) v: products and softmax per part
    attention_one_query                    decoding's step: one query per head that sees every key
    attention_tile_softmax_                one tile of flash attention's online softmax, in place
    attention_tile_backward_               one tile of its backward: P and dS, in place

Each wrapper but index_add_rows's splits its rows (or elements) over tinyattn's
threads (``threads.split``): the kernels release the GIL, so the parts run at once.

Why not numpy's ``exp``: numba calls the C library's scalar ``exp`` once per
element, several times slower than numpy's SIMD loop. ``_exp`` below is
the classic Cephes float32 exp (a range reduction and a degree-6
polynomial, within 1e-7 relative), written so that the compiler turns the
loop into SIMD code, as fast as numpy's own float32 exp or faster on the CPUs
measured (docs/benchmarks.md). float64 keeps the exact ``np.exp``.
"""
import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from .threads import split, too_small

# Every kernel: compiled on first call and cached on disk; division by zero gives inf
# as in numpy (no Python-style check, which would stop the loops from vectorising);
# the GIL released, so two threads can run kernels at once.
kernel = njit(cache=True, error_model="numpy", nogil=True)
# Kernels that sum along a row may add in any order ("reassoc"), as BLAS and numpy's
# pairwise sums do: that lets the compiler keep several partial sums in SIMD registers.
row_kernel = njit(cache=True, error_model="numpy", nogil=True, fastmath={"reassoc"})


# --------------------------------------------------------------------------
# exp that vectorises: float32 by a polynomial, float64 by np.exp
# --------------------------------------------------------------------------
@intrinsic
def _float32_from_bits(typingctx, bits):
    """The float32 whose bit pattern is the int32 ``bits`` (a reinterpretation, no conversion)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


_LOG2E = np.float32(1.4426950408889634)
_LN2_HI, _LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)     # ln 2 in two parts
_EXP_POLY = tuple(np.float32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3,
                                          4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1))


def _exp(x):
    """exp(x) for a float32 or float64 scalar inside a kernel."""
    return np.exp(x)


# Its steps run in the order written, even inside a row_kernel (no "reassoc": the range reduction
# needs it), but a multiply and an add may fuse into one FMA ("contract": one rounding fewer, and
# the polynomial takes half the instructions, 1.6x faster on a Xeon with AVX-512).
@overload(_exp, jit_options=dict(fastmath={"contract"}, error_model="numpy"))
def _exp_by_type(x):
    if x != types.float32:
        return lambda x: np.exp(x)

    def exp32(x):
        # exp(x) = 2^n exp(r), n = round(x / ln 2), |r| <= ln(2) / 2
        lo, hi = np.float32(-87.0), np.float32(88.0)               # 2^n stays a normal float32
        xc = x if x > lo else lo                                   # (a NaN becomes lo here ...)
        xc = xc if xc < hi else hi
        n = np.floor(xc * _LOG2E + np.float32(0.5))
        r = xc - n * _LN2_HI - n * _LN2_LO                         # x - n ln 2, in two steps for precision
        c0, c1, c2, c3, c4, c5 = _EXP_POLY
        p = ((((c0 * r + c1) * r + c2) * r + c3) * r + c4) * r + c5
        p = p * r * r + r + np.float32(1.0)                        # exp(r)
        e = p * _float32_from_bits((np.int32(n) + np.int32(127)) << np.int32(23))   # * 2^n
        e = e if x >= lo else np.float32(0.0)                      # below: underflow, exp(-inf) = 0
        return e if x == x else x                                  # (... and comes out as NaN)
    return exp32


def _real(c, like):
    """The Python number ``c`` in the float type of ``like`` (a float scalar or array), inside a kernel.

    numba, as numpy's scalar rules, makes float32 * 2 or float32 * 0.5 a float64;
    a kernel writes ``one = _real(1, x)`` once and computes in x's own type."""
    return c


@overload(_real)
def _real_by_type(c, like):
    dtype = like.dtype if isinstance(like, types.Array) else like
    if dtype == types.float32:
        return lambda c, like: np.float32(c)
    return lambda c, like: np.float64(c)


def _all_float(*arrays):
    """True when all arrays share the dtype float32 or float64, and none is empty."""
    dtype = arrays[0].dtype
    if dtype.char not in "fd":                       # float32, float64
        return False
    for a in arrays:                                 # (a loop: this runs before every kernel, on tiny arrays too)
        if a.dtype != dtype or a.size == 0:
            return False
    return True


def _rows(a):
    """(..., C) -> a C-contiguous (N, C) array (a view when ``a`` is contiguous already)."""
    if a.flags.c_contiguous:                                        # (the usual case: no copy, no call)
        return a if a.ndim == 2 else a.reshape(-1, a.shape[-1])
    return np.ascontiguousarray(a).reshape(-1, a.shape[-1])


def _in_parts(kernel, args, sliced, n, work):
    """``kernel(*args)`` over n rows, split over the threads: each part gets ``args[k][i:j]`` for
    each k in ``sliced`` (the arrays whose first axis is the rows) and the other args whole.
    Work too small to share runs as one call on the whole arrays (slicing costs time too)."""
    if too_small(work):
        kernel(*args)
        return

    def part(i, j):
        kernel(*[a[i:j] if k in sliced else a for k, a in enumerate(args)])

    split(part, n, work=work)


# --------------------------------------------------------------------------
# GELU, tanh approximation: 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), u = k0 (x + k1 x^3)
# --------------------------------------------------------------------------
_K0, _K1 = math.sqrt(2.0 / math.pi), 0.044715
GELU_CONSTANTS = (-2 * _K0 * _K1, -2 * _K0, 6 * _K0 * _K1, 2 * _K0)    # a, b, c, d of the two kernels below


@kernel
def _gelu_tanh_fwd(x, y, a, b):                    # x, y (n,); -2u = x (a x^2 + b)
    one = _real(1, x)
    for i in range(x.size):
        v = x[i]
        y[i] = v / (_exp(v * (a * v * v + b)) + one)


@kernel
def _gelu_tanh_bwd(x, g, dx, a, b, c, d):          # dx = g (s + x u'' s (1 - s)), s = sigmoid(2u)
    one = _real(1, x)
    for i in range(x.size):
        v = x[i]
        s = one / (_exp(v * (a * v * v + b)) + one)
        dx[i] = g[i] * (s + v * (c * v * v + d) * s * (one - s))   # c x^2 + d = 2 du/dx


def gelu_tanh(x):
    return _elementwise(_gelu_tanh_fwd, x, consts=GELU_CONSTANTS[:2])


def gelu_tanh_backward(x, g):
    return _elementwise(_gelu_tanh_bwd, x, g, consts=GELU_CONSTANTS)


def _elementwise(kernel, *arrays, consts=()):
    """kernel(*arrays flat, out, *consts) on same-shaped float arrays, split over the threads: the
    output array (the arrays' shape), or None. consts: numbers, passed in the arrays' dtype."""
    if not _all_float(*arrays) or any(a.shape != arrays[0].shape for a in arrays):
        return None
    flat = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
    out = np.empty_like(flat[0])
    real = out.dtype.type
    _in_parts(kernel, (*flat, out, *[real(c) for c in consts]), tuple(range(len(flat) + 1)), out.size, work=out.size)
    return out.reshape(arrays[0].shape)


# --------------------------------------------------------------------------
# erf, for the exact GELU: float32 by two polynomials that vectorise, float64 by the C library's
# --------------------------------------------------------------------------
# |x| < 1: the Taylor series, erf(x) = 2/sqrt(pi) sum (-1)^n x^(2n+1) / (n! (2n+1)), to n = 10.
# |x| >= 1: 1 - erfc(|x|), erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z/2): Numerical Recipes'
# erfcc, relative error under 1.2e-7. Within 3 float32 roundings of the exact erf, and 8x faster
# than the C library's erf called one element at a time (which float64 keeps).
_ERF_TAYLOR = tuple(np.float32(2 / math.sqrt(math.pi) * (-1) ** n / (math.factorial(n) * (2 * n + 1)))
                    for n in range(11))
_ERFC_POLY = tuple(np.float32(c) for c in (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
                                           0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277))


def _erf_scalar(x):
    """erf(x) for a float32 or float64 scalar inside a kernel."""
    return math.erf(x)


@overload(_erf_scalar, inline="always")            # (inlined where it is called, so that the loop vectorises)
def _erf_scalar_by_type(x):
    if x != types.float32:
        return lambda x: math.erf(x)

    def erf32(x):
        c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10 = _ERF_TAYLOR
        p0, p1, p2, p3, p4, p5, p6, p7, p8, p9 = _ERFC_POLY
        one = np.float32(1.0)
        s = x * x
        small = x * (c0 + s * (c1 + s * (c2 + s * (c3 + s * (c4 + s * (c5 + s * (c6 + s * (c7 + s * (c8 + s * (
            c9 + s * c10))))))))))
        z = abs(x)
        t = one / (one + np.float32(0.5) * z)
        p = p0 + t * (p1 + t * (p2 + t * (p3 + t * (p4 + t * (p5 + t * (p6 + t * (p7 + t * (p8 + t * p9))))))))
        big = one - t * _exp(p - s)                                 # (a NaN comes out of both as NaN)
        big = big if x >= 0 else -big
        return small if z < one else big
    return erf32


# Kernels whose multiplies and adds may fuse into FMAs (the polynomials above: one rounding fewer).
fma_kernel = njit(cache=True, error_model="numpy", nogil=True, fastmath={"contract"})


@fma_kernel
def _erf(x, y):                                    # x, y (n,)
    for i in range(x.size):
        y[i] = _erf_scalar(x[i])


@fma_kernel
def _gelu_erf_fwd(x, y):                           # y = x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2
    half, one, r = _real(0.5, x), _real(1, x), _real(1 / math.sqrt(2), x)
    for i in range(x.size):
        v = x[i]
        y[i] = half * v * (one + _erf_scalar(v * r))


@fma_kernel
def _gelu_erf_bwd(x, g, dx):                       # dx = g (Phi(x) + x phi(x)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
    half, one, r = _real(0.5, x), _real(1, x), _real(1 / math.sqrt(2), x)
    c = _real(1 / math.sqrt(2 * math.pi), x)
    for i in range(x.size):
        v = x[i]
        dx[i] = g[i] * (half * (one + _erf_scalar(v * r)) + v * (_exp(-half * v * v) * c))


def erf(x):
    """erf of each element (numpy has none: the backend's formula takes about 250 array passes)."""
    return _elementwise(_erf, x)


def gelu_erf(x):
    """The exact GELU, x Phi(x), in one pass."""
    return _elementwise(_gelu_erf_fwd, x)


def gelu_erf_backward(x, g):
    """Its gradient for the output gradient g, in one pass."""
    return _elementwise(_gelu_erf_bwd, x, g)


# --------------------------------------------------------------------------
# layer norm over the last dim, one row at a time
# --------------------------------------------------------------------------
# Layer norm costs about half as much an element as the other kernels, so it splits from twice as
# many elements (docs/benchmarks.md: what this bought the baby and default GPT steps).
_LIGHT = 2


@row_kernel
def _layer_norm_fwd(x, w, b, y, xhat, rstd, eps):  # x, y, xhat (N, C); w, b (C,); rstd (N, 1)
    N, C = x.shape                                  # (xhat and rstd with no rows: y only)
    one, inv_c = _real(1, x), _real(1 / C, x)
    keep = len(xhat) > 0
    for n in range(N):
        total = _real(0, x)
        for c in range(C):                          # (a loop: x[n].sum() is not SIMD)
            total += x[n, c]
        mean = total * inv_c
        var = _real(0, x)
        for c in range(C):
            d = x[n, c] - mean
            var += d * d
        r = one / np.sqrt(var * inv_c + eps)
        if keep:
            rstd[n, 0] = r
            for c in range(C):
                h = (x[n, c] - mean) * r
                xhat[n, c] = h
                y[n, c] = h * w[c] + b[c]
        else:
            _normalize_row(x, n, mean, r, w, b, y)


@kernel
def _normalize_row(x, n, mean, r, w, b, y):       # y[n] = (x[n] - mean) r w + b
    for c in range(x.shape[1]):                     # (no "reassoc" here: the same rounding as through xhat)
        y[n, c] = (x[n, c] - mean) * r * w[c] + b[c]


@row_kernel
def _layer_norm_bwd(g, xhat, w, rstd, dx, dw, db):  # dx = rstd (gx - mean(gx) - xhat mean(gx xhat)), gx = g w
    N, C = g.shape                                  # dw += sum of g xhat over these rows, db += sum of g
    inv_c = _real(1 / C, g)
    for n in range(N):
        s1, s2 = _real(0, g), _real(0, g)
        for c in range(C):
            gx = g[n, c] * w[c]
            s1 += gx
            s2 += gx * xhat[n, c]
            dw[c] += g[n, c] * xhat[n, c]
            db[c] += g[n, c]
        s1 *= inv_c
        s2 *= inv_c
        r = rstd[n]
        for c in range(C):
            dx[n, c] = r * (g[n, c] * w[c] - s1 - xhat[n, c] * s2)


_NO_ROWS = {c: (np.empty((0, 1), c), np.empty((0, 1), c)) for c in "fd"}    # (xhat, rstd) to keep nothing
_scalars = {}


def _scalar(dtype, value):
    """The Python number ``value`` as a numpy scalar of ``dtype``, made once (eps and scale come often)."""
    if type(value) is not float:                    # (an int, an array: made each time)
        return dtype.type(value)
    key = (dtype.char, value)
    made = _scalars.get(key)
    if made is None:
        if len(_scalars) >= 1024:
            _scalars.clear()
        made = _scalars[key] = dtype.type(value)
    return made


def layer_norm(x, weight, bias, eps, keep=True):
    """(y, xhat, rstd) shaped (..., C), (..., C), (..., 1); with keep=False (no backward will
    run), (y, None, None), computed without writing xhat or rstd."""
    dtype = x.dtype
    if (dtype.char not in "fd" or weight.dtype != dtype or bias.dtype != dtype or x.size == 0
            or weight.shape != x.shape[-1:] or bias.shape != weight.shape):
        return None
    x2 = _rows(x)                                                   # (N, C)
    y = np.empty_like(x2)
    if keep:
        xhat, rstd = np.empty_like(x2), np.empty((len(x2), 1), dtype)
    else:
        xhat, rstd = _NO_ROWS[dtype.char]                           # (no rows: the kernel keeps nothing)
    w = weight if weight.flags.c_contiguous else np.ascontiguousarray(weight)
    b = bias if bias.flags.c_contiguous else np.ascontiguousarray(bias)
    args = (x2, w, b, y, xhat, rstd, _scalar(dtype, eps))
    _in_parts(_layer_norm_fwd, args, (0, 3, 4, 5), len(x2), work=x2.size // _LIGHT)
    if not keep:
        return (y if x.ndim == 2 else y.reshape(x.shape)), None, None
    if x.ndim == 2:
        return y, xhat, rstd
    return y.reshape(x.shape), xhat.reshape(x.shape), rstd.reshape(x.shape[:-1] + (1,))


def layer_norm_backward(g, xhat, weight, rstd):
    """(dx, dw, db): each part of the rows sums its share of dw and db, and the parts are added at the
    end, in order (the same parts on the threads or not: threads.split's same_parts)."""
    if not _all_float(g, xhat, weight, rstd) or g.shape != xhat.shape:
        return None
    g2 = _rows(g)                                                   # (N, C)
    dx = np.empty_like(g2)
    xhat2, w, rstd1 = _rows(xhat), np.ascontiguousarray(weight), np.ascontiguousarray(rstd).reshape(-1)
    sums = {}                                                       # a part's first row -> its (dw, db)

    def rows(i, j):
        dw, db = np.zeros_like(w), np.zeros_like(w)
        _layer_norm_bwd(g2[i:j], xhat2[i:j], w, rstd1[i:j], dx[i:j], dw, db)
        sums[i] = dw, db

    split(rows, len(g2), work=g2.size // _LIGHT, same_parts=True)
    (dw, db), *others = [sums[i] for i in sorted(sums)]            # (in order: the same sums every run)
    for more_dw, more_db in others:
        dw += more_dw
        db += more_db
    return dx.reshape(g.shape), dw, db


# --------------------------------------------------------------------------
# softmax over the last dim, with a (Tq, Tk) mask (True = take part)
# --------------------------------------------------------------------------
@row_kernel
def _masked_softmax_fwd(x, allowed, first, stop, dense, scale, y):   # x, y (N, Tq, Tk); allowed (Tq, Tk);
    N, Tq, Tk = x.shape                                         # first, stop, dense (Tq,) (_row_bounds)
    zero, one = _real(0, x), _real(1, x)                        # y = softmax(x scale) where allowed
    row = np.empty(Tk, x.dtype)                                 # one row's exps (see _ROW below)
    maxes = np.empty(Tq, x.dtype)
    for n in range(N):
        for i in range(Tq):                                     # the maxes first, in a loop of their own (_row_max)
            if dense[i]:
                maxes[i] = _range_max(x[n, i], first[i], stop[i], scale)
            else:
                m = _real(-np.inf, x)
                for j in range(first[i], stop[i]):              # only where keys may be allowed
                    v = x[n, i, j] * scale
                    m = v if allowed[i, j] and v > m else m
                maxes[i] = m
        for i in range(Tq):
            m = maxes[i] if maxes[i] > _real(-np.inf, x) else zero   # every allowed entry -inf: zeros
            total = zero
            for j in range(Tk):                                 # the whole row: a loop the compiler vectorises
                e = _exp(x[n, i, j] * scale - m)
                e = e if allowed[i, j] else zero
                row[j] = e
                total += e
            inv = zero if total == zero else one / total        # a fully masked row: zeros
            for j in range(Tk):
                y[n, i, j] = row[j] * inv


# _ROW: a kernel that may run in place (y is x, as attention's forward and backward call them)
# writes each row through a scratch row. Written straight into y, the loops would read and write
# one array, and the compiler, which cannot prove that safe for SIMD, runs them one element at a
# time: 3 to 4 times slower (docs/benchmarks.md).


@row_kernel
def _softmax_bwd(y, g, scale, dx):                 # dx = y (g - sum(g y)) scale, rows of y, g, dx (N, C)
    N, C = y.shape
    row = np.empty(C, y.dtype)                     # (dx may be g itself: _ROW above)
    for n in range(N):
        s = _real(0, y)
        for c in range(C):
            s += g[n, c] * y[n, c]
        for c in range(C):
            row[c] = y[n, c] * (g[n, c] - s) * scale
        for c in range(C):
            dx[n, c] = row[c]


@kernel
def _range_max(row, a, b, scale):                  # the max of row[a:b] * scale, for a < b
    m = row[a] * scale                             # (a loop of max(): SIMD, where row.max() is not: 2x to 4x
    for c in range(a + 1, b):                      # faster on short rows. A NaN in the row may be skipped here;
        m = max(m, row[c] * scale)                 # it reaches the callers' exp, so the row still comes out NaN.
    return m                                       # Callers find every row's max in a loop of its own: inside
                                                   # the loop that sums the exps, the compiler runs it unrolled, not SIMD)


@kernel
def _row_max(x, n):                                # the max of row n of x (N, C)
    return _range_max(x[n], 0, x.shape[1], _real(1, x))


@row_kernel
def _softmax_fwd(x, y):                            # y = softmax(x) over each row, x, y (N, C)
    N, C = x.shape
    zero, one = _real(0, x), _real(1, x)
    row = np.empty(C, x.dtype)                     # (y may be x itself: _ROW above)
    maxes = np.empty(N, x.dtype)
    for n in range(N):                             # (the maxes first, in a loop of their own: _row_max)
        maxes[n] = _row_max(x, n)
    for n in range(N):
        m = maxes[n]
        total = zero
        for c in range(C):
            e = _exp(x[n, c] - m)
            row[c] = e
            total += e
        inv = one / total
        for c in range(C):
            y[n, c] = row[c] * inv


@kernel
def _row_bounds_(allowed, first, stop, dense):     # allowed (Tq, Tk); first, stop, dense (Tq,)
    Tq, Tk = allowed.shape
    for i in range(Tq):
        first[i], stop[i] = 0, 0
        for j in range(Tk):
            if allowed[i, j]:
                first[i] = j
                break
        for j in range(Tk - 1, -1, -1):
            if allowed[i, j]:
                stop[i] = j + 1
                break
        dense[i] = first[i] < stop[i]
        for j in range(first[i], stop[i]):
            if not allowed[i, j]:
                dense[i] = False


_bounds_of_small_masks = {}       # (shape, the mask's bytes) -> _row_bounds: decoding asks for the same few


def _row_bounds(allowed):
    """(first, stop, dense), (Tq,) each: row i's allowed keys lie in first[i]..stop[i] - 1 (0, 0: none),
    and dense[i] says every key between is allowed. For a causal mask, 0, i + 1 and True: the max
    skips the masked half, and checks no mask."""
    key = (allowed.shape, allowed.tobytes()) if allowed.size <= 4096 else None
    bounds = _bounds_of_small_masks.get(key) if key is not None else None
    if bounds is None:
        first, stop = np.empty(len(allowed), np.int64), np.empty(len(allowed), np.int64)
        dense = np.empty(len(allowed), np.bool_)
        _row_bounds_(allowed, first, stop, dense)
        bounds = first, stop, dense
        if key is not None:
            if len(_bounds_of_small_masks) >= 256:
                _bounds_of_small_masks.clear()
            _bounds_of_small_masks[key] = bounds
    return bounds


def softmax(x):
    """Softmax over the last dim of x (..., C)."""
    if x.dtype.char not in "fd" or x.size == 0 or x.ndim < 1:
        return None
    x2 = _rows(x)                                                   # (N, C)
    y = np.empty_like(x2)
    _in_parts(_softmax_fwd, (x2, y), (0, 1), len(x2), work=x2.size)
    return y if x.ndim == 2 else y.reshape(x.shape)


def masked_softmax(x, allowed):
    """Softmax over the last dim of x (..., Tq, Tk) where ``allowed`` (Tq, Tk) is True; None for other masks."""
    if not _all_float(x) or x.ndim < 2 or allowed.shape != x.shape[-2:] or allowed.dtype != np.bool_:
        return None
    x3 = np.ascontiguousarray(x).reshape((-1,) + x.shape[-2:])     # (N, Tq, Tk)
    y = np.empty_like(x3)
    allowed = np.ascontiguousarray(allowed)
    first, stop, dense = _row_bounds(allowed)
    args = (x3, allowed, first, stop, dense, x.dtype.type(1), y)
    _in_parts(_masked_softmax_fwd, args, (0, 6), len(x3), work=x3.size)
    return y.reshape(x.shape)


def softmax_backward(y, g):
    """d loss / dx through y = softmax(x) over the last dim, for the output gradient g."""
    if not _all_float(y, g) or y.shape != g.shape or y.ndim < 1:
        return None
    y2 = _rows(y)
    dx = np.empty_like(y2)
    g2 = _rows(g)
    one = y.dtype.type(1)
    _in_parts(_softmax_bwd, (y2, g2, one, dx), (0, 1, 3), len(y2), work=y2.size)
    return dx.reshape(y.shape)


# --------------------------------------------------------------------------
# attention, softmax(q k^T scale where allowed) v: the naive path as one op
# --------------------------------------------------------------------------
def _all_stacked(*arrays):
    """True when every array is a stack (S, ..., n, m) over the same leading dims."""
    lead = arrays[0].shape[:-2]
    return all(a.ndim >= 3 and a.shape[:-2] == lead for a in arrays)


def attention(q, k, v, allowed, scale):
    """(out, weights) for q (S, ..., Tq, D), k (S, ..., Tk, D), v (S, ..., Tk, Dv), allowed (Tq, Tk) bools.

    Each thread takes some of the S leading rows and runs the scores, the masked
    softmax (in place) and the second product on them, while they are in its
    cache. ``out`` has q's memory order: heads that are a (B, T, H, D) buffer seen
    as (B, H, T, D) give an output that merges back to (B, T, H * D) as a view.
    """
    if not (_all_float(q, k, v) and _all_stacked(q, k, v) and allowed.dtype == np.bool_
            and allowed.shape == (q.shape[-2], k.shape[-2]) and q.shape[-1] == k.shape[-1]):
        return None
    weights = np.empty(q.shape[:-1] + k.shape[-2:-1], dtype=q.dtype)     # (S, ..., Tq, Tk)
    out = np.empty_like(q, shape=q.shape[:-1] + v.shape[-1:])             # (S, ..., Tq, Dv), q's order
    allowed, scale = np.ascontiguousarray(allowed), q.dtype.type(scale)
    first, stop, dense = _row_bounds(allowed)

    def rows(i, j):
        w = weights[i:j]
        np.matmul(q[i:j], np.matrix_transpose(k[i:j]), out=w)   # scores, unscaled
        w3 = w.reshape((-1,) + w.shape[-2:])
        _masked_softmax_fwd(w3, allowed, first, stop, dense, scale, w3)   # weights, in place
        np.matmul(w, v[i:j], out=out[i:j])

    split(rows, len(q), work=weights.size * (q.shape[-1] + v.shape[-1]) // 32)
    return out, weights


def _empty_like_parts(*arrays):
    """Empty arrays laid out as ``arrays``. When those are disjoint views that fill one array
    (attention's q, k and v, cut from one qkv product), the new ones are views of one new
    array at the same places, so their gradients join into qkv's without a copy (ops.Split)."""
    base = arrays[0].base
    if (base is not None and base.flags.c_contiguous and base.dtype == arrays[0].dtype
            and all(a.base is base for a in arrays) and sum(a.size for a in arrays) == base.size
            and not any(np.shares_memory(a, b) for i, a in enumerate(arrays) for b in arrays[i + 1:])):
        whole, start = np.empty_like(base), base.ctypes.data
        return [np.ndarray(a.shape, a.dtype, buffer=whole, offset=a.ctypes.data - start, strides=a.strides)
                for a in arrays]
    return [np.empty_like(a) for a in arrays]


def attention_backward(g, q, k, v, weights, scale):
    """(dq, dk, dv) for the output gradient g, each in its input's memory order."""
    if not (_all_float(g, q, k, v, weights) and _all_stacked(g, q, k, v, weights)):
        return None
    dq, dk, dv = _empty_like_parts(q, k, v)
    scale = q.dtype.type(scale)

    def rows(i, j):
        w = weights[i:j]
        np.matmul(np.matrix_transpose(w), g[i:j], out=dv[i:j])   # dV = P^T dO
        ds = np.matmul(g[i:j], np.matrix_transpose(v[i:j]))   # dP = dO V^T
        ds2 = ds.reshape(-1, ds.shape[-1])
        _softmax_bwd(w.reshape(ds2.shape), ds2, scale, ds2)               # dS = P (dP - rowsum(dP P)) scale, in place
        np.matmul(ds, k[i:j], out=dq[i:j])                                # dQ = dS K scale
        np.matmul(np.matrix_transpose(ds), q[i:j], out=dk[i:j])   # dK = dS^T Q scale

    split(rows, len(q), work=weights.size * (2 * q.shape[-1] + 2 * v.shape[-1]) // 32)
    return dq, dk, dv


def attention_one_query(q, k, v, scale):
    """softmax(q k^T scale) v for one query per head that may see every key (decoding's new token):
    q (B, H, D), k (B, H, Tk, D), v (B, H, Tk, Dv) -> (B, H, Dv). None for other shapes (or Tk = 0).

    What ``attention`` does with an all-True mask, without building or reading one: the two
    products as stacked BLAS calls, and the plain softmax kernel on the (B * H, Tk) scores."""
    if not (_all_float(q, k, v) and q.ndim == 3 and k.ndim == v.ndim == 4 and k.shape[:2] == v.shape[:2] == q.shape[:2]
            and k.shape[2] == v.shape[2] and k.shape[3] == q.shape[2]):
        return None
    out = np.empty(q.shape[:2] + v.shape[3:], q.dtype)                   # (B, H, Dv)
    scale = q.dtype.type(scale)

    def rows(i, j):                                                       # sequences i..j
        scores = np.matmul(q[i:j, :, None, :], np.matrix_transpose(k[i:j]))   # (n, H, 1, Tk)
        weights = scores.reshape(-1, scores.shape[-1])
        weights *= scale
        _softmax_fwd(weights, weights)                                    # in place
        np.matmul(scores, v[i:j], out=out[i:j, :, None, :])

    split(rows, len(q), work=(k.size + v.size) // 32)
    return out


# --------------------------------------------------------------------------
# embedding backward: rows scattered and added into a table
# --------------------------------------------------------------------------
@kernel
def _index_add_rows(idx, values, out):             # out[idx[i]] += values[i]; idx (N,), values (N, C)
    N, C = values.shape
    for i in range(N):
        r = idx[i]
        for c in range(C):
            out[r, c] += values[i, c]


def index_add_rows(n_rows, idx, values):
    """(n_rows, C) zeros with out[idx[i]] += values[i] for (N, C) values: one pass over them,
    on one thread (rows repeat). None for ids outside [0, n_rows) (the formula then decides)."""
    if not _all_float(values) or values.ndim != 2 or idx.shape != values.shape[:1] or idx.dtype.kind not in "iu" \
            or int(idx.min()) < 0 or int(idx.max()) >= n_rows:
        return None
    out = np.zeros((n_rows, values.shape[1]), dtype=values.dtype)
    _index_add_rows(np.ascontiguousarray(idx), np.ascontiguousarray(values), out)
    return out


# --------------------------------------------------------------------------
# softmax cross-entropy: logits (N, C), targets (N,) ints
# --------------------------------------------------------------------------
@row_kernel
def _cross_entropy_fwd(x, t, lse, ignore_index):   # returns (sum of the counted rows' losses, their count)
    N, C = x.shape
    loss, count = 0.0, 0                                          # loss in float64
    for n in range(N):                                            # (the maxes first: _row_max)
        lse[n] = _row_max(x, n)
    for n in range(N):
        m = lse[n]
        s = _real(0, x)
        for c in range(C):
            s += _exp(x[n, c] - m)
        lse[n] = m + np.log(s)
        if t[n] != ignore_index:
            loss += lse[n] - x[n, t[n]]
            count += 1
    return loss, count


@kernel
def _cross_entropy_bwd(x, t, lse, gscale, dx, ignore_index):   # dx = gscale (softmax - onehot), 0 if ignored
    N, C = x.shape
    for n in range(N):
        if t[n] == ignore_index:
            dx[n] = 0
            continue
        for c in range(C):
            dx[n, c] = gscale * _exp(x[n, c] - lse[n])
        dx[n, t[n]] -= gscale


def cross_entropy(logits, targets, ignore_index):
    """(loss (), lse (N,), scale ()): scale = 1 / max(counted rows, 1). Targets in range (checked by the op)."""
    if logits.ndim != 2 or not _all_float(logits) or targets.shape != logits.shape[:1] or targets.dtype.kind not in "iu":
        return None
    x = np.ascontiguousarray(logits)
    lse = np.empty(x.shape[0], dtype=x.dtype)
    t, ignore = np.ascontiguousarray(targets, dtype=np.int64), np.int64(ignore_index)
    parts = {}                                                       # a part's first row -> (loss, count)

    def rows(i, j):
        parts[i] = _cross_entropy_fwd(x[i:j], t[i:j], lse[i:j], ignore)

    split(rows, len(x), work=x.size, same_parts=True)
    total, count = (sum(parts[i][k] for i in sorted(parts)) for k in (0, 1))
    real = x.dtype.type
    scale = real(1.0 / max(count, 1))
    return np.asarray(real(total) * scale), lse, np.asarray(scale)


def cross_entropy_backward(g, logits, targets, lse, scale, ignore_index):
    """d loss / d logits (N, C) for the loss gradient g (a 0-d array)."""
    if not _all_float(logits, lse) or g.dtype != logits.dtype or g.size != 1:
        return None
    x = np.ascontiguousarray(logits)
    dx = np.empty_like(x)
    real = x.dtype.type
    t, gscale, ignore = np.ascontiguousarray(targets, dtype=np.int64), real(g.reshape(()) * scale), np.int64(ignore_index)
    _in_parts(_cross_entropy_bwd, (x, t, lse, gscale, dx, ignore), (0, 1, 2, 4), len(x), work=x.size)
    return dx


# --------------------------------------------------------------------------
# AdamW, in place over p, m, v: the arithmetic of AdamW.step, in its order
# --------------------------------------------------------------------------
@kernel
def _adamw(p, g, m, v, b1, one_minus_b1, b2, one_minus_b2, eps, decay, step_size, inv_sqrt_bc2):
    for i in range(p.size):
        m[i] = m[i] * b1 + g[i] * one_minus_b1                     # first moment
        v[i] = v[i] * b2 + (g[i] * g[i]) * one_minus_b2            # second moment
        p[i] = p[i] * decay                                        # decoupled weight decay
        p[i] = p[i] - m[i] / (np.sqrt(v[i]) * inv_sqrt_bc2 + eps) * step_size


def adamw_(p, g, m, v, lr, beta1, beta2, eps, weight_decay, step):
    """One AdamW step for one flat or shaped parameter, in place. Returns p (None: not for these inputs)."""
    if not _all_float(p, g, m, v) or not (p.shape == g.shape == m.shape == v.shape):
        return None
    if not all(a.flags.c_contiguous for a in (p, g, m, v)):
        return None
    real = p.dtype.type
    p1, g1, m1, v1 = (a.reshape(-1) for a in (p, g, m, v))
    consts = (real(beta1), real(1 - beta1), real(beta2), real(1 - beta2), real(eps), real(1 - lr * weight_decay),
              real(lr / (1 - beta1 ** step)), real(1.0 / math.sqrt(1 - beta2 ** step)))
    _in_parts(_adamw, (p1, g1, m1, v1, *consts), (0, 1, 2, 3), p1.size, work=p1.size)
    return p


# --------------------------------------------------------------------------
# flash attention (nn/flash.py): the elementwise work on one (bk, bq) tile
# --------------------------------------------------------------------------
# A tile is transposed, keys x queries: s[r, c] is the score of key j0 + r for
# query i0 + c, so each row of s runs over queries and every per-query number
# (max, sum, logsumexp L, D) is a (bq,) vector that the inner loop sweeps along
# with the row: the loops vectorise. Causal: key j0 + r may be seen by query
# i0 + c when c >= first + r, first = j0 - i0 (any first <= -bk: no causal mask).
# Masked entries (causal, or -inf from a user's mask) get weight exactly 0.
# (Every inner loop runs over the whole row: a loop that starts at a varying
# column, range(c0, bq), stopped numba from vectorising it.)
@kernel
def _causal_fill(s, first):                        # s[r, c] = -inf where c < first + r
    bk, bq = s.shape
    for r in range(bk):
        for c in range(min(bq, max(0, first + r))):
            s[r, c] = -np.inf


@kernel
def _attention_tile_softmax(s, m, l, alpha, first):   # s (bk, bq) in place; m, l, alpha (bq,)
    bk, bq = s.shape
    zero, neg_inf = _real(0, s), _real(-np.inf, s)
    _causal_fill(s, first)
    new_m = m.copy()                                               # the running max with this tile
    for r in range(bk):
        for c in range(bq):
            x = s[r, c]
            new_m[c] = x if x > new_m[c] else new_m[c]
    shift = np.empty_like(m)                                       # 0 for a query that has seen nothing yet
    for c in range(bq):
        shift[c] = new_m[c] if new_m[c] > neg_inf else zero
        a = _exp(m[c] - shift[c])
        alpha[c] = a if m[c] > neg_inf else zero                   # rescales the old sums; 0 at the start
        l[c] *= alpha[c]
        m[c] = new_m[c]
    for r in range(bk):
        for c in range(bq):
            x = s[r, c] - shift[c]
            e = _exp(x)
            e = zero if x == neg_inf else e                        # masked: exactly 0 (the float32 exp clamps)
            s[r, c] = e
            l[c] += e


@kernel
def _attention_tile_backward(s, dp, lse, d, first):   # s, dp (bk, bq) in place; lse, d (bq,)
    bk, bq = s.shape
    zero, neg_inf = _real(0, s), _real(-np.inf, s)
    _causal_fill(s, first)
    for r in range(bk):
        for c in range(bq):
            x = s[r, c] - lse[c]                                   # -inf: masked, or a query that sees nothing
            p = _exp(x)
            p = zero if x == neg_inf else p                        # (a NaN stays NaN)
            s[r, c] = p                                            # P^T
            dp[r, c] = p * (dp[r, c] - d[c])                       # dS^T = P^T * (dP^T - D)


def _tile_args_fit(s, *vectors):
    """True when s is a C-contiguous (bk, bq) float tile and each vector a contiguous (bq,) of its dtype."""
    return (s.ndim == 2 and s.flags.c_contiguous and _all_float(s, *vectors)
            and all(v.shape == (s.shape[1],) and v.flags.c_contiguous for v in vectors))


def attention_tile_softmax_(s, m, l, first):
    """One key block of the online softmax, in place; returns alpha (bq,), the factor for the old sums.

    s (bk, bq) scores, keys x queries, becomes exp(s - m_new) (0 where masked);
    m (bq,) the running max becomes m_new, l (bq,) the running sum becomes alpha l + colsum(P).
    first = j0 - i0 for a causal tile, any value <= -bk otherwise."""
    if not _tile_args_fit(s, m, l):
        return None
    alpha = np.empty_like(m)
    _attention_tile_softmax(s, m, l, alpha, int(first))
    return alpha


def attention_tile_backward_(s, dp, lse, d, first):
    """One tile of the backward, in place: s (bk, bq) scores becomes P^T = exp(s - L) (0 where masked),
    dp (bk, bq) = (dO V^T)^T becomes dS^T = P^T * (dP^T - D). lse, d (bq,). Returns (s, dp), or None."""
    if not _tile_args_fit(s, lse, d) or dp.shape != s.shape or dp.dtype != s.dtype or not dp.flags.c_contiguous:
        return None
    _attention_tile_backward(s, dp, lse, d, int(first))
    return s, dp


# The one table the backend reads: ``backend.kernel(name)``.
KERNELS = {
    "gelu_tanh": gelu_tanh,
    "gelu_tanh_backward": gelu_tanh_backward,
    "erf": erf,
    "gelu_erf": gelu_erf,
    "gelu_erf_backward": gelu_erf_backward,
    "layer_norm": layer_norm,
    "layer_norm_backward": layer_norm_backward,
    "index_add_rows": index_add_rows,
    "softmax": softmax,
    "masked_softmax": masked_softmax,
    "softmax_backward": softmax_backward,
    "cross_entropy": cross_entropy,
    "cross_entropy_backward": cross_entropy_backward,
    "adamw_": adamw_,
    "attention": attention,
    "attention_backward": attention_backward,
    "attention_one_query": attention_one_query,
    "attention_tile_softmax_": attention_tile_softmax_,
    "attention_tile_backward_": attention_tile_backward_,
}
