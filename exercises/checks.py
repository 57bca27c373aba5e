"""The checks of EXERCISES.md, each written once and given the module to check.

A check takes the module under test (the learner's exercises/<name>.py, or a
reference solution from tests/support/exercise_solutions/) and returns quietly, raises
NotStarted (a piece is not written yet: skipped), or raises ExerciseFailure
with a message that says what was checked and how it failed, in the
exercise's terms. tests/exercise_checks/test_exercises_<name>.py run them under pytest,
``python -m exercises`` runs them without it. Part two's checks are in
checks_core.py.
"""
import importlib
import importlib.util
import sys
import traceback
import warnings
from pathlib import Path

import numpy as np

import tinyattn as ta
import tinyattn.nn.functional as F

HERE = Path(__file__).resolve().parent                  # this package: the learner's files and the checks
MACHINERY = {"__init__", "__main__", "checks", "checks_core", "checks_bpe", "progress", "swap"}   # not the learner's files
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


def compare(actual, expected, what, tol=1e-10, hint=""):
    """ExerciseFailure naming ``what`` and its worst element, unless actual matches expected.

    The message holds a few numbers, never whole arrays.
    """
    if actual is None:
        raise ExerciseFailure(f"{what}: got None, expected an array of shape {host(expected).shape}. {hint}".strip())
    a, e = host(actual).astype(np.float64), host(expected).astype(np.float64)
    if a.shape != e.shape:
        raise ExerciseFailure(f"{what}: shape {a.shape}, expected {e.shape}. {hint}".strip())
    if not np.all(np.isfinite(a)) and np.all(np.isfinite(e)):
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
        raise ExerciseFailure(f"{what}: {a[bad]} at index {bad}, expected {e[bad]:.6g}. {hint}".strip())
    excess = np.abs(a - e) - (tol + tol * np.abs(e))
    if a.size and excess.max() > 0:
        i = np.unravel_index(np.argmax(excess), a.shape)
        where = f" at index {tuple(int(n) for n in i)}" if a.ndim else ""
        raise ExerciseFailure(f"{what} is wrong{where}: you give {a[i]:.6g}, expected {e[i]:.6g} "
                              f"(largest error {np.abs(a - e).max():.3g}). {hint}".strip())


def close(a, b, tol=1e-10, what="the result"):
    compare(a, b, what, tol)


def raises(error, fn, what):
    """ExerciseFailure unless fn() raises ``error``."""
    try:
        fn()
    except error:
        return
    raise ExerciseFailure(f"{what}: expected a {error.__name__}, nothing was raised")


def rng_():
    return np.random.default_rng(0)


# ---------------------------------------------------------------- 1. RMSNorm
def np_rms_norm(x, w, eps, form="right"):
    rms = np.sqrt((x ** 2).mean(-1, keepdims=True) + (eps if form == "right" else 0.0))
    return x / (rms + (eps if form == "eps outside" else 0.0)) * w


RMS_NORM_EPS_WRONG = {
    "no eps": "your rms_norm leaves eps out: add eps under the square root, x / sqrt(mean(x^2) + eps)",
    "eps outside": "your rms_norm adds eps to the root mean square; it goes under the square root: "
                   "x / sqrt(mean(x^2) + eps)",
}


def rms_norm_matches_formula(mod):
    """Two eps, and an x whose mean square is about eps (0.01), where eps changes the result most."""
    rms_norm, rng = need(mod, "rms_norm"), rng_()
    x, w = rand(rng, 2, 3, 8), rand(rng, 8)
    for xi, eps in ((x, 1e-6), (x, 0.5), (x * 0.1, 0.01)):
        what = f"rms_norm(x, w, eps={eps}) on x {x.shape} with mean square {float((xi * xi).mean()):.2g}"
        got = rms_norm(xi, w, eps)
        try:
            close(got, np_rms_norm(xi.numpy(), w.numpy(), eps), what=what)
        except ExerciseFailure:
            for form, message in RMS_NORM_EPS_WRONG.items():
                if np.allclose(host(got), np_rms_norm(xi.numpy(), w.numpy(), eps, form), rtol=1e-9, atol=1e-12):
                    raise ExerciseFailure(f"{what}: {message}") from None
            raise


def rms_norm_has_unit_rms(mod):
    rms_norm, rng = need(mod, "rms_norm"), rng_()
    x = rand(rng, 4, 16) * 3.0 + 1.0
    y = rms_norm(x, ta.ones(16, dtype="float64"), 1e-6).numpy()
    compare(np.sqrt((y ** 2).mean(-1)), np.ones(4), "the RMS of each row, with a unit weight", tol=1e-6)
    assert not np.allclose(y.mean(-1), 0.0), "RMSNorm does not subtract the mean (LayerNorm does)"


