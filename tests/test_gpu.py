"""Real-CUDA checks: they carry the ``gpu`` marker and skip cleanly without CuPy and a GPU.

Run them on a GPU machine with ``pytest -m gpu``.
"""
import numpy as np
import pytest

import tinyattn as ta
from conftest import make_tensors, forward_and_backward
from optable import OPS

pytestmark = pytest.mark.gpu
IDS = [spec.name for spec in OPS]


@pytest.mark.parametrize("spec", OPS, ids=IDS)
def test_op_matches_numpy_on_cuda(spec):
    """Forward and backward of every table op: CuPy against numpy, float64."""
    arrays = spec.inputs(np.random.default_rng(4))
    on_cpu = forward_and_backward(spec, arrays, "cpu")
    on_gpu = forward_and_backward(spec, arrays, "cuda")
    for a, b in zip(on_cpu, on_gpu):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("spec", OPS, ids=IDS)
def test_gradcheck_on_cuda(spec):
    inputs = make_tensors(spec.inputs(np.random.default_rng(1)), device="cuda")
    assert ta.gradcheck(spec.fn, inputs, eps=spec.eps)


# ---------------------------------------------------------------- fused CUDA kernels
# Each kernel in tinyattn/backend/cuda_kernels.py against the composite array code,
# both on the GPU (the same op with the backend's fused kernels switched off), and
# against numpy on the CPU. Every kernel is compiled for float32 and float64.
import math  # noqa: E402

import tinyattn.nn.functional as F  # noqa: E402
from tinyattn.backend import get_backend  # noqa: E402
from tinyattn.models import GPT, GPTConfig  # noqa: E402

TOL = {"float32": 1e-4, "float64": 1e-10}    # relative to the largest |value| of the reference


