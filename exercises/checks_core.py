"""The checks of EXERCISES.md, part two ("Build the core"): exercises 5 to 16.

Each check runs the library's own machinery on the code under test
(ta.gradcheck with a random cotangent, ta.gradgradcheck where the backward is
written with Tensor ops, a numpy formula, the stand-in device "strict"). When
a gradient is wrong, the check compares it with the typical wrong answers of
that exercise and says which one it matches, in the exercise's terms.
"""
import math
import tracemalloc

import numpy as np

import tinyattn as ta
import tinyattn.nn as nn
import tinyattn.nn.functional as F
from tinyattn.gradcheck import GradcheckError

from .checks import ExerciseFailure, NotStarted, compare, need, rand, unwritten

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


# ---------------------------------------------------------------- shared tools
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


# ---------------------------------------------------------------- 5. sum_to
SUM_TO_CASES = [((2, 3, 4), (3, 4)), ((2, 3, 4), (3, 1)), ((2, 3, 4), (1, 3, 1)), ((2, 3, 4), ()),
                ((2, 3, 4), (2, 1, 4)), ((5,), (1,)), ((2, 3), (2, 3)), ((4, 1, 3), (1, 3))]


def np_sum_to(g, shape):
    lead = g.ndim - len(shape)
    g = g.sum(tuple(range(lead)))
    return g.sum(tuple(i for i, n in enumerate(shape) if n == 1), keepdims=True).reshape(shape)


def sum_to_undoes_broadcasting(mod):
    sum_to, rng = need(mod, "sum_to"), rng_()
    for gshape, shape in SUM_TO_CASES:
        g = rand(rng, *gshape)
        what = f"sum_to(g of shape {gshape}, {shape})"
        out = attempt(what, lambda: sum_to(g, shape))
        if not isinstance(out, ta.Tensor):
            raise ExerciseFailure(f"{what} returned a {type(out).__name__}, not a Tensor: use Tensor ops")
        leading_only = g.numpy().sum(tuple(range(len(gshape) - len(shape)))).shape
        if out.shape != shape and out.shape == leading_only:
            raise ExerciseFailure(f"{what} returned shape {out.shape}: you summed the dims that broadcasting added "
                                  "in front, but not the dims where shape has 1 and g does not "
                                  "(sum those too, with keepdim=True)")
        compare(out, np_sum_to(g.numpy(), shape), what, hint="It should add up every element that broadcasting "
                "copied from one element of shape.")


def sum_to_gradcheck(mod):
    sum_to, rng = need(mod, "sum_to"), rng_()
    g = rand(rng, 2, 3, 4, grad=True)
    gradcheck("the gradient through sum_to(g (2, 3, 4), (3, 1))", lambda g: sum_to(g, (3, 1)), (g,),
              hint="Build it from Tensor ops only (g.sum, .reshape), so the engine can differentiate it.")


MUL_SHAPES = [((2, 3, 4), (3, 1)), ((4,), (2, 3, 4)), ((2, 3, 4), ()), ((3, 1), (1, 5))]
MUL_WRONG = [("your Mul backward swaps the inputs: d(a*b)/da is b, so grad_a = sum_to(g * b, a.shape), "
              "and grad_b = sum_to(g * a, b.shape)",
              lambda u, a, b: [np_sum_to(u * a, a.shape), np_sum_to(u * b, b.shape)]),
             ("your Mul backward ignores g, the gradient of the output: multiply by it",
              lambda u, a, b: [np_sum_to(np.broadcast_to(b, u.shape), a.shape),
                               np_sum_to(np.broadcast_to(a, u.shape), b.shape)])]


def mul_gradients(mod):
    Mul, rng = need(mod, "Mul"), rng_()
    for sa, sb in MUL_SHAPES:
        a, b = rand(rng, *sa, grad=True), rand(rng, *sb, grad=True)
        what = f"Mul.apply(a {sa}, b {sb})"
        compare(writes_no_input(what, Mul.apply, [a, b], ["a", "b"]), a.numpy() * b.numpy(), f"{what}, forward")
        gradcheck(f"the gradients of {what}", Mul.apply, (a, b), MUL_WRONG,
                  hint="Each gradient is g times the other input, then sum_to(..., that input's shape).")


def mul_gradgradcheck(mod):
    Mul, rng = need(mod, "Mul"), rng_()
    a, b = rand(rng, 2, 3, 4, grad=True), rand(rng, 3, 1, grad=True)
    gradgradcheck("Mul's backward, differentiated again", Mul.apply, (a, b))


def sum_to_on_strict(mod):
    sum_to, Mul, rng = need(mod, "sum_to"), need(mod, "Mul"), rng_()
    a, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((3, 1))
    on_strict("sum_to and Mul", lambda d: [sum_to(tensors(d, a, grad=False)[0], (3, 1))]
              + grads_on(d, Mul.apply, [a, b]))


def mul_keeps_float32(mod):
    Mul, rng = need(mod, "Mul"), rng_()
    keeps_float32("Mul.apply(a (2, 3, 4), b (3, 1))", Mul.apply, [rng.standard_normal((2, 3, 4)),
                                                                  rng.standard_normal((3, 1))], "ab")


SUM_TO = [sum_to_undoes_broadcasting, sum_to_gradcheck, mul_gradients, mul_gradgradcheck, mul_keeps_float32,
          sum_to_on_strict]


# ---------------------------------------------------------------- 6. matmul
MATMUL_SHAPES = [((3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (4, 5)), ((1, 3, 4), (2, 4, 5)),
                 ((2, 1, 3, 4), (5, 4, 2)), ((2, 4, 4), (2, 4, 4))]
MATMUL_HINT = ("dA = g @ B^T and dB = A^T @ g, with .mT for ^T, then ta.sum_to(..., shape) for batch dims "
               "that were broadcast in forward.")
MATMUL_WRONG = [("your dB is g^T @ A, the transpose of the right answer: dB = A^T @ g (A^T on the left)",
                 lambda u, a, b: [None, np.swapaxes(u, -1, -2) @ a]),
                ("your dA is g @ B without the transpose: dA = g @ B^T (use b.mT)",
                 lambda u, a, b: [u @ b, None]),
                ("your dB is A @ g without the transpose: dB = A^T @ g (use a.mT)",
                 lambda u, a, b: [None, a @ u])]


def matmul_forward(mod):
    MatMul, rng = need(mod, "MatMul"), rng_()
    for sa, sb in MATMUL_SHAPES:
        a, b = rand(rng, *sa), rand(rng, *sb)
        what = f"MatMul.apply(a {sa}, b {sb})"
        compare(writes_no_input(what, MatMul.apply, [a, b], ["a", "b"]), a.numpy() @ b.numpy(), what)


def matmul_gradients(mod):
    MatMul, rng = need(mod, "MatMul"), rng_()
    for sa, sb in MATMUL_SHAPES:
        a, b = rand(rng, *sa, grad=True), rand(rng, *sb, grad=True)
        gradcheck(f"the gradients of MatMul.apply(a {sa}, b {sb})", MatMul.apply, (a, b), MATMUL_WRONG,
                  hint=MATMUL_HINT)


def matmul_gradgradcheck(mod):
    MatMul, rng = need(mod, "MatMul"), rng_()
    a, b = rand(rng, 2, 3, 4, grad=True), rand(rng, 4, 5, grad=True)
    gradgradcheck("MatMul's backward, differentiated again", MatMul.apply, (a, b))


def matmul_on_strict(mod):
    MatMul, rng = need(mod, "MatMul"), rng_()
    a, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5))
    on_strict("MatMul, forward and backward", lambda d: grads_on(d, MatMul.apply, [a, b]))


def matmul_keeps_float32(mod):
    MatMul, rng = need(mod, "MatMul"), rng_()
    keeps_float32("MatMul.apply(a (2, 3, 4), b (4, 5))", MatMul.apply, [rng.standard_normal((2, 3, 4)),
                                                                        rng.standard_normal((4, 5))], "ab")


MATMUL = [matmul_forward, matmul_gradients, matmul_gradgradcheck, matmul_keeps_float32, matmul_on_strict]


# ---------------------------------------------------------------- 7. exp, log, tanh
def positive(rng, *shape, grad=True):
    return ta.tensor(np.abs(rng.standard_normal(shape)) + 0.5, dtype="float64", requires_grad=grad)