def rms_norm_ignores_scale(mod):
    rms_norm, rng = need(mod, "rms_norm"), rng_()
    x, w = rand(rng, 3, 8), rand(rng, 8)
    close(rms_norm(x * 7.5, w, 1e-12), rms_norm(x, w, 1e-12), tol=1e-8,
          what=f"rms_norm(7.5 * x) against rms_norm(x) on x {x.shape} (RMSNorm ignores the scale of x)")


def rms_norm_gradcheck(mod):
    rms_norm, rng = need(mod, "rms_norm"), rng_()
    x, w = rand(rng, 2, 3, 8, grad=True), rand(rng, 8, grad=True)
    assert ta.gradcheck(lambda x, w: rms_norm(x, w, 1e-6), (x, w))


def rms_norm_module(mod):
    RMSNorm, rms_norm, rng = need(mod, "RMSNorm"), need(mod, "rms_norm"), rng_()
    m = RMSNorm(8)
    params = dict(m.named_parameters())
    assert list(params) == ["weight"], f"RMSNorm should have one parameter, weight; it has {list(params)}"
    assert params["weight"].shape == (8,) and np.all(params["weight"].numpy() == 1.0)
    x = ta.tensor(rng.standard_normal((2, 5, 8)).astype(np.float32))
    y = m(x)
    assert y.shape == x.shape and y.dtype == x.dtype
    close(y, rms_norm(x, m.weight, m.eps), tol=1e-6, what=f"RMSNorm(8)(x) against rms_norm(x, weight, eps) on x {x.shape}")
    small = RMSNorm(8, eps=0.25)
    assert small.eps == 0.25, f"RMSNorm(8, eps=0.25).eps is {small.eps}: keep the eps you are given as self.eps"
    x2 = x * 0.5                                                      # mean square about 0.25, as large as eps
    compare(small(x2), np_rms_norm(x2.numpy().astype(np.float64), 1.0, 0.25), "RMSNorm(8, eps=0.25)(x) on x "
            "with mean square near 0.25 (against the formula)", tol=1e-6, hint="Pass self.eps to rms_norm.")
    double(m)
    xg = rand(rng, 2, 8, grad=True)
    assert ta.gradcheck(lambda x, w: m(x), (xg, m.weight))


RMSNORM = [rms_norm_matches_formula, rms_norm_has_unit_rms, rms_norm_ignores_scale, rms_norm_gradcheck,
           rms_norm_module]


# ---------------------------------------------------------------- 2. RoPE
def rope_keeps_shape_and_dtype(mod):
    apply_rotary, rng = need(mod, "apply_rotary"), rng_()
    x = ta.tensor(rng.standard_normal((2, 3, 5, 8)).astype(np.float32))
    y = apply_rotary(x, list(range(5)))
    assert y.shape == x.shape and y.dtype == x.dtype


def rope_position_zero_is_identity(mod):
    apply_rotary, rng = need(mod, "apply_rotary"), rng_()
    x = rand(rng, 2, 4, 8)
    close(apply_rotary(x, [0, 0, 0, 0]), x, tol=1e-12, what=f"apply_rotary at position 0 (must leave x {x.shape} as it is)")


def rope_preserves_norms(mod):
    apply_rotary, rng = need(mod, "apply_rotary"), rng_()
    x = rand(rng, 2, 6, 16)
    y = apply_rotary(x, [0, 1, 2, 5, 17, 100])
    close(np.linalg.norm(y.numpy(), axis=-1), np.linalg.norm(x.numpy(), axis=-1),
          what=f"the norm of each rotated vector (a rotation keeps it) on x {x.shape}")
    assert not np.allclose(y.numpy()[:, 1:], x.numpy()[:, 1:]), "positions > 0 should rotate"


def rope_rotates_pairs(mod):
    """With D = 2 there is one pair and theta_0 = 1: (1, 0) at position m becomes (cos m, sin m)."""
    apply_rotary = need(mod, "apply_rotary")
    x = ta.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype="float64")   # (T=3, D=2)
    m = np.array([1.0, 2.0, 3.0])
    expected = np.stack([np.cos(m), np.sin(m)], -1)                  # rows 0 and 1: (cos m, sin m)
    expected[2] = [-np.sin(3.0), np.cos(3.0)]                        # (0, 1) turns the same way
    close(apply_rotary(x, [1, 2, 3]), expected, what=f"apply_rotary(x {x.shape}, positions [1, 2, 3]) against the pairwise rotation")


