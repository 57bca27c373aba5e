"""Fused CuPy kernels for the "cuda" backend.

Only ``CupyBackend`` imports this module, and only on first use, so a machine
without CuPy never sees it. Every function takes and returns CuPy arrays and
returns None when it has no kernel for its input (a dtype other than float32
or float64, an empty array, a head size over 128): the op then runs its
ordinary array code. tests/test_gpu.py checks each kernel against that code.

    gelu_tanh, gelu_tanh_backward        ElementwiseKernel
    adamw_                               ElementwiseKernel: p, m, v updated in place
    layer_norm, layer_norm_backward      RawKernel, one block per row
    cross_entropy, cross_entropy_backward  RawKernel, one block per row
    attention_forward                    RawKernel, tiled, forward only (no backward)

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


def _floats(*arrays):
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
    return _gelu_tanh_fwd(x) if _floats(x) else None


def gelu_tanh_backward(x, g):
    """d gelu_tanh(x) / dx * g, recomputing tanh from x (nothing saved but x)."""
    if not _floats(x, g) or x.shape != g.shape:
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
    """The AdamW update of ``AdamW.step`` for one parameter, in place. True when done.

    The same arithmetic as the array code: the bias corrections are folded
    into step_size = lr / (1 - beta1^t) and 1 / sqrt(1 - beta2^t).
    """
    if not _floats(p, g, m, v) or not (p.shape == g.shape == m.shape == v.shape):
        return None
    real = p.dtype.type                                      # np.float32 or np.float64
    _adamw(g, real(beta1), real(1 - beta1), real(beta2), real(1 - beta2), real(eps),
           real(1 - lr * weight_decay), real(lr / (1 - beta1 ** step)),
           real(1.0 / (1 - beta2 ** step) ** 0.5), p, m, v)
    return True


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


def layer_norm(x, weight, bias, eps):
    """Layer norm over the last dim: (y, xhat, rstd) shaped (..., C), (..., C), (..., 1)."""
    if not _floats(x, weight, bias) or weight.shape != x.shape[-1:] or bias.shape != x.shape[-1:]:
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
    """d loss / dx of layer norm from the saved xhat and rstd; g and xhat (..., C), rstd (..., 1)."""
    if not _floats(g, xhat, weight, rstd) or g.shape != xhat.shape:
        return None
    g2, xhat2 = _rows(g), _rows(xhat)                              # (N, C)
    N, C = g2.shape
    dx = cupy.empty_like(g2)
    threads = _threads(C)
    kernel = _row_module(g2.dtype, threads).get_function("layer_norm_bwd")
    kernel((N,), (threads,), (g2, xhat2, cupy.ascontiguousarray(weight),
                              cupy.ascontiguousarray(rstd).reshape(-1), dx, np.int32(C)))
    return dx.reshape(g.shape)


def cross_entropy(logits, targets, ignore_index):
    """Mean softmax cross-entropy of (N, C) logits against (N,) int targets.

    Returns (loss (), lse (N,), scale ()), all on the device: scale is
    1 / max(number of counted rows, 1), which the backward needs too.
    """
    if (logits.ndim != 2 or not _floats(logits) or targets.shape != logits.shape[:1]
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
    if not _floats(logits, lse) or g.dtype != logits.dtype or g.size != 1:
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


# --------------------------------------------------------------------------
# Tiled attention, forward only: softmax(q k^T * scale) v without the (T, T) scores
# --------------------------------------------------------------------------
_ATTENTION = r"""
// One thread per query row, blockDim.x query rows per block; blockIdx.y picks the
// (batch, head). Keys and values pass through shared memory in tiles of BK rows.
// Online softmax: a running max m, a running sum l of exp(s - m) and a running
// acc = sum exp(s - m) v, both rescaled by exp(m_old - m_new) when the max grows.
// q, out: (BH, Tq, HEAD_DIM); k, v: (BH, Tk, HEAD_DIM); lse: (BH, Tq).
// causal: query i sees keys j <= i (top-left aligned, as PyTorch's is_causal).
__device__ int smaller(int a, int b) { return a < b ? a : b; }