ELEMENTWISE = {   # name: (numpy forward, make an input, typical wrong gradients)
    "Exp": (np.exp, rand, [("your Exp backward multiplies g by x; the derivative of exp(x) is exp(x) itself: "
                            "g * self.output", lambda u, x: [u * x])]),
    "Log": (np.log, positive, [("your Log backward multiplies g by x; the derivative of log(x) is 1 / x: g / x",
                                lambda u, x: [u * x]),
                               ("your Log backward divides g by log(x) (self.output); the derivative of log(x) "
                                "is 1 / x: divide by the input, self.parents[0]", lambda u, x: [u / np.log(x)])]),
    "Tanh": (np.tanh, rand, [("your Tanh backward uses 1 - x^2; the derivative of tanh(x) is 1 - tanh(x)^2 = "
                              "1 - y^2, with y = self.output", lambda u, x: [u * (1 - x * x)]),
                             ("your Tanh backward uses 1 - y; the derivative of tanh(x) is 1 - y^2",
                              lambda u, x: [u * (1 - np.tanh(x))])]),
}


def elementwise_forward(mod):
    rng = rng_()
    for name, (formula, make, _) in ELEMENTWISE.items():
        op = need(mod, name)
        x = make(rng, 3, 5, grad=False)
        compare(writes_no_input(f"{name}.apply(x)", op.apply, [x], ["x"]), formula(x.numpy()), f"{name}.apply(x)")


def elementwise_gradcheck(mod):
    rng = rng_()
    for name, (_, make, wrong) in ELEMENTWISE.items():
        op = need(mod, name)
        gradcheck(f"the gradient of {name}", op.apply, (make(rng, 3, 5, grad=True),), wrong)


def elementwise_gradgradcheck(mod):
    rng = rng_()
    for name, (_, make, _) in ELEMENTWISE.items():
        gradgradcheck(f"{name}'s backward, differentiated again", need(mod, name).apply, (make(rng, 3, 5, grad=True),))


def elementwise_on_strict(mod):
    x = np.abs(rng_().standard_normal((3, 5))) + 0.5
    ops = [need(mod, name) for name in ELEMENTWISE]
    on_strict("Exp, Log and Tanh, forward and backward",
              lambda d: [r for op in ops for r in grads_on(d, op.apply, [x])])


def elementwise_keeps_float32(mod):
    x = np.abs(rng_().standard_normal((3, 5))) + 0.5
    for name in ELEMENTWISE:
        keeps_float32(f"{name}.apply(x)", need(mod, name).apply, [x], "x")


ELEMENTWISE_CHECKS = [elementwise_forward, elementwise_gradcheck, elementwise_gradgradcheck, elementwise_keeps_float32,
                      elementwise_on_strict]


# ---------------------------------------------------------------- 8. softmax
def np_softmax(x, dim=-1):
    e = np.exp(x - x.max(dim, keepdims=True))
    return e / e.sum(dim, keepdims=True)


SOFTMAX_HINT = "The gradient is y * (g - sum(g * y)), the sum along dim with keepdim=True."
SOFTMAX_WRONG = [
    ("your softmax backward returns the gradient of sum(y), which is zero since every row of y sums to 1, not the "
     "gradient of <g, y>: it leaves g out. Check the term that subtracts sum_j g_j y_j: the gradient is "
     "y * (g - sum(g * y))", lambda u, x: [np.zeros_like(x)]),
    ("your softmax backward keeps only the Jacobian's diagonal, g * y * (1 - y): every y_i depends on every x_j. "
     "Check the term that subtracts sum_j g_j y_j: the gradient is y * (g - sum(g * y))",
     lambda u, x: [u * np_softmax(x) * (1 - np_softmax(x))]),
    ("your softmax backward ignores g, the gradient of the output: the gradient is y * (g - sum(g * y))",
     lambda u, x: [np_softmax(x) * (1 - np_softmax(x))]),
    ("your softmax backward subtracts sum(g), not sum(g * y): check the term that subtracts sum_j g_j y_j",
     lambda u, x: [np_softmax(x) * (u - u.sum(-1, keepdims=True))]),
    ("your softmax backward sums g * y over the whole tensor: sum along dim only, with keepdim=True, "
     "one sum per row", lambda u, x: [np_softmax(x) * (u - (u * np_softmax(x)).sum())]),
]


def softmax_forward(mod):
    softmax, rng = need(mod, "softmax"), rng_()
    x = rand(rng, 3, 4, 5)
    for dim in (-1, 0, 1):
        what = f"softmax(x (3, 4, 5), dim={dim})"
        compare(writes_no_input(what, lambda x: softmax(x, dim), [x], ["x"]), np_softmax(x.numpy(), dim), what,
                hint="exp(x) / sum(exp(x)), both along dim.")
    big = ta.tensor(rng.standard_normal((2, 6)) * 3 + 1000.0, dtype="float64")
    compare(attempt("softmax of inputs near 1000", lambda: softmax(big)), np_softmax(big.numpy()),
            "softmax of inputs near 1000", hint="exp(1000) overflows: subtract the max along dim before exp.")
    apart = ta.tensor(rng.standard_normal((2, 6)) * 3 + np.array([[1000.0], [-1000.0]]), dtype="float64")
    compare(attempt("softmax of a row near 1000 and a row near -1000", lambda: softmax(apart)),
            np_softmax(apart.numpy()), "softmax of a row near 1000 and a row near -1000",
            hint="Subtract each row's max along dim (keepdims=True), not the max of the whole tensor: "
                 "exp of a row far below it underflows to 0, and 0 / 0 is nan.")


def softmax_gradcheck(mod):
    softmax, rng = need(mod, "softmax"), rng_()
    gradcheck("the gradient of softmax(x (3, 4, 5))", softmax, (rand(rng, 3, 4, 5, grad=True),), SOFTMAX_WRONG,
              SOFTMAX_HINT)
    gradcheck("the gradient of softmax(x (3, 4, 5), dim=1)", lambda x: softmax(x, 1), (rand(rng, 3, 4, 5, grad=True),),
              hint="Keep dim on self in forward and sum along it in backward.")


def softmax_gradgradcheck(mod):
    softmax, rng = need(mod, "softmax"), rng_()
    gradgradcheck("softmax's backward, differentiated again", softmax, (rand(rng, 3, 5, grad=True),))


def softmax_builds_no_jacobian(mod):
    """The backward of a (2, 1024) softmax must not hold a (1024, 1024) Jacobian (8 MB per row)."""
    softmax, rng = need(mod, "softmax"), rng_()
    x = rand(rng, 2, 1024, grad=True)
    y = attempt("softmax(x (2, 1024))", lambda: softmax(x))
    u = ta.tensor(rng.standard_normal(y.shape), dtype="float64")
    used = peak_bytes(lambda: attempt("softmax's backward on (2, 1024)", lambda: y.backward(u)))
    if used > 4 * 2**20:
        raise ExerciseFailure(f"your softmax backward used {used / 2**20:.0f} MB at once for an input of "
                              f"{x.numel() * 8 / 2**10:.0f} KB: it builds the (C, C) Jacobian. Write J^T g as one "
                              "formula instead: y * (g - sum(g * y)), a few arrays shaped like x")


def softmax_on_strict(mod):
    softmax = need(mod, "softmax")
    x = rng_().standard_normal((3, 5))
    on_strict("softmax, forward and backward", lambda d: grads_on(d, softmax, [x]))


def softmax_keeps_float32(mod):
    keeps_float32("softmax(x (3, 5))", need(mod, "softmax"), [rng_().standard_normal((3, 5))], "x")


SOFTMAX = [softmax_forward, softmax_gradcheck, softmax_gradgradcheck, softmax_builds_no_jacobian,
           softmax_keeps_float32, softmax_on_strict]


# ---------------------------------------------------------------- 9. LayerNorm
def np_layer_norm(x, w, b, eps):
    xc = x - x.mean(-1, keepdims=True)
    return xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + eps) * w + b


def _ln_parts(x, w, eps=1e-5):
    xc = x - x.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt((xc * xc).mean(-1, keepdims=True) + eps)
    return xc * rstd, rstd