def rope_is_relative(mod):
    """q_m . k_n depends only on m - n."""
    apply_rotary, rng = need(mod, "apply_rotary"), rng_()
    q, k = rand(rng, 1, 16), rand(rng, 1, 16)

    def score(m, n):
        return float((apply_rotary(q, [m]).numpy() * apply_rotary(k, [n]).numpy()).sum())
    same = [score(3, 1), score(10, 8), score(52, 50), score(2, 0)]
    compare(same, np.full(4, same[0]), "q_m . k_n for m - n = 2 at four positions", tol=1e-9)
    assert abs(score(5, 1) - same[0]) > 1e-6, "a different offset should give a different score"


def rope_rows_are_independent(mod):
    """Rotating T rows at once equals rotating each row at its own position."""
    apply_rotary, rng = need(mod, "apply_rotary"), rng_()
    x = rand(rng, 2, 5, 8)
    positions = [4, 0, 9, 2, 7]
    y = apply_rotary(x, positions).numpy()
    for t, p in enumerate(positions):
        close(y[:, t:t + 1], apply_rotary(x[:, t:t + 1], [p]), what=f"row {t} rotated alone against rotated with the others")


def rope_gradcheck(mod):
    apply_rotary, rng = need(mod, "apply_rotary"), rng_()
    x = rand(rng, 2, 4, 8, grad=True)
    assert ta.gradcheck(lambda x: apply_rotary(x, [0, 1, 2, 3]), (x,))


ROPE = [rope_keeps_shape_and_dtype, rope_position_zero_is_identity, rope_preserves_norms, rope_rotates_pairs,
        rope_is_relative, rope_rows_are_independent, rope_gradcheck]


# ---------------------------------------------------------------- 3. GQA
def gqa_with_one_group_per_head_is_mha(mod):
    gqa, rng = need(mod, "grouped_query_attention"), rng_()
    q, k, v = rand(rng, 2, 4, 5, 8), rand(rng, 2, 4, 5, 8), rand(rng, 2, 4, 5, 8)
    for causal in (False, True):
        close(gqa(q, k, v, is_causal=causal), F.scaled_dot_product_attention(q, k, v, is_causal=causal),
              what=f"gqa with one k/v head per q head (causal={causal}) against multi-head attention, q {q.shape}")


def gqa_with_one_group_is_mqa(mod):
    """Multi-query attention: every query head reads the same single key/value head."""
    gqa, rng = need(mod, "grouped_query_attention"), rng_()
    q, k, v = rand(rng, 2, 4, 5, 8), rand(rng, 2, 1, 5, 8), rand(rng, 2, 1, 5, 8)
    out = gqa(q, k, v, is_causal=True).numpy()
    for h in range(4):
        close(out[:, h:h + 1], F.scaled_dot_product_attention(q[:, h:h + 1], k, v, is_causal=True),
              what=f"head {h} with one shared k/v head (multi-query attention)")


def gqa_groups_consecutive_heads(mod):
    """With H = 6 and G = 2, heads 0-2 read group 0 and heads 3-5 group 1."""
    gqa, rng = need(mod, "grouped_query_attention"), rng_()
    q, k, v = rand(rng, 1, 6, 4, 8), rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8)
    out = gqa(q, k, v, is_causal=False).numpy()
    for h in range(6):
        g = h // 3
        close(out[:, h:h + 1], F.scaled_dot_product_attention(q[:, h:h + 1], k[:, g:g + 1], v[:, g:g + 1]),
              what=f"head {h} against k/v head {g} (consecutive q heads share a k/v head)")


def gqa_shapes(mod):
    gqa, rng = need(mod, "grouped_query_attention"), rng_()
    q, k, v = rand(rng, 3, 8, 7, 4), rand(rng, 3, 2, 7, 4), rand(rng, 3, 2, 7, 4)
    assert gqa(q, k, v).shape == (3, 8, 7, 4)
    raises(ValueError, lambda: gqa(q, rand(rng, 3, 3, 7, 4), rand(rng, 3, 3, 7, 4)),
           "8 query heads do not split into 3 groups")


