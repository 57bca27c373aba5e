"""What you edit is what runs: without ta.compile nothing of the fast layer runs, and with it an
edited formula (in the file, or replaced while the program runs) runs as written: the compiled
paths that depend on it step aside, saying so in one line.

An edit here is what a learner does: a function's source with one change, compiled in the library's
module and set in place of the library's (put back after), or a copy of the package on disk with
one file changed, for a fresh process (``edited_package``).
"""
import cProfile
import inspect
import json
import os
import pstats
import shutil
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path

import numpy as np
import pytest

import tinyattn as ta
from tinyattn import ops, optim
from tinyattn.backend import NumpyBackend
from tinyattn.fast import checked
from tinyattn.fast.fingerprints import FINGERPRINTS
from tinyattn.models import GPT, GPTConfig, gpt
from tinyattn.nn import attention, functional as F
from training_data import TEXT

ROOT = Path(__file__).resolve().parents[2]
FAST = str(ROOT / "tinyattn" / "fast")


# ---------------------------------------------------------------- the fingerprints
def test_the_stored_fingerprints_are_the_librarys_files():
    """A teaching file changed in the library without checking its fast paths against it fails
    here: check them (tests/engine/test_optable.py), then run python -m tinyattn.fast --write."""
    assert checked.file_fingerprints() == FINGERPRINTS
    assert checked.differences() == {} and checked.allowed() == set(checked.DEPENDS)


def test_every_teaching_file_a_path_depends_on_holds_a_module_that_is_noted():
    assert set(FINGERPRINTS) == set(checked.FILES)
    noted = {file for file, *_ in checked._noted.spaces}
    assert noted == set(checked.FILES)
    owners = {owner for _, owner, *_ in checked._noted.spaces}
    assert {"Tensor", "Function", "Module", "Softmax", "MultiHeadAttention", "Block", "AdamW", "NumpyBackend"} <= owners


def test_a_fingerprint_ignores_comments_blank_lines_docstrings_and_line_endings():
    plain = "def f(x):\n    return x * 2 + 1\n"
    noted = '"""A module."""\ndef f(x):\n    """Twice x, plus one."""\n\n    # the formula\n    return x * 2 + 1   # (one)\n'
    prints = [checked.fingerprint(s) for s in (plain, noted, plain.replace("\n", "\r\n"), plain.replace("+ 1", "+ 2"))]
    assert prints[0] == prints[1] == prints[2] != prints[3]


def other_python(name):
    """The interpreter ``name`` where it runs here (a different version from this one), else None."""
    exe = shutil.which(name)
    if exe is None or name == f"python3.{sys.version_info[1]}":
        return None
    probe = subprocess.run([exe, "-c", "import sys; print(sys.version_info[1])"], capture_output=True, text=True)
    return exe if probe.returncode == 0 else None


@pytest.mark.parametrize("python", ["python3.10", "python3.12", "python3.13"])
def test_the_fingerprints_do_not_depend_on_the_python_version(python):
    """The same file gives the same fingerprint under another Python (its syntax tree has other
    empty fields, which the fingerprint leaves out): checked.py's fingerprint, run there alone."""
    exe = other_python(python)
    if exe is None:
        pytest.skip(f"no other Python named {python} here")
    source = Path(checked.__file__).read_text()
    body = source[source.index("def fingerprint(source):"):source.index("def file_fingerprints():")]
    script = ("import ast, hashlib, json, sys\n" + body + "\nprint(json.dumps({f: fingerprint(open(f, 'rb').read()) "
              "for f in sys.argv[1:]}))")
    out = subprocess.run([exe, "-c", script, *checked.FILES], capture_output=True, text=True, timeout=60,
                         cwd=ROOT / "tinyattn")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == FINGERPRINTS