def _ln_wrong_dx(u, x, w, b, form):
    xhat, rstd = _ln_parts(x, w)
    gx = u * w if form != "no weight" else u
    mean = gx.mean(-1, keepdims=True)
    proj = xhat * (gx * xhat).mean(-1, keepdims=True)
    if form == "no variance term":
        dx = rstd * (gx - mean)
    elif form == "no mean term":
        dx = rstd * (gx - proj)
    else:
        dx = rstd * (gx - mean - proj)
    return [dx, None, None]


LAYERNORM_HINT = ("With xhat = (x - mean) * rstd and gx = g * weight: dx = rstd * (gx - mean(gx) - xhat * "
                  "mean(gx * xhat)), dweight = sum(g * xhat), dbias = sum(g), the sums over every leading dim.")
LAYERNORM_WRONG = [
    ("your dx treats the variance as a constant: check the term that subtracts xhat * mean(gx * xhat) "
     "(the variance depends on x too)", lambda u, x, w, b: _ln_wrong_dx(u, x, w, b, "no variance term")),
    ("your dx treats the mean as a constant: check the term that subtracts mean(gx) (the mean depends on x too)",
     lambda u, x, w, b: _ln_wrong_dx(u, x, w, b, "no mean term")),
    ("your dx forgets the weight: the gradient that reaches xhat is gx = g * weight",
     lambda u, x, w, b: _ln_wrong_dx(u, x, w, b, "no weight")),
    ("your dweight is sum(g * x); the weight multiplies xhat, the normalised x: dweight = sum(g * xhat)",
     lambda u, x, w, b: [None, (u * x).reshape(-1, x.shape[-1]).sum(0), None]),
]


def layernorm_forward(mod):
    layer_norm, rng = need(mod, "layer_norm"), rng_()
    x, w, b = rand(rng, 2, 3, 8) * 2.0 + 1.0, rand(rng, 8), rand(rng, 8)
    for eps in (1e-5, 0.5):
        what = f"layer_norm(x (2, 3, 8), weight, bias, eps={eps})"
        got = writes_no_input(what, lambda x, w, b: layer_norm(x, w, b, eps), [x, w, b], ["x", "weight", "bias"])
        compare(got, np_layer_norm(x.numpy(), w.numpy(), b.numpy(), eps),
                what, hint="(x - mean) / sqrt(var + eps) * weight + bias; var is the mean of (x - mean)^2.")
    far = x + 1e5
    what = "layer_norm(x + 100000, weight, bias), rows whose mean is far larger than their spread"
    compare(attempt(what, lambda: layer_norm(far, w, b, 1e-5)), np_layer_norm(x.numpy(), w.numpy(), b.numpy(), 1e-5),
            what, tol=1e-9, hint="Take var as mean((x - mean)^2): mean(x^2) - mean^2 subtracts two numbers near "
                                 "10^10 and loses the digits that make var (in float32, rows with a mean of 1000 "
                                 "come out 50% off).")


def layernorm_matches_composite(mod):
    """Each of dx, dweight, dbias against the library's composite layer norm (built from primitives)."""
    layer_norm, rng = need(mod, "layer_norm"), rng_()
    x, w, b = rand(rng, 2, 3, 8, grad=True), rand(rng, 8, grad=True), rand(rng, 8, grad=True)
    fn = lambda x, w, b: layer_norm(x, w, b, 1e-5)                           # noqa: E731
    _, _, got = attempt("your LayerNorm backward", lambda: vjp(fn, (x, w, b)), LAYERNORM_HINT)
    _, _, expected = vjp(lambda x, w, b: F.layer_norm(x, (8,), w, b, 1e-5, fused=False), (x, w, b))
    for name, g, e in zip(("dx", "dweight", "dbias"), got, expected):
        try:
            compare(g, e, f"{name} of your LayerNorm (against the composite layer norm)", tol=1e-8)
        except ExerciseFailure as failure:
            mistake = known_mistake(fn, (x, w, b), LAYERNORM_WRONG)
            raise ExerciseFailure(f"{name} of your LayerNorm: {mistake}" if mistake else
                                  f"{failure} {LAYERNORM_HINT}") from None


def layernorm_gradcheck(mod):
    layer_norm, rng = need(mod, "layer_norm"), rng_()
    x, w, b = rand(rng, 4, 6, grad=True), rand(rng, 6, grad=True), rand(rng, 6, grad=True)
    gradcheck("the gradients of your LayerNorm", lambda x, w, b: layer_norm(x, w, b, 1e-5), (x, w, b),
              LAYERNORM_WRONG, LAYERNORM_HINT)
    gradcheck("the gradients of your LayerNorm with eps=0.5", lambda x, w, b: layer_norm(x, w, b, 0.5), (x, w, b),
              hint="They are right with eps=1e-5: backward must use the eps given to forward, through the rstd "
                   "that forward saved.")


def layernorm_on_strict(mod):
    layer_norm, rng = need(mod, "layer_norm"), rng_()
    arrays = [rng.standard_normal((2, 3, 8)), rng.standard_normal(8), rng.standard_normal(8)]
    on_strict("LayerNorm, forward and backward", lambda d: grads_on(d, lambda x, w, b: layer_norm(x, w, b), arrays))


def layernorm_keeps_float32(mod):
    layer_norm, rng = need(mod, "layer_norm"), rng_()
    arrays = [rng.standard_normal((2, 3, 8)), rng.standard_normal(8), rng.standard_normal(8)]
    keeps_float32("layer_norm(x (2, 3, 8), weight, bias)", lambda x, w, b: layer_norm(x, w, b), arrays,
                  ["x", "weight", "bias"])


LAYERNORM = [layernorm_forward, layernorm_matches_composite, layernorm_gradcheck, layernorm_keeps_float32,
             layernorm_on_strict]


# ---------------------------------------------------------------- 10. cross-entropy
def np_cross_entropy(logits, targets, ignore_index=-100):
    logp = np.log(np_softmax(logits))
    keep = targets != ignore_index
    return -logp[np.arange(len(targets))[keep], targets[keep]].mean()


def _ce_grad(u, logits, targets, ignore_index=-100, count="valid", zero_ignored=True, scale=True):
    keep = targets != ignore_index
    onehot = np.eye(logits.shape[1])[np.where(keep, targets, 0)]
    d = np_softmax(logits) - onehot
    if zero_ignored:
        d = d * keep[:, None]
    n = {"valid": keep.sum(), "all": len(targets), "none": 1}[count]
    return [(u if scale else 1.0) * d / n]


CE_HINT = "d loss / d logits = g * (softmax(logits) - onehot(targets)) / N, N the number of rows that count."
CE_WRONG = [
    ("your cross-entropy gradient is N times too large: the loss is the mean over the rows, so divide by N",
     lambda u, lg, t: _ce_grad(u, lg, t, count="none")),
    ("your cross-entropy backward ignores g, the gradient of the loss (here a random number): multiply by it",
     lambda u, lg, t: _ce_grad(u, lg, t, scale=False)),
    ("your cross-entropy gradient has the wrong sign: it is softmax(logits) - onehot(targets)",
     lambda u, lg, t: [-_ce_grad(u, lg, t)[0]]),
    ("your cross-entropy gives a gradient to the rows whose target is ignore_index: they count for nothing, "
     "so their rows of dlogits are zero", lambda u, lg, t: _ce_grad(u, lg, t, zero_ignored=False)),
    ("your cross-entropy divides by all N rows, not by the rows that count (targets != ignore_index)",
     lambda u, lg, t: _ce_grad(u, lg, t, count="all")),
]


def ce_inputs(rng, n=6, c=5, device="cpu"):
    targets = rng.integers(0, c, n)
    targets[[1, 4]] = -100                                                   # two ignored rows
    targets[2] = targets[0]
    return rand(rng, n, c, grad=True, device=device), ta.tensor(targets, device=device)