def gqa_gradcheck(mod):
    gqa, rng = need(mod, "grouped_query_attention"), rng_()
    q = rand(rng, 1, 4, 3, 4, grad=True)
    k, v = rand(rng, 1, 2, 3, 4, grad=True), rand(rng, 1, 2, 3, 4, grad=True)
    assert ta.gradcheck(lambda q, k, v: gqa(q, k, v, is_causal=True), (q, k, v))


def gqa_module(mod):
    GQA, rng = need(mod, "GroupedQueryAttention"), rng_()
    C, H, G = 16, 4, 2
    m = GQA(C, H, G, bias=False)
    n = sum(p.numel() for p in m.parameters())
    assert n == 2 * C * C + 2 * C * G * (C // H), \
        f"expected {2 * C * C + 2 * C * G * (C // H)} parameters (q and out: C x C, k and v: C x G*D), got {n}"
    double(m)
    x = rand(rng, 2, 5, C)
    y = m(x)
    assert y.shape == (2, 5, C)
    x2 = x.numpy().copy()
    x2[:, 3:] += 1.0                                                  # change the future only
    close(m(ta.tensor(x2, dtype="float64")).numpy()[:, :3], y.numpy()[:, :3],
          what="the first 3 positions after later tokens changed (the module must be causal)")
    xg = rand(rng, 1, 3, C, grad=True)
    assert ta.gradcheck(lambda x, *params: m(x), (xg, *m.parameters()))


GQA = [gqa_with_one_group_per_head_is_mha, gqa_with_one_group_is_mqa, gqa_groups_consecutive_heads, gqa_shapes,
       gqa_gradcheck, gqa_module]


# ---------------------------------------------------------------- 4. SwiGLU
def silu_matches_formula(mod):
    silu, rng = need(mod, "silu"), rng_()
    x = rand(rng, 3, 7, grad=True)
    xn = x.numpy()
    close(silu(x), xn / (1.0 + np.exp(-xn)), what=f"silu(x) against x * sigmoid(x) on x {x.shape}")
    assert ta.gradcheck(silu, (x,))


def swiglu_matches_formula(mod):
    SwiGLU, rng = need(mod, "SwiGLU"), rng_()
    m = double(SwiGLU(8, 12))
    x = rand(rng, 2, 3, 8)
    W1, V, W2 = (layer.weight.numpy() for layer in (m.w1, m.v, m.w2))   # (out, in) each
    h = x.numpy() @ W1.T
    expected = (h / (1.0 + np.exp(-h)) * (x.numpy() @ V.T)) @ W2.T
    close(m(x), expected, what=f"SwiGLU(x) against w2(silu(w1(x)) * v(x)) on x {x.shape}")


def swiglu_parameters(mod):
    SwiGLU = need(mod, "SwiGLU")
    m = SwiGLU(8, 12)
    names = [n for n, _ in m.named_parameters()]
    assert sorted(names) == ["v.weight", "w1.weight", "w2.weight"], f"expected w1, v, w2 without biases, got {names}"
    assert m.w1.weight.shape == (12, 8) and m.v.weight.shape == (12, 8) and m.w2.weight.shape == (8, 12)
    assert SwiGLU(48).w1.weight.shape == (128, 48), "the default hidden size is 8 * n_embd // 3"


def swiglu_gradcheck(mod):
    SwiGLU, rng = need(mod, "SwiGLU"), rng_()
    m = double(SwiGLU(6, 10))
    x = rand(rng, 2, 3, 6, grad=True)
    assert ta.gradcheck(lambda x, *params: m(x), (x, *m.parameters()))


SWIGLU = [silu_matches_formula, swiglu_matches_formula, swiglu_parameters, swiglu_gradcheck]



# ---------------------------------------------------------------- 17. LoRA
def lora_layer(mod, r=2, alpha=8.0, d_in=6, d_out=5, bias=True, random_b=False):
    """A LoRALinear around a float64 Linear; with random_b, B random too (it starts at zero)."""
    import tinyattn.nn as nn
    LoRALinear = need(mod, "LoRALinear")
    ta.manual_seed(0)
    base = double(nn.Linear(d_in, d_out, bias=bias))
    m = double(LoRALinear(base, r, alpha))
    for name, shape in (("A", (r, d_in)), ("B", (d_out, r))):
        p = getattr(m, name, None)
        if p is None:
            raise NotStarted(f"LoRALinear has no {name} yet")
        if tuple(p.shape) != shape:
            raise ExerciseFailure(f"LoRALinear(Linear({d_in}, {d_out}), r={r}).{name} is {tuple(p.shape)}, "
                                  f"expected {shape}: A is (r, in_features), B is (out_features, r)")
    if random_b:
        m.B.data = ta.tensor(rng_().standard_normal(m.B.shape), dtype="float64").data
    return m


def lora_starts_as_the_base_layer(mod):
    m = lora_layer(mod)
    x = rand(rng_(), 3, 6)
    if not np.any(m.A.numpy()):
        raise ExerciseFailure("A starts at zero: then B's gradient (which goes through x A^T) is zero too and "
                              "nothing trains; start A random and B at zero")
    close(m(x), m.base(x), what="a new LoRALinear(base, r) against base(x) (B starts at zero, so the update is 0)")


def lora_matches_formula(mod):
    rng = rng_()
    x = rand(rng, 2, 3, 6)
    for r, alpha in ((2, 8.0), (3, None)):
        m = lora_layer(mod, r=r, alpha=alpha, random_b=True)
        scale = (r if alpha is None else alpha) / r
        W, b, A, B = (t.numpy() for t in (m.base.weight, m.base.bias, m.A, m.B))
        plain = x.numpy() @ W.T + b
        update = x.numpy() @ A.T @ B.T
        got = m(x).numpy()
        if scale != 1 and np.allclose(got, plain + update, atol=1e-10):
            raise ExerciseFailure(f"LoRALinear(base, r={r}, alpha={alpha}) leaves out the scale alpha / r = {scale:g}: "
                                  "the update is (alpha / r) * x A^T B^T")
        compare(got, plain + scale * update,
                f"LoRALinear(base, r={r}, alpha={alpha})(x) against base(x) + (alpha / r) x A^T B^T on x {x.shape}",
                hint="alpha defaults to r (a scale of 1)" if alpha is None else "")


def lora_trains_only_the_adapters(mod):
    m = lora_layer(mod, r=2, d_in=6, d_out=5, random_b=True)
    trainable = {n: p for n, p in m.named_parameters() if p.requires_grad}
    if any(p.requires_grad for p in m.base.parameters()):
        raise ExerciseFailure("base's weight still has requires_grad: it would get a gradient and the optimizer "
                              "would change it; set requires_grad = False on base's parameters")
    n = sum(p.numel() for p in trainable.values())
    assert n == 2 * (6 + 5), f"{n} trainable numbers, expected r * (in + out) = {2 * (6 + 5)}: A and B only"
    m(rand(rng_(), 3, 6)).sum().backward()
    if m.base.weight.grad is not None:
        raise ExerciseFailure("base.weight got a gradient: the frozen weight must not (requires_grad = False)")
    if m.A.grad is None or m.B.grad is None:
        raise ExerciseFailure("A or B got no gradient: build the update from them with tinyattn ops")


def lora_gradcheck(mod):
    m = lora_layer(mod, random_b=True)
    x = rand(rng_(), 2, 3, 6, grad=True)
    assert ta.gradcheck(lambda x, A, B: m(x), (x, m.A, m.B))


def lora_merge_keeps_the_logits(mod):
    import tinyattn.nn as nn
    from tinyattn.models import GPT, GPTConfig
    LoRALinear = need(mod, "LoRALinear")
    if not hasattr(LoRALinear, "merge"):
        raise NotStarted("LoRALinear has no merge yet")
    ta.manual_seed(0)
    model = double(GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=8))).eval()
    rng = rng_()
    for block in model.h:                                 # adapt every block's qkv and first MLP projection
        for owner, name in ((block.attn, "c_attn"), (block.mlp, "c_fc")):
            layer = double(LoRALinear(getattr(owner, name), 2, 4.0))
            layer.B.data = ta.tensor(rng.standard_normal(layer.B.shape), dtype="float64").data
            setattr(owner, name, layer)
    idx = ta.tensor(rng.integers(0, 11, (2, 8)))
    adapted = model(idx)[0].numpy()
    for block in model.h:
        for owner, name in ((block.attn, "c_attn"), (block.mlp, "c_fc")):
            merged = getattr(owner, name).merge()
            if type(merged) is not nn.Linear:
                raise ExerciseFailure(f"merge() returned a {type(merged).__name__}, expected one nn.Linear")
            setattr(owner, name, merged)
    compare(model(idx)[0], adapted, "a GPT's logits with every adapter merged against the adapted GPT's",
            tol=1e-9, hint="merge's weight is W + (alpha / r) B A, and the bias is base's")


LORA = [lora_starts_as_the_base_layer, lora_matches_formula, lora_trains_only_the_adapters, lora_gradcheck,
        lora_merge_keeps_the_logits]
