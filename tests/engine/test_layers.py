"""Imports run one way: backend -> autograd -> ops -> tensor API -> nn -> models -> train.

Each module's imports are read with ``ast`` (lazy imports inside functions
too); a module may import its own layer or lower ones, never a higher one.
"""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# (module prefix, layer): the longest matching prefix names a module's layer
LAYERS = [
    ("tinyattn.errors", 0),         # the error classes: they import nothing
    ("tinyattn.backend", 0),
    ("tinyattn.autograd", 1),
    ("tinyattn.ops", 2),
    ("tinyattn.hooks", 2),          # the learner tools' hook into the engine
    ("tinyattn.anomaly", 2),
    ("tinyattn.profiler", 2),
    ("tinyattn.tensor", 3),
    ("tinyattn.viz", 4),
    ("tinyattn.gradcheck", 4),
    ("tinyattn.nn", 4),
    ("tinyattn.optim", 4),
    ("tinyattn.distributed", 4),
    ("tinyattn.safetensors", 4),   # a file format: Tensors in and out
    ("tinyattn.tokenizers", 4),    # text to ids: stdlib, numpy and numba only
    ("tinyattn.fast", 5),          # the fast layer: subclasses of the ops above, never imported by them
    ("tinyattn.models", 6),
    ("tinyattn.fast.models", 6),   # the fast layer's versions of the GPT's own layers
    ("tinyattn.fast.compiled", 6),  # ta.compile: runs a model with them
    ("data", 7),
    ("train", 8),
    ("bench", 9),
]
PACKAGES = ("tinyattn", "data", "train", "bench")


def layer_of(module):
    best = None
    for prefix, layer in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, layer)
    return None if best is None else best[1]


def module_name(path, root=ROOT):
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts), path.name == "__init__.py"


def imported_modules(path, root=ROOT):
    """Every module that ``path`` imports, as absolute dotted names."""
    name, is_package = module_name(path, root)
    package = name if is_package else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module
            out.append(stem)
            out += [f"{stem}.{alias.name}" for alias in node.names]   # "from . import ops" names a module
    return out


def source_files():
    files = []
    for pkg in PACKAGES:
        files += sorted((ROOT / pkg).rglob("*.py")) if (ROOT / pkg).is_dir() else []
    return [f for f in files if f != ROOT / "tinyattn" / "__init__.py"]   # the facade re-exports every layer


def test_the_layer_table_covers_every_module():
    unknown = [str(f.relative_to(ROOT)) for f in source_files() if layer_of(module_name(f)[0]) is None]
    assert not unknown, f"modules with no layer in tests/engine/test_layers.py: {unknown}"