# ---------------------------------------------------------------- run-time replacement, of anything noted
def test_replacing_anything_noted_turns_off_the_paths_of_its_file_and_back_on(capsys):
    """Every function, class, method, property and constant of the teaching modules (and of the
    backends), replaced (a function by a wrapper: the same numbers, other code), turns off exactly
    the paths that depend on its file, with one line; put back, they run again and nothing more is said."""
    assert checked.allowed() == set(checked.DEPENDS)
    capsys.readouterr()
    seen = 0
    for file, owner, namespace, names, _, values, *_ in checked._noted.spaces:
        target = _owner(file, owner)
        for name, value in zip(names, values):
            setattr(target, name, _replacement(value))
            try:
                allowed = checked.allowed()
                err = capsys.readouterr().err.splitlines()
            finally:
                setattr(target, name, value)
            want = {path for path, files in checked.DEPENDS.items() if file not in files}
            assert allowed == want, (file, owner, name)
            shown = f"{owner}.{name}" if owner else name
            assert len(err) == 1 and err[0].startswith(f"tinyattn: {file}: {shown} is not the library's; "), err
            assert err[0].endswith("and your code runs")
            assert checked.allowed() == set(checked.DEPENDS) and capsys.readouterr().err == ""
            seen += 1
    assert seen > 500                                   # (every function of nine files, and Tensor's methods)


@pytest.mark.parametrize("rank, said", [("0", True), ("1", False)])
def test_in_a_job_of_several_processes_the_first_says_what_steps_aside(monkeypatch, capsys, rank, said):
    """Under mpiexec every process runs the same files: one line from rank 0, not one per process."""
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setenv("PMI_RANK", rank)
    capsys.readouterr()
    mean = ta.Tensor.mean
    ta.Tensor.mean = lambda self, *args, **kwargs: mean(self, *args, **kwargs)
    try:
        assert checked.allowed() == set()                       # (tensor.py: every path reads it)
        err = capsys.readouterr().err
    finally:
        ta.Tensor.mean = mean
    assert checked.allowed() == set(checked.DEPENDS)
    assert ("tensor.py: Tensor.mean is not the library's" in err) is said


def _owner(file, owner):
    """What a noted namespace belongs to: the module, a backend (get_backend('cpu')), or a class."""
    if not owner:
        return checked.module_of(file)
    if owner.startswith("get_backend("):
        return ta.backend.get_backend(owner[len("get_backend('"):-2])
    obj = checked.module_of(file)
    for part in owner.split("."):
        obj = getattr(obj, part)
    return obj


def _replacement(value):
    """Other code with the same numbers (a class subclassed, a property re-made, a function wrapped),
    or another value of a constant."""
    if isinstance(value, type):
        return type(value.__name__, (value,), {})
    if isinstance(value, property):
        return property(lambda self: value.__get__(self), value.fset)
    if isinstance(value, (staticmethod, classmethod)):
        return type(value)(lambda *a, **k: value.__func__(*a, **k))
    if callable(value):
        return lambda *args, **kwargs: value(*args, **kwargs)
    if isinstance(value, frozenset):
        return value | {None}
    return value + ((None,) if isinstance(value, tuple) else "x" if isinstance(value, str)
                    else b"x" if isinstance(value, bytes) else 1)


@pytest.mark.parametrize("where", ["NumpyBackend.erf over Backend.erf", "Linear.__call__ over Module.__call__",
                                   "erf set on the cpu backend itself"])
def test_a_name_added_that_shadows_another_counts_as_a_replacement(where, monkeypatch):
    """A method set on a subclass over the one it inherits, or on a backend object over its class's:
    what runs changes, though no noted name did."""
    owner, name, file = {"NumpyBackend.erf over Backend.erf": (NumpyBackend, "erf", "backend/__init__.py"),
                         "Linear.__call__ over Module.__call__": (ta.nn.Linear, "__call__", "nn/modules.py"),
                         "erf set on the cpu backend itself": (ta.backend.get_backend("cpu"), "erf",
                                                               "backend/__init__.py")}[where]
    assert name not in vars(owner)
    monkeypatch.setattr(owner, name, lambda *args: None, raising=False)
    assert checked.allowed() == {path for path, files in checked.DEPENDS.items() if file not in files}
    monkeypatch.undo()
    assert checked.allowed() == set(checked.DEPENDS)


