"""Whether a compiled path may stand in for the library's code: decided from the code itself.

A fast path (the fast ops, the fused layers, AdamW's flat step) runs in place of
teaching code, and its kernels were checked against that code (the op table runs
both). So it may run only while that code is the library's. Two checks decide,
with no list of functions kept by hand:

- **the files**: each path depends on whole files of the library (``DEPENDS``,
  the engine's files included, so nothing a formula calls is missed). A file's
  fingerprint is a hash of its syntax tree without docstrings (comments, blank
  lines, line endings and the Python version do not change it); fingerprints.py
  holds the library's. Compared once, at the first check (the first ``ta.compile``).
- **what runs now**: at the end of ``import tinyattn``, every function, class and
  constant of those files' modules, every function, method and property of their
  classes (Tensor's included) and of the devices' backends is noted; each compiled
  call compares them by identity, so a replacement made at any time
  (``Tensor.mean = my_mean``, ``ops.stable_exp = f``) counts, and so does a name
  added that shadows another (``NumpyBackend.erf = f`` over ``Backend.erf``).

Any difference turns off each path that depends on that file, with one line on
stderr naming what differs and what steps aside; put the code back and the paths
run again. After changing a teaching file in the library itself, check its fast
paths against it (``pytest tests/engine/test_optable.py``), then store the new
fingerprints: ``python -m tinyattn.fast --write``.
"""
import ast
import builtins
import hashlib
import importlib
import operator
import sys
from pathlib import Path

from ..backend import made_backends
from ..distributed import launched

PACKAGE = Path(__file__).resolve().parents[1]           # tinyattn/
ENGINE = ("autograd.py", "tensor.py", "ops.py", "backend/__init__.py")       # what every formula runs on
DEPENDS = {
    "the fast ops": ENGINE + ("nn/functional.py", "nn/attention.py", "nn/flash.py"),
    "the fused layers": ENGINE + ("nn/functional.py", "nn/attention.py", "nn/flash.py", "nn/modules.py",
                                  "models/gpt.py"),
    "the fused AdamW": ENGINE + ("optim/__init__.py",),
}
FILES = sorted({f for files in DEPENDS.values() for f in files})


def fingerprint(source):
    """A hash of Python source as a syntax tree, without docstrings."""
    return hashlib.sha256(_canonical(ast.parse(source)).encode()).hexdigest()[:16]


def _canonical(node):
    """A node as text: its type and fields, leaving out docstrings, positions and empty fields
    (which Python versions add or drop)."""
    if isinstance(node, list):
        if node and isinstance(node[0], ast.Expr) and isinstance(node[0].value, ast.Constant) \
                and isinstance(node[0].value.value, str):
            node = node[1:]                              # a docstring (a string statement at the top of a body)
        return "[" + ",".join(_canonical(n) for n in node) + "]"
    if not isinstance(node, ast.AST):
        return repr(node)
    fields = [f"{name}={_canonical(value)}" for name, value in ast.iter_fields(node)
              if value is not None and value != [] and name != "type_comment"]
    return f"{type(node).__name__}({','.join(fields)})"


def file_fingerprints():
    """{file: fingerprint} of the teaching files as they are on disk now."""
    return {f: fingerprint((PACKAGE / f).read_bytes()) for f in FILES}


def module_of(file):
    """'nn/attention.py' -> the module tinyattn.nn.attention."""
    name = "tinyattn." + file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    return sys.modules.get(name) or importlib.import_module(name)


_CONSTANTS = (int, float, complex, str, bytes, tuple, frozenset)


def _is_code(name, value, module):
    """What a formula runs: functions, classes, cached functions and other callables, a class's
    descriptors, and a module's constants (NAMES_IN_CAPITALS: a fast path may hold its own copy)."""
    return (callable(value) or isinstance(value, (staticmethod, classmethod, property))
            or (module and isinstance(value, _CONSTANTS) and name.lstrip("_").isupper()))