def cross_entropy_forward(mod):
    cross_entropy, rng = need(mod, "cross_entropy"), rng_()
    logits, targets = ce_inputs(rng)
    what = "cross_entropy(logits (6, 5), targets with two rows ignored)"
    got = writes_no_input(what, cross_entropy, [logits, targets], ["logits", "targets"])
    compare(got, np_cross_entropy(logits.numpy(), targets.numpy()),
            what, hint="The mean over the rows that count of -log softmax(logits)[target].")
    big = ta.tensor(rng.standard_normal((3, 4)) * 3 + 1000.0, dtype="float64")
    t = ta.tensor(np.array([0, 3, 1]))
    compare(attempt("cross_entropy of logits near 1000", lambda: cross_entropy(big, t)),
            np_cross_entropy(big.numpy(), t.numpy()), "cross_entropy of logits near 1000",
            hint="Subtract each row's max before exp (log softmax = x - max - log sum exp(x - max)).")
    far = ta.tensor(rng.standard_normal((2, 4)) * 3 + np.array([[1000.0], [-1000.0]]), dtype="float64")
    t = ta.tensor(np.array([1, 2]))
    what = "cross_entropy of a row of logits near 1000 and a row near -1000"
    compare(attempt(what, lambda: cross_entropy(far, t)), np_cross_entropy(far.numpy(), t.numpy()), what,
            hint="Subtract each row's own max (axis=1, keepdims=True), not the max of all the logits: "
                 "exp of a row far below it is 0, and log(0) is -inf.")
    logits, targets = ce_inputs(rng)
    targets = ta.tensor(np.where(targets.numpy() == -100, -1, targets.numpy()))
    what = "cross_entropy(logits (6, 5), targets, ignore_index=-1), two rows ignored (GPT pads with -1)"
    compare(attempt(what, lambda: cross_entropy(logits, targets, ignore_index=-1)),
            np_cross_entropy(logits.numpy(), targets.numpy(), -1), what,
            hint="Leave out the rows whose target is the ignore_index you are given (-100 is only its default).")


def cross_entropy_gradcheck(mod):
    cross_entropy, rng = need(mod, "cross_entropy"), rng_()
    logits, targets = ce_inputs(rng)
    fn = lambda lg: cross_entropy(lg, targets)                               # noqa: E731
    gradcheck("the gradient of cross_entropy(logits (6, 5), targets)", fn, (logits,),
              [(m, lambda u, lg, f=f: f(u, lg, targets.numpy())) for m, f in CE_WRONG], CE_HINT)
    padded = ta.tensor(np.where(targets.numpy() == -100, -1, targets.numpy()))
    gradcheck("the gradient of cross_entropy(logits (6, 5), targets, ignore_index=-1)",
              lambda lg: cross_entropy(lg, padded, ignore_index=-1), (logits,),
              hint="Leave out the rows whose target is the ignore_index you are given (-100 is only its default).")


def cross_entropy_on_strict(mod):
    cross_entropy, rng = need(mod, "cross_entropy"), rng_()
    logits, targets = ce_inputs(rng)
    on_strict("cross_entropy, forward and backward",
              lambda d: grads_on(d, cross_entropy, [logits.numpy()], ints=[targets.numpy()]))


def cross_entropy_keeps_float32(mod):
    cross_entropy, rng = need(mod, "cross_entropy"), rng_()
    logits, targets = ce_inputs(rng)
    keeps_float32("cross_entropy(logits (6, 5), targets)", cross_entropy, [logits.numpy()], ["logits"],
                  ints=[targets.numpy()])


CROSS_ENTROPY = [cross_entropy_forward, cross_entropy_gradcheck, cross_entropy_keeps_float32, cross_entropy_on_strict]


# ---------------------------------------------------------------- 11. embedding
IDS = np.array([[3, 1, 3], [0, 3, 5]])          # id 3 three times, id 2 and 4 never


def np_embedding_grad(u, weight, idx=IDS):
    out = np.zeros_like(weight)
    np.add.at(out, idx.reshape(-1), u.reshape(-1, weight.shape[1]))
    return out


def _last_write_wins(u, weight, idx=IDS):
    out = np.zeros_like(weight)
    out[idx.reshape(-1)] = u.reshape(-1, weight.shape[1])
    return out


EMBEDDING_WRONG = [("id 3 is looked up three times, but its row of dweight holds only one of those gradients: "
                    "`dw[idx] = g` and `dw[idx] += g` keep one write per row. Scatter-add: every occurrence adds "
                    "its row (a one-hot matrix @ g does it)", lambda u, w: [_last_write_wins(u, w)])]


def embedding_forward(mod):
    embedding, rng = need(mod, "embedding"), rng_()
    w = rand(rng, 6, 4)
    got = writes_no_input("embedding(idx (2, 3), weight (6, 4))", embedding, [ta.tensor(IDS), w], ["idx", "weight"])
    compare(got, w.numpy()[IDS],
            "embedding(idx (2, 3), weight (6, 4))", hint="Row idx[b, t] of weight, for every position.")
    for ids in (IDS[0], IDS.reshape(2, 1, 3)):                        # positions are 1-d ids (T,)
        what = f"embedding(idx {ids.shape}, weight (6, 4))"
        hint = ("The ids may have any shape (GPT looks up positions (T,) and tokens (B, T)): the output is "
                "idx.shape + (C,).")
        compare(attempt(what, lambda: embedding(ta.tensor(ids), w), hint), w.numpy()[ids], what, hint=hint)


def embedding_gradients(mod):
    embedding, rng = need(mod, "embedding"), rng_()
    w, idx = rand(rng, 6, 4, grad=True), ta.tensor(IDS)
    fn = lambda w: embedding(idx, w)                                         # noqa: E731
    _, u, (got,) = attempt("your Embedding backward", lambda: vjp(fn, (w,)))
    try:
        compare(got, np_embedding_grad(u, w.numpy()), "dweight of embedding(ids with repeats, weight (6, 4))",
                hint="Row v of dweight is the sum of g over every position whose id is v; rows never looked up "
                     "are zero.")
    except ExerciseFailure as failure:
        raise ExerciseFailure(known_mistake(fn, (w,), EMBEDDING_WRONG) or str(failure)) from None
    gradcheck("the gradient of embedding", fn, (w,), EMBEDDING_WRONG)


def embedding_on_strict(mod):
    embedding, rng = need(mod, "embedding"), rng_()
    w = rng.standard_normal((6, 4))
    on_strict("embedding, forward and backward",
              lambda d: grads_on(d, lambda w, idx: embedding(idx, w), [w], ints=[IDS]))


def embedding_keeps_float32(mod):
    embedding = need(mod, "embedding")
    keeps_float32("embedding(idx (2, 3), weight (6, 4))", lambda w, idx: embedding(idx, w),
                  [rng_().standard_normal((6, 4))], ["weight"], ints=[IDS])


EMBEDDING = [embedding_forward, embedding_gradients, embedding_keeps_float32, embedding_on_strict]


# ---------------------------------------------------------------- 12. the engine
class SharedGradient(ta.Function):
    """a + b, whose backward hands both inputs the same gradient Tensor (as an addition may)."""

    def forward(self, a, b):
        return a + b

    def backward(self, g):
        return g, g


def _diamond(x):
    """a = x * 2, b = a * a, c = b + a: a is used twice. Returns (c, the tensors by name)."""
    a = x * 2.0
    b = a * a
    c = b + a
    return c, {"x": x, "a": a, "b": b, "c": c}


def engine_toposort(mod):
    toposort, rng = need(mod, "toposort"), rng_()
    x = rand(rng, 3, grad=True)
    c, named = _diamond(x)
    order = attempt("toposort([c]) for c = a * a + a, a = x * 2", lambda: toposort([c]))
    name = {id(t): n for n, t in named.items()}
    names = [name.get(id(t), "another tensor") for t in order]
    for n in ("c", "b", "a", "x"):
        if names.count(n) != 1:
            raise ExerciseFailure(f"toposort([c]) for c = a * a + a: {n} appears {names.count(n)} times in {names}, "
                                  "expected once: mark the tensors you have visited")
    for later, earlier in (("b", "c"), ("a", "b"), ("a", "c"), ("x", "a")):
        if names.index(later) < names.index(earlier):
            raise ExerciseFailure(f"toposort([c]) gave {names}: {later} comes before {earlier}, but {earlier} was "
                                  f"made from {later}. A tensor must come after every tensor that uses it, or "
                                  "backward runs it before its gradient is complete (add a tensor to the order "
                                  "only after all its inputs are done, then reverse)")
    if len(order) != 4:
        raise ExerciseFailure(f"toposort([c]) gave {len(order)} tensors {names}, expected c, b, a, x")
    y = x * 3.0
    frozen = ta.tensor([1.0, 2.0, 3.0], dtype="float64")                     # requires no grad
    z = y * frozen
    order = toposort([z])
    if any(t is frozen for t in order):
        raise ExerciseFailure("toposort includes a tensor that does not require grad: leave those out")


