"""What every exercise's checks share: loading the code under test (the learner's
exercises/<name>.py or a reference solution), the failure and not-started signals,
running a check, and the tools the checks are written with (ta.gradcheck with a
random cotangent, gradgradcheck, numpy formulas, the stand-in device "strict").
"""
import importlib
import importlib.util
import re
import sys
import traceback
import warnings
from pathlib import Path

import tracemalloc

import numpy as np

import tinyattn as ta
from tinyattn.gradcheck import GradcheckError

HERE = Path(__file__).resolve().parent.parent           # the exercises package: the learner's files
MACHINERY = {"__init__", "__main__"}                   # not the learner's files (the checks are in checking/)
SOLUTIONS = "exercise_solutions"                        # the reference solutions, imported under this name
SOLUTIONS_DIR = HERE.parent / "tests" / "support" / SOLUTIONS     # kept with the tests, out of the learner's folder


class NotStarted(Exception):
    """A piece of the exercise is not written yet: its checks are skipped, not failed."""


class ExerciseFailure(AssertionError):
    """The code under test is wrong. The message's first line is the one-line reason."""


def load_exercise(name, package="exercises"):
    """<package>/<name>.py as a module. A learner's file that does not exist yet is NotStarted.

    (Only a missing file counts as not started: an error inside the file is reported.)
    """
    if package == "exercises" and not (HERE / f"{name}.py").exists():
        raise NotStarted(f"exercises/{name}.py does not exist yet: see EXERCISES.md")
    if package == SOLUTIONS:
        load_solutions()
    return importlib.import_module(f"{package}.{name}")


def load_solutions():
    """tests/support/exercise_solutions/ as the package ``exercise_solutions``, found by its path.

    The solutions live with the tests, not on the import path; once their package is
    imported, ``exercise_solutions.<name>`` (and imports between solutions) resolve in that folder.
    """
    if SOLUTIONS in sys.modules:                        # imported already (by the tests, or an earlier call)
        return sys.modules[SOLUTIONS]
    init = SOLUTIONS_DIR / "__init__.py"
    if not init.exists():
        raise FileNotFoundError(f"no reference solutions at {SOLUTIONS_DIR}: they come with the repository "
                                "(a clone installed with pip install -e .)")
    spec = importlib.util.spec_from_file_location(SOLUTIONS, init, submodule_search_locations=[str(SOLUTIONS_DIR)])
    package = importlib.util.module_from_spec(spec)
    sys.modules[SOLUTIONS] = package
    try:
        spec.loader.exec_module(package)
    except BaseException:
        del sys.modules[SOLUTIONS]
        raise
    return package


def need(mod, name):
    """mod.name, or NotStarted saying what to write next."""
    if not hasattr(mod, name):
        raise NotStarted(f"{getattr(mod, '__name__', 'the module')} has no {name} yet")
    return getattr(mod, name)


def is_learner_code(filename):
    """Is this file an answer: the learner's exercises/<name>.py, a reference solution, a wrong answer?"""
    path = Path(filename)
    if path.parent.name == "exercises":
        return path.stem not in MACHINERY
    return path.parent.name == SOLUTIONS or path.stem == "exercise_wrong_answers"


def unwritten(error):
    """'Softmax.backward (exercises/softmax.py:25)': the learner's line an error came from."""
    for frame, lineno in reversed(list(traceback.walk_tb(error.__traceback__))):
        code = frame.f_code
        if is_learner_code(code.co_filename):
            path = "/".join(Path(code.co_filename).parts[-2:])
            return f"{getattr(code, 'co_qualname', code.co_name)} ({path}:{lineno})"
    return str(error) or "a piece"


def run_check(check, module):
    """("pass" | "skip" | "fail", one-line reason) of one check on one module."""
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):    # the message says what went wrong
            warnings.simplefilter("ignore")
            check(module)
    except NotStarted as e:
        return "skip", str(e)
    except NotImplementedError as e:
        return "skip", f"not written yet: {unwritten(e)} raises NotImplementedError"
    except ExerciseFailure as e:
        return "fail", str(e)
    except AssertionError as e:
        return "fail", f"{check.__name__}: {str(e).strip() or 'an assertion failed'}"
    except Exception as e:  # the learner's code raised: say what and where
        where = unwritten(e)
        return "fail", f"{check.__name__}: your code raised {type(e).__name__}: {e} (in {where})"
    return "pass", ""


