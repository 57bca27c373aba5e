"""What each fast path stands in for, and whether that code is still the library's.

A fast path (a fast op, the fused block, a layer's forward on arrays, AdamW's
flat step) runs in place of teaching code: an op's forward and backward, the
helpers they call, a module's forward. Its kernels were checked against that
code (the op table runs both), so it may run only while that code is unchanged.

``STANDS_IN_FOR`` names the teaching code of each path. ``fingerprints.py``,
beside this file, holds a fingerprint of each function as the library ships
it: a hash of its syntax tree without docstrings, so comments, blank lines,
line endings and the Python version do not change it. When the fast layer is
first imported, each live function is fingerprinted and compared:

- edited in the file, replaced at run time (``gpt.Block.forward = f``,
  ``ops.stable_exp = f``; tinyattn/watch.py reports those as they happen), or
  swapped for another class: every path that stands in for it steps aside, and
  one line on stderr says so, once;
- put back as it was: the paths run again.

A subclass (``class MyBlock(gpt.Block)``) never runs a fast path: those are
chosen by exact class.

After changing a teaching formula in the library itself, check its fast path
against it (``pytest tests/engine/test_optable.py``), then store the new
fingerprints: ``python -m tinyattn.fast.checked --write``. The suite fails while
they differ (tests/engine/test_edits_run.py).
"""
import ast
import hashlib
import importlib
import inspect
import sys
import textwrap
import weakref
from pathlib import Path

from .. import watch

O, F, A, FL, NN, G, OPT = ("tinyattn.ops", "tinyattn.nn.functional", "tinyattn.nn.attention", "tinyattn.nn.flash",
                           "tinyattn.nn.modules", "tinyattn.models.gpt", "tinyattn.optim")

# A name "module:Class" is every function the class defines (an op's forward, backward and their
# helpers); "module:Class.method" one method; "module:function" a function, as the teaching code
# looks it up (attention.py's causal_mask is its own global, though it comes from ops.py). An op's
# backward formula runs other ops (Tensor methods: g * y is Mul): their forwards count too.


def _forwards(*ops):
    return [f"{O}:{op}.forward" for op in ops]


_SOFTMAX = [f"{O}:MaskedSoftmax", f"{O}:masked_softmax"] + _forwards("Mul", "Sub", "Sum")
_OPS = {
    "MatMul": [f"{O}:MatMul", f"{O}:sum_to"] + _forwards("Permute", "Sum", "Reshape"),
    "Erf": [f"{O}:Erf"] + _forwards("Mul", "Neg", "Exp"),
    "Gelu": [f"{O}:Gelu"] + _forwards("Mul", "Add", "Erf", "Exp"),
    "GeluTanh": [f"{O}:GeluTanh", f"{O}:gelu_tanh_u", f"{O}:gelu_tanh_slope"] + _forwards("Mul", "Add", "Sub", "Tanh"),
    "Sum": [f"{O}:Sum"] + _forwards("Reshape", "Expand"),
    "Split": [f"{O}:Split", f"{O}:Cat"],
    "Softmax": [f"{O}:Softmax", f"{O}:stable_exp"] + _forwards("Mul", "Sub", "Sum"),
    "MaskedSoftmax": _SOFTMAX,
    "CrossEntropy": [f"{F}:CrossEntropy", f"{F}:stable_exp", f"{F}:softmax", f"{O}:Softmax", f"{O}:stable_exp"]
                    + _forwards("Mul", "Sub", "Sum"),
    "EmbeddingGrad": [f"{F}:EmbeddingGrad", f"{F}:Embedding"],
    "LayerNorm": [f"{F}:LayerNorm"] + _forwards("Sub", "Sum", "Mul", "Add", "PowScalar", "Reshape"),
    "Linear": [f"{F}:Linear"] + _forwards("Reshape", "MatMul", "Permute", "Sum"),
    "Attention": [f"{A}:Attention", f"{A}:masked_softmax", f"{A}:matrix_transpose", f"{A}:MaskedSoftmax"]
                 + _SOFTMAX + _forwards("MatMul", "Permute"),
    "FlashAttention": [f"{FL}:FlashAttention", f"{FL}:_blocks", f"{FL}:_mask_tile", f"{FL}:_parts",
                       f"{FL}:causal_mask"],
}
_LINEAR = [f"{NN}:Linear.forward", f"{NN}:expect_shape", f"{F}:linear"] + _OPS["Linear"]
_LAYER_NORM = [f"{NN}:LayerNorm.forward", f"{F}:layer_norm"] + _OPS["LayerNorm"]
_DROPOUT = [f"{NN}:Dropout.forward", f"{F}:dropout"]
_MHA = ([f"{A}:MultiHeadAttention.forward", f"{A}:MultiHeadAttention.head_keep", f"{A}:scaled_dot_product_attention",
         f"{A}:attention_impl", f"{A}:is_long", f"{A}:_fused_attention_fits", f"{A}:causal_mask", f"{A}:dropout",
         f"{A}:KVCache.causal_mask", f"{O}:causal_mask", f"{O}:Split"]
        + _LINEAR + _DROPOUT + _OPS["Attention"])