def engine_backward_sums_paths(mod):
    backward, rng = need(mod, "backward"), rng_()
    x = rand(rng, 3, grad=True)
    y = (x * 3.0 + x * 5.0).sum()                                            # x is used twice: dy/dx = 8
    attempt("backward(y) for y = sum(x * 3 + x * 5)", lambda: backward(y))
    if x.grad is None:
        raise ExerciseFailure("backward(y) for y = sum(x * 3 + x * 5) left x.grad as None: put the leaves' "
                              "gradients in .grad")
    got = x.grad.numpy()
    if np.allclose(got, 3.0) or np.allclose(got, 5.0):
        raise ExerciseFailure(f"backward(y) for y = sum(x * 3 + x * 5) gave x.grad = {got[0]:g}, expected 8: x is "
                              "used twice and you kept one path's gradient. Add up the gradients that reach "
                              "the same tensor")
    if np.allclose(got, 16.0) or np.allclose(got, 11.0) or np.allclose(got, 13.0):
        raise ExerciseFailure(f"backward(y) for y = sum(x * 3 + x * 5) gave x.grad = {got[0]:g}, expected 8: a "
                              "gradient was counted twice. Run each tensor's backward once, after all its users "
                              "(in toposort order)")
    compare(got, np.full(3, 8.0), "x.grad for y = sum(x * 3 + x * 5)")
    x2 = rand(rng, 3, grad=True)
    c, _ = _diamond(x2)
    backward(c.sum())
    compare(x2.grad, 8.0 * x2.numpy() + 2.0, "x.grad for c = a * a + a, a = x * 2 (a used twice)",
            hint="dc/dx = (2a + 1) * 2 = 8x + 2: wait until both of a's users have given their gradient.")
    x3 = rand(rng, 3, grad=True)
    p, q = x3 * 2.0, x3 * 3.0
    what = "x.grad for t = (p + q) + p, p = x * 2, q = x * 3, each + giving both its inputs the same g"
    attempt(what, lambda: backward(SharedGradient.apply(SharedGradient.apply(p, q), p).sum()))
    if np.allclose(x3.grad.numpy(), 10.0):
        raise ExerciseFailure(f"{what}: you give 10, expected 7: adding p's second gradient in place "
                              "(pending[k] += g) also changed q's, the same Tensor. Make a new one: "
                              "pending[k] = pending[k] + g")
    compare(x3.grad, np.full(3, 7.0), what)


def engine_backward_accumulates(mod):
    backward, rng = need(mod, "backward"), rng_()
    x = rand(rng, 3, grad=True)
    backward((x * 2.0).sum())
    backward((x * 5.0).sum())
    compare(x.grad, np.full(3, 7.0), "x.grad after backward(sum(x * 2)) then backward(sum(x * 5))",
            hint="As in PyTorch, .grad adds up across backward calls (the training loop accumulates "
                 "micro-batches this way): the first gradient (a copy), then grad = grad + g.")
    y = x * 4.0
    backward(y, ta.tensor([1.0, 0.0, 2.0], dtype="float64"))
    compare(x.grad, np.array([11.0, 7.0, 15.0]), "x.grad after backward(y, gradient) for y = x * 4 (not a scalar)",
            hint="Start from the given gradient, not from ones.")
    w = rand(rng, 3, grad=False)
    backward((x * w).sum())
    if w.grad is not None:
        raise ExerciseFailure("backward gave a .grad to a tensor that does not require grad")


def _shares(a, b):
    """Do two Tensors share memory (the same Tensor, or arrays that overlap)?"""
    return a is b or np.shares_memory(a.data, b.data)


OWN_GRAD = ("a leaf's .grad must be its own array, as in PyTorch: code that scales one gradient in place "
            "(clip_grad_norm_, an optimizer) would change the other. Copy the first gradient that reaches a leaf "
            "(g.clone() is a copy), then add: t.grad = t.grad + g")


def engine_grads_are_their_own(mod):
    """After backward, no two leaves share a .grad array, nor a leaf and the caller's gradient; accumulating
    does not write into an array that another tensor holds."""
    backward, rng = need(mod, "backward"), rng_()
    a, b = rand(rng, 3, grad=True), rand(rng, 3, grad=True)
    u = ta.tensor(rng.standard_normal(3), dtype="float64")
    kept = u.numpy().copy()
    attempt("backward(a + b, gradient)", lambda: backward(SharedGradient.apply(a, b), u))
    if _shares(a.grad, b.grad):
        raise ExerciseFailure(f"after backward(a + b, gradient), a.grad and b.grad are the same array: {OWN_GRAD}")
    if _shares(a.grad, u) or _shares(b.grad, u):
        raise ExerciseFailure("after backward(a + b, gradient), a.grad is the gradient array you were given: "
                              f"{OWN_GRAD}")
    held = b.grad.numpy().copy()
    attempt("a second backward, of sum(a * 2)", lambda: backward((a * 2.0).sum()))
    if not np.array_equal(u.numpy(), kept) or not np.array_equal(b.grad.numpy(), held):
        raise ExerciseFailure("a second backward, of sum(a * 2), added a's gradient into an array that another "
                              f"tensor holds (b.grad, or the gradient given to the first backward): {OWN_GRAD}")
    x = rand(rng, 3, grad=True)
    attempt("backward(x, gradient) with x a leaf", lambda: backward(x, u))
    if _shares(x.grad, u):
        raise ExerciseFailure(f"after backward(x, gradient) with x a leaf, x.grad is the gradient array you were "
                              f"given, which the caller still holds and may change: {OWN_GRAD}")


def _mlp_grads(backward_fn, device):
    ta.manual_seed(0)
    layers = [nn.Linear(5, 7), nn.Linear(7, 3)]
    params = [p for layer in layers for p in layer.parameters()]
    for p in params:
        p.data = p.double().data
    for layer in layers:
        layer.to(device)
    rng = rng_(1)
    x = ta.tensor(rng.standard_normal((4, 5)), dtype="float64", device=device)
    t = ta.tensor(rng.integers(0, 3, 4), device=device)
    h = layers[0](x).tanh()
    loss = F.cross_entropy(layers[1](h + h), t)                             # h is used twice
    backward_fn(loss)
    return [p.grad for p in params]


def engine_matches_the_library(mod):
    backward = need(mod, "backward")
    got = attempt("your backward on a small MLP with cross-entropy", lambda: _mlp_grads(backward, "cpu"))
    expected = _mlp_grads(lambda loss: loss.backward(), "cpu")
    for i, (g, e) in enumerate(zip(got, expected)):
        compare(g, e.numpy(), f"the gradient of parameter {i} of a small MLP (against loss.backward())", tol=1e-9)


def engine_on_strict(mod):
    backward = need(mod, "backward")
    on_strict("your backward on a small MLP", lambda d: _mlp_grads(backward, d))


ENGINE = [engine_toposort, engine_backward_sums_paths, engine_backward_accumulates, engine_grads_are_their_own,
          engine_matches_the_library, engine_on_strict]


# ---------------------------------------------------------------- 13. attention
def np_attention(q, k, v, is_causal=False, scale=None):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if is_causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    return np_softmax(s) @ v


def _attention_parts(q, k, v, is_causal):
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = q @ np.swapaxes(k, -1, -2) * scale
    if is_causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    return np_softmax(s), scale


def _attention_wrong(u, q, k, v, is_causal, form):
    p, scale = _attention_parts(q, k, v, is_causal)
    dp = u @ np.swapaxes(v, -1, -2)
    ds = p * dp if form == "no subtraction" else p * (dp - (dp * p).sum(-1, keepdims=True))
    s = 1.0 if form == "no scale" else scale
    return [ds @ k * s, np.swapaxes(ds, -1, -2) @ q * s, None]