def pytest_check(check, module_or_loader):
    """Run a check under pytest: NotStarted and NotImplementedError skip, ExerciseFailure fails
    with its message only (no traceback into the checker); any other error keeps its traceback."""
    import pytest
    try:
        check(module_or_loader() if callable(module_or_loader) else module_or_loader)
    except NotStarted as e:
        pytest.skip(str(e))
    except NotImplementedError as e:
        pytest.skip(f"not written yet: {unwritten(e)} raises NotImplementedError")
    except ExerciseFailure as e:
        pytest.fail(str(e), pytrace=False)


def pytest_tests(name, checks):
    """A parametrized pytest test running ``checks`` on exercises/<name>.py."""
    import pytest

    @pytest.mark.parametrize("check", checks, ids=lambda f: f.__name__)
    def test(check):
        pytest_check(check, lambda: load_exercise(name))
    test.__name__ = f"test_{name}"
    return test


def rand(rng, *shape, grad=False, device="cpu"):
    return ta.tensor(rng.standard_normal(shape), dtype="float64", requires_grad=grad, device=device)


def double(module):
    """Turn a module's parameters into float64, in place, for gradcheck."""
    for p in module.parameters():
        p.data = p.double().data
    return module


def host(a):
    return a.numpy() if isinstance(a, ta.Tensor) else np.asarray(a)


def tell_apart(a, e):
    """a and e as text, to the significant digits where they differ (6 at least; past 6, one more than the
    first that differs, so that rounding does not overstate it; 17 at most): 1.99999995 and 2, not 2 and 2."""
    for digits in range(6, 18):
        if f"{a:.{digits}g}" != f"{e:.{digits}g}":
            break
    digits = digits if digits == 6 else min(digits + 1, 17)
    return f"{a:.{digits}g}", f"{e:.{digits}g}"


def compare(actual, expected, what, tol=1e-10, hint="", why=""):
    """ExerciseFailure naming ``what`` and its worst element, unless actual matches expected
    within tol + tol * |expected|, elementwise.

    The message holds a few numbers, never whole arrays: the worst element's two values, to the
    digits where they differ, its error and the error allowed there (``why``: why that much).
    """
    if actual is None:
        raise ExerciseFailure(f"{what}: got None, expected an array of shape {host(expected).shape}. {hint}".strip())
    a, e = host(actual).astype(np.float64), host(expected).astype(np.float64)
    if a.shape != e.shape:
        raise ExerciseFailure(f"{what}: shape {a.shape}, expected {e.shape}. {hint}".strip())
    if not np.all(np.isfinite(a)) and np.all(np.isfinite(e)):
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
        raise ExerciseFailure(f"{what}: {a[bad]} at index {bad}, expected {e[bad]:.6g}. {hint}".strip())
    allowed = tol + tol * np.abs(e)
    excess = np.abs(a - e) - allowed
    if a.size and excess.max() > 0:
        i = np.unravel_index(np.argmax(excess), a.shape)
        where = f" at index {tuple(int(n) for n in i)}" if a.ndim else ""
        got, want = tell_apart(float(a[i]), float(e[i]))
        largest = np.abs(a - e).max()
        elsewhere = f"; the largest error is {largest:.2g}" if largest > abs(a[i] - e[i]) else ""
        raise ExerciseFailure(f"{what} is wrong{where}: you give {got}, expected {want} (an error of "
                              f"{abs(a[i] - e[i]):.2g} where {allowed[i]:.2g} is allowed{': ' + why if why else ''}"
                              f"{elsewhere}). {hint}".strip())


def close(a, b, tol=1e-10, what="the result"):
    compare(a, b, what, tol)


def raises(error, fn, what):
    """ExerciseFailure unless fn() raises ``error``."""
    try:
        fn()
    except error:
        return
    raise ExerciseFailure(f"{what}: expected a {error.__name__}, nothing was raised")


STRICT = "the stand-in device 'strict' (array_api_strict, standing in for a GPU)"
NOT_NUMPY = ("Code that works only on numpy fails there: use self.xp or t.xp (the array namespace of the "
             "inputs' device) and Tensor ops, never numpy by name, and make new arrays on the inputs' device.")