def test_a_method_added_to_a_class_changes_nothing():
    ta.Tensor.my_helper = lambda self: self * 2
    try:
        assert checked.allowed() == set(checked.DEPENDS)
    finally:
        del ta.Tensor.my_helper


def test_a_subclass_of_an_op_runs_as_written_and_no_fast_op():
    class Hotter(ops.Softmax):
        def forward(self, x, dim):
            return super().forward(x * 0.5, dim)
    x = ta.randn(3, 5, requires_grad=True)
    y = ta.compile(lambda x: Hotter.apply(x, dim=1))(x)
    assert type(y.grad_fn) is Hotter and checked.allowed() == set(checked.DEPENDS)
    np.testing.assert_allclose(y.numpy(), F.softmax(x * 0.5, 1).numpy(), rtol=1e-6)


# ---------------------------------------------------------------- edits run: compiled as not
def edited(fn, old, new):
    """``fn`` with ``old`` replaced by ``new`` in its source, compiled in its module (no file: not the library's)."""
    fn = inspect.unwrap(fn)                                  # (causal_mask is cached: its function)
    source = textwrap.dedent(inspect.getsource(fn))
    assert old in source, (fn.__qualname__, old)
    namespace = {}
    exec(compile(source.replace(old, new), f"<edited {fn.__qualname__}>", "exec"), fn.__globals__, namespace)
    return namespace[fn.__name__]


_mean = ta.Tensor.mean


def _my_mean(self, dim=None, keepdim=False):
    """A learner's own mean: the library's, ten percent larger."""
    return _mean(self, dim, keepdim) * 1.1


_index_add = NumpyBackend.index_add


def _my_index_add(self, out, idx, values):
    return _index_add(self, out, idx, values * 1.5)


# name: (owner, attribute, replacement, or (old, new) in its source). The two edits (the scale in
# attend, a replaced Tensor.mean) first, then ones a hand-kept list would miss (a helper a backward calls,
# the backend's scatter-add), then the same kind of edit to each formula a compiled path stands in for.
EDITS = {
    "attend: the scale 1 / d_k": (attention, "attend", ("1.0 / math.sqrt(q.shape[-1]) if scale is None",
                                                        "1.0 / q.shape[-1] if scale is None")),
    "Tensor.mean replaced at run time": (ta.Tensor, "mean", _my_mean),
    "sum_to (unbroadcast's helper): doubled": (ops, "sum_to", ("return g.sum(axes, keepdim=True).reshape(shape)",
                                                                "return (g.sum(axes, keepdim=True) * 2).reshape(shape)")),
    "NumpyBackend.index_add (the embedding's backward)": (NumpyBackend, "index_add", _my_index_add),
    "Block.forward: half the attention branch": (gpt.Block, "forward", ("x = x + self.attn(", "x = x + 0.5 * self.attn(")),
    "MLP.forward: ReLU for GELU": (gpt.MLP, "forward", ("self.gelu(self.c_fc(x))", "self.c_fc(x).relu()")),
    "LayerNorm.forward: no centring": (F.LayerNorm, "forward", ("xc = x - xp.mean(x, axis=-1, keepdims=True)",
                                                                "xc = x")),
    "Softmax.forward: temperature 2": (ops.Softmax, "forward", ("stable_exp(self.xp, x, dim)",
                                                                "stable_exp(self.xp, x / 2, dim)")),
    "AdamW.update: no first-moment bias correction": (optim.AdamW, "update", ("step_size = lr / (1 - b1 ** t)",
                                                                              "step_size = lr")),
    "CrossEntropy.forward: label smoothing": (F.CrossEntropy, "forward", (
        "return -xp.sum(picked * weight)", "return -xp.sum((0.9 * picked + 0.1 * xp.mean(logp, axis=1)) * weight)")),
    "Linear.forward: the weight scaled": (F.Linear, "forward", ("permute_dims(weight, (1, 0))",
                                                                "permute_dims(weight * 1.5, (1, 0))")),
    "MultiHeadAttention.forward: q and k split the other way": (attention.MultiHeadAttention, "forward", (
        "q, k, v = qkv.transpose(1, 2).split(H, dim=1)", "k, q, v = qkv.transpose(1, 2).split(H, dim=1)")),
    "Attention.forward: twice the scale": (attention.Attention, "forward", ("self.scale = scale",
                                                                            "scale = self.scale = scale * 2")),
    "causal_mask: one key further": (attention, "causal_mask", ("xp.tril(ones, k=offset)", "xp.tril(ones, k=offset + 1)")),
    "GeluTanh.forward: another constant": (ops.GeluTanh, "forward", ("0.5 * a * (1.0 + ", "0.45 * a * (1.0 + ")),
    "Embedding.forward: rows scaled": (F.Embedding, "forward", ("self.xp.take(weight, flat, axis=0)",
                                                                "self.xp.take(weight, flat, axis=0) * 2")),
}