ATTENTION_HINT = ("dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)), dQ = dS K * scale, "
                  "dK = dS^T Q * scale.")
ATTENTION_WRONG = {c: [
    ("your dS is P * dP: the softmax backward also subtracts each row's sum(dP * P). Check the term that "
     "subtracts it: dS = P * (dP - rowsum(dP * P))", lambda u, q, k, v, c=c: _attention_wrong(u, q, k, v, c,
                                                                                              "no subtraction")),
    ("your dQ and dK miss the scale: the scores are q k^T * scale, so dQ = dS K * scale and dK = dS^T Q * scale",
     lambda u, q, k, v, c=c: _attention_wrong(u, q, k, v, c, "no scale")),
] for c in (False, True)}


def attention_forward(mod):
    sdpa, rng = need(mod, "scaled_dot_product_attention"), rng_()
    q, k, v = rand(rng, 2, 2, 4, 8), rand(rng, 2, 2, 6, 8), rand(rng, 2, 2, 6, 3)
    what = "attention(q (2, 2, 4, 8), k (2, 2, 6, 8), v (2, 2, 6, 3))"
    compare(writes_no_input(what, sdpa, [q, k, v], "qkv"), np_attention(q.numpy(), k.numpy(), v.numpy()), what,
            hint="softmax(q k^T / sqrt(D)) v, the softmax over the keys (last dim).")
    q, k, v = rand(rng, 2, 2, 5, 8), rand(rng, 2, 2, 5, 8), rand(rng, 2, 2, 5, 8)
    what = "causal attention (T = 5)"
    compare(attempt(what, lambda: sdpa(q, k, v, is_causal=True)),
            np_attention(q.numpy(), k.numpy(), v.numpy(), True), what,
            hint="Set the scores of keys j > i to -inf before the softmax.")
    what = "causal attention (T = 5) with scale=0.3"
    compare(attempt(what, lambda: sdpa(q, k, v, is_causal=True, scale=0.3)),
            np_attention(q.numpy(), k.numpy(), v.numpy(), True, scale=0.3), what,
            hint="Use the scale forward is given (1 / sqrt(D) is only its default).")


def attention_gradients(mod):
    """dQ, dK, dV against the library's attention (autodiff through primitives), then gradcheck."""
    sdpa, rng = need(mod, "scaled_dot_product_attention"), rng_()
    cases = [((2, 2, 4, 8), (2, 2, 6, 8), (2, 2, 6, 3), False), ((1, 2, 5, 4), (1, 2, 5, 4), (1, 2, 5, 4), True)]
    for sq, sk, sv, causal in cases:
        q, k, v = rand(rng, *sq, grad=True), rand(rng, *sk, grad=True), rand(rng, *sv, grad=True)
        fn = lambda q, k, v, c=causal: sdpa(q, k, v, is_causal=c)           # noqa: E731
        label = f"{'causal' if causal else 'non-causal'} attention, q {sq}, k {sk}, v {sv}"
        _, _, got = attempt(f"your Attention backward ({label})", lambda: vjp(fn, (q, k, v)))
        _, _, expected = vjp(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), (q, k, v))
        for name, g, e in zip(("dQ", "dK", "dV"), got, expected):
            try:
                compare(g, e, f"{name} of {label} (against the library's attention)", tol=1e-8)
            except ExerciseFailure as failure:
                mistake = known_mistake(fn, (q, k, v), ATTENTION_WRONG[causal])
                raise ExerciseFailure(f"{name} of {label}: {mistake}" if mistake else
                                      f"{failure} {ATTENTION_HINT}") from None
        gradcheck(f"the gradients of {label}", fn, (q, k, v), ATTENTION_WRONG[causal], ATTENTION_HINT)
    gradcheck(f"the gradients of {label}, scale=0.3", lambda q, k, v: sdpa(q, k, v, is_causal=True, scale=0.3),
              (q, k, v), hint="Use self.scale, the scale forward was given (1 / sqrt(D) is only its default).")


def attention_on_strict(mod):
    sdpa, rng = need(mod, "scaled_dot_product_attention"), rng_()
    arrays = [rng.standard_normal((1, 2, 5, 4)) for _ in range(3)]
    on_strict("causal attention, forward and backward",
              lambda d: grads_on(d, lambda q, k, v: sdpa(q, k, v, is_causal=True), arrays))


def attention_keeps_float32(mod):
    sdpa, rng = need(mod, "scaled_dot_product_attention"), rng_()
    keeps_float32("causal attention(q, k, v (1, 2, 5, 4))", lambda q, k, v: sdpa(q, k, v, is_causal=True),
                  [rng.standard_normal((1, 2, 5, 4)) for _ in range(3)], "qkv")


ATTENTION = [attention_forward, attention_gradients, attention_keeps_float32, attention_on_strict]


