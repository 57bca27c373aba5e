"""The rest of the public API against PyTorch, and a coverage check: every public Tensor method,
nn.functional function and top-level function appears in this suite."""
import pathlib
import re

import numpy as np
import pytest

from torch_compare import DTYPES, check, sample

import tinyattn as ta

CASES = {
    "ta.exp, log, sqrt, tanh, sigmoid, relu": lambda m, x: m.exp(x) + m.log(x.abs()) + m.sqrt(x.abs()) + m.tanh(x)
    + m.sigmoid(x) + m.relu(x),
    "ta.tril, triu": lambda m, x: m.tril(x) - m.triu(x, 1),
    "ta.clamp": lambda m, x: m.clamp(x, -0.5, 0.5), "ta.masked_fill": lambda m, x: m.masked_fill(x, x > 0, 0.25),
    "ta.chunk, split": lambda m, x: m.cat(list(m.chunk(x, 2, 1)[::-1]) + list(m.split(x, [1, 3], 1)), 1),
    "ta.matmul": lambda m, x: m.matmul(x, x.mT),
    "ta.zeros_like, ones_like, full_like": lambda m, x: x * m.ones_like(x) + m.zeros_like(x) + m.full_like(x, 2.0),
    "Tensor.broadcast_to, expand_as": lambda m, x: x[:1].broadcast_to((3, 4)) * x[:, :1].expand_as(x),
    "Tensor.double, long, to, float": lambda m, x: x.double() * 2 + x.long() + x.to(m.float32).double(),
    "F.logsumexp": lambda m, x: m.F.logsumexp(x, 1) if hasattr(m.F, "logsumexp") else m.logsumexp(x, 1),
}


@pytest.mark.parametrize("case", CASES)
def test_the_rest_of_the_api(case):
    check(CASES[case], [sample("float64", (3, 4))])


@pytest.mark.parametrize("dtype", DTYPES)
def test_casts_between_dtypes(dtype):
    x = sample(dtype, (2, 3))
    check(lambda m, t: t.float(), [x], grad=False)
    check(lambda m, t: t.double() if dtype != "float16" else t.float(), [x])
    check(lambda m, t: t.long(), [x], grad=False)


def test_sizes_and_flags():
    for lib, t in (("tinyattn", ta.randn(2, 3, requires_grad=True)), ("torch", None)):
        if t is None:
            import torch
            t = torch.randn(2, 3, requires_grad=True)
        y = t * 2
        y.retain_grad()
        y.sum().backward()
        assert (t.ndim, t.numel(), tuple(t.size()), t.size(1), t.is_leaf, y.is_leaf) == (2, 6, (2, 3), 3, True, False), lib
        assert y.grad is not None and tuple(y.grad.shape) == (2, 3), lib


NOT_IN_TORCH_OR_NOT_COMPARABLE = {
    "backend", "xp", "data", "device", "cpu", "cuda", "set_", "grad_fn", "retains_grad",  # the device and the engine
    "flash_attention",                                                                   # tinyattn's own
}


def test_every_public_name_has_a_case():
    src = "".join(p.read_text() for p in pathlib.Path(__file__).parent.glob("*.py"))
    names = [n for n in dir(ta.Tensor) if not n.startswith("_")] + list(ta.nn.functional.__all__)
    names += ["exp", "log", "sqrt", "tanh", "sigmoid", "relu", "tril", "triu", "clamp", "masked_fill", "chunk",
              "cat", "stack", "split", "where", "matmul", "zeros", "ones", "full", "arange", "tensor", "zeros_like",
              "ones_like", "full_like"]
    missing = [n for n in names if n not in NOT_IN_TORCH_OR_NOT_COMPARABLE and not re.search(r"\." + n + r"\b", src)]
    assert not missing, f"public names with no case in tests/conformance: {missing}"