def gpt_run(compiled, seed=0):
    """A GPT's training step with AdamW as the training program makes them (compiled: ta.compile and its
    fused AdamW), then greedy decoding with the KV cache: (loss, gradients, weights after the step, logits)."""
    ta.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=11, init="default"))
    model = ta.compile(model, disable=not compiled)
    optimizer = model.configure_optimizer(0.1, 1e-2, (0.9, 0.95))
    for group in optimizer.param_groups:     # Adam's first step is lr * g / (|g| + eps): for a gradient that is
        group["eps"] = 1e-5                  # rounding noise (k's bias), +-lr by its sign; eps damps that noise
    rng = np.random.default_rng(seed)
    idx, targets = (ta.tensor(rng.integers(0, 11, (4, 16))) for _ in range(2))
    _, loss = model(idx, targets)
    loss.backward()
    grads = {name: p.grad.numpy().copy() for name, p in model.named_parameters()}
    optimizer.step()
    weights = {name: p.numpy().copy() for name, p in model.named_parameters()}
    model.eval()
    with ta.inference_mode():
        caches = [ta.nn.KVCache() for _ in model.h]
        logits = [model(idx[:, :6], kv_caches=caches)[0].numpy()]
        logits += [model(idx[:, t:t + 1], kv_caches=caches)[0].numpy() for t in range(6, 10)]
    return float(loss.item()), grads, weights, np.concatenate(logits, axis=1)


def far(a, b):
    """The largest difference between two runs, over every number they hold."""
    return max(abs(a[0] - b[0]), *(np.abs(a[1][k] - b[1][k]).max() for k in a[1]),
               *(np.abs(a[2][k] - b[2][k]).max() for k in a[2]), np.abs(a[3] - b[3]).max())


