"""Fused CuPy kernels for the "cuda" backend, registered by name in ``KERNELS``.

Only ``CupyBackend`` imports this module, and only on first use, so a machine
without CuPy never sees it. Every function takes and returns CuPy arrays and
returns None when it has no kernel for its input (a dtype other than float32
or float64, an empty array): the op then runs its own formula. The op-table
tests check each registered kernel against that formula.

    gelu_tanh, gelu_tanh_backward        ElementwiseKernel
    adamw_                               ElementwiseKernel: p, m, v updated in place
    layer_norm, layer_norm_backward      RawKernel, one block per row
    cross_entropy, cross_entropy_backward  RawKernel, one block per row

The RawKernels are written once for a type ``real`` and compiled for float or
double. CuPy checks neither the number nor the types of RawKernel arguments,
so every scalar goes in with an explicit NumPy type (np.int32 for ``int``,
np.int64 for ``long long``, the array's own float type for ``real``), and
every array is made C-contiguous first: a RawKernel ignores strides.
"""
import functools

import cupy
import numpy as np

_CTYPES = {np.dtype("float32"): "float", np.dtype("float64"): "double"}


def _all_float(*arrays):
    """True when all arrays share one dtype that the kernels are compiled for, and are not empty."""
    dtype = arrays[0].dtype
    return dtype in _CTYPES and all(a.dtype == dtype for a in arrays) and all(a.size for a in arrays)


def _threads(n):
    """Threads per block for a row of n elements: a power of two from 32 to 256."""
    t = 32
    while t < n and t < 256:
        t *= 2
    return t


# --------------------------------------------------------------------------
# GELU, tanh approximation: one pass instead of about ten elementwise ops
# --------------------------------------------------------------------------
_gelu_tanh_fwd = cupy.ElementwiseKernel(
    "T x", "T y",
    """
    const T k0 = 0.7978845608028654;      // sqrt(2 / pi)
    const T k1 = 0.044715;
    T t = tanh(k0 * (x + k1 * x * x * x));
    y = (T)0.5 * x * ((T)1 + t);
    """,
    "tinyattn_gelu_tanh_fwd")

_gelu_tanh_bwd = cupy.ElementwiseKernel(
    "T x, T g", "T dx",
    """
    const T k0 = 0.7978845608028654;
    const T k1 = 0.044715;
    T t = tanh(k0 * (x + k1 * x * x * x));
    T du = k0 * ((T)1 + (T)3 * k1 * x * x);                 // d/dx of the tanh's argument
    dx = g * ((T)0.5 * ((T)1 + t) + (T)0.5 * x * ((T)1 - t * t) * du);
    """,
    "tinyattn_gelu_tanh_bwd")


def gelu_tanh(x):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise."""
    return _gelu_tanh_fwd(x) if _all_float(x) else None


def gelu_tanh_backward(x, g):
    """d gelu_tanh(x) / dx * g, recomputing tanh from x (nothing saved but x)."""
    if not _all_float(x, g) or x.shape != g.shape:
        return None
    return _gelu_tanh_bwd(x, g)


# --------------------------------------------------------------------------
# AdamW: one pass over p, m, v instead of about ten
# --------------------------------------------------------------------------
_adamw = cupy.ElementwiseKernel(
    "T g, T beta1, T one_minus_beta1, T beta2, T one_minus_beta2, T eps, T decay, "
    "T step_size, T inv_sqrt_bc2",
    "T p, T m, T v",
    """
    m = beta1 * m + one_minus_beta1 * g;                    // first moment
    v = beta2 * v + one_minus_beta2 * (g * g);              // second moment
    p = p * decay;                                          // decoupled weight decay
    p = p - step_size * (m / (sqrt(v) * inv_sqrt_bc2 + eps));
    """,
    "tinyattn_adamw")


def adamw_(p, g, m, v, lr, beta1, beta2, eps, weight_decay, step):
    """The AdamW update of ``AdamW.step`` for one parameter, in place. Returns p (None: not for these inputs).

    The same arithmetic as the array code: the bias corrections are folded
    into step_size = lr / (1 - beta1^t) and 1 / sqrt(1 - beta2^t).
    """
    if not _all_float(p, g, m, v) or not (p.shape == g.shape == m.shape == v.shape):
        return None
    real = p.dtype.type                                      # np.float32 or np.float64
    _adamw(g, real(beta1), real(1 - beta1), real(beta2), real(1 - beta2), real(eps),
           real(1 - lr * weight_decay), real(lr / (1 - beta1 ** step)),
           real(1.0 / (1 - beta2 ** step) ** 0.5), p, m, v)
    return p


# --------------------------------------------------------------------------
# RawKernels: layer norm and softmax cross-entropy, one block per row
# --------------------------------------------------------------------------
_BLOCK_REDUCE = r"""
// Block-wide reductions. Every thread of the block calls them with its partial
// value and gets the total back. THREADS (a power of two) threads per block.
__device__ real block_sum(real v, real* buf) {
    int tid = threadIdx.x;
    buf[tid] = v;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s /= 2) {
        if (tid < s) buf[tid] += buf[tid + s];
        __syncthreads();
    }
    real total = buf[0];
    __syncthreads();                        // all have read buf[0] before buf is reused
    return total;
}

