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
    "rotary_embedding",         # torch has none: tests/nn/test_modern_block.py compares transformers' Llama rotation
}


def test_every_public_name_has_a_case():
    src = "".join(p.read_text() for p in pathlib.Path(__file__).parent.glob("*.py"))
    names = [n for n in dir(ta.Tensor) if not n.startswith("_")] + list(ta.nn.functional.__all__)
    names += ["exp", "log", "sqrt", "tanh", "sigmoid", "relu", "tril", "triu", "clamp", "masked_fill", "chunk",
              "cat", "stack", "split", "where", "matmul", "zeros", "ones", "full", "arange", "tensor", "zeros_like",
              "ones_like", "full_like"]
    missing = [n for n in names if n not in NOT_IN_TORCH_OR_NOT_COMPARABLE and not re.search(r"\." + n + r"\b", src)]
    assert not missing, f"public names with no case in tests/conformance: {missing}"


# ------------------------------------------------------------------ the everyday API of issue 46
def test_dim_dot_clip_and_empty():
    x = sample("float64", (3, 4))
    check(lambda m, t: t.clip(-0.5, 0.5) * t.dim() + m.clip(t, min=0.1) + t.clip(max=0.2), [x])
    check(lambda m, a, b: m.dot(a, b) + a.dot(b * 2), [x[0], x[1]])
    check(lambda m, a, b: a.dot(b), [sample("int64", (5,)), sample("int64", (5,), seed=1)], grad=False)
    check(lambda m, a, b: a.dot(b), [sample("int32", (5,)), sample("int32", (5,), seed=1)], grad=False)
    for make in (lambda m: m.empty(2, 3), lambda m: m.empty((2, 3), dtype=m.int64), lambda m: m.empty(0)):
        check(lambda m: m.zeros_like(make(m)), [], grad=False)             # its shape and dtype (PyTorch: values unset)


def test_clamp_with_tensor_bounds():
    """Tensor bounds broadcast, and the gradient reaches a bound where it binds (min > max: max wins)."""
    x = sample("float64", (3, 4))
    lo = sample("float64", (4,), seed=1) * 0.5 - 0.3
    hi = lo + 0.6
    check(lambda m, t, a, b: t.clamp(a, b), [x, lo, hi])
    check(lambda m, t, a: t.clamp(min=a), [x, lo])
    check(lambda m, t, b: m.clamp(t, max=b) + t.clip(max=b * 0.5), [x, hi])
    check(lambda m, t, a, b: t.clamp(a, b), [x, hi, lo])                # every min above its max
    check(lambda m, t, a: t.clamp(a, 0.1), [x, lo], grad=False)         # a tensor and a number: refused by both


TOPK_X = np.random.default_rng(0).permutation(60).reshape(3, 4, 5) / 7.0 - 4.0     # no ties


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_topk(dim, largest):
    """Values, indices (int64) and the gradient, which reaches the picked elements only."""
    check(lambda m, t: m.topk(t, 2, dim=dim, largest=largest), [TOPK_X])
    check(lambda m, t: t.topk(TOPK_X.shape[dim], dim, largest, True), [TOPK_X])
    check(lambda m, t: t.topk(1, dim, largest).values * 1, [TOPK_X.astype("float32")])


def test_topk_of_integers_nan_0_d_and_unsorted():
    check(lambda m, t: t.topk(2), [np.array([[3, -1, 7, 2], [0, 5, -2, 4]])], grad=False)
    check(lambda m, t: t.topk(2), [np.array([[1.0, np.nan, 3.0, 2.0]])])           # NaN counts as the largest
    check(lambda m, t: t.topk(2, largest=False), [np.array([[1.0, np.nan, 3.0, 2.0]])])
    check(lambda m, t: t.topk(1), [np.array(2.5)])
    check(lambda m, t: t.topk(0, 1).values, [TOPK_X])
    import torch
    for t in (ta.tensor(TOPK_X, dtype="float64"), torch.tensor(TOPK_X)):
        values, indices = t.topk(3, dim=2, sorted=False)                             # in any order: compare as sets
        np.testing.assert_array_equal(np.sort(values.numpy(), -1), np.sort(TOPK_X, -1)[..., 2:])
        np.testing.assert_array_equal(np.sort(indices.numpy(), -1), np.sort(np.argsort(-TOPK_X, -1)[..., :3], -1))


