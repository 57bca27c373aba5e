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