def assert_close(actual, expected, rtol, what=""):
    expected = np.asarray(expected)
    atol = rtol * max(float(np.max(np.abs(expected))), 1e-30)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=what)


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts calls of each kernel function, to prove that the fused path really ran."""
    from tinyattn.backend import cuda_kernels
    calls = {}

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            out = fn(*args, **kwargs)
            if out is not None:
                calls[name] = calls.get(name, 0) + 1
            return out
        return wrapper

    for name in ("gelu_tanh", "gelu_tanh_backward", "layer_norm", "layer_norm_backward", "cross_entropy",
                 "cross_entropy_backward", "adamw_", "attention_forward"):
        monkeypatch.setattr(cuda_kernels, name, counting(name, getattr(cuda_kernels, name)))
    yield calls
    get_backend("cuda").use_fused_kernels = True


def _targets(rng, n, classes):
    t = rng.integers(0, classes, n)
    t[::5] = -1                                                   # some ignored rows
    return t


FUSED_OPS = [
    ("gelu_tanh", lambda a: F.gelu(a, approximate="tanh"), lambda r: [3 * r.standard_normal((64, 100))],
     {"gelu_tanh", "gelu_tanh_backward"}),
    ("layer_norm C=384", lambda x, w, b: F.layer_norm(x, 384, w, b),
     lambda r: [2 * r.standard_normal((4, 7, 384)) + 0.5, r.standard_normal(384), r.standard_normal(384)],
     {"layer_norm", "layer_norm_backward"}),
    ("layer_norm C=1000", lambda x, w, b: F.layer_norm(x, 1000, w, b),                     # > 256 threads a row
     lambda r: [r.standard_normal((5, 1000)), r.standard_normal(1000), r.standard_normal(1000)],
     {"layer_norm", "layer_norm_backward"}),
    ("layer_norm C=5", lambda x, w, b: F.layer_norm(x, 5, w, b),
     lambda r: [r.standard_normal((9, 5)), r.standard_normal(5), r.standard_normal(5)],
     {"layer_norm", "layer_norm_backward"}),
    ("cross_entropy V=65", lambda a, t: F.cross_entropy(a, t, ignore_index=-1),
     lambda r: [3 * r.standard_normal((300, 65)), _targets(r, 300, 65)],
     {"cross_entropy", "cross_entropy_backward"}),
    ("cross_entropy V=1000", lambda a, t: F.cross_entropy(a, t, ignore_index=-1),
     lambda r: [r.standard_normal((37, 1000)), _targets(r, 37, 1000)],
     {"cross_entropy", "cross_entropy_backward"}),
]


def _forward_backward(fn, arrays, device, dtype):
    inputs = make_tensors(arrays, device=device, dtype=dtype)
    out = fn(*inputs)
    cotangent = np.random.default_rng(5).standard_normal(out.shape)
    out.backward(ta.tensor(cotangent, dtype=dtype, device=device))
    return [out.numpy()] + [t.grad.numpy() for t in inputs if t.requires_grad]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name, fn, make, kernels", FUSED_OPS, ids=[c[0] for c in FUSED_OPS])
def test_fused_kernel_matches_composite_on_gpu(name, fn, make, kernels, dtype, kernel_calls):
    arrays = make(np.random.default_rng(11))
    cuda = get_backend("cuda")
    cuda.use_fused_kernels = False
    composite = _forward_backward(fn, arrays, "cuda", dtype)
    cuda.use_fused_kernels = True
    fused = _forward_backward(fn, arrays, "cuda", dtype)
    on_cpu = _forward_backward(fn, arrays, "cpu", dtype)
    assert set(kernel_calls) == kernels, f"fused kernels that ran: {kernel_calls}"
    for i, (f, c, h) in enumerate(zip(fused, composite, on_cpu)):
        assert f.dtype == np.dtype(dtype)
        assert_close(f, c, TOL[dtype], f"{name}: output {i}, fused vs composite on the GPU")
        assert_close(f, h, TOL[dtype], f"{name}: output {i}, fused on the GPU vs numpy")


@pytest.mark.parametrize("name, fn, make, kernels", FUSED_OPS, ids=[c[0] for c in FUSED_OPS])
def test_fused_kernel_gradcheck_float64_on_gpu(name, fn, make, kernels, kernel_calls):
    inputs = make_tensors(make(np.random.default_rng(12)), device="cuda")
    assert ta.gradcheck(fn, inputs)
    assert kernels <= set(kernel_calls)


def test_fused_forward_still_differentiates_twice_on_gpu(kernel_calls):
    """create_graph=True: GELU and cross-entropy switch to their Tensor backward."""
    r = np.random.default_rng(13)
    (x,) = make_tensors([r.standard_normal((4, 6))], device="cuda")
    assert ta.gradgradcheck(lambda a: F.gelu(a, approximate="tanh"), [x])
    logits, t = make_tensors([r.standard_normal((6, 5)), np.array([0, -1, 4, 2, 2, 1])], device="cuda")
    assert ta.gradgradcheck(lambda a, tt: F.cross_entropy(a, tt, ignore_index=-1), [logits, t])
    assert {"gelu_tanh", "cross_entropy"} <= set(kernel_calls)


def test_fused_cross_entropy_edge_rows(kernel_calls):
    """All rows ignored: loss 0 and zero gradient, as the composite gives (no 0/0)."""
    logits = ta.tensor(np.random.default_rng(14).standard_normal((4, 7)), device="cuda", requires_grad=True)
    loss = F.cross_entropy(logits, ta.tensor(np.full(4, -1), device="cuda"), ignore_index=-1)
    loss.backward()
    assert loss.item() == 0.0 and not np.any(logits.grad.numpy())
    assert kernel_calls.get("cross_entropy_backward") == 1


def test_kernels_decline_what_they_do_not_handle():
    """float16 and mixed dtypes fall back to the array code (None), they do not fail."""
    import cupy
    cuda = get_backend("cuda")
    assert cuda.fused_gelu_tanh(cupy.zeros(3, dtype=cupy.float16)) is None
    x32, w64 = cupy.ones((2, 3), dtype=cupy.float32), cupy.ones(3, dtype=cupy.float64)
    assert cuda.fused_layer_norm(x32, w64, w64, 1e-5) is None
    q = cupy.ones((1, 1, 4, 129), dtype=cupy.float32)
    assert cuda.fused_attention(q, q, q) is None                  # head size over 128
    cuda.use_fused_kernels = False
    try:
        assert cuda.fused_gelu_tanh(x32) is None
    finally:
        cuda.use_fused_kernels = True
    x16 = ta.tensor(np.linspace(-3, 3, 8), dtype="float16", device="cuda")
    assert F.gelu(x16, approximate="tanh").dtype == ta.float16


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fused_adamw_matches_the_array_update(dtype, kernel_calls):
    """Three AdamW steps with weight decay: fused on the GPU, array code on the GPU, numpy."""
    r = np.random.default_rng(15)
    start = [r.standard_normal((33, 17)), r.standard_normal(17)]
    grads = [[r.standard_normal(a.shape) for a in start] for _ in range(3)]
    results = {}
    for label, device, fused in [("fused", "cuda", True), ("composite", "cuda", False), ("numpy", "cpu", True)]:
        get_backend("cuda").use_fused_kernels = fused
        params = [ta.tensor(a, dtype=dtype, device=device, requires_grad=True) for a in start]
        opt = ta.optim.AdamW([{"params": params[:1], "weight_decay": 0.1},
                              {"params": params[1:], "weight_decay": 0.0}], lr=1e-2, betas=(0.9, 0.99))
        for step_grads in grads:
            for p, g in zip(params, step_grads):
                p.grad = ta.tensor(g, dtype=dtype, device=device)
            opt.step()
        state = [opt.state[id(p)] for p in params]
        results[label] = ([p.numpy() for p in params] + [p._backend.to_numpy(s["exp_avg"]) for p, s in zip(params, state)]
                          + [p._backend.to_numpy(s["exp_avg_sq"]) for p, s in zip(params, state)])
    get_backend("cuda").use_fused_kernels = True
    assert kernel_calls.get("adamw_") == 6                        # 2 parameters x 3 steps
    for other in ("composite", "numpy"):
        for i, (a, b) in enumerate(zip(results["fused"], results[other])):
            assert_close(a, b, TOL[dtype], f"AdamW array {i}: fused vs {other}")


def _naive_attention(q, k, v, causal):
    """The reference, in float64 numpy."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    return e / e.sum(-1, keepdims=True) @ v, (m + np.log(e.sum(-1, keepdims=True)))[..., 0]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(2, 3, 100, 100, 16), (1, 6, 256, 256, 64), (2, 2, 70, 70, 128),
                                   (1, 2, 5, 130, 32), (1, 1, 130, 7, 8)],
                         ids=lambda s: "B{}H{}Tq{}Tk{}D{}".format(*s))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_tiled_attention_kernel_matches_naive_attention(shape, causal, dtype):
    """The RawKernel attention (forward only) against softmax(q k^T / sqrt(D)) v on the GPU and in numpy."""
    import cupy
    B, H, Tq, Tk, D = shape
    r = np.random.default_rng(16)
    q, k, v = r.standard_normal((B, H, Tq, D)), r.standard_normal((B, H, Tk, D)), r.standard_normal((B, H, Tk, D))
    fused = get_backend("cuda").fused_attention(*(cupy.asarray(a, dtype=dtype) for a in (q, k, v)), is_causal=causal)
    assert fused is not None
    out, lse = (cupy.asnumpy(a) for a in fused)
    ref_out, ref_lse = _naive_attention(q, k, v, causal)
    assert_close(out, ref_out, TOL[dtype], "attention output vs numpy")
    assert_close(lse, ref_lse, TOL[dtype], "attention log-sum-exp vs numpy")
    if Tq == Tk or not causal:                                    # the composite op on the GPU too
        qt, kt, vt = (ta.tensor(a, dtype=dtype, device="cuda") for a in (q, k, v))
        composite = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).numpy()
        assert_close(out, composite, TOL[dtype], "attention output vs the composite op on the GPU")