def test_multinomial_is_torch_s_distribution():
    """Frequencies over many draws, against PyTorch's and against the weights (the values differ:
    each library draws from its own generator)."""
    import torch
    weights = np.array([1.0, 0.0, 3.0, 6.0])                 # need not add up to 1; category 1 never drawn
    n = 20000
    ta.manual_seed(0)
    torch.manual_seed(0)
    ours = ta.multinomial(ta.tensor(weights), n, replacement=True)
    theirs = torch.multinomial(torch.tensor(weights), n, replacement=True)
    assert ours.dtype == ta.int64 and ours.shape == (n,)
    f_ours, f_theirs = (np.bincount(s.numpy(), minlength=4) / n for s in (ours, theirs))
    np.testing.assert_allclose(f_ours, weights / weights.sum(), atol=0.015)
    np.testing.assert_allclose(f_ours, f_theirs, atol=0.02)
    assert f_ours[1] == 0
    # without replacement: the first two draws of each of n rows, as ordered pairs
    rows = np.tile(weights, (n, 1))
    ours = ta.tensor(rows).multinomial(2).numpy()
    theirs = torch.tensor(rows).multinomial(2).numpy()
    assert ours.shape == (n, 2) and (ours[:, 0] != ours[:, 1]).all()
    p = weights / weights.sum()
    exact = np.array([[p[i] * p[j] / (1 - p[i]) if i != j else 0.0 for j in range(4)] for i in range(4)])
    pairs = [np.bincount(s[:, 0] * 4 + s[:, 1], minlength=16).reshape(4, 4) / n for s in (ours, theirs)]
    np.testing.assert_allclose(pairs[0], exact, atol=0.015)
    np.testing.assert_allclose(pairs[0], pairs[1], atol=0.02)
    # every category, zeros last (as PyTorch)
    assert ta.multinomial(ta.tensor(weights), 4).tolist()[3] == 1
    assert torch.multinomial(torch.tensor(weights), 4).tolist()[3] == 1


def test_multinomial_follows_manual_seed():
    p = ta.tensor([[0.2, 0.3, 0.5], [0.9, 0.05, 0.05]])
    ta.manual_seed(3)
    first = [ta.multinomial(p, 5, replacement=True).tolist(), p.multinomial(3).tolist()]
    ta.manual_seed(3)
    assert [ta.multinomial(p, 5, replacement=True).tolist(), p.multinomial(3).tolist()] == first


# ------------------------------------------------------------------ optimizers and schedulers
def two_groups(lib, make_optimizer):
    """An optimizer of two parameter groups (rates 0.1 and 0.02) over fixed weights, with PyTorch's
    or tinyattn's classes: lib is ta or torch."""
    rng = np.random.default_rng(0)
    params = [lib.tensor(rng.standard_normal(s), dtype=lib.float64, requires_grad=True) for s in ((3, 4), (4,), (2,))]
    return make_optimizer(lib.optim, [{"params": params[:2]}, {"params": params[2:], "lr": 0.02}]), params