_MLP = [f"{G}:MLP.forward", f"{NN}:GELU.forward", f"{F}:gelu", f"{O}:gelu"] + _LINEAR + _DROPOUT + _OPS["GeluTanh"]
_BLOCK = [f"{G}:Block.forward"] + _LAYER_NORM + _MHA + _MLP
STANDS_IN_FOR = {
    **_OPS,                                          # fast/ops.py: the fast version of each op
    "AdamW": [f"{OPT}:AdamW.step", f"{OPT}:AdamW.update"],          # fast/optim.py: the flat step
    "MultiHeadAttention": _MHA,                      # fast/modules.py: forwards on arrays, without a graph
    "MLP": _MLP,
    "Block": _BLOCK,
    "GPT": [f"{G}:GPT.forward", f"{NN}:Embedding.forward", f"{F}:embedding", f"{F}:Embedding"] + _BLOCK + _LAYER_NORM,
    "fused block": _BLOCK,                           # fast/models.py: the block as one op, in training
}
WHAT = {"AdamW": "AdamW's flat step", "MultiHeadAttention": "MultiHeadAttention on arrays", "MLP": "the MLP on arrays",
        "Block": "the block on arrays", "GPT": "the GPT on arrays (decoding)", "fused block": "the fused block"}


def describe(path):
    """How a notice names a path: "the fast Softmax", "the fused block", ..."""
    return WHAT.get(path, f"the fast {path}")


# ---------------------------------------------------------------- fingerprints
def fingerprint(fn):
    """A hash of ``fn``'s source as a syntax tree, without docstrings; None where it has no source."""
    known = _known.get(fn)
    if known is None:
        known = _known[fn] = _fingerprint(fn)
    return known


_known = weakref.WeakKeyDictionary()     # function -> its fingerprint (a function's code does not
                                         # change; replacing it makes a new one)


def _fingerprint(fn):
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    return hashlib.sha256(_canonical(tree).encode()).hexdigest()[:16]


def _canonical(node):
    """A node as text: its type and its fields, leaving out docstrings and empty fields (which
    Python versions add or drop), and positions."""
    if isinstance(node, list):
        items = node
        if items and isinstance(items[0], ast.Expr) and isinstance(items[0].value, ast.Constant) \
                and isinstance(items[0].value.value, str):
            items = items[1:]                        # a docstring (any string statement at the top)
        return "[" + ",".join(_canonical(n) for n in items) + "]"
    if not isinstance(node, ast.AST):
        return repr(node)
    fields = [f"{name}={_canonical(value)}" for name, value in ast.iter_fields(node)
              if value is not None and value != [] and name != "type_comment"]
    return f"{type(node).__name__}({','.join(fields)})"


def functions(name):
    """The functions a name of STANDS_IN_FOR stands for, live: {"module:qualname": function or None}."""
    module_name, _, attr = name.partition(":")
    obj = sys.modules.get(module_name) or importlib.import_module(module_name)
    first, _, method = attr.partition(".")
    obj = getattr(obj, first, None)
    if method:
        return {name: _function(inspect.getattr_static(obj, method, None) if obj is not None else None)}
    if isinstance(obj, type):                        # a class: each function it defines itself
        return {f"{name}.{key}": _function(value) for key, value in vars(obj).items()
                if _function(value) is not None}
    return {name: _function(obj)}


def _function(value):
    value = getattr(value, "__func__", value)        # staticmethod, classmethod
    value = getattr(value, "__wrapped__", value)     # functools.lru_cache
    return value if inspect.isfunction(value) else None


def live_fingerprints():
    """{"module:qualname": fingerprint} of every function that some path stands in for, as they are now."""
    out = {}
    for names in STANDS_IN_FOR.values():
        for name in names:
            for key, fn in functions(name).items():
                out[key] = None if fn is None else fingerprint(fn)
    return out


# ---------------------------------------------------------------- which paths run
class _State:
    def __init__(self):
        self.differ = {}    # "module:qualname" -> why, for each function that is not the library's
        self.said = set()   # the functions a notice has named
        self.checked = False


_state = _State()
OFF = frozenset()           # the paths that step aside now (check() sets it; runs() reads it)
on_change = []              # functions () -> None, called when the paths that run change (fast/__init__.py)


def runs(path):
    """True while every function ``path`` stands in for is the library's."""
    if not _state.checked:
        check()
    return path not in OFF