@pytest.mark.parametrize("path", source_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_a_higher_layer(path):
    own = layer_of(module_name(path)[0])
    upward = sorted({m for m in imported_modules(path) if (layer_of(m) or -1) > own})
    assert not upward, f"{path.relative_to(ROOT)} (layer {own}) imports higher layers: {upward}"


def node_is_package_private_module(node):
    return isinstance(node, ast.ImportFrom) and node.level == 1 and node.module is None


def test_no_private_name_is_imported_across_modules():
    found = []
    for path in source_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if node_is_package_private_module(node):
                continue                                  # "from . import _common": the package's own helper
            if isinstance(node, ast.ImportFrom) and (node.level or node.module.split(".")[0] in PACKAGES):
                found += [f"{path.relative_to(ROOT)}: {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, f"private names imported from another module: {found}"


def test_the_checker_sees_an_upward_import(tmp_path):
    """A lower layer that imports a higher one is caught, lazy imports inside functions too."""
    fake = tmp_path / "tinyattn" / "ops.py"
    fake.parent.mkdir()
    fake.write_text("import math\n\ndef f():\n    from .nn import functional\n    return functional\n")
    upward = [m for m in imported_modules(fake, tmp_path) if (layer_of(m) or -1) > layer_of("tinyattn.ops")]
    assert upward == ["tinyattn.nn", "tinyattn.nn.functional"]


def test_no_sys_path_edits():
    """train, data and exercises are installed with the package: nothing edits sys.path."""
    edits = []
    for path in sorted(ROOT.rglob("*.py")):
        if ".venv" in path.parts or path == Path(__file__).resolve():
            continue
        text = path.read_text(errors="replace")
        if "sys.path.insert" in text or "sys.path.append" in text:
            edits.append(str(path.relative_to(ROOT)))
    assert not edits, f"sys.path edits in {edits}"


@pytest.mark.parametrize("package", ["train", "data", "exercises"])
def test_the_programs_import_from_this_checkout(package):
    """Installed with tinyattn, so another installed package of that name cannot shadow them."""
    module = __import__(package)
    assert Path(module.__file__).resolve().parent == ROOT / package


DEVICE_NAME_COMPARISON = re.compile(r"""(\.name|\bdevice)\s*[!=]=\s*["'](cuda|cpu|strict)|startswith\(\s*["'](cuda|cpu|strict)|["'](cuda|cpu|strict)["']\s*[!=]=""")


def test_nothing_above_the_backend_compares_a_device_name():
    """What differs between devices is a backend's capability (on_host, has_nccl, clock...), never
    its name: a new backend then works everywhere without a search for "cuda"."""
    files = [p for folder in ("tinyattn", "train") for p in (ROOT / folder).rglob("*.py")
             if "backend" not in p.relative_to(ROOT).parts]
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in files
             for n, line in enumerate(p.read_text().splitlines(), 1) if DEVICE_NAME_COMPARISON.search(line)]
    assert not found, "device names compared above the backend:\n" + "\n".join(found)


TEACHING = ["tinyattn/autograd.py", "tinyattn/ops.py", "tinyattn/tensor.py", "tinyattn/nn/functional.py",
            "tinyattn/nn/modules.py", "tinyattn/nn/attention.py", "tinyattn/nn/flash.py", "tinyattn/nn/utils.py",
            "tinyattn/optim/__init__.py",
            "tinyattn/models/gpt.py"]
SPEED_WORDS = re.compile(r"\b(run_kernel|hold_blas|several_outputs|use_kernels)\b|\.kernel\(|threads\.")


@pytest.mark.parametrize("name", TEACHING)
def test_a_teaching_file_holds_only_its_formulas(name):
    """It neither imports the fast layer nor asks whether a kernel exists, and no op branches on
    is_grad_enabled (grad mode's own definition and the in-place rule of tensor.py aside)."""
    path = ROOT / name
    assert not [m for m in imported_modules(path) if m.startswith("tinyattn.fast")], f"{name} imports the fast layer"
    lines = path.read_text().splitlines()
    found = [f"{name}:{n}: {line.strip()}" for n, line in enumerate(lines, 1) if SPEED_WORDS.search(line)]
    if name not in ("tinyattn/autograd.py", "tinyattn/tensor.py"):
        found += [f"{name}:{n}: {line.strip()}" for n, line in enumerate(lines, 1) if "is_grad_enabled" in line]
    assert not found, "speed code in a teaching file:\n" + "\n".join(found)


def test_the_checker_sees_speed_code():
    assert SPEED_WORDS.search("x = self.backend.run_kernel('gelu', a)")
    assert SPEED_WORDS.search("with threads.hold_blas():")


def test_the_fast_layer_is_imported_by_no_teaching_module_and_not_by_the_engine():
    importers = [str(p.relative_to(ROOT)) for p in source_files()
                 if not module_name(p)[0].startswith("tinyattn.fast")
                 and any(m.startswith("tinyattn.fast") for m in imported_modules(p))]
    assert "tinyattn/autograd.py" not in importers
    assert all(not p.startswith("tinyattn/") for p in importers), importers   # only train/ and bench/


def test_every_fast_op_is_a_subclass_of_the_teaching_op_it_replaces():
    from tinyattn.fast.ops import FAST_OPS
    assert FAST_OPS
    for teaching, fast in FAST_OPS.items():
        assert issubclass(fast, teaching) and fast.__name__ == teaching.__name__, fast
        assert not teaching.__module__.startswith("tinyattn.fast")


def test_every_fast_layer_names_the_teaching_layer_it_runs_for_and_none_is_a_subclass():
    """Layers are not swapped for fast subclasses: ta.compile gives a layer a runner, which names its class."""
    import tinyattn  # noqa: F401  (its __init__ imports fast/models.py, which adds the GPT's layers)
    from tinyattn.fast.modules import RUNNERS
    from tinyattn.models.gpt import GPT, MLP, Block
    from tinyattn.nn import MultiHeadAttention
    assert {runner.teaching for runner in RUNNERS} == {MultiHeadAttention, MLP, Block, GPT}
    for runner in RUNNERS:
        assert not issubclass(runner, tinyattn.nn.Module) and not runner.teaching.__module__.startswith("tinyattn.fast")


def test_no_class_is_swapped_behind_the_users_back():
    """type(GPT(cfg)) is the class in gpt.py, type(AdamW(...)) the one in optim, compiled or not
    (ta.compile wraps the model, as PyTorch's does, and changes none of its layers); and no
    __new__ in nn or optim makes another class."""
    import tinyattn as ta
    from tinyattn.models import GPT, GPTConfig, gpt
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=4, vocab_size=5))
    assert type(model) is gpt.GPT and type(model.h[0]) is gpt.Block
    compiled = ta.compile(model)
    assert compiled._orig_mod is model and type(model.h[0].mlp) is gpt.MLP and compiled.h[0] is model.h[0]
    assert type(compiled.configure_optimizer(0.1, 1e-3, (0.9, 0.95))) is ta.optim.AdamW
    found = [f"{p.relative_to(ROOT)}:{n}" for folder in ("tinyattn/nn", "tinyattn/optim")
             for p in sorted((ROOT / folder).rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if "__new__" in line]
    assert not found, found


def test_ops_run_their_formulas_unless_compiled():
    import numpy as np
    import tinyattn as ta
    import tinyattn.nn.functional as F
    x = ta.randn(3, 8, requires_grad=True)
    assert type(F.gelu(x, "tanh").grad_fn).__module__ == "tinyattn.ops"
    gelu = ta.compile(F.gelu)
    assert type(gelu(x, "tanh").grad_fn).__module__ == "tinyattn.fast.ops"
    assert type(F.gelu(x, "tanh").grad_fn).__module__ == "tinyattn.ops"          # only inside the compiled call
    np.testing.assert_allclose(gelu(x, "tanh").numpy(), F.gelu(x, "tanh").numpy(), rtol=1e-6, atol=1e-6)