OPTIMIZERS = {
    "SGD": lambda o, g: o.SGD(g, lr=0.1),
    "SGD momentum, dampening, weight_decay": lambda o, g: o.SGD(g, lr=0.1, momentum=0.9, dampening=0.3, weight_decay=0.01),
    "SGD nesterov": lambda o, g: o.SGD(g, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "Adam": lambda o, g: o.Adam(g, lr=0.1),
    "Adam weight_decay (L2)": lambda o, g: o.Adam(g, lr=0.1, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    "Adam amsgrad": lambda o, g: o.Adam(g, lr=0.1, weight_decay=0.05, amsgrad=True),
    "AdamW": lambda o, g: o.AdamW(g, lr=0.1, weight_decay=0.1),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_optimizer_steps_match(name):
    """Ten steps on a quadratic whose gradients change sign, both groups, then the saved state."""
    import torch
    results = []
    for lib in (ta, torch):
        opt, params = two_groups(lib, OPTIMIZERS[name])
        for _ in range(10):
            opt.zero_grad()
            sum(((p - 0.3) ** 2 * (i + 1)).sum() + (p ** 3).sum() for i, p in enumerate(params)).backward()
            opt.step()
        results.append([p.detach().numpy() for p in params])
    for a, t in zip(*results):
        np.testing.assert_allclose(a, t, rtol=1e-12, atol=1e-14)


def test_optimizer_checks():
    import torch
    for lib in (ta, torch):
        w = [lib.zeros(2, requires_grad=True)]
        for bad in (dict(nesterov=True), dict(momentum=0.9, dampening=0.1, nesterov=True), dict(lr=-0.1)):
            with pytest.raises(ValueError):
                lib.optim.SGD(w, **bad)
        for bad in (dict(weight_decay=-1), dict(betas=(1.0, 0.9)), dict(eps=-1)):
            with pytest.raises(ValueError):
                lib.optim.Adam(w, **bad)
        assert lib.optim.Adam(w).defaults["weight_decay"] == 0 and lib.optim.SGD(w).defaults["lr"] == 1e-3


SCHEDULERS = {
    "LambdaLR": lambda s, o: s.LambdaLR(o, lambda t: 0.95 ** t),
    "LambdaLR, one per group": lambda s, o: s.LambdaLR(o, [lambda t: 1 / (1 + t), lambda t: 0.5 + (t % 7)]),
    "StepLR": lambda s, o: s.StepLR(o, step_size=7, gamma=0.5),
    "MultiStepLR": lambda s, o: s.MultiStepLR(o, milestones=[30, 10, 10, 45], gamma=0.3),
    "LinearLR": lambda s, o: s.LinearLR(o, start_factor=0.1, end_factor=0.8, total_iters=12),
    "LinearLR, defaults": lambda s, o: s.LinearLR(o),
    "CosineAnnealingLR": lambda s, o: s.CosineAnnealingLR(o, T_max=20, eta_min=0.001),  # past T_max: up again
    "SequentialLR: warmup, then cosine": lambda s, o: s.SequentialLR(
        o, [s.LinearLR(o, start_factor=0.01, total_iters=10), s.CosineAnnealingLR(o, T_max=40)], milestones=[10]),
    "SequentialLR of three": lambda s, o: s.SequentialLR(
        o, [s.LambdaLR(o, lambda t: 1.0 + t), s.StepLR(o, 4), s.MultiStepLR(o, [3, 5], 0.5)], milestones=[5, 25]),
    "OneCycleLR": lambda s, o: s.OneCycleLR(o, max_lr=[0.5, 0.1], total_steps=50),
    "OneCycleLR, linear, three phases": lambda s, o: s.OneCycleLR(
        o, max_lr=0.4, epochs=10, steps_per_epoch=5, pct_start=0.25, anneal_strategy="linear", three_phase=True,
        base_momentum=0.8, max_momentum=[0.9, 0.95]),
}
PLATEAU = {
    "ReduceLROnPlateau": lambda s, o: s.ReduceLROnPlateau(o, patience=2, cooldown=1, factor=0.5, min_lr=[0.0, 0.004]),
    "ReduceLROnPlateau, max, abs": lambda s, o: s.ReduceLROnPlateau(o, mode="max", patience=0, threshold=0.05,
                                                                    threshold_mode="abs", eps=0.01),
}
METRIC = [1.0 - 0.02 * t + 0.3 * ((t * 7) % 5 == 0) for t in range(60)]         # falls, with bumps


def run_schedule(lib, make_optimizer, make, steps, start=0, saved=None):
    """The rates (and momenta) after making the scheduler and after each of ``steps`` steps; from
    ``saved`` (the optimizer's and the scheduler's state after ``start`` steps), when given."""
    opt, _ = two_groups(lib, make_optimizer)
    sched = make(lib.optim.lr_scheduler, opt)
    if saved is not None:
        opt.load_state_dict(saved[0])
        sched.load_state_dict(saved[1])
    def now():
        group = opt.param_groups[1]
        return list(sched.get_last_lr()) + [group.get("momentum", group.get("betas", (0,))[0])]
    rates = [] if saved is not None else [now()]
    for t in range(start, start + steps):
        opt.step()
        sched.step(METRIC[t]) if "Plateau" in type(sched).__name__ else sched.step()
        rates.append(now())
    return rates, (opt.state_dict(), sched.state_dict())


@pytest.mark.parametrize("optimizer", ["SGD momentum, dampening, weight_decay", "AdamW"])
@pytest.mark.parametrize("name", list(SCHEDULERS) + list(PLATEAU))
def test_scheduler_rates_match_over_a_whole_schedule(name, optimizer):
    """50 steps, two parameter groups: PyTorch's rates (and OneCycleLR's momenta); then the same
    schedule stopped after 20 steps, saved, and resumed in a new optimizer and scheduler."""
    import torch
    make = {**SCHEDULERS, **PLATEAU}[name]
    want, _ = run_schedule(torch, OPTIMIZERS[optimizer], make, 50)
    got, _ = run_schedule(ta, OPTIMIZERS[optimizer], make, 50)
    np.testing.assert_allclose(np.array(got, float), np.array(want, float), rtol=1e-12, atol=1e-15)
    first, saved = run_schedule(ta, OPTIMIZERS[optimizer], make, 20)
    rest, _ = run_schedule(ta, OPTIMIZERS[optimizer], make, 30, start=20, saved=saved)
    np.testing.assert_allclose(np.array(first + rest, float), np.array(want, float), rtol=1e-12, atol=1e-15)


def test_scheduler_checks():
    import torch
    for lib in (ta, torch):
        opt, _ = two_groups(lib, OPTIMIZERS["SGD"])
        s = lib.optim.lr_scheduler
        for make, error in [(lambda: s.LinearLR(opt, start_factor=0), ValueError),
                            (lambda: s.LinearLR(opt, end_factor=1.5), ValueError),
                            (lambda: s.LambdaLR(opt, [lambda t: 1.0]), ValueError),
                            (lambda: s.SequentialLR(opt, [s.StepLR(opt, 2)], milestones=[3]), ValueError),
                            (lambda: s.SequentialLR(opt, [s.ReduceLROnPlateau(opt), s.StepLR(opt, 2)], [3]), ValueError),
                            (lambda: s.OneCycleLR(opt, 0.1), ValueError),
                            (lambda: s.ReduceLROnPlateau(opt, factor=1.0), ValueError),
                            (lambda: s.StepLR(object(), 2), TypeError),
                            (lambda: s.StepLR(lib.optim.SGD([lib.zeros(1, requires_grad=True)]), 2, last_epoch=3),
                             KeyError)]:
            with pytest.raises(error):
                make()
        one_cycle = s.OneCycleLR(opt, 0.1, total_steps=2)
        for _ in range(2):
            opt.step()
            one_cycle.step()
        with pytest.raises(ValueError):
            one_cycle.step()