def check(names=None):
    """Compare the live functions with the stored fingerprints (all, or those under ``names``),
    and decide again which paths step aside; say so in one line for each newly changed function."""
    from .fingerprints import FINGERPRINTS
    if not _state.checked:
        _watch_modules()
        names = None
    keys = set()
    for name in _NAMES:                              # (each name once, however many paths name it)
        if names is None or any(name == n or name.startswith(n + ".") or n.startswith(name + ".") for n in names):
            for key, fn in functions(name).items():
                keys.add(key)
                stored = FINGERPRINTS.get(key)
                if fn is not None and stored is not None and fingerprint(fn) == stored:
                    _state.differ.pop(key, None)
                else:
                    _state.differ[key] = "is not the library's" if fn is None else "differs from the library's"
    if names is None:
        for key in set(FINGERPRINTS) - keys:         # a stored function no longer there
            _state.differ[key] = "is gone"
    off = {path for path, group in STANDS_IN_FOR.items() if any(_covers(group, key) for key in _state.differ)}
    global OFF
    changed = off != OFF or not _state.checked
    OFF, _state.checked = frozenset(off), True
    _say(sorted(set(_state.differ) - _state.said))
    _state.said &= set(_state.differ)                # put back: a later change is said again
    if changed:
        for fn in on_change:
            fn()


def _say(keys):
    """One line on stderr for each function newly not the library's (a class's method named from
    two modules is one function), with the paths that step aside for it."""
    groups = {}
    for key in keys:
        _state.said.add(key)
        qualname = key.partition(":")[2]
        head = _head(key)
        shared = isinstance(head, type) and "." in qualname and head.__module__ in _MODULES_SET   # (a library class)
        home = f"{head.__module__}:{qualname}" if shared else key
        groups.setdefault(home, []).append(key)
    for home, same in groups.items():
        paths = [describe(p) for p, group in STANDS_IN_FOR.items() if any(_covers(group, key) for key in same)]
        if paths:
            print(f"tinyattn: {where(home)} {_state.differ[same[0]]}; {', '.join(paths)} "
                  f"step{'s' * (len(paths) == 1)} aside, and your code runs", file=sys.stderr)


def where(key):
    """'tinyattn.models.gpt:Block.forward' -> 'models/gpt.py Block.forward' (the file, from tinyattn/)."""
    module, _, qualname = key.partition(":")
    package = Path(sys.modules["tinyattn"].__file__).parent
    path = Path(sys.modules[module].__file__)
    return f"{path.relative_to(package).as_posix() if path.is_relative_to(package) else module} {qualname}"


def status():
    """{path: [the functions it stands in for that are not the library's]} (empty lists: it runs)."""
    if not _state.checked:
        check()
    return {path: sorted(key for key in _state.differ if _covers(group, key)) for path, group in STANDS_IN_FOR.items()}


def _covers(group, key):
    """Whether one of a path's names (a class, or a function) covers the function ``key``."""
    return any(key == name or key.startswith(name + ".") for name in group)


# ---------------------------------------------------------------- changes at run time
def _modules():
    return sorted({name.partition(":")[0] for group in STANDS_IN_FOR.values() for name in group})


def _watch_modules():
    """Give the modules that hold stood-in-for code the type that reports changes (watch.py)."""
    for name in _modules():
        module = sys.modules.get(name) or importlib.import_module(name)
        if type(module) is not watch.WatchedModule:
            module.__class__ = watch.WatchedModule


def _changed(owner, name):
    """watch.py's report: ``name`` of a class or module was set. Check again what it may touch: a
    class wherever STANDS_IN_FOR names it (attention.py names ops.py's MaskedSoftmax too), a
    module's name where it names that module's."""
    if not _state.checked:
        return
    if isinstance(owner, type):
        names = [name for name in _NAMES if _head(name) is owner]
        if names:
            check(names)
    elif owner.__name__ in _MODULES_SET:
        check([f"{owner.__name__}:{name}"])


def _head(name):
    """What a name of STANDS_IN_FOR starts from: the class or function its module holds now."""
    module_name, _, attr = name.partition(":")
    return getattr(sys.modules.get(module_name), attr.partition(".")[0], None)


_MODULES_SET = set(_modules())
_NAMES = sorted({name for group in STANDS_IN_FOR.values() for name in group})
watch.listeners.append(_changed)


def write():
    """Store the live fingerprints as the library's (fingerprints.py)."""
    import pathlib
    prints = live_fingerprints()
    lines = ['"""The fingerprint of each function a fast path stands in for, as the library ships it.',
             "", "Written by ``python -m tinyattn.fast.checked --write``: see checked.py.", '"""',
             "FINGERPRINTS = {"]
    lines += [f"    {key!r}: {value!r}," for key, value in sorted(prints.items())]
    lines.append("}")
    path = pathlib.Path(__file__).with_name("fingerprints.py")
    path.write_text("\n".join(lines) + "\n")
    return path
