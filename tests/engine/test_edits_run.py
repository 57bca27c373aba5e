"""What you edit is what runs: a changed formula, forward or update runs as written with the fast
layer on, as it does with the layer off, and the fast paths it stands in for step aside, saying so.

An edit here is what a learner does to a file, made to a copy of the function: its source with one
change, compiled in the library's module (so it has no source file: it is not the library's), then
set in place of the library's, and put back after. ``edited_file`` edits a copy of the package on
disk, for a fresh process.
"""
import inspect
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tinyattn as ta
from tinyattn import ops
from tinyattn.fast import checked
from tinyattn.fast.fingerprints import FINGERPRINTS
from tinyattn.models import GPT, GPTConfig, gpt
from tinyattn.nn import attention, functional as F, modules
from tinyattn import optim

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("fast_layer_on")


# ---------------------------------------------------------------- the fingerprints
def test_the_stored_fingerprints_are_the_librarys_code():
    """A teaching formula changed in the library without checking its fast path against it fails
    here: check it (tests/engine/test_optable.py), then run python -m tinyattn.fast --write."""
    live = checked.live_fingerprints()
    differ = sorted(key for key in set(live) | set(FINGERPRINTS) if live.get(key) != FINGERPRINTS.get(key))
    assert not differ, f"fingerprints differ from the library's code for {differ}"
    assert all(not differ for differ in checked.status().values())


def first_function(source):
    namespace = {}
    exec(source, namespace)                                  # noqa: S102 (test code, written here)
    return next(v for k, v in namespace.items() if k == "f")


def test_a_fingerprint_ignores_comments_blank_lines_docstrings_and_line_endings(tmp_path):
    plain = "def f(x):\n    return x * 2 + 1\n"
    noted = 'def f(x):\n    """Twice x, plus one."""\n\n    # the formula\n    return x * 2 + 1   # (one)\n'
    windows = plain.replace("\n", "\r\n")
    prints = []
    for i, source in enumerate((plain, noted, windows, "def f(x):\n    return x * 2 + 2\n")):
        path = tmp_path / f"m{i}.py"
        path.write_bytes(source.encode())
        spec = __import__("importlib.util").util.spec_from_file_location(f"m{i}", path)
        module = __import__("importlib.util").util.module_from_spec(spec)
        spec.loader.exec_module(module)
        prints.append(checked.fingerprint(module.f))
    assert prints[0] == prints[1] == prints[2] and prints[3] != prints[0] and None not in prints


def test_a_function_without_source_is_not_the_librarys():
    assert checked.fingerprint(first_function("def f(x):\n    return x\n")) is None
    assert checked.fingerprint(len) is None


def other_python(name):
    """The interpreter ``name`` where it runs here (a different version from this one), else None."""
    exe = shutil.which(name)
    if exe is None or name == f"python3.{sys.version_info[1]}":
        return None
    probe = subprocess.run([exe, "-c", "import sys; print(sys.version_info[1])"], capture_output=True, text=True)
    return exe if probe.returncode == 0 else None