# ---------------------------------------------------------------- a short training run, CPU vs GPU
def _train_losses(device, dtype, steps=20):
    """A 2-layer GPT, 20 AdamW steps on a learnable sequence task, dropout 0.

    The init comes from the host generator (ta.manual_seed), so both devices
    start from identical weights; the batches come from a numpy generator.
    """
    from train.__main__ import train_step
    ta.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=65, n_layer=2, n_head=2, n_embd=32, dropout=0.0))
    for p in model.parameters():
        p.data = p.data.astype(np.dtype(dtype))
    model.to(device)
    optimizer = model.configure_optimizer(0.1, 3e-3, (0.9, 0.99))
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        seq = (rng.integers(0, 65, (8, 1)) + 3 * np.arange(17)) % 65                 # (8, 17)
        x, y = (ta.tensor(a, device=device) for a in (seq[:, :-1], seq[:, 1:]))
        losses.append(train_step(model, optimizer, [(x, y)], grad_clip=1.0))     # stays on the device
    return np.array([loss.item() for loss in losses])                            # read once, at the end


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gpt_training_losses_match_the_cpu_run(dtype, kernel_calls):
    """Per-step losses of the same 20-step run on "cpu" and "cuda".

    float32: rtol 1e-4. The devices sum in different orders (cuBLAS and the
    kernels' tree reductions against OpenBLAS and numpy's pairwise sums), so
    each op differs by a few float32 ulps (~1e-7). On this run float32 and
    float64 losses on the CPU differ by 6e-8 relative after 20 steps, so
    1e-4 leaves about 1000x room for that, while a kernel that is wrong by one
    term moves the losses by 1e-3 or more. (It assumes plain float32 matmuls:
    CuPy's default, CUPY_TF32 unset.) float64: rtol 1e-9.
    """
    on_cpu = _train_losses("cpu", dtype)
    on_gpu = _train_losses("cuda", dtype)
    assert {"gelu_tanh", "layer_norm", "cross_entropy", "adamw_",
            "gelu_tanh_backward", "layer_norm_backward", "cross_entropy_backward"} <= set(kernel_calls)
    assert on_cpu[-1] < on_cpu[0] - 0.5                           # it does learn
    np.testing.assert_allclose(on_gpu, on_cpu, rtol=1e-4 if dtype == "float32" else 1e-9)