__device__ real block_max(real v, real* buf) {
    int tid = threadIdx.x;
    buf[tid] = v;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s /= 2) {
        if (tid < s) buf[tid] = fmax(buf[tid], buf[tid + s]);
        __syncthreads();
    }
    real total = buf[0];
    __syncthreads();
    return total;
}
"""

_ROW_KERNELS = r"""
// x, y, xhat: (N, C); w, b: (C,); rstd: (N,). Block `row` normalises row `row`.
extern "C" __global__ void layer_norm_fwd(const real* x, const real* w, const real* b,
                                          real* y, real* xhat, real* rstd, int C, real eps) {
    __shared__ real buf[THREADS];
    const long long off = (long long)blockIdx.x * C;
    const real* xr = x + off;
    real s = 0;
    for (int c = threadIdx.x; c < C; c += THREADS) s += xr[c];
    const real mean = block_sum(s, buf) / (real)C;
    real s2 = 0;                                    // two passes: the variance of centred values
    for (int c = threadIdx.x; c < C; c += THREADS) { real d = xr[c] - mean; s2 += d * d; }
    const real var = block_sum(s2, buf) / (real)C;
    const real r = (real)1 / sqrt(var + eps);
    for (int c = threadIdx.x; c < C; c += THREADS) {
        real h = (xr[c] - mean) * r;
        xhat[off + c] = h;
        y[off + c] = h * w[c] + b[c];
    }
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
}

// dx = rstd * (gx - mean(gx) - xhat * mean(gx * xhat)), with gx = g * w. g, xhat, dx: (N, C).
extern "C" __global__ void layer_norm_bwd(const real* g, const real* xhat, const real* w,
                                          const real* rstd, real* dx, int C) {
    __shared__ real buf[THREADS];
    const long long off = (long long)blockIdx.x * C;
    real s1 = 0, s2 = 0;
    for (int c = threadIdx.x; c < C; c += THREADS) {
        real gx = g[off + c] * w[c];
        s1 += gx;
        s2 += gx * xhat[off + c];
    }
    const real mean_gx = block_sum(s1, buf) / (real)C;
    const real mean_gx_xhat = block_sum(s2, buf) / (real)C;
    const real r = rstd[blockIdx.x];
    for (int c = threadIdx.x; c < C; c += THREADS) {
        real gx = g[off + c] * w[c];
        dx[off + c] = r * (gx - mean_gx - xhat[off + c] * mean_gx_xhat);
    }
}

// logits: (N, C); targets: (N,) int64. Per row: lse = log sum exp(logits) and
// row_loss = lse - logits[target] (0 for an ignored row, NaN for a target out of range).
extern "C" __global__ void cross_entropy_fwd(const real* logits, const long long* targets,
                                             real* row_loss, real* lse, int C, long long ignore_index) {
    __shared__ real buf[THREADS];
    const real* xr = logits + (long long)blockIdx.x * C;
    real m = xr[0];                                 // any element of the row starts a max
    for (int c = threadIdx.x; c < C; c += THREADS) m = fmax(m, xr[c]);
    m = block_max(m, buf);
    real s = 0;
    for (int c = threadIdx.x; c < C; c += THREADS) s += exp(xr[c] - m);
    s = block_sum(s, buf);
    if (threadIdx.x == 0) {
        const real l = m + log(s);
        const long long t = targets[blockIdx.x];
        lse[blockIdx.x] = l;
        if (t == ignore_index) row_loss[blockIdx.x] = 0;
        else if (t < 0 || t >= C) row_loss[blockIdx.x] = (real)nan("");
        else row_loss[blockIdx.x] = l - xr[t];
    }
}