@pytest.mark.parametrize("python", ["python3.10", "python3.12", "python3.13"])
def test_the_fingerprints_do_not_depend_on_the_python_version(python, tmp_path):
    """The same source gives the same fingerprint under another Python (its syntax tree has other
    empty fields, which the fingerprint leaves out): checked.py's fingerprint, run there on three
    functions of ops.py (alone: that Python need not have numpy)."""
    exe = other_python(python)
    if exe is None:
        pytest.skip(f"no other Python named {python} here")
    source = Path(checked.__file__).read_text()
    body = source[source.index("def fingerprint(fn):"):source.index("def functions(name):")]
    names = ("stable_exp", "masked_softmax", "sum_to")
    (tmp_path / "target.py").write_text(_functions_only((ROOT / "tinyattn" / "ops.py").read_text(), names))
    script = ("import ast, hashlib, importlib.util, inspect, json, sys, textwrap, weakref\n" + body
              + "\nspec = importlib.util.spec_from_file_location('target', sys.argv[1])\n"
              "target = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(target)\n"
              f"print(json.dumps({{n: fingerprint(getattr(target, n)) for n in {names!r}}}))")
    out = subprocess.run([exe, "-c", script, str(tmp_path / "target.py")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {n: FINGERPRINTS[f"tinyattn.ops:{n}"] for n in names}


def _functions_only(source, names):
    """The top-level functions ``names`` of a module's source, alone (no imports needed to define them)."""
    import ast
    tree = ast.parse(source)
    lines = source.splitlines()
    parts = [lines[node.lineno - 1 - len(node.decorator_list):node.end_lineno] for node in tree.body
             if isinstance(node, ast.FunctionDef) and node.name in names]
    return "\n\n".join("\n".join(p for p in part if not p.lstrip().startswith("@")) for part in parts) + "\n"


# ---------------------------------------------------------------- each path steps aside, and comes back
def every_function():
    """Each function that some fast path stands in for, once: (key, owner, attribute name)."""
    out = {}
    for names in checked.STANDS_IN_FOR.values():
        for name in names:
            for key in checked.functions(name):
                module_name, _, qualname = key.partition(":")
                owner = sys.modules[module_name]
                *classes, attr = qualname.split(".")
                for cls in classes:
                    owner = getattr(owner, cls)
                out[key] = (owner, attr)
    return out


def names_it(name, key):
    """Whether a name of STANDS_IN_FOR covers the function ``key``: a module's function by that
    module's name; a method by its class, from whichever module names the class."""
    key_module, _, key_qualname = key.partition(":")
    if "." not in key_qualname:
        return name == key
    cls, _, method = key_qualname.partition(".")
    module, _, qualname = name.partition(":")
    head, _, rest = qualname.partition(".")
    return getattr(sys.modules[module], head) is getattr(sys.modules[key_module], cls) and rest in ("", method)


def wrapped(fn):
    """fn called through a wrapper: the same numbers, other code."""
    return lambda *args, **kwargs: fn(*args, **kwargs)


@pytest.mark.parametrize("key", sorted(every_function()))
def test_replacing_any_stood_in_for_function_turns_its_paths_off_and_back_on(key, capsys):
    owner, attr = every_function()[key]
    original = inspect.getattr_static(owner, attr)
    paths = {path for path, names in checked.STANDS_IN_FOR.items() if any(names_it(name, key) for name in names)}
    assert paths and all(checked.runs(p) for p in checked.STANDS_IN_FOR)
    replacement = wrapped(getattr(owner, attr))
    if isinstance(original, staticmethod):
        replacement = staticmethod(replacement)
    setattr(owner, attr, replacement)
    try:
        assert {p for p in checked.STANDS_IN_FOR if not checked.runs(p)} == paths
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and " differs from the library's; " in err[0], err
        assert err[0].endswith("and your code runs") and all(checked.describe(p) in err[0] for p in paths)
    finally:
        setattr(owner, attr, original)
    assert all(checked.runs(p) for p in checked.STANDS_IN_FOR)
    assert capsys.readouterr().err == ""


def test_a_subclass_of_an_op_runs_as_written_and_no_fast_op():
    class Hotter(ops.Softmax):
        def forward(self, x, dim):
            return super().forward(x * 0.5, dim)
    x = ta.randn(3, 5, requires_grad=True)
    y = Hotter.apply(x, dim=1)
    assert type(y.grad_fn) is Hotter and all(checked.runs(p) for p in checked.STANDS_IN_FOR)
    np.testing.assert_allclose(y.numpy(), F.softmax(x * 0.5, 1).numpy(), rtol=1e-6)


# ---------------------------------------------------------------- edits run: the same numbers on and off
def edited(fn, old, new):
    """``fn`` with ``old`` replaced by ``new`` in its source, compiled in its module (no file: not the library's)."""
    fn = inspect.unwrap(fn)                                  # (causal_mask is cached: its function)
    source = textwrap.dedent(inspect.getsource(fn))
    assert old in source, (fn.__qualname__, old)
    namespace = {}
    exec(compile(source.replace(old, new), f"<edited {fn.__qualname__}>", "exec"), fn.__globals__, namespace)
    return namespace[fn.__name__]


# name: (owner, attribute, old, new): the table, and the same kind of edit to each other formula
EDITS = {
    "Block.forward: half the attention branch": (gpt.Block, "forward", "x = x + self.attn(", "x = x + 0.5 * self.attn("),
    "MLP.forward: ReLU for GELU": (gpt.MLP, "forward", "self.gelu(self.c_fc(x))", "self.c_fc(x).relu()"),
    "LayerNorm.forward: no centring": (F.LayerNorm, "forward", "xc = x - xp.mean(x, axis=-1, keepdims=True)", "xc = x"),
    "Softmax.forward: temperature 2": (ops.Softmax, "forward", "stable_exp(self.xp, x, dim)", "stable_exp(self.xp, x / 2, dim)"),
    "AdamW.update: no first-moment bias correction": (optim.AdamW, "update", "step_size = lr / (1 - b1 ** t)", "step_size = lr"),
    "CrossEntropy.forward: label smoothing": (F.CrossEntropy, "forward", "return -xp.sum(picked * weight)",
                                              "return -xp.sum((0.9 * picked + 0.1 * xp.mean(logp, axis=1)) * weight)"),
    "Linear.forward: the weight scaled": (F.Linear, "forward", "permute_dims(weight, (1, 0))", "permute_dims(weight * 1.5, (1, 0))"),
    "MultiHeadAttention.forward: q and k split the other way": (
        attention.MultiHeadAttention, "forward", "q, k, v = qkv.transpose(1, 2).split(H, dim=1)",
        "k, q, v = qkv.transpose(1, 2).split(H, dim=1)"),
    "Attention.forward: twice the scale": (attention.Attention, "forward", "self.scale = scale", "scale = self.scale = scale * 2"),
    "causal_mask: one key further": (attention, "causal_mask", "xp.tril(ones, k=offset)", "xp.tril(ones, k=offset + 1)"),
    "GeluTanh.forward: another constant": (ops.GeluTanh, "forward", "0.5 * a * (1.0 + ", "0.45 * a * (1.0 + "),
    "Embedding.forward: rows scaled": (F.Embedding, "forward", "self.xp.take(weight, flat, axis=0)",
                                       "self.xp.take(weight, flat, axis=0) * 2"),
}


def gpt_run(fast, seed=0):
    """A GPT's training step with AdamW as the training program makes them (nn.fuse, a fused AdamW),
    then greedy decoding with the KV cache: (loss, gradients, weights after the step, decoded logits)."""
    ta.set_fast(fast)
    ta.manual_seed(seed)
    model = ta.nn.fuse(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=11, init="default")))
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
    assert abs(on[0] - off[0]) <= 1e-5 * max(1.0, abs(off[0]))
    for key in on[1]:
        np.testing.assert_allclose(on[1][key], off[1][key], rtol=1e-4, atol=1e-5, err_msg=key)
        np.testing.assert_allclose(on[2][key], off[2][key], rtol=0, atol=0.1 * lr, err_msg=key)
    np.testing.assert_allclose(on[3], off[3], rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def unedited():
    return gpt_run(True)


@pytest.mark.parametrize("name", sorted(EDITS))
def test_an_edit_runs_with_the_fast_layer_on_as_with_it_off(name, unedited, capsys):
    owner, attr, old, new = EDITS[name]
    original = inspect.getattr_static(owner, attr)
    setattr(owner, attr, edited(getattr(owner, attr), old, new))
    try:
        on, off = gpt_run(True), gpt_run(False)
        err = capsys.readouterr().err
    finally:
        setattr(owner, attr, original)
    assert_same_runs(on, off)
    assert far(on, unedited) > 1e-3, "the edit changes nothing: it does not test anything"
    key = f"{owner.__module__}:{owner.__qualname__}.{attr}" if isinstance(owner, type) else f"{owner.__name__}:{attr}"
    assert err.count("\n") == 1 and err.startswith(f"tinyattn: {checked.where(key)} differs from the library's"), err


def test_unedited_the_fast_layer_runs_and_agrees_with_the_formulas(unedited, monkeypatch):
    """The comparison above is not the teaching path against itself: unedited, the fused block,
    the fast ops and AdamW's flat step run (and agree with the formulas)."""
    from tinyattn.fast import models as fast_models, optim as fast_optim
    ran = {"block": 0, "adamw": 0}
    block_apply, flat = fast_models.BlockOp.apply, fast_optim.fused_step

    def count(name, fn):
        def counted(*args, **kwargs):
            out = fn(*args, **kwargs)
            ran[name] += out is not False
            return out
        return counted
    monkeypatch.setattr(fast_models.BlockOp, "apply", count("block", block_apply))
    monkeypatch.setattr(optim.AdamW, "fused_step", count("adamw", flat))
    on = gpt_run(True)
    if ta.backend.get_backend("cpu").kernel("block") is not None:
        assert ran["block"] == 2
    assert ran["adamw"] == 1
    assert_same_runs(on, gpt_run(False))
    assert_same_runs(on, unedited)         # (to float32 rounding: a product's threads and layout may differ)


def test_a_method_replaced_after_the_model_was_built_runs(capsys):
    """gpt.Block.forward set at run time, after nn.fuse decided: the next call runs it."""
    ta.manual_seed(0)
    model = ta.nn.fuse(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=5)))
    idx = ta.tensor(np.random.default_rng(0).integers(0, 5, (2, 8)))
    before = model(idx, idx)[1].item()
    assert "one op in training" in repr(model.h[0]) or "no block kernel" in repr(model.h[0])
    original = gpt.Block.forward

    def my_forward(self, x, kv_cache=None):
        return original(self, x, kv_cache) * 2.0
    gpt.Block.forward = my_forward
    try:
        after = model(idx, idx)[1].item()
        shown = repr(model.h[0])
    finally:
        gpt.Block.forward = original
    assert after != before and "fused: off, models/gpt.py Block.forward is not the library's" in shown
    assert model(idx, idx)[1].item() == before
    assert "models/gpt.py Block.forward differs from the library's" in capsys.readouterr().err