OTHER_DEVICE = ("An array made without device= lands on the CPU: make new arrays from the inputs "
                "(xp.zeros_like(a), self.backend.arange(n)) or with device=a.device.")
BOOL_RULE = ("The array API does no arithmetic on booleans (numpy turns them into 0 and 1): choose with "
             "xp.where(mask, a, b), or convert with xp.astype(mask, a.dtype) first.")
DTYPE_RULE = ("The array API does not mix or convert dtypes as numpy does (integers with floats, exp of "
              "integers, a float64 array written into a float32 one): convert first with xp.astype(a, x.dtype).")
TAKE_RULE = ("The array API's take wants 1-d indices: reshape the ids to 1-d (xp.reshape(idx, (-1,))), "
             "take along axis 0, then reshape the rows back to (..., C).")
SLICE_RULE = ("The array API does not cut slices short at the end as numpy does: a slice must stay inside the "
              "array (x[..., i:min(i + block, T), :]).")
SETITEM_RULE = ("The array API has no writes through an array of ids (a[ids] = ..., a[ids] += ...): build the "
                "result instead (a one-hot matrix @ g adds up rows).")
INDEX_RULE = ("The array API does not index as numpy does (no a[ids] with an array of ids on a table): pick "
              "rows with xp.take(a, ids, axis=0), the ids reshaped to 1-d, then reshape the rows back.")


def strict_advice(error):
    """Which array-API rule the code under test broke on the stand-in device, as advice."""
    text = str(error)
    if isinstance(error, TypeError) and "Only numeric dtypes" in text:       # bool * float, bool + int, ...
        return BOOL_RULE
    if isinstance(error, TypeError) and ("dtypes are allowed" in text or "type promoted" in text
                                         or "mismatched dtypes" in text):
        return DTYPE_RULE
    if "Only 1-dim indices" in text:
        return TAKE_RULE
    if isinstance(error, IndexError) and "out-of-bounds" in text:
        return SLICE_RULE
    if isinstance(error, IndexError) and "__setitem__" in text:
        return SETITEM_RULE
    if isinstance(error, IndexError) and "must be array_api_strict arrays" not in text:
        return INDEX_RULE
    if "different devices" in text:
        return OTHER_DEVICE
    return NOT_NUMPY


def rng_(seed=0):
    return np.random.default_rng(seed)


def attempt(what, fn, hint=""):
    """fn(), with any error of the code under test turned into one ExerciseFailure line."""
    try:
        return fn()
    except (NotStarted, NotImplementedError, ExerciseFailure, GradcheckError):
        raise
    except RuntimeError as e:
        if "returned a gradient of shape" in str(e):      # the engine's shape check
            raise ExerciseFailure(f"{what}: {e}. {hint}".strip()) from None
        raise ExerciseFailure(f"{what}: your code raised RuntimeError: {e} (in {unwritten(e)}). {hint}".strip()) from None
    except Exception as e:
        raise ExerciseFailure(f"{what}: your code raised {type(e).__name__}: {e} (in {unwritten(e)}). "
                              f"{hint}".strip()) from None


IN_PLACE = ("forward's arrays are the caller's own tensors, and `x -= m` writes into them: make new arrays "
            "(x = x - m)")


def writes_no_input(what, fn, inputs, names):
    """fn(*inputs), once its inputs are seen to hold what they held before (a forward must not write to them)."""
    before = [t.numpy().copy() if isinstance(t, ta.Tensor) else None for t in inputs]
    out = attempt(what, lambda: fn(*inputs))
    for name, t, kept in zip(names, inputs, before):
        if kept is not None and not np.array_equal(t.numpy(), kept):
            raise ExerciseFailure(f"{what} changed its input {name} in place: {IN_PLACE}")
    return out


def vjp(fn, inputs, seed=11):
    """fn(*inputs) and the gradients of <u, fn(inputs)> for a random cotangent u (host arrays)."""
    out = fn(*inputs)
    u = rng_(seed).standard_normal(out.shape)
    diff = [t for t in inputs if isinstance(t, ta.Tensor) and t.requires_grad]
    grads = ta.grad(out, diff, grad_outputs=ta.tensor(u, dtype=out.dtype, device=out.device), allow_unused=True)
    return out.numpy(), u, [None if g is None else g.numpy() for g in grads]