def assert_same_runs(on, off, lr=1e-2):
    """The tolerances of the fast-against-formula tests: float32 rounding."""
    assert abs(on[0] - off[0]) <= 1e-5 * max(1.0, abs(off[0]))
    for key in on[1]:
        np.testing.assert_allclose(on[1][key], off[1][key], rtol=1e-4, atol=1e-5, err_msg=key)
        np.testing.assert_allclose(on[2][key], off[2][key], rtol=0, atol=0.1 * lr, err_msg=key)
    np.testing.assert_allclose(on[3], off[3], rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def unedited():
    return gpt_run(True)


@pytest.mark.parametrize("name", list(EDITS))
def test_an_edit_runs_compiled_as_it_does_not_compiled(name, unedited, capsys):
    owner, attr, change = EDITS[name]
    original = inspect.getattr_static(owner, attr)
    setattr(owner, attr, edited(getattr(owner, attr), *change) if isinstance(change, tuple) else change)
    try:
        capsys.readouterr()
        on = gpt_run(True)
        err = capsys.readouterr().err
        off = gpt_run(False)
    finally:
        setattr(owner, attr, original)
    assert_same_runs(on, off)
    assert far(on, unedited) > 1e-3, "the edit changes nothing: it does not test anything"
    shown = f"{owner.__qualname__}.{attr}" if isinstance(owner, type) else attr
    lines = err.splitlines()
    assert len(lines) == 1 and f": {shown} is not the library's; " in lines[0], err
    assert lines[0].endswith(" aside, and your code runs")


def test_unedited_the_compiled_paths_run_and_agree_with_the_formulas(unedited, monkeypatch):
    """The comparison above is not the teaching path against itself: unedited, the fused block,
    the fast ops and the fused AdamW run (and agree with the formulas)."""
    from tinyattn.fast import models as fast_models, optim as fast_optim
    ran = {"block": 0, "adamw": 0}                      # (spied on in tinyattn/fast: a spy on library code
    block_apply, flat = fast_models.BlockOp.apply, fast_optim._FlatAdamState.gather_grads   # would turn them off)

    def count(name, fn):
        def counted(*args, **kwargs):
            out = fn(*args, **kwargs)
            ran[name] += out is not False
            return out
        return counted
    monkeypatch.setattr(fast_models.BlockOp, "apply", count("block", block_apply))
    monkeypatch.setattr(fast_optim._FlatAdamState, "gather_grads", count("adamw", flat))
    on = gpt_run(True)
    if ta.backend.get_backend("cpu").kernel("block") is not None:
        assert ran["block"] == 2
    assert ran["adamw"] == 1
    assert_same_runs(on, gpt_run(False))
    assert_same_runs(on, unedited)         # (to float32 rounding: a product's threads and layout may differ)


def test_a_method_replaced_after_the_model_was_compiled_runs(capsys):
    """gpt.Block.forward set at run time, after ta.compile: the next call runs it, and print says so."""
    ta.manual_seed(0)
    model = ta.compile(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=5)))
    idx = ta.tensor(np.random.default_rng(0).integers(0, 5, (2, 8)))
    before = model(idx, idx)[1].item()
    assert "one op in training" in repr(model) or "no block kernel" in repr(model)
    original = gpt.Block.forward

    def my_forward(self, x, kv_cache=None):
        return original(self, x, kv_cache) * 2.0
    gpt.Block.forward = my_forward
    try:
        after = model(idx, idx)[1].item()
        shown = repr(model)
    finally:
        gpt.Block.forward = original
    assert after != before and "the fused layers: off" in shown and "one op in training" not in shown
    assert model(idx, idx)[1].item() == before and "the fused layers: on" in repr(model)
    assert "models/gpt.py: Block.forward is not the library's" in capsys.readouterr().err


def test_a_forward_set_on_one_layer_runs_for_that_layer():
    ta.manual_seed(0)
    model = ta.compile(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=8, block_size=8, vocab_size=5)))
    idx = ta.tensor(np.random.default_rng(0).integers(0, 5, (2, 8)))
    calls = []
    block = model.h[1]
    block.forward = lambda x, kv_cache=None: calls.append(1) or gpt.Block.forward(block, x, kv_cache)
    model(idx, idx)[1].backward()
    with ta.inference_mode():
        model(idx)
    text = repr(model).split("(1): Block(")
    assert calls == [1, 1] and "a forward of its own is set on it" in text[1] and "fused: off" not in text[0]