def test_a_forward_set_on_one_layer_runs_for_that_layer():
    ta.manual_seed(0)
    model = ta.nn.fuse(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=8, block_size=8, vocab_size=5)))
    idx = ta.tensor(np.random.default_rng(0).integers(0, 5, (2, 8)))
    calls = []
    block = model.h[1]
    block.forward = lambda x, kv_cache=None: calls.append(1) or gpt.Block.forward(block, x, kv_cache)
    model(idx, idx)[1].backward()
    with ta.inference_mode():
        model(idx)
    assert calls == [1, 1] and "a forward of its own is set on it" in repr(block)
    assert "fused: off" not in repr(model.h[0])


# ---------------------------------------------------------------- an edited file, a fresh process
@pytest.fixture(scope="module")
def edited_package(tmp_path_factory):
    """A copy of the package (and the training program, with its presets in config/) whose
    models/gpt.py Block.forward halves the attention branch."""
    root = tmp_path_factory.mktemp("edited")
    for folder in ("tinyattn", "train", "config", "data"):
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    path = root / "tinyattn" / "models" / "gpt.py"
    source = path.read_text()
    assert "x = x + self.attn(" in source
    path.write_text(source.replace("x = x + self.attn(", "x = x + 0.5 * self.attn("))
    return root


STEP = """
import json, numpy as np, tinyattn as ta
from tinyattn.models import GPT, GPTConfig
ta.manual_seed(0)
model = ta.nn.fuse(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=11)))
opt = model.configure_optimizer(0.1, 1e-2, (0.9, 0.95))
idx = ta.tensor(np.random.default_rng(0).integers(0, 11, (4, 16)))
_, loss = model(idx, idx)
loss.backward()
opt.step()
print(json.dumps([loss.item(), float(model.h[0].attn.c_attn.weight.numpy().sum()), repr(model.h[0]).splitlines()[0]]))
"""