def matches(grads, candidate, tol=1e-7):
    """Do the gradients equal a candidate's (None in the candidate: any value)?"""
    for g, c in zip(grads, candidate):
        if c is None:
            continue
        if g is None or g.shape != np.shape(c) or not np.allclose(g, c, rtol=tol, atol=tol):
            return False
    return True


def known_mistake(fn, inputs, wrong):
    """The message of the first typical wrong answer that fn's gradients equal, or None.

    ``wrong``: (message, formula) pairs; formula(u, *host inputs) gives the
    gradients that mistake produces, one per differentiable input (None: any).
    """
    try:
        _, u, grads = vjp(fn, inputs)
    except Exception:
        return None
    arrays = [t.numpy() if isinstance(t, ta.Tensor) else t for t in inputs]
    for message, formula in wrong:
        if matches(grads, formula(u, *arrays)):
            return message
    if all(g is None or not np.any(g) for g in grads):
        return "your backward returns zeros"
    return None


def writes_no_gradient(what, fn, inputs, hint=""):
    """Backward must leave g, the gradient it is given, and the inputs as they were: other ops share them."""
    out = attempt(what, lambda: fn(*inputs))
    u = ta.tensor(rng_(13).standard_normal(out.shape), dtype=out.dtype, device=out.device)
    kept, before = u.numpy().copy(), [t.numpy().copy() for t in inputs]
    diff = [t for t in inputs if t.requires_grad]
    attempt(what, lambda: ta.grad(out, diff, grad_outputs=u, allow_unused=True), hint)
    if not np.array_equal(u.numpy(), kept):
        raise ExerciseFailure(f"{what}: your backward changed g, the gradient it was given, in place (`g -= s` and "
                              "`g.data *= w` write into it); other ops may hold it too (x + f(x) gives both the same "
                              "g): make new ones (g = g - s, gx = g.data * w)")
    for i, (t, b) in enumerate(zip(inputs, before)):
        if not np.array_equal(t.numpy(), b):
            raise ExerciseFailure(f"{what}: your backward changed input {i} in place: the inputs are the caller's "
                                  "own tensors; make new arrays")


def gradcheck(what, fn, inputs, wrong=(), hint=""):
    """ta.gradcheck of fn (float64, random cotangent); on failure say which typical mistake it is.
    First, backward must write into neither g nor the inputs."""
    writes_no_gradient(what, fn, inputs, hint)
    try:
        attempt(what, lambda: ta.gradcheck(fn, inputs), hint)
    except GradcheckError as e:
        mistake = known_mistake(fn, inputs, wrong)
        raise ExerciseFailure(f"{what}: {mistake or 'your gradient differs from central differences'}. "
                              f"{'' if mistake else hint} (ta.gradcheck with a random cotangent: {e})"
                              .replace("  ", " ")) from None


AUTODIFF_HINT = ("Write every step with tinyattn ops: a piece computed on raw arrays (.numpy(), .data, numpy "
                 "functions), under ta.no_grad() or after .detach() is a constant to autodiff, and its share of "
                 "the gradient is lost")


def autodiff_gradcheck(what, fn, inputs, names, hint=AUTODIFF_HINT):
    """ta.gradcheck of fn, for code whose backward autodiff derives (the exercises of part one, and the
    composite losses): on failure, say which of ``names`` (one per input) gets no gradient or a wrong one."""
    try:
        attempt(what, lambda: ta.gradcheck(fn, inputs))
        return
    except GradcheckError as e:
        detail = re.sub(r"input (\d+)", lambda m: names[int(m.group(1))], str(e))
    out = attempt(what, lambda: fn(*inputs))
    if not out.requires_grad:
        lead = "your result carries no gradient at all"
    else:
        grads = ta.grad(out.sum(), list(inputs), allow_unused=True)
        none = [n for n, g in zip(names, grads) if g is None]
        worst = re.search(r"worst element: (\S+)", detail)
        lead = (f"{' and '.join(none)} {'gets' if len(none) == 1 else 'get'} no gradient" if none else
                f"the gradient of {worst.group(1) if worst else 'an input'} differs from central differences")
    raise ExerciseFailure(f"{what}: {lead}. {hint} (ta.gradcheck with a random cotangent: {detail})") from None