# ---------------------------------------------------------------- without compile, nothing of tinyattn/fast
def _step(model, optimizer, idx):
    _, loss = model(idx, idx)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def test_without_compile_no_call_goes_into_the_fast_layer():
    """cProfile of a model's forward, backward and optimizer step (and of generate) finds no function
    of tinyattn/fast; compiled, it does (the profile sees them)."""
    ta.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=11))
    idx = ta.tensor(np.random.default_rng(0).integers(0, 11, (4, 16)))

    def fast_functions(model, optimizer):
        profile = cProfile.Profile()
        profile.runcall(_step, model, optimizer, idx)
        profile.runcall(model.generate, idx[:, :4], 3)
        return sorted({f"{Path(file).name}:{name}" for file, _, name in pstats.Stats(profile).stats
                       if file.startswith(FAST)})
    assert fast_functions(model, model.configure_optimizer(0.1, 1e-3, (0.9, 0.95))) == []
    attributes = {name: dict(vars(m)) for name, m in model.named_modules()}
    compiled = ta.compile(model)
    assert fast_functions(compiled, compiled.configure_optimizer(0.1, 1e-3, (0.9, 0.95)))
    assert ta.autograd.compiled.layers is None and {name: dict(vars(m)) for name, m in model.named_modules()} == attributes
    assert fast_functions(model, model.configure_optimizer(0.1, 1e-3, (0.9, 0.95))) == []   # (the model is as it was)


def test_a_traceback_from_a_broken_forward_shows_no_frame_of_the_fast_layer(monkeypatch):
    def broken(self, x):
        raise RuntimeError("my MLP is broken")
    monkeypatch.setattr(gpt.MLP, "forward", broken)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=5))
    idx = ta.tensor(np.random.default_rng(0).integers(0, 5, (2, 8)))
    with pytest.raises(RuntimeError, match="my MLP is broken") as caught:
        model(idx, idx)
    frames = [frame.filename for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert not [f for f in frames if f.startswith(FAST)], frames
    with ta.inference_mode(), pytest.raises(RuntimeError, match="my MLP is broken") as caught:
        model.generate(idx, 2)
    assert not [f.filename for f in traceback.extract_tb(caught.value.__traceback__) if f.filename.startswith(FAST)]


def test_print_of_a_compiled_model_shows_what_runs_fused():
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=5))
    assert "fused" not in repr(model)
    text = repr(ta.compile(model))
    assert text.startswith("CompiledModule(the fast ops: on, the fused layers: on, the fused AdamW: on")
    assert "(_orig_mod): GPT(fused: on arrays where no graph is recorded" in text
    assert "MLP(fused: on arrays where no graph is recorded" in text
    assert "Block(fused: one op in training" in text or "no block kernel here" in text


# ---------------------------------------------------------------- an edited file, a fresh process
@pytest.fixture(scope="module")
def edited_package(tmp_path_factory):
    """A copy of the package (and the training program, with its presets in config/) whose attend,
    in nn/attention.py, scales the scores by 1 / d_k instead of 1 / sqrt(d_k): the lesson's claim."""
    root = tmp_path_factory.mktemp("edited")
    for folder in ("tinyattn", "train", "config", "data"):
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__", "out*"))
    path = root / "tinyattn" / "nn" / "attention.py"
    source = path.read_text()
    old = "scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale"
    assert old in source
    path.write_text(source.replace(old, "scale = 1.0 / q.shape[-1] if scale is None else scale"))
    return root


def training_run(root, compiled, tmp_path, *flags):
    out = tmp_path / f"run-{root.name}-{compiled}"
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-m", "train", "--max_iters", "6", "--eval_interval", "3", "--eval_iters", "2",
                           "--out_dir", str(out), "--quiet", "--compile", str(compiled), *flags],
                          capture_output=True, text=True, env=env, cwd=root, timeout=300)
    assert done.returncode == 0, done.stderr
    losses = [row.split(",") for row in (out / "log.csv").read_text().splitlines()]
    return json.loads((out / "summary.json").read_text())["val_loss"], losses, done.stderr


