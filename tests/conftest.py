import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))   # tests import optable

import tinyattn as ta  # noqa: E402


def make_tensors(arrays, device="cpu", dtype="float64"):
    """Float arrays become tensors that require grad; int and bool ones stay constants."""
    return [ta.tensor(a, dtype=dtype, requires_grad=True, device=device) if a.dtype.kind == "f"
            else ta.tensor(a, device=device) for a in arrays]


def forward_and_backward(spec, arrays, device):
    """An op-table entry on ``device``: [output, gradient of each differentiable input] as host arrays.

    The cotangent is the same random array on every device, so results compare directly.
    """
    inputs = make_tensors(arrays, device=device)
    out = spec.fn(*inputs)
    assert out.device == device
    cotangent = np.random.default_rng(5).standard_normal(out.shape)
    out.backward(ta.tensor(cotangent, dtype="float64", device=device))
    return [out.numpy()] + [t.grad.numpy() for t in inputs if t.requires_grad]


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def pytest_collection_modifyitems(config, items):
    if ta.cuda_is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: CuPy and an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