extern "C" __global__ void attention_fwd(const real* q, const real* k, const real* v,
                                         real* out, real* lse, int Tq, int Tk, int BK,
                                         int causal, real scale) {
    extern __shared__ unsigned char smem[];
    real* ks = (real*)smem;                         // (BK, HEAD_DIM)
    real* vs = ks + BK * HEAD_DIM;                  // (BK, HEAD_DIM)
    const long long bh = blockIdx.y;
    const int first = blockIdx.x * blockDim.x;      // this block's first query row
    const int i = first + threadIdx.x;              // this thread's query row
    const bool active = i < Tq;
    const real* kb = k + bh * Tk * HEAD_DIM;
    const real* vb = v + bh * Tk * HEAD_DIM;

    real qi[HEAD_DIM], acc[HEAD_DIM];
    #pragma unroll
    for (int d = 0; d < HEAD_DIM; ++d) {
        qi[d] = active ? q[(bh * Tq + i) * HEAD_DIM + d] * scale : (real)0;
        acc[d] = 0;
    }
    real m = (real)-1e30;                           // a finite stand-in for -infinity
    real l = 0;

    // causal: no row of this block looks past key first + blockDim.x - 1
    const int kend = causal ? smaller(Tk, first + (int)blockDim.x) : Tk;
    for (int start = 0; start < kend; start += BK) {
        const int rows = smaller(BK, kend - start);
        for (int idx = threadIdx.x; idx < rows * HEAD_DIM; idx += blockDim.x) {
            ks[idx] = kb[(long long)start * HEAD_DIM + idx];   // rows start.. are contiguous
            vs[idx] = vb[(long long)start * HEAD_DIM + idx];
        }
        __syncthreads();
        if (active) {
            const int last = causal ? smaller(rows, i - start + 1) : rows;
            for (int r = 0; r < last; ++r) {
                real s = 0;
                #pragma unroll
                for (int d = 0; d < HEAD_DIM; ++d) s += qi[d] * ks[r * HEAD_DIM + d];
                const real m_new = fmax(m, s);
                const real corr = exp(m - m_new);   // 0 on the first key, 1 while the max holds
                const real p = exp(s - m_new);
                l = l * corr + p;
                #pragma unroll
                for (int d = 0; d < HEAD_DIM; ++d) acc[d] = acc[d] * corr + p * vs[r * HEAD_DIM + d];
                m = m_new;
            }
        }
        __syncthreads();                            // the tile is used up before it is overwritten
    }
    if (active) {                                   // every row saw key 0, so l > 0
        #pragma unroll
        for (int d = 0; d < HEAD_DIM; ++d) out[(bh * Tq + i) * HEAD_DIM + d] = acc[d] / l;
        lse[bh * Tq + i] = m + log(l);
    }
}
"""

ATTENTION_MAX_HEAD_DIM = 128
_QUERY_ROWS = 64                  # threads (query rows) per block
_SHARED_BYTES = 48 * 1024         # the default limit of dynamic shared memory per block


@functools.cache
def _attention_kernel(dtype, head_dim):
    head = f"typedef {_CTYPES[dtype]} real;\n#define HEAD_DIM {head_dim}\n"
    return cupy.RawKernel(head + _ATTENTION, "attention_fwd")


def attention_forward(q, k, v, is_causal=False, scale=None):
    """softmax(q k^T * scale) v for q (B, H, Tq, D), k and v (B, H, Tk, D): (out, lse).

    out is (B, H, Tq, D) and lse (B, H, Tq) the log-sum-exp of each row of
    scaled scores (what a backward would need). No mask other than causal, no
    dropout, no autograd: None for D > 128, for other shapes or dtypes.
    """
    if q.ndim != 4 or not _floats(q, k, v) or k.shape != v.shape or q.shape[:2] != k.shape[:2]:
        return None
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    if D > ATTENTION_MAX_HEAD_DIM or k.shape[3] != D or B * H > 65535:
        return None
    scale = 1.0 / D ** 0.5 if scale is None else scale
    itemsize = q.dtype.itemsize
    bk = max(1, min(64, _SHARED_BYTES // (2 * D * itemsize)))     # key rows per tile
    q3, k3, v3 = (cupy.ascontiguousarray(a).reshape(B * H, -1, D) for a in (q, k, v))
    out = cupy.empty((B * H, Tq, D), dtype=q.dtype)
    lse = cupy.empty((B * H, Tq), dtype=q.dtype)
    grid = ((Tq + _QUERY_ROWS - 1) // _QUERY_ROWS, B * H)
    _attention_kernel(q.dtype, D)(grid, (_QUERY_ROWS,),
                                  (q3, k3, v3, out, lse, np.int32(Tq), np.int32(Tk), np.int32(bk),
                                   np.int32(1 if is_causal else 0), q.dtype.type(scale)),
                                  shared_mem=2 * bk * D * itemsize)
    return out.reshape(B, H, Tq, D), lse.reshape(B, H, Tq)