def gradgradcheck(what, fn, inputs):
    """ta.gradgradcheck of fn; first say plainly if the backward returns constants."""
    def first_order():
        out = fn(*inputs)
        u = ta.tensor(rng_(5).standard_normal(out.shape), dtype=out.dtype, device=out.device)
        diff = [t for t in inputs if t.requires_grad]
        return ta.grad(out, diff, grad_outputs=u, create_graph=True, allow_unused=True)
    grads = attempt(what, first_order)
    if any(g is not None and not g.requires_grad for g in grads):
        raise ExerciseFailure(f"{what}: your backward returns a constant, built from raw arrays (.data, self.xp or "
                              "numpy), so the engine cannot differentiate it again and second derivatives are lost. "
                              "Write it with Tensor ops on g, self.parents and self.output.")
    try:
        attempt(what, lambda: ta.gradgradcheck(fn, inputs))
    except GradcheckError as e:
        raise ExerciseFailure(f"{what}: the second derivatives are wrong (ta.gradgradcheck: {e})") from None


def on_strict(what, run, tol=1e-9):
    """run(device) -> list of Tensors, on "cpu" and on "strict": it must run there and agree."""
    expected = [t.numpy() for t in run("cpu")]
    try:
        got = run("strict")
    except (NotStarted, NotImplementedError, ExerciseFailure):
        raise
    except Exception as e:
        raise ExerciseFailure(f"{what} on {STRICT}: your code raised {type(e).__name__}: {e} (in {unwritten(e)}). "
                              f"{strict_advice(e)}") from None
    for i, (g, e) in enumerate(zip(got, expected)):
        if g is None or g.device != "strict":
            raise ExerciseFailure(f"{what} on {STRICT}: result {i} is on {getattr(g, 'device', None)!r}, "
                                  f"not on the inputs' device. {NOT_NUMPY}")
        compare(g.numpy(), e, f"{what} on {STRICT} (result {i}, against the CPU)", tol=tol)


DTYPE_RULE_OF_OPS = ("an op's output and each gradient have the dtype of the input they belong to (one float64 "
                     "array turns a whole float32 model into float64, at half the speed): make new arrays in "
                     "that dtype (xp.zeros_like(a), xp.astype(m, g.data.dtype)), never float64 by default")


def keeps_float32(what, fn, arrays, names, ints=()):
    """fn on float32 inputs (then int ones): the output is float32, and so is every gradient its backward returns."""
    rng = rng_(17)
    inputs = [ta.tensor(a, dtype="float32", requires_grad=True) for a in arrays] + [ta.tensor(i) for i in ints]
    out = attempt(f"{what} in float32", lambda: fn(*inputs))
    if out.dtype != np.float32:
        raise ExerciseFailure(f"{what} on float32 inputs returned {out.dtype}: {DTYPE_RULE_OF_OPS}")
    ctx = out.grad_fn
    if ctx is None:                                  # no graph: the gradient checks say so
        return
    u = ta.tensor(rng.standard_normal(out.shape), dtype="float32")
    with ta.no_grad():
        grads = attempt(f"the backward of {what} in float32", lambda: ctx.backward(u))
    grads = grads if isinstance(grads, (tuple, list)) else (grads,)
    by_parent = {id(t): name for t, name in zip(inputs, names)}
    for parent, g in zip(ctx.parents, grads):
        if isinstance(g, ta.Tensor) and g.dtype != parent.dtype:
            name = by_parent.get(id(parent), "an input")
            raise ExerciseFailure(f"the backward of {what} returns a {g.dtype} gradient for {name}, a {parent.dtype} "
                                  f"tensor: {DTYPE_RULE_OF_OPS}")


def tensors(device, *arrays, grad=True):
    return [ta.tensor(a, dtype="float64", device=device, requires_grad=grad) for a in arrays]


def grads_on(device, fn, arrays, ints=()):
    """[output, gradient of each float input] of fn on device, with a fixed random cotangent."""
    inputs = tensors(device, *arrays) + [ta.tensor(a, device=device) for a in ints]
    out = fn(*inputs)
    u = ta.tensor(rng_(5).standard_normal(out.shape), dtype="float64", device=device)
    out.backward(u)
    return [out] + [t.grad for t in inputs if t.requires_grad]


def peak_bytes(fn):
    """The largest memory in use at once while fn runs, above what was in use before (bytes)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