@pytest.mark.parametrize("data", ["lesson", "text"])
def test_through_the_training_program_the_edited_scale_runs_compiled_as_not(edited_package, tmp_path, data):
    """python -m train (the lesson's model, or a text with its own preset) with the scale edited:
    compiled, the same val loss as --compile False to float32 rounding, not the library's, and one line."""
    text = tmp_path / "tiny.txt"
    text.write_text(TEXT)
    flags = () if data == "lesson" else ("--data", str(text), "--n_layer", "2", "--n_head", "2", "--n_embd", "32",
                                         "--block_size", "32", "--batch_size", "8", "--learning_rate", "0.03",
                                         "--warmup_iters", "0")
    (on, on_log, err), (off, off_log, _) = (training_run(edited_package, c, tmp_path / "e", *flags) for c in (True, False))
    library, _, library_err = training_run(ROOT, True, tmp_path / "l", *flags)
    assert abs(on - off) <= 1e-5 * max(1.0, abs(off)) and len(on_log) == len(off_log)
    assert abs(on - library) > 1e-3                                      # the edit moves it
    lines = [line for line in err.splitlines() if line.startswith("tinyattn:")]
    assert lines == ["tinyattn: nn/attention.py is edited; the fast ops and the fused layers step aside, "
                     "and your code runs"], err
    assert "tinyattn:" not in library_err


def test_through_the_training_program_a_replaced_tensor_mean_runs_compiled_as_not(tmp_path, monkeypatch, capsys):
    """python -m train (its main, in this process) with Tensor.mean replaced at run time by the
    learner's own: compiled, every step's loss and the val loss are --compile False's to float32
    rounding, not the library's, and one line says what stepped aside."""
    from train import checkpoint
    from train.command import main
    from training_data import TINY
    text = tmp_path / "tiny.txt"
    text.write_text(TEXT)

    def train(name, *flags):
        out = tmp_path / name
        assert main(["--data", str(text), "--out_dir", str(out), *TINY, "--max_iters", "8", "--eval_interval", "4",
                     "--learning_rate", "0.03", "--warmup_iters", "0", "--quiet", *flags]) == 0
        meta = checkpoint.read_meta(str(out / "ckpt.npz"))
        return np.array(meta["train_losses"]), meta["log"][-1]["val_loss"]
    library = train("library")
    capsys.readouterr()
    monkeypatch.setattr(ta.Tensor, "mean", _my_mean)
    on = train("on")
    err = capsys.readouterr().err
    off = train("off", "--compile", "False")
    np.testing.assert_allclose(on[0], off[0], rtol=1e-5)
    assert on[1] == pytest.approx(off[1], rel=1e-5) and abs(on[1] - library[1]) > 1e-3
    lines = [line for line in err.splitlines() if line.startswith("tinyattn:")]
    assert lines == ["tinyattn: tensor.py: Tensor.mean is not the library's; the fast ops, the fused layers and "
                     "the fused AdamW step aside, and your code runs"], err


STEP = """
import json, sys, numpy as np, tinyattn as ta
from tinyattn.models import GPT, GPTConfig
ta.manual_seed(0)
model = ta.compile(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=11)))
opt = model.configure_optimizer(0.1, 1e-2, (0.9, 0.95))
idx = ta.tensor(np.random.default_rng(0).integers(0, 11, (4, 16)))
for _ in range(4):
    _, loss = model(idx, idx)
    loss.backward()
    opt.step()
    opt.zero_grad()
print(json.dumps([loss.item(), repr(model).splitlines()[0]]))
"""


def test_a_users_own_loop_with_compile_runs_the_edited_file(edited_package):
    def step(root):
        out = subprocess.run([sys.executable, "-c", STEP], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PYTHONPATH": str(root)}, cwd=root)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.splitlines()[-1]), out.stderr
    (loss, shown), err = step(edited_package)
    (library_loss, library_shown), library_err = step(ROOT)
    assert abs(loss - library_loss) > 1e-4 and "tinyattn: nn/attention.py is edited" in err
    assert shown == "CompiledModule(the fast ops: off, the fused layers: off, the fused AdamW: on"
    assert library_shown == "CompiledModule(the fast ops: on, the fused layers: on, the fused AdamW: on"
    assert "tinyattn:" not in library_err
