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
# Each kernel registered in tinyattn/fast/cuda_kernels.py (KERNELS) against the
# op's own formula, both on the GPU (the same case with the backend's kernels
# switched off) and against numpy on the CPU. Every kernel is compiled for float32
# and float64. The cases are tests/support/optable.py's KERNEL_CASES.
import tinyattn.nn.functional as F  # noqa: E402
from tinyattn.backend import get_backend  # noqa: E402
from tinyattn.models import GPT, GPTConfig  # noqa: E402
from conftest import count_kernel_calls, kernel_and_formula  # noqa: E402
from optable import KERNEL_CASES  # noqa: E402

TOL = {"float32": 1e-4, "float64": 1e-10}    # relative to the largest |value| of the reference


def assert_close(actual, expected, rtol, what=""):
    expected = np.asarray(expected)
    atol = rtol * max(float(np.max(np.abs(expected))), 1e-30)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=what)


def skip_unless_on_cuda(case):
    """Most cases test CPU kernels (numba's): only those whose kernels CUDA has too run here."""
    if not case.kernels <= set(get_backend("cuda").kernels):
        pytest.skip(f"{case.name}: its kernels are the CPU's only")


def test_every_cuda_kernel_has_a_case():
    covered = set().union(*(case.kernels for case in KERNEL_CASES))
    assert set(get_backend("cuda").kernels) <= covered


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", KERNEL_CASES, ids=[c.name for c in KERNEL_CASES])
def test_fused_kernel_matches_composite_on_gpu(case, dtype, monkeypatch):
    skip_unless_on_cuda(case)
    fused, composite = kernel_and_formula(case, "cuda", dtype, monkeypatch)
    on_cpu = case.run(case.inputs(np.random.default_rng(11)), "cpu", dtype)
    for i, (f, c, h) in enumerate(zip(fused, composite, on_cpu)):
        assert f.dtype == np.dtype(dtype)
        assert_close(f, c, TOL[dtype], f"{case.name}: output {i}, fused vs composite on the GPU")
        assert_close(f, h, TOL[dtype], f"{case.name}: output {i}, fused on the GPU vs numpy")


@pytest.mark.parametrize("case", [c for c in KERNEL_CASES if c.fn], ids=[c.name for c in KERNEL_CASES if c.fn])
def test_fused_kernel_gradcheck_float64_on_gpu(case, monkeypatch):
    skip_unless_on_cuda(case)
    calls = count_kernel_calls(get_backend("cuda"), monkeypatch)
    inputs = make_tensors(case.inputs(np.random.default_rng(12)), device="cuda")
    assert ta.gradcheck(case.fn, inputs)
    assert case.kernels <= set(calls)


def test_fused_forward_still_differentiates_twice_on_gpu(monkeypatch):
    """create_graph=True: GELU and cross-entropy switch to their Tensor backward."""
    calls = count_kernel_calls(get_backend("cuda"), monkeypatch)
    r = np.random.default_rng(13)
    (x,) = make_tensors([r.standard_normal((4, 6))], device="cuda")
    assert ta.gradgradcheck(lambda a: F.gelu(a, approximate="tanh"), [x])
    logits, t = make_tensors([r.standard_normal((6, 5)), np.array([0, -1, 4, 2, 2, 1])], device="cuda")
    assert ta.gradgradcheck(lambda a, tt: F.cross_entropy(a, tt, ignore_index=-1), [logits, t])
    assert {"gelu_tanh", "cross_entropy"} <= set(calls)


def test_fused_cross_entropy_edge_rows(monkeypatch):
    """All rows ignored: loss 0 and zero gradient, as the composite gives (no 0/0)."""
    calls = count_kernel_calls(get_backend("cuda"), monkeypatch)
    logits = ta.tensor(np.random.default_rng(14).standard_normal((4, 7)), device="cuda", requires_grad=True)
    loss = F.cross_entropy(logits, ta.tensor(np.full(4, -1), device="cuda"), ignore_index=-1)
    loss.backward()
    assert loss.item() == 0.0 and not np.any(logits.grad.numpy())
    assert calls.get("cross_entropy_backward") == 1


def test_kernels_decline_what_they_do_not_handle(monkeypatch):
    """float16 and mixed dtypes fall back to the formula (None), they do not fail."""
    import cupy
    cuda = get_backend("cuda")
    assert cuda.run_kernel("gelu_tanh", cupy.zeros(3, dtype=cupy.float16)) is None
    x32, w64 = cupy.ones((2, 3), dtype=cupy.float32), cupy.ones(3, dtype=cupy.float64)
    assert cuda.run_kernel("layer_norm", x32, w64, w64, 1e-5) is None
    monkeypatch.setattr(cuda, "use_kernels", False)
    assert cuda.kernel("gelu_tanh") is None and cuda.run_kernel("gelu_tanh", x32) is None
    monkeypatch.setattr(cuda, "use_kernels", True)
    x16 = ta.tensor(np.linspace(-3, 3, 8), dtype="float16", device="cuda")
    assert F.gelu(x16, approximate="tanh").dtype == ta.float16


# ---------------------------------------------------------------- a short training run, CPU vs GPU
def _train_losses(device, dtype, steps=20):
    """A 2-layer GPT, 20 AdamW steps on a learnable sequence task, dropout 0.

    The init comes from the host generator (ta.manual_seed), so both devices
    start from identical weights; the batches come from a numpy generator.
    """
    from train.loop import train_step
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