def run_step(root, fast):
    env = {**os.environ, "PYTHONPATH": str(root), "TINYATTN_FAST": "1" if fast else "0"}
    out = subprocess.run([sys.executable, "-c", STEP], capture_output=True, text=True, env=env, cwd=root, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1]), out.stderr


def test_a_file_edited_before_the_process_starts_runs_with_the_fast_layer_on(edited_package):
    (loss_on, weight_on, shown), err = run_step(edited_package, True)
    (loss_off, weight_off, _), _ = run_step(edited_package, False)
    (loss_library, _, shown_library), err_library = run_step(ROOT, True)
    assert abs(loss_on - loss_off) < 1e-6 and abs(weight_on - weight_off) < 1e-4
    assert abs(loss_on - loss_library) > 1e-4
    lines = [line for line in err.splitlines() if line.startswith("tinyattn:")]
    assert lines == ["tinyattn: models/gpt.py Block.forward differs from the library's; the block on arrays, the GPT "
                     "on arrays (decoding), the fused block step aside, and your code runs"], err
    assert "fused: off, models/gpt.py Block.forward is not the library's" in shown
    assert "tinyattn:" not in err_library and "fused: off" not in shown_library


def val_loss_after_six_steps(root, fast, tmp_path):
    out = tmp_path / f"run-{root.name}-{fast}"
    env = {**os.environ, "PYTHONPATH": str(root), "TINYATTN_FAST": "1" if fast else "0"}
    done = subprocess.run([sys.executable, "-m", "train", "--max_iters", "6", "--eval_interval", "3", "--eval_iters", "2",
                           "--out_dir", str(out), "--quiet"], capture_output=True, text=True, env=env, cwd=root,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads((out / "summary.json").read_text())["val_loss"], done.stderr


def test_through_the_training_program_the_edit_moves_the_val_loss_the_same_with_the_fast_layer_on_and_off(
        edited_package, tmp_path):
    (edited_on, err), (edited_off, _) = (val_loss_after_six_steps(edited_package, fast, tmp_path) for fast in (1, 0))
    library_on, library_off = (val_loss_after_six_steps(ROOT, fast, tmp_path)[0] for fast in (1, 0))
    assert abs(edited_on - library_on) > 0.01                            # the edit moves it
    assert abs((edited_on - library_on) - (edited_off - library_off)) < 1e-3
    assert "models/gpt.py Block.forward differs from the library's" in err