# ---------------------------------------------------------------- 14. online softmax
def np_tiled_without_rescale(q, k, v, block):
    """The typical wrong tiling: the running sums are never rescaled when the max grows."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    m = np.full(q.shape[:-1] + (1,), -np.inf)
    l, acc = np.zeros(q.shape[:-1] + (1,)), np.zeros(q.shape[:-1] + (v.shape[-1],))
    for j in range(0, k.shape[-2], block):
        s = q @ np.swapaxes(k[..., j:j + block, :], -1, -2) * scale
        m = np.maximum(m, s.max(-1, keepdims=True))
        p = np.exp(s - m)
        l, acc = l + p.sum(-1, keepdims=True), acc + p @ v[..., j:j + block, :]
    return acc / l


def online_softmax_matches_naive(mod):
    tiled, rng = need(mod, "tiled_attention"), rng_()
    for (tq, tk, block, causal) in [(10, 10, 4, False), (10, 10, 4, True), (7, 13, 5, False), (9, 9, 1, True),
                                    (6, 6, 16, True)]:
        q, k, v = rand(rng, 2, 2, tq, 8), rand(rng, 2, 2, tk, 8), rand(rng, 2, 2, tk, 3)
        what = f"tiled_attention(Tq={tq}, Tk={tk}, block_size={block}, is_causal={causal})"
        out = attempt(what, lambda: tiled(q, k, v, block_size=block, is_causal=causal))
        if not isinstance(out, ta.Tensor):
            raise ExerciseFailure(f"{what} returned a {type(out).__name__}, not a Tensor")
        compare(out, np_attention(q.numpy(), k.numpy(), v.numpy(), causal), f"{what} (against naive attention)",
                hint="At the end of the key blocks, out = acc / l.")
    q, k, v = rand(rng, 1, 2, 7, 8), rand(rng, 1, 2, 13, 8), rand(rng, 1, 2, 13, 3)
    what = "tiled_attention(Tq=7, Tk=13, block_size=5, scale=0.3)"
    compare(attempt(what, lambda: tiled(q, k, v, block_size=5, scale=0.3)),
            np_attention(q.numpy(), k.numpy(), v.numpy(), scale=0.3), f"{what} (against naive attention)",
            hint="Use the scale you are given (1 / sqrt(D) is only its default).")


def online_softmax_rescales(mod):
    """Later key blocks hold larger scores, so the running max grows: the old sums must be rescaled."""
    tiled, rng = need(mod, "tiled_attention"), rng_()
    q = ta.tensor(np.abs(rng.standard_normal((1, 1, 4, 8))) + 0.5, dtype="float64")
    k = ta.tensor(np.linspace(0.1, 3.0, 12)[:, None] * np.ones((1, 1, 12, 8)), dtype="float64")   # growing scores
    v = rand(rng, 1, 1, 12, 3)
    out = writes_no_input("tiled_attention with growing scores", lambda q, k, v: tiled(q, k, v, block_size=4),
                          [q, k, v], "qkv")
    expected = np_attention(q.numpy(), k.numpy(), v.numpy())
    if np.allclose(out.numpy(), np_tiled_without_rescale(q.numpy(), k.numpy(), v.numpy(), 4), atol=1e-9):
        raise ExerciseFailure("tiled_attention is wrong when a later key block raises a row's max: when m grows "
                              "to m_new, the sums l and acc so far were taken relative to the old m; multiply "
                              "them by exp(m - m_new) before adding the new tile")
    compare(out, expected, "tiled_attention with scores that grow from block to block (against naive attention)",
            hint="When a row's max grows from m to m_new, rescale l and acc by exp(m - m_new).")


def online_softmax_memory(mod):
    """With T = 512 the full score matrix is 2 MB; tiles of 32 x 32 need a few KB."""
    tiled, rng = need(mod, "tiled_attention"), rng_()
    q, k, v = rand(rng, 1, 1, 512, 8), rand(rng, 1, 1, 512, 8), rand(rng, 1, 1, 512, 8)
    used = peak_bytes(lambda: attempt("tiled_attention(T = 512, block_size=32)",
                                      lambda: tiled(q, k, v, block_size=32)))
    full = 512 * 512 * 8
    if used >= full / 2:
        raise ExerciseFailure(f"tiled_attention(T = 512, block_size=32) held {used / 2**20:.1f} MB at once; the "
                              f"whole (T, T) score matrix is {full / 2**20:.0f} MB: keep one (block, block) tile "
                              "of scores at a time, and per query row only m, l and acc")
    q, k, v = rand(rng, 1, 1, 32, 8), rand(rng, 1, 1, 4096, 8), rand(rng, 1, 1, 4096, 8)
    used = peak_bytes(lambda: attempt("tiled_attention(Tq = 32, Tk = 4096, block_size=32)",
                                      lambda: tiled(q, k, v, block_size=32)))
    strip = 32 * 4096 * 8
    if used >= strip / 4:
        raise ExerciseFailure(f"tiled_attention(Tq = 32, Tk = 4096, block_size=32) held {used / 2**20:.1f} MB at "
                              f"once; a block of queries against every key is {strip / 2**20:.0f} MB: go through the "
                              "keys one block at a time too, with the running m, l and acc of the online softmax")


def online_softmax_on_strict(mod):
    tiled, rng = need(mod, "tiled_attention"), rng_()
    arrays = [rng.standard_normal((1, 2, 7, 4)) for _ in range(3)]
    on_strict("tiled_attention (causal, block_size=3)",
              lambda d: [tiled(*tensors(d, *arrays, grad=False), block_size=3, is_causal=True)])


def online_softmax_keeps_float32(mod):
    tiled, rng = need(mod, "tiled_attention"), rng_()
    q, k, v = (ta.tensor(rng.standard_normal((1, 2, 7, 4)), dtype="float32") for _ in range(3))
    out = attempt("tiled_attention in float32", lambda: tiled(q, k, v, block_size=3, is_causal=True))
    if out.dtype != np.float32:
        raise ExerciseFailure(f"tiled_attention on float32 q, k, v returned {out.dtype}: {DTYPE_RULE_OF_OPS} "
                              "(backend.full(shape, value, q.dtype) makes m, l and acc in q's dtype)")


ONLINE_SOFTMAX = [online_softmax_rescales, online_softmax_matches_naive, online_softmax_memory,
                  online_softmax_keeps_float32,
                  online_softmax_on_strict]


# ---------------------------------------------------------------- 15. AdamW
def _np_adam(p, grads, lrs, b1, b2, eps, wd, form="adamw"):
    """The parameter after each step, for a few kinds of Adam."""
    m, v, out = np.zeros_like(p), np.zeros_like(p), []
    for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
        if form == "l2":
            g = g + wd * p
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        mh, vh = (m, v) if form == "no bias correction" else (m / (1 - b1 ** t), v / (1 - b2 ** t))
        lr = lrs[0] if form == "first lr" else lr
        if form not in ("l2", "decay after"):
            p = p * (1 - lr * wd)                                        # decoupled decay, first
        p = p - lr * mh / (np.sqrt(vh) + eps)
        if form == "decay after":
            p = p * (1 - lr * wd)
        out.append(p)
    return out


ADAMW_WRONG = {
    "l2": "your step adds weight_decay * p to the gradient (Adam with L2), which Adam then rescales; AdamW decays "
          "the weights directly, apart from the gradient: p *= 1 - lr * weight_decay",
    "no bias correction": "your step has no bias correction: divide m by (1 - beta1^t) and v by (1 - beta2^t), "
                          "t the step count of that parameter (from 1)",
    "decay after": "you decay the weights after the Adam update; AdamW (and ta.optim.AdamW, and PyTorch) decay "
                   "first: p *= 1 - lr * weight_decay, then the Adam step",
    "first lr": "your step keeps the first learning rate: read group['lr'] at every step, the training loop "
                "changes it (warmup, cosine)",
}


def _adam_run(AdamW, device, grads, lrs, hyper):
    p = ta.tensor(rng_(2).standard_normal((3, 4)), dtype="float64", device=device, requires_grad=True)
    q = ta.tensor(rng_(3).standard_normal(4), dtype="float64", device=device, requires_grad=True)
    opt = AdamW([{"params": [p], "weight_decay": hyper["weight_decay"]}, {"params": [q], "weight_decay": 0.0}],
                lr=lrs[0], betas=hyper["betas"], eps=hyper["eps"])
    states = []
    for g, lr in zip(grads, lrs):
        for group in opt.param_groups:
            group["lr"] = lr
        p.grad = ta.tensor(g, dtype="float64", device=device)
        q.grad = ta.tensor(g[0], dtype="float64", device=device)
        opt.step()
        states.append((p.numpy().copy(), q.numpy().copy()))
    return states


ADAM_HYPER = dict(betas=(0.8, 0.9), eps=1e-8, weight_decay=0.5)


def _adam_case():
    rng = rng_(4)
    return [rng.standard_normal((3, 4)) for _ in range(4)], [0.1, 0.05, 0.2, 0.1]


def adamw_matches_the_library(mod):
    AdamW = need(mod, "AdamW")
    grads, lrs = _adam_case()
    got = attempt("your AdamW, four steps", lambda: _adam_run(AdamW, "cpu", grads, lrs, ADAM_HYPER))
    expected = _adam_run(ta.optim.AdamW, "cpu", grads, lrs, ADAM_HYPER)
    p0 = rng_(2).standard_normal((3, 4))
    b1, b2 = ADAM_HYPER["betas"]
    for step, ((gp, gq), (ep, eq)) in enumerate(zip(got, expected), start=1):
        try:
            compare(gq, eq, f"a parameter with weight_decay 0 after step {step} (against ta.optim.AdamW)", tol=1e-9)
            compare(gp, ep, f"a parameter with weight_decay 0.5 after step {step} (against ta.optim.AdamW)",
                    tol=1e-9)
        except ExerciseFailure as failure:
            for form, message in ADAMW_WRONG.items():
                wrong = _np_adam(p0, grads, lrs, b1, b2, ADAM_HYPER["eps"], ADAM_HYPER["weight_decay"], form)
                if all(np.allclose(g[0], w, atol=1e-9) for g, w in zip(got, wrong)):
                    raise ExerciseFailure(message) from None
            raise ExerciseFailure(f"{failure} AdamW: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, "
                                  "p *= 1 - lr wd, p -= lr m_hat / (sqrt(v_hat) + eps).") from None


def adamw_skips_missing_gradients(mod):
    AdamW = need(mod, "AdamW")
    p = ta.tensor(np.ones(3), dtype="float64", requires_grad=True)
    q = ta.tensor(np.ones(3), dtype="float64", requires_grad=True)
    opt = AdamW([p, q], lr=0.1, weight_decay=0.1)
    p.grad = ta.tensor(np.ones(3), dtype="float64")
    attempt("AdamW.step() with a parameter whose .grad is None", opt.step,
            hint="Skip parameters with no gradient (p.grad is None): they were not used.")
    compare(q, np.ones(3), "a parameter with no gradient, after a step",
            hint="Skip it: no decay and no update without a gradient, as in PyTorch.")
    q.grad = ta.tensor(np.full(3, 0.5), dtype="float64")              # q's first step is the optimizer's second
    attempt("a second AdamW.step(), with both gradients", opt.step)
    q_lib = ta.tensor(np.ones(3), dtype="float64", requires_grad=True)
    q_lib.grad = q.grad
    ta.optim.AdamW([q_lib], lr=0.1, weight_decay=0.1).step()
    compare(q, q_lib.numpy(), "a parameter after its first step, taken at the optimizer's second step "
            "(against ta.optim.AdamW)", tol=1e-9, hint="Count steps per parameter (t in the state of p, "
            "from 1): a parameter skipped before takes its first step with t = 1.")


def adamw_on_strict(mod):
    AdamW = need(mod, "AdamW")
    grads, lrs = _adam_case()
    on_strict("AdamW, four steps", lambda d: [ta.tensor(a, device=d) for state in _adam_run(AdamW, d, grads, lrs,
                                                                                            ADAM_HYPER) for a in state])


def adamw_keeps_float32(mod):
    """A float32 parameter stays float32, and so do the arrays AdamW keeps for it (m and v)."""
    AdamW, rng = need(mod, "AdamW"), rng_()
    p = ta.tensor(rng.standard_normal((3, 4)), dtype="float32", requires_grad=True)
    opt = AdamW([p], lr=0.1, weight_decay=0.1)
    for step in (1, 2):
        p.grad = ta.tensor(rng.standard_normal((3, 4)), dtype="float32")
        attempt(f"AdamW step {step} on a float32 parameter", opt.step)
        if p.dtype != np.float32:
            raise ExerciseFailure(f"after step {step}, your AdamW turned a float32 parameter into {p.dtype}: keep "
                                  "the moments m and v in the parameter's dtype (xp.zeros_like(p.data)), and every "
                                  "parameter stays float32 (float64 state doubles the memory and slows every step)")
        for state in opt.state.values():
            for key, value in (state.items() if isinstance(state, dict) else ()):
                dtype = getattr(value, "dtype", None)
                if getattr(value, "shape", None) == p.shape and np.dtype(dtype).kind == "f" and dtype != p.dtype:
                    raise ExerciseFailure(f"your AdamW keeps state[{key!r}] of a float32 parameter in {dtype}: the "
                                          "moments m and v have the parameter's dtype (xp.zeros_like(p.data)), float32 "
                                          "here: float64 state doubles the memory and slows every step")


ADAMW = [adamw_matches_the_library, adamw_skips_missing_gradients, adamw_keeps_float32, adamw_on_strict]


# ---------------------------------------------------------------- 16. KV cache
def tiny_gpt(device="cpu"):
    from tinyattn.models import GPT, GPTConfig
    ta.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=11, n_layer=2, n_head=2, n_embd=16)).to(device)
    return model.eval()


def kv_cache_append(mod):
    KVCache, rng = need(mod, "KVCache"), rng_()
    cache = KVCache()
    if len(cache) != 0:
        raise ExerciseFailure(f"len(KVCache()) is {len(cache)}, expected 0")
    k1, v1 = rand(rng, 1, 2, 3, 4), rand(rng, 1, 2, 3, 4)
    k2, v2 = rand(rng, 1, 2, 1, 4), rand(rng, 1, 2, 1, 4)
    attempt("cache.append(k (1, 2, 3, 4), v)", lambda: cache.append(k1, v1))
    k, v = attempt("a second cache.append(k (1, 2, 1, 4), v)", lambda: cache.append(k2, v2),
                   hint="Concatenate the cached and the new keys along the time dim, dim 2 of (B, H, T, D).")
    if k.shape == (1, 2, 1, 4):
        raise ExerciseFailure("after appending 3 positions then 1, append returned only the new one: return the "
                              "cached keys and values followed by the new ones, (B, H, T_past + T_new, D)")
    if k.shape == (1, 4, 3, 4) or k.shape == (2, 2, 3, 4) or k.shape == (1, 2, 3, 8):
        raise ExerciseFailure(f"after appending 3 positions then 1, append returned keys of shape {k.shape}: "
                              "concatenate along the time dim, dim 2 of (B, H, T, D)")
    compare(k, np.concatenate([k1.numpy(), k2.numpy()], 2), "the keys after two appends (3 positions, then 1)")
    compare(v, np.concatenate([v1.numpy(), v2.numpy()], 2), "the values after two appends (3 positions, then 1)")
    if len(cache) != 4:
        raise ExerciseFailure(f"len(cache) after appending 3 positions then 1 is {len(cache)}, expected 4")


def kv_cache_mask(mod):
    KVCache = need(mod, "KVCache")
    like = ta.zeros(1)
    for t_new, t_total in [(2, 5), (3, 3), (1, 4)]:
        what = f"causal_mask({t_new}, {t_total}, like)"
        mask = attempt(what, lambda: KVCache.causal_mask(t_new, t_total, like))
        expected = np.arange(t_total)[None, :] <= np.arange(t_total - t_new, t_total)[:, None]
        got = mask.numpy() if isinstance(mask, ta.Tensor) else None
        if got is None or got.shape != expected.shape:
            raise ExerciseFailure(f"{what} should be a ({t_new}, {t_total}) boolean Tensor, got "
                                  f"{getattr(got, 'shape', type(mask).__name__)}")
        if got.dtype != bool:
            raise ExerciseFailure(f"{what} is {got.dtype}, not boolean: attention adds a float mask to the scores "
                                  "(0 and 1 would change them, not hide keys); return the comparison itself, "
                                  "True where a query may see the key")
        if np.array_equal(got, np.tril(np.ones((t_new, t_total), bool))) and t_new != t_total:
            raise ExerciseFailure(f"{what} lines the new queries up at the top left (query i sees keys <= i); they "
                                  f"are the last {t_new} of {t_total} positions: query i sits at position "
                                  f"t_total - t_new + i and sees the keys up to there")
        if not np.array_equal(got, expected):
            raise ExerciseFailure(f"{what} is wrong: new query i sits at position t_total - t_new + i and may see "
                                  "every key j up to and including that position")


def _cached_logits(model, KVCache, idx, prefill):
    """Logits of each position after the prefill, from a cached run: [(B, V), ...]."""
    caches = [KVCache() for _ in model.h]
    logits, _ = model(idx[:, :prefill], kv_caches=caches)
    out = [logits[:, -1]]
    for t in range(prefill, idx.shape[1]):
        logits, _ = model(idx[:, t:t + 1], kv_caches=caches)
        out.append(logits[:, -1])
    return out


def kv_cache_token_for_token(mod, device="cpu"):
    """Prefill 4 tokens, then one at a time: every step's logits equal the uncached forward's."""
    KVCache = need(mod, "KVCache")
    model = tiny_gpt(device)
    idx = ta.tensor(rng_(6).integers(0, 11, (2, 10)), device=device)
    with ta.no_grad():
        got = attempt("a GPT run with your KVCache (prefill 4 tokens, then 6 one at a time)",
                      lambda: _cached_logits(model, KVCache, idx, 4))
        for step, logits in enumerate(got):
            t = 4 + step
            full, _ = model(idx[:, :t])
            where = "after the 4-token prefill" if step == 0 else f"at token {t} (the {step}th cached step)"
            hint = ("The prefill goes through causal_mask." if step == 0 else
                    "The prefill matched, so the cache loses or misplaces positions when one token is added.")
            compare(logits, full[:, -1].numpy(), f"the cached logits {where} (against the uncached forward)",
                    tol=1e-5, hint=hint)
    return got


def kv_cache_generate(mod):
    """GPT.generate with your KVCache (greedy) writes the same tokens as without a cache."""
    KVCache = need(mod, "KVCache")
    model = tiny_gpt()
    idx = ta.tensor(rng_(7).integers(0, 11, (2, 3)))
    expected = model.generate(idx, 8, temperature=0, use_cache=False).numpy()
    saved = nn.KVCache
    nn.KVCache = KVCache                                    # what GPT.generate builds its caches from
    try:
        got = attempt("GPT.generate with your KVCache", lambda: model.generate(idx, 8, temperature=0)).numpy()
    finally:
        nn.KVCache = saved
    if not np.array_equal(got, expected):
        first = int(np.argwhere((got != expected).any(0))[0, 0])
        raise ExerciseFailure(f"GPT.generate(greedy) with your KVCache writes a different token at position "
                              f"{first} than without a cache")


def kv_cache_on_strict(mod):
    need(mod, "KVCache")
    on_strict("a GPT run with your KVCache", lambda d: kv_cache_token_for_token(mod, d), tol=1e-5)


KV_CACHE = [kv_cache_append, kv_cache_mask, kv_cache_token_for_token, kv_cache_generate, kv_cache_on_strict]
