import contextlib
import os
from pathlib import Path

import numpy as np
import pytest

import tinyattn as ta
from tinyattn.autograd import Function
from tinyattn.backend import get_backend
from tinyattn.fast import denormals
from tinyattn.fast.compiled import running


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


def count_kernel_calls(backend, monkeypatch):
    """Wrap each of ``backend``'s registered kernels: {name: calls that did not decline}."""
    calls = {}

    def counting(name, fn):
        def wrapper(*args):
            out = fn(*args)
            if out is not None:
                calls[name] = calls.get(name, 0) + 1
            return out
        return wrapper

    for name, fn in list(backend.kernels.items()):
        monkeypatch.setitem(backend.kernels, name, counting(name, fn))
    return calls


def kernel_and_formula(case, device, dtype, monkeypatch, seed=11):
    """A KernelCase run with the device's kernels on, then off: (fused, formula) host arrays.

    Fails unless every kernel that the case names really ran."""
    backend = get_backend(device)
    calls = count_kernel_calls(backend, monkeypatch)
    arrays = case.inputs(np.random.default_rng(seed))
    monkeypatch.setattr(backend, "use_kernels", True)
    with running():                                 # (the kernels are the fast ops', which run compiled)
        fused = case.run(arrays, device, dtype)
    monkeypatch.setattr(backend, "use_kernels", False)
    formula = case.run(arrays, device, dtype)
    assert case.kernels <= set(calls), f"{case.name} on {device}: kernels that ran: {calls}"
    return fused, formula


@pytest.fixture(params=["cpu-kernels", "numpy", "formulas"])
def cpu_kernels(request, monkeypatch):
    """Run a test three ways: compiled with the CPU's fused kernels (numba), compiled with numpy
    in place of the kernels, and not compiled (every op's teaching formula). Compiled: the whole
    test runs as inside a call of a compiled model (its ops' fast versions)."""
    cpu = get_backend("cpu")
    if request.param == "cpu-kernels" and not cpu.kernels:
        pytest.skip("no CPU kernels here (numba is not installed, or TINYATTN_CPU_KERNELS=0)")
    monkeypatch.setattr(cpu, "use_kernels", request.param == "cpu-kernels")
    if request.param == "formulas":
        yield request.param
        return
    with running():
        yield request.param


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def compiled_ops(on=True):
    """A context in which ops run as inside a compiled model's call (their fast versions) with
    on=True, and as written (their formulas) with on=False."""
    return running() if on else contextlib.nullcontext()


@pytest.fixture
def fast_layer_on():
    """For a test of the fast ops: the whole test runs as inside a call of a compiled model."""
    with running():
        yield


_code_before = pytest.StashKey()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    from tinyattn.fast import checked
    item.stash[_code_before] = checked.differences()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    """A test that replaces a function of the library (monkeypatch, an exercise swapped in) puts it
    back: otherwise every compiled path would step aside in the tests after it. (Checked once every
    fixture is torn down, monkeypatch's too.)"""
    yield
    from tinyattn.fast import checked
    assert checked.differences() == item.stash.get(_code_before, {}), "the test left the library's code replaced"


REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def in_a_folder_of_its_own(tmp_path_factory, monkeypatch):
    """Every test runs in a new empty folder, with this checkout first on PYTHONPATH.

    A command a test runs, in this process or in another (python -m train, python -m exercises, a
    bench script), reads and writes its relative paths there, never in the user's checkout: what
    README's commands leave in it (out-coref/, out/, data/...) changes no test, and no test leaves
    anything in it. A child process imports this checkout, not another install of tinyattn.
    """
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))


@pytest.fixture(autouse=True)
def flushing_as_it_was():
    """A test that runs the training program (which flushes subnormals to zero for its process) or
    calls ta.set_flush_denormal gets the CPU's mode put back for the tests after."""
    was = denormals.flushes_here()
    yield
    if denormals.flushes_here() != was:
        ta.set_flush_denormal(was)


def pytest_collection_modifyitems(config, items):
    if ta.cuda_is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: CuPy and an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def record_applied_ops(monkeypatch):
    """A set that collects every Function class applied from now on (in backward formulas too)."""
    applied, apply = set(), Function.apply.__func__

    def recording(cls, *inputs, **params):
        applied.add(cls)
        return apply(cls, *inputs, **params)

    monkeypatch.setattr(Function, "apply", classmethod(recording))
    return applied


def all_subclasses(cls):
    """Every subclass of ``cls``, however deep."""
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | all_subclasses(sub)
    return out