class _Noted:
    """What the teaching modules run, as it was when noted: per namespace (a module's dict, a
    class's, a backend's), the names and one itemgetter that reads them all back, so the check at
    each compiled call is a few C-level reads and comparisons; and every name there then, so that
    a name added later that shadows another (a method set on a subclass over its base's, a
    function set on a backend over its class's, a builtin) counts too."""

    def __init__(self):
        self.spaces = []          # (file, owner's name, namespace, names, getter, values, size, known, shadows)
        for file in FILES:
            module = module_of(file)
            self._note(file, "", vars(module), lambda name: hasattr(builtins, name))
            classes = {}                                 # each class of the module's own, once, by its name there
            for name, value in vars(module).items():
                if isinstance(value, type) and value.__module__ == module.__name__:
                    classes.setdefault(id(value), (name, value))
            for name, value in classes.values():
                self._note(file, name, vars(value), lambda attr, cls=value: any(attr in vars(base)
                                                                               for base in cls.__mro__[1:]))
        for backend in made_backends():                  # (functions set on the device objects themselves)
            self._note("backend/__init__.py", f"get_backend({backend.name!r})", vars(backend),
                       lambda attr, cls=type(backend): hasattr(cls, attr))

    def _note(self, file, owner, namespace, shadows):
        names = [name for name, value in namespace.items() if _is_code(name, value, not owner)]
        if not names:
            get, values = (lambda space: ()), ()
        else:                                            # (itemgetter of one name gives a value, not a tuple)
            get = operator.itemgetter(*names) if len(names) > 1 else lambda space, name=names[0]: (space[name],)
            values = get(namespace)
        self.spaces.append((file, owner, namespace, names, get, values, len(namespace), set(namespace), shadows))

    def changed(self):
        """{file: [what in it is not as noted]}, empty when everything is."""
        out = {}
        for file, owner, namespace, names, get, values, size, known, shadows in self.spaces:
            try:
                if len(namespace) == size and get(namespace) == values:   # (the usual case: one read)
                    continue
            except KeyError:
                pass
            differ = [name for name, was in zip(names, values) if namespace.get(name, _GONE) is not was]
            differ += [name for name in namespace.keys() - known if callable(namespace[name]) and shadows(name)]
            out.setdefault(file, []).extend(f"{owner}.{name}" if owner else name for name in differ)
        return {file: names for file, names in out.items() if names}


_GONE = object()
_noted = None
EDITED = ("(edited)",)
_edited = None              # {file: EDITED} for each file whose fingerprint is not the library's (first compile)
_said = {}                  # what the last notice named: {file: [names]}


def note():
    """Note the library's code as it runs now (tinyattn/__init__.py: at the end of import tinyattn)."""
    global _noted
    _noted = _Noted()


def differences():
    """{file: [what differs]} for every teaching file that is not the library's now: edited on disk
    (compared at the first call), or a function in it replaced while the program runs."""
    global _edited
    if _edited is None:
        from .fingerprints import FINGERPRINTS
        _edited = {f: EDITED for f, p in file_fingerprints().items() if FINGERPRINTS.get(f) != p}
    changed = _noted.changed()
    return {**changed, **_edited} if _edited else changed


def allowed():
    """The paths that may run now (a set of DEPENDS' names). Where the code that differs is not
    what the last call found, one line on stderr says what differs and what steps aside (in a
    job of several processes, the first says it: every process runs the same files)."""
    global _said
    differ = differences()
    off = {path for path, files in DEPENDS.items() if any(f in differ for f in files)}
    if differ != _said:
        _said = differ
        if differ and launched()[1] == 0:
            paths = [p for p in DEPENDS if p in off]
            paths = ", ".join(paths[:-1]) + " and " + paths[-1] if len(paths) > 1 else paths[0]
            print(f"tinyattn: {', '.join(_what(f, names) for f, names in sorted(differ.items()))}; {paths} "
                  f"step{'s' * (len(off) == 1)} aside, and your code runs", file=sys.stderr)
    return DEPENDS.keys() - off


def _what(file, names):
    """'nn/attention.py is edited', 'tensor.py: Tensor.mean is not the library's'."""
    if names is EDITED:
        return f"{file} is edited"
    shown = ", ".join(sorted(names)[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return f"{file}: {shown} {'is' if len(names) == 1 else 'are'} not the library's"


def write():
    """Store the files' fingerprints as the library's (fingerprints.py)."""
    global _edited
    prints = file_fingerprints()
    lines = ['"""The fingerprint of each teaching file that a fast path depends on, as the library ships it.',
             "", "Written by ``python -m tinyattn.fast --write``: see checked.py.", '"""', "FINGERPRINTS = {"]
    lines += [f"    {f!r}: {p!r}," for f, p in prints.items()]
    path = Path(__file__).with_name("fingerprints.py")
    path.write_text("\n".join(lines + ["}"]) + "\n")
    from . import fingerprints
    fingerprints.FINGERPRINTS = prints                   # (this process, too)
    _edited = None
    return path