// dlogits = gscale * (softmax(logits) - onehot(target)) on counted rows, 0 on ignored ones.
// gscale (1 element, on the device): the loss gradient over the number of counted rows.
extern "C" __global__ void cross_entropy_bwd(const real* logits, const long long* targets,
                                             const real* lse, const real* gscale, real* dlogits,
                                             int C, long long ignore_index) {
    const long long off = (long long)blockIdx.x * C;
    const long long t = targets[blockIdx.x];
    const real coef = (t == ignore_index) ? (real)0 : gscale[0];
    const real l = lse[blockIdx.x];
    for (int c = threadIdx.x; c < C; c += THREADS) {
        real p = exp(logits[off + c] - l);
        dlogits[off + c] = coef * (p - (c == t ? (real)1 : (real)0));
    }
}
"""


@functools.cache
def _row_module(dtype, threads):
    """The row kernels compiled for one float type and block size (compiled on first launch)."""
    head = f"typedef {_CTYPES[dtype]} real;\n#define THREADS {threads}\n"
    return cupy.RawModule(code=head + _BLOCK_REDUCE + _ROW_KERNELS)


def _rows(x):
    """(..., C) -> a C-contiguous (N, C) array."""
    return cupy.ascontiguousarray(x).reshape(-1, x.shape[-1])


def layer_norm(x, weight, bias, eps, keep=True):
    """Layer norm over the last dim: (y, xhat, rstd) shaped (..., C), (..., C), (..., 1).
    (``keep``, as the CPU kernel takes it, changes nothing here: xhat and rstd come back always.)"""
    if not _all_float(x, weight, bias) or weight.shape != x.shape[-1:] or bias.shape != x.shape[-1:]:
        return None
    x2 = _rows(x)                                                  # (N, C)
    N, C = x2.shape
    y, xhat = cupy.empty_like(x2), cupy.empty_like(x2)
    rstd = cupy.empty((N,), dtype=x2.dtype)
    threads = _threads(C)
    kernel = _row_module(x2.dtype, threads).get_function("layer_norm_fwd")
    kernel((N,), (threads,), (x2, cupy.ascontiguousarray(weight), cupy.ascontiguousarray(bias),
                              y, xhat, rstd, np.int32(C), x2.dtype.type(eps)))
    return y.reshape(x.shape), xhat.reshape(x.shape), rstd.reshape(x.shape[:-1] + (1,))


def layer_norm_backward(g, xhat, weight, rstd):
    """(dx, dw, db) of layer norm from the saved xhat and rstd; g and xhat (..., C), rstd (..., 1).
    The kernel gives dx; dw and db are CuPy's sums over the rows."""
    if not _all_float(g, xhat, weight, rstd) or g.shape != xhat.shape:
        return None
    g2, xhat2 = _rows(g), _rows(xhat)                              # (N, C)
    N, C = g2.shape
    dx = cupy.empty_like(g2)
    threads = _threads(C)
    kernel = _row_module(g2.dtype, threads).get_function("layer_norm_bwd")
    kernel((N,), (threads,), (g2, xhat2, cupy.ascontiguousarray(weight),
                              cupy.ascontiguousarray(rstd).reshape(-1), dx, np.int32(C)))
    return dx.reshape(g.shape), (g2 * xhat2).sum(axis=0), g2.sum(axis=0)


def cross_entropy(logits, targets, ignore_index):
    """Mean softmax cross-entropy of (N, C) logits against (N,) int targets.

    Returns (loss (), lse (N,), scale ()), all on the device: scale is
    1 / max(number of counted rows, 1), which the backward needs too.
    """
    if (logits.ndim != 2 or not _all_float(logits) or targets.shape != logits.shape[:1]
            or targets.dtype.kind not in "iu"):
        return None
    x = cupy.ascontiguousarray(logits)                             # (N, C)
    t = cupy.ascontiguousarray(targets.astype(cupy.int64, copy=False))   # (N,)
    N, C = x.shape
    row_loss, lse = cupy.empty((N,), dtype=x.dtype), cupy.empty((N,), dtype=x.dtype)
    threads = _threads(C)
    kernel = _row_module(x.dtype, threads).get_function("cross_entropy_fwd")
    kernel((N,), (threads,), (x, t, row_loss, lse, np.int32(C), np.int64(ignore_index)))
    count = cupy.sum(t != ignore_index, dtype=x.dtype)             # () on the device: no sync
    scale = cupy.reciprocal(cupy.maximum(count, cupy.ones((), dtype=x.dtype)))
    return cupy.sum(row_loss) * scale, lse, scale


def cross_entropy_backward(g, logits, targets, lse, scale, ignore_index):
    """d loss / d logits (N, C) for the loss gradient g (a 0-d device array)."""
    if not _all_float(logits, lse) or g.dtype != logits.dtype or g.size != 1:
        return None
    x = cupy.ascontiguousarray(logits)
    t = cupy.ascontiguousarray(targets.astype(cupy.int64, copy=False))
    N, C = x.shape
    gscale = cupy.ascontiguousarray((g * scale).astype(x.dtype, copy=False).reshape(1))   # (1,)
    dlogits = cupy.empty_like(x)
    threads = _threads(C)
    kernel = _row_module(x.dtype, threads).get_function("cross_entropy_bwd")
    kernel((N,), (threads,), (x, t, cupy.ascontiguousarray(lse), gscale, dlogits,
                              np.int32(C), np.int64(ignore_index)))
    return dlogits


# The one table the backend reads: ``backend.kernel(name)``.
KERNELS = {
    "gelu_tanh": gelu_tanh,
    "gelu_tanh_backward": gelu_tanh_backward,
    "layer_norm": layer_norm,
    "layer_norm_backward": layer_norm_backward,
    "cross_entropy": cross_entropy,
    "cross_entropy_backward": cross_entropy_backward,
    "adamw_": adamw_,
}
