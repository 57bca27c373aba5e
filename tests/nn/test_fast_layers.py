"""The fast layers (tinyattn/fast/modules.py and fast/models.py), which run for a model made by
``ta.compile``: a GPT's attention, MLP and block as a few array calls where no graph is recorded,
each block as one op in training, the teaching forward everywhere else.

Each test compares the compiled model with the same model not compiled (the teaching path: every
op's formula, no runner), and counts with spies which path ran, so that no comparison is the
teaching path against itself. Nothing here turns the fast ops on outside a compiled call: each
test compiles what it tests (a model, a layer, or a function of ops).
"""
import collections
import contextlib
import importlib.util

import numpy as np
import pytest

import tinyattn as ta
import tinyattn.nn as nn
from exercise_solutions import kv_cache as learner_kv_cache
from exercise_solutions import lora as learner_lora
from tinyattn.backend import get_backend
from tinyattn.fast import checked
from tinyattn.fast import models as fast_models
from tinyattn.fast import modules as fast_modules
from tinyattn.fast import ops as fast_ops
from tinyattn.fast.compiled import CompiledModule
from tinyattn.models import GPT, GPTConfig, gpt
from tinyattn.nn import attention

TOL = {"float32": dict(rtol=1e-5, atol=1e-5), "float64": dict(rtol=1e-12, atol=1e-12)}
PATHS = ("attention", "mlp", "block", "gpt")


def gpt_model(dtype="float32", **kw):
    """A small GPT in eval mode, not compiled. init="default" (Embedding N(0, 1), uniform Linears):
    logits of order one, so a wrong product or a missing bias shows; the layer norms' weights and
    biases moved off 1 and 0, so that each layer norm is its own."""
    ta.manual_seed(0)
    cfg = dict(block_size=64, vocab_size=13, n_layer=2, n_head=2, n_embd=16, init="default")
    cfg.update(kw)
    model = GPT(GPTConfig(**cfg)).eval()
    rng = np.random.default_rng(2)
    for name, p in model.named_parameters():
        if ".ln_" in name or name.startswith("ln_"):
            p.data = p.data + 0.2 * rng.standard_normal(p.shape).astype(p.dtype)
        p.data = p.data.astype(dtype)
    return model


def random_ids(B, T, vocab=13, seed=1):
    return ta.tensor(np.random.default_rng(seed).integers(0, vocab, (B, T)))


def no_graph(mode):
    return ta.no_grad() if mode == "no_grad" else ta.inference_mode()


def attributes(model):
    """{path: the names in the layer's __dict__} of every layer: what compiling may not add to."""
    return {name: set(m.__dict__) for name, m in model.named_modules()}


@pytest.fixture(autouse=True)
def nothing_left_compiled():
    """After each test, no layer's runner and no fast op is left on: they run only inside a call."""
    yield
    assert ta.autograd.compiled.layers is None
    assert not ta.autograd.compiled.ops


@pytest.fixture
def array_paths(monkeypatch):
    """Counts of the array paths that ran: "attention" (fast MultiHeadAttention's products),
    "mlp" (fast MLP's products), "block" (fast Block's layer norms by the kernel), "gpt" (fast
    GPT's final layer norm and head)."""
    calls = collections.Counter()

    def counted(name, fn):
        def spy(*args):
            out = fn(*args)
            if out is not None:                  # (_layer_norm declines with None: the Block falls back)
                calls[name] += 1
            return out
        return spy

    monkeypatch.setattr(fast_modules, "linear_on_arrays", counted("attention", fast_modules.linear_on_arrays))
    monkeypatch.setattr(fast_models, "linear_on_arrays", counted("mlp", fast_models.linear_on_arrays))
    monkeypatch.setattr(fast_models, "_layer_norm", counted("block", fast_models._layer_norm))
    monkeypatch.setattr(fast_models, "_logits", counted("gpt", fast_models._logits))
    return calls


@pytest.fixture
def runner_calls(monkeypatch):
    """Counts of the runners called in place of a layer's forward, by the layer's class name."""
    calls = collections.Counter()
    call = fast_modules.Runner.__call__

    def counted(self, module, args, kwargs):
        calls[type(module).__name__] += 1
        return call(self, module, args, kwargs)
    monkeypatch.setattr(fast_modules.Runner, "__call__", counted)
    return calls


@pytest.fixture(params=["kernels", "numpy"])
def kernels(request, monkeypatch):
    """With the CPU's fused kernels, and without (the attention formula on arrays; the Block and
    MLP, which need the layer norm and GELU kernels, fall back)."""
    cpu = get_backend("cpu")
    if request.param == "kernels" and not cpu.kernels:
        pytest.skip("no CPU kernels here (numba is not installed, or TINYATTN_CPU_KERNELS=0)")
    monkeypatch.setattr(cpu, "use_kernels", request.param == "kernels")
    return request.param


def expected_paths(kernels):
    return set(PATHS) if kernels == "kernels" else {"attention"}


def paths_here():
    """The array paths that a GPT's no-graph forward takes on this machine: the MLP and the Block
    need the CPU's GELU and layer norm kernels (numba, the ``fast`` extra)."""
    return expected_paths("kernels" if get_backend("cpu").kernel("gelu_tanh") else "numpy")


def decode(model, idx, ends, cache=nn.KVCache):
    """Logits (B, T, V) of idx run through one KV cache a block: idx[:, :ends[0]] first, then up to
    each next end."""
    caches = [cache() for _ in model.h]
    out, start = [], 0
    for end in ends:
        out.append(model(idx[:, start:end], kv_caches=caches)[0].numpy())
        start = end
    return np.concatenate(out, axis=1)


PROMPT_THEN_TOKENS = [10, 13] + list(range(14, 41))   # a prompt, a chunk of 3, then one at a time past 16 and 32


# ---------------------------------------------------------------- what ta.compile sets, and says
def test_compile_keeps_every_class_sets_nothing_on_the_layers_and_gives_the_librarys_layers_a_runner(runner_calls):
    model = gpt_model()
    block = model.h[0]
    seen = []                                                           # the compiled layers, seen by lm_head
    model.lm_head.forward = lambda x, head=model.lm_head: seen.append(ta.autograd.compiled.layers) or nn.Linear.forward(head, x)
    before = attributes(model)
    compiled = ta.compile(model)
    assert isinstance(compiled, CompiledModule) and compiled._orig_mod is model and ta.compile(compiled) is compiled
    assert type(model) is gpt.GPT and type(block) is gpt.Block and type(block.mlp) is gpt.MLP
    assert type(block.attn) is attention.MultiHeadAttention
    assert compiled.h is model.h and compiled.config is model.config
    assert [id(p) for p in compiled.parameters()] == [id(p) for p in model.parameters()]
    assert list(compiled.state_dict()) == list(model.state_dict())     # (no _orig_mod. prefix)
    assert compiled.train() is compiled and model.training and block.attn.training
    compiled.eval()
    assert not model.training and not block.mlp.training
    idx = random_ids(1, 4)
    with ta.inference_mode():
        fast = compiled(idx)[0].numpy()
    (layers,) = seen                                                    # during the call: {layer: runner}
    assert {m: type(r) for m, r in layers.items()} == {
        **{model: fast_models.GPT}, **{b: fast_models.Block for b in model.h},
        **{b.mlp: fast_models.MLP for b in model.h}, **{b.attn: fast_modules.MultiHeadAttention for b in model.h}}
    assert runner_calls["GPT"] == 1 and runner_calls["Block"] == 2 and runner_calls["MultiHeadAttention"] == 2
    assert ta.autograd.compiled.layers is None                                  # and after it, nothing
    repr(compiled)
    assert attributes(model) == before                                  # nothing set on any layer
    assert not [m for m in model.modules() if "_fused" in m.__dict__]
    runner_calls.clear()
    with ta.inference_mode():
        plain = model(idx)[0].numpy()                                   # the model itself runs no runner
    assert seen[1:] == [None] and not runner_calls and attributes(model) == before
    np.testing.assert_allclose(fast, plain, **TOL["float32"])


def test_print_compiled_says_which_blocks_run_fused_and_why_not_and_print_model_says_nothing(capsys):
    model = gpt_model(n_layer=3)
    model.h[1].ln_2 = RMSNorm(16)
    model.h[2].mlp.gelu = nn.GELU("none")
    plain = repr(model)
    compiled = ta.compile(model)
    print(compiled)
    text = capsys.readouterr().out
    header = ", ".join(f"{path}: on" for path in checked.DEPENDS)
    first_lines = f"CompiledModule({header}\n  (_orig_mod): GPT(fused: on arrays where no graph is recorded\n"
    assert text.startswith(first_lines), text
    assert "the fast ops: on, the fused layers: on" in text
    blocks = [line for line in text.splitlines() if line.strip().startswith("(") and "Block(" in line]
    assert len(blocks) == 3, text
    one_op = "one op in training" if get_backend("cpu").kernel("block") else "no block kernel here"
    assert one_op in blocks[0] and "off" not in blocks[0].replace("one op in training: off, no block kernel", "")
    assert "fused: off, ln_2 is RMSNorm, not the library's LayerNorm" in blocks[1], blocks[1]
    assert "one op in training: off, its activation is not the library's GELU(approximate='tanh')" in blocks[2]
    mlps = [line.strip() for line in text.splitlines() if "(mlp): MLP(" in line]
    attns = [line.strip() for line in text.splitlines() if "(attn): MultiHeadAttention(" in line]
    assert mlps[:2] == ["(mlp): MLP(fused: on arrays where no graph is recorded"] * 2, mlps
    assert mlps[2] == "(mlp): MLP(fused: off, its activation is not the library's GELU(approximate='tanh')", mlps
    assert attns == ["(attn): MultiHeadAttention(fused: on arrays where no graph is recorded"] * 3, attns
    assert text.count("fused:") == 1 + 3 + 3 + 3                        # the GPT, its blocks, MLPs and attentions
    assert text.endswith("\n)\n")
    # the model inside, its notes taken out, is the model's own print
    inner = text[text.index("GPT("):-len("\n)\n")].replace("\n  ", "\n")
    unnoted = "\n".join(line.split("(fused: ")[0] + "(" if "(fused: " in line else line for line in inner.splitlines())
    assert unnoted == plain
    print(model)                                                        # the model itself: no notes
    assert "fused" not in capsys.readouterr().out and "fused" not in plain and repr(model) == plain
    assert repr(nn.LayerNorm(4)) == "LayerNorm((4,), eps=1e-05)"                # (layers without a runner)


class RMSNorm(nn.Module):
    """A norm of the learner's own (exercise 1)."""

    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(ta.ones(n))

    def forward(self, x):
        return x * ((x * x).mean(-1, keepdim=True) + 1e-5) ** -0.5 * self.weight


class MyMLP(nn.Module):
    """An MLP of the learner's own (ReLU), counting its calls without setting an attribute."""

    def __init__(self, n, dtype):
        super().__init__()
        self.c_fc, self.c_proj = nn.Linear(n, 2 * n), nn.Linear(2 * n, n)
        for p in self.parameters():
            p.data = p.data.astype(dtype)
        self.calls = []

    def forward(self, x):
        self.calls.append(x.shape)
        return self.c_proj(self.c_fc(x).relu())


def a_library_mlp(model, dtype):
    """A new MLP of the library's own, its weights not the model's."""
    ta.manual_seed(7)
    mlp = gpt.MLP(model.config)
    for p in mlp.parameters():
        p.data = (p.data + 0.1).astype(dtype)
    return mlp


@pytest.mark.parametrize("new", ["MyMLP", "a new library MLP"])
def test_a_layer_replaced_after_compile_runs_at_the_next_call(new, array_paths, runner_calls):
    """The runners are found again after any layer's attribute is set: the new layer's forward
    runs (a learner's), or its runner (the library's), never the old layer's."""
    model = gpt_model("float64")
    compiled = ta.compile(model)
    idx = random_ids(3, 20)
    with ta.inference_mode():
        before = compiled(idx)[0].numpy()
    assert array_paths["mlp"] == (4 if "mlp" in paths_here() else 0)     # two products, in each of two MLPs
    old = compiled.h[0].mlp
    mlp = MyMLP(16, "float64") if new == "MyMLP" else a_library_mlp(model, "float64")
    compiled.h[0].mlp = mlp
    assert model.h[0].mlp is mlp
    array_paths.clear()
    runner_calls.clear()
    with ta.inference_mode():
        fast = compiled(idx)[0].numpy()
    if new == "MyMLP":
        assert mlp.calls == [(3, 20, 16)] and runner_calls["MLP"] == 1          # the other block's MLP
        assert set(array_paths) == paths_here(), array_paths
        assert array_paths["mlp"] == (2 if "mlp" in paths_here() else 0)
        text = repr(compiled)
        assert "(mlp): MyMLP(\n" in text and "mlp is MyMLP, not the library's MLP" in text, text
    else:
        assert runner_calls["MLP"] == 2 and array_paths["mlp"] == (4 if "mlp" in paths_here() else 0)
    assert old not in [m for m in model.modules()]
    assert np.abs(fast - before).max() > 1e-3                           # the new layer changes the logits
    array_paths.clear()
    with ta.inference_mode():
        teaching = model(idx)[0].numpy()
    assert not array_paths
    np.testing.assert_allclose(fast, teaching, **TOL["float64"])


# ---------------------------------------------------------------- the same numbers both ways
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("B", [1, 3])
def test_logits_on_arrays_match_the_teaching_path(dtype, mode, B, kernels, array_paths):
    model = gpt_model(dtype)
    idx = random_ids(B, 20)
    with no_graph(mode):
        fast = ta.compile(model)(idx)[0]
    assert set(array_paths) == expected_paths(kernels), array_paths
    assert fast.dtype == dtype and not fast.requires_grad
    array_paths.clear()
    with no_graph(mode):
        teaching = model(idx)[0]
    assert not array_paths
    np.testing.assert_allclose(fast.numpy(), teaching.numpy(), **TOL[dtype])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("B", [1, 3])
def test_logits_through_the_kv_cache_match_the_teaching_path(dtype, mode, B, kernels, array_paths):
    model = gpt_model(dtype)
    idx = random_ids(B, 40)
    with no_graph(mode):
        fast = decode(ta.compile(model), idx, PROMPT_THEN_TOKENS)
    assert set(array_paths) == expected_paths(kernels), array_paths
    array_paths.clear()
    with no_graph(mode):
        teaching = decode(model, idx, PROMPT_THEN_TOKENS)
        whole = model(idx)[0].numpy()                                   # (and the cache changes nothing)
    assert not array_paths
    np.testing.assert_allclose(fast, teaching, **TOL[dtype])
    np.testing.assert_allclose(fast, whole, **TOL[dtype])


@pytest.mark.parametrize("B", [1, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_greedy_generate_writes_the_same_tokens_both_ways_and_leaves_the_model_as_it_was(B, dtype, array_paths,
                                                                                          runner_calls):
    model = gpt_model(dtype, block_size=32).train()                     # (generate puts the mode back)
    before = attributes(model)
    idx = random_ids(B, 5)
    teaching = model.generate(idx, 40, temperature=0).numpy()           # past 16 and 32: the window slides
    assert not array_paths and not runner_calls                         # the plain model: no runner ran
    assert ta.autograd.compiled.layers is None and attributes(model) == before and model.training
    uncached = model.generate(idx, 40, temperature=0, use_cache=False).numpy()
    fast = ta.compile(model).generate(idx, 40, temperature=0).numpy()
    assert array_paths["attention"] > 0 and runner_calls["GPT"] == 40
    assert ta.autograd.compiled.layers is None and attributes(model) == before and model.training
    np.testing.assert_array_equal(fast, teaching)
    np.testing.assert_array_equal(fast, uncached)


def test_without_biases_the_block_falls_back_and_the_logits_still_match(array_paths):
    """bias=False: Linears without a bias run on arrays; a LayerNorm without one has no kernel,
    so the Block runs its teaching forward around the fast attention and MLP, and the GPT its
    final layer norm and head."""
    model = gpt_model("float64", bias=False)
    compiled = ta.compile(model)
    block = model.h[0]
    assert block.attn.c_attn.bias is None and block.mlp.c_fc.bias is None and block.ln_1.bias is None
    idx = random_ids(3, 40)
    with ta.inference_mode():
        fast = compiled(idx)[0].numpy()
        fast_cached = decode(compiled, idx, PROMPT_THEN_TOKENS)
    assert set(array_paths) == paths_here() - {"block", "gpt"}, array_paths
    array_paths.clear()
    with ta.inference_mode():
        teaching = model(idx)[0].numpy()
    assert not array_paths
    np.testing.assert_allclose(fast, teaching, **TOL["float64"])
    np.testing.assert_allclose(fast_cached, teaching, **TOL["float64"])


def test_exact_gelu_takes_the_teaching_mlp_and_the_logits_still_match(array_paths):
    model = gpt_model("float64", gelu="none")
    idx = random_ids(3, 20)
    with ta.inference_mode():
        fast = ta.compile(model)(idx)[0].numpy()
    assert set(array_paths) == paths_here() - {"mlp"}, array_paths
    array_paths.clear()
    with ta.inference_mode():
        teaching = model(idx)[0].numpy()
    assert not array_paths
    np.testing.assert_allclose(fast, teaching, **TOL["float64"])


def test_frozen_parameters_with_grad_on_run_on_arrays(array_paths):
    """Grad on but nothing requires grad: no graph can be recorded, so the arrays serve."""
    model = gpt_model("float64")
    for p in model.parameters():
        p.requires_grad = False
    idx = random_ids(3, 20)
    fast = ta.compile(model)(idx)[0]
    assert not fast.requires_grad and set(array_paths) == paths_here()
    array_paths.clear()
    teaching = model(idx)[0].numpy()
    assert not array_paths
    np.testing.assert_allclose(fast.numpy(), teaching, **TOL["float64"])


# ---------------------------------------------------------------- where the teaching forward runs
def test_training_runs_the_teaching_forward_and_gives_the_teaching_gradients(array_paths):
    model = gpt_model("float64").train()                                # dropout 0: only the graph stops it
    compiled = ta.compile(model)
    idx, targets = random_ids(3, 20), random_ids(3, 20, seed=2)
    _, loss = compiled(idx, targets)
    loss.backward()
    assert not array_paths
    grads = {name: p.grad.numpy() for name, p in model.named_parameters()}
    model.zero_grad()
    _, teaching_loss = model(idx, targets)
    teaching_loss.backward()
    np.testing.assert_allclose(loss.item(), teaching_loss.item(), rtol=1e-12)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), **TOL["float64"], err_msg=name)


def test_an_input_that_requires_grad_runs_the_teaching_forward(array_paths, runner_calls):
    """Frozen parameters, but the input wants a gradient (as for a saliency map)."""
    ta.manual_seed(0)
    mha = nn.MultiHeadAttention(16, 2).eval()
    for p in mha.parameters():
        p.requires_grad = False
    x = ta.randn(2, 5, 16, requires_grad=True)
    ta.compile(mha)(x, is_causal=True).sum().backward()
    assert runner_calls["MultiHeadAttention"] == 1                      # (asked, and it declined)
    assert not array_paths and x.grad is not None and np.abs(x.grad.numpy()).sum() > 0
    fast, x.grad = x.grad.numpy(), None
    mha(x, is_causal=True).sum().backward()
    np.testing.assert_allclose(fast, x.grad.numpy(), **TOL["float32"])


@pytest.mark.parametrize("watch", ["profile", "detect_anomaly"])
def test_under_a_profiler_or_anomaly_detection_every_op_is_recorded(watch, array_paths):
    model = gpt_model(n_layer=1)
    compiled = ta.compile(model)
    idx = random_ids(3, 20)
    with ta.no_grad():
        fast = compiled(idx)[0].numpy()
    assert array_paths
    array_paths.clear()
    with ta.no_grad(), (ta.profile() if watch == "profile" else ta.detect_anomaly()) as watching:
        watched = compiled(idx)[0].numpy()
    assert not array_paths
    np.testing.assert_allclose(watched, fast, **TOL["float32"])
    if watch == "profile":
        calls = {name: row["calls"] for name, row in watching.key_averages().items()}
        # c_attn, c_proj, c_fc, c_proj and lm_head; ln_1, ln_2 and ln_f
        assert calls["Linear"] == 5 and calls["LayerNorm"] == 3, calls
        assert calls["Attention"] == 1 and calls["GeluTanh"] == 1, calls


def test_keep_weights_runs_the_teaching_forward_and_keeps_them(array_paths):
    ta.manual_seed(0)
    mha = nn.MultiHeadAttention(16, 2).eval()
    compiled = ta.compile(mha)
    x = ta.randn(3, 7, 16)
    with ta.no_grad():
        fast = compiled(x, is_causal=True).numpy()
        assert array_paths["attention"] > 0
        array_paths.clear()
        compiled.keep_weights = True                                    # (set on the layer itself)
        assert mha.keep_weights
        kept = compiled(x, is_causal=True).numpy()
    assert not array_paths
    np.testing.assert_allclose(kept, fast, **TOL["float32"])
    w = mha.last_weights.numpy()
    assert w.shape == (3, 2, 7, 7)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)
    assert np.all(w[..., np.triu_indices(7, 1)[0], np.triu_indices(7, 1)[1]] == 0)   # causal


@pytest.mark.parametrize("mask", ["none", "not causal", "boolean", "additive"])
def test_attention_that_is_not_just_causal_runs_the_teaching_forward(mask, array_paths):
    ta.manual_seed(0)
    mha = nn.MultiHeadAttention(16, 2).eval()
    x = ta.randn(3, 7, 16)
    rng = np.random.default_rng(4)
    allowed = rng.random((7, 7)) < 0.6
    allowed[:, 0] = True
    kwargs = {"none": dict(is_causal=True), "not causal": dict(),
              "boolean": dict(attn_mask=ta.tensor(allowed)),
              "additive": dict(attn_mask=ta.tensor(rng.standard_normal((7, 7)), dtype="float32"))}[mask]
    with ta.inference_mode():
        fast = ta.compile(mha)(x, **kwargs).numpy()
    assert array_paths["attention"] == (2 if mask == "none" else 0)
    array_paths.clear()
    with ta.inference_mode():
        teaching = mha(x, **kwargs).numpy()
    assert not array_paths
    np.testing.assert_allclose(fast, teaching, **TOL["float32"])


class ShiftedLinear(nn.Linear):
    """A Linear with a vector added (as a LoRA adapter adds its update), counting its calls."""

    def forward(self, x):
        self.calls = getattr(self, "calls", 0) + 1
        return super().forward(x) + self.shift       # (not the same in every channel: a LayerNorm would undo that)


def with_adapter(layer, kind):
    """``layer``'s weights inside a Linear subclass, or the reference LoRALinear (exercise 17) with B nonzero."""
    if kind == "Linear subclass":
        adapted = ShiftedLinear(layer.in_features, layer.out_features, bias=layer.bias is not None)
        adapted.weight, adapted.bias = layer.weight, layer.bias
        adapted.shift = ta.tensor(np.linspace(-0.5, 0.5, layer.out_features), dtype=layer.weight.dtype)
        return adapted
    ta.manual_seed(3)
    adapted = learner_lora.LoRALinear(layer, r=2)
    adapted.A.data = adapted.A.data.astype(layer.weight.dtype)
    adapted.B.data = (ta.randn(*adapted.B.shape).data * 0.5).astype(layer.weight.dtype)
    adapted.forward = counting_forward(adapted, adapted.forward)
    return adapted


def counting_forward(module, forward):
    def counted(*args):
        module.calls = getattr(module, "calls", 0) + 1
        return forward(*args)
    return counted


@pytest.mark.parametrize("kind", ["Linear subclass", "LoRALinear"])
@pytest.mark.parametrize("where", ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"])
def test_an_adapter_in_place_of_a_linear_is_called(where, kind, array_paths):
    """The adapter is set after compile, and after a compiled call: the next call runs it."""
    model = gpt_model("float64", n_layer=1)
    compiled = ta.compile(model)
    idx = random_ids(3, 20)
    with ta.inference_mode():
        plain = compiled(idx)[0].numpy()
    layer_name, linear_name = where.split(".")
    layer = getattr(compiled.h[0], layer_name)
    adapter = with_adapter(getattr(layer, linear_name), kind)
    setattr(layer, linear_name, adapter)
    array_paths.clear()
    with ta.inference_mode():
        fast = compiled(idx)[0].numpy()
        fast_cached = decode(compiled, idx, [10] + list(range(11, 21)))
    assert adapter.calls == 1 + 11
    assert set(array_paths) == paths_here() - {"attention" if layer_name == "attn" else "mlp"}, array_paths
    assert np.abs(fast - plain).max() > 1e-3                            # the adapter changes the logits
    array_paths.clear()
    with ta.inference_mode():
        teaching = model(idx)[0].numpy()
    assert not array_paths and adapter.calls == 1 + 11 + 1
    np.testing.assert_allclose(fast, teaching, **TOL["float64"])
    np.testing.assert_allclose(fast_cached, teaching, **TOL["float64"])


def test_a_learners_kv_cache_is_used_through_the_teaching_path(array_paths, monkeypatch):
    model = gpt_model()
    compiled = ta.compile(model)
    idx = random_ids(3, 40)
    with ta.inference_mode():
        library = decode(compiled, idx, PROMPT_THEN_TOKENS)
        greedy = compiled.generate(idx[:, :5], 30, temperature=0).numpy()
    assert array_paths["attention"] > 0
    array_paths.clear()
    appends = collections.Counter()
    append = learner_kv_cache.KVCache.append

    def counted_append(self, k, v):
        appends["append"] += 1
        return append(self, k, v)
    monkeypatch.setattr(learner_kv_cache.KVCache, "append", counted_append)
    with ta.inference_mode():
        learners = decode(compiled, idx, PROMPT_THEN_TOKENS, cache=learner_kv_cache.KVCache)
    assert appends["append"] == 2 * len(PROMPT_THEN_TOKENS) and array_paths["attention"] == 0
    np.testing.assert_allclose(learners, library, **TOL["float32"])
    monkeypatch.setattr(ta.nn, "KVCache", learner_kv_cache.KVCache)     # what generate makes
    np.testing.assert_array_equal(compiled.generate(idx[:, :5], 30, temperature=0).numpy(), greedy)
    assert array_paths["attention"] == 0 and appends["append"] > 2 * len(PROMPT_THEN_TOKENS)


@pytest.mark.parametrize("which", ["dropout", "head_dropout", "attention dropout"])
def test_training_mode_with_dropout_runs_the_teaching_forward(which, array_paths):
    model = gpt_model("float64", n_layer=1, **{"head_dropout" if which == "head_dropout" else "dropout": 0.3})
    compiled = ta.compile(model)
    if which == "attention dropout":                                    # on the attention weights alone
        for layer in model.modules():
            if type(layer) is nn.Dropout:
                layer.p = 0.0
    idx = random_ids(3, 20)
    with ta.no_grad():
        clean = compiled(idx)[0].numpy()                                # eval: dropout does nothing
        array_paths.clear()
        compiled.train()
        ta.manual_seed(5)
        dropped = compiled(idx)[0].numpy()
    assert set(array_paths) == paths_here() - ({"attention", "mlp", "gpt"} if which == "dropout" else {"attention"})
    assert np.abs(dropped - clean).max() > 1e-3
    array_paths.clear()
    with ta.no_grad():
        ta.manual_seed(5)
        teaching = model(idx)[0].numpy()
    assert not array_paths
    np.testing.assert_allclose(dropped, teaching, **TOL["float64"])


@pytest.mark.parametrize("cached", [False, True])
def test_a_sequence_long_enough_for_the_tiled_path_runs_the_teaching_forward(cached, array_paths, monkeypatch):
    model = gpt_model("float64")
    compiled = ta.compile(model)
    idx = random_ids(3, 40)
    run = (lambda m: decode(m, idx, PROMPT_THEN_TOKENS)) if cached else (lambda m: m(idx)[0].numpy())
    with ta.inference_mode():
        naive = run(compiled)
    assert array_paths["attention"] > 0
    array_paths.clear()
    tiled = collections.Counter()
    forward = fast_ops.FlashAttention.forward      # (the fast op's: a spy on the library's own flash_attention
                                                   # would be a replacement of its code, and turn the paths off)

    def counted_flash(self, *args, **kwargs):
        tiled["calls"] += 1
        return forward(self, *args, **kwargs)
    monkeypatch.setattr(fast_ops.FlashAttention, "forward", counted_flash)
    with every_length_long(), ta.inference_mode():
        long = run(compiled)
    assert array_paths["attention"] == 0 and tiled["calls"] > 0
    np.testing.assert_allclose(long, naive, **TOL["float64"])
    tiled.clear()
    array_paths.clear()
    with every_length_long(), ta.inference_mode():
        teaching = run(model)
    assert not array_paths and not tiled                               # (the teaching FlashAttention)
    np.testing.assert_allclose(long, teaching, **TOL["float64"])


def test_a_dropout_left_training_in_an_eval_model_still_samples(runner_calls):
    """Monte Carlo dropout: model.eval(), then the Dropout layers alone put back in training mode.
    The teaching forward samples in them; the fast forward must too (or fall back)."""
    ta.manual_seed(0)
    mha = nn.MultiHeadAttention(8, 2, dropout=0.5).eval()
    mha.resid_dropout.train()
    compiled = ta.compile(mha)
    x = ta.randn(1, 4, 8)
    with ta.no_grad():
        first, second = compiled(x, is_causal=True).numpy(), compiled(x, is_causal=True).numpy()
    assert runner_calls["MultiHeadAttention"] == 2
    assert not np.array_equal(first, second)


# ---------------------------------------------------------------- errors stay the teaching ones
def error_both_ways(module, call, error=ValueError):
    """The message of what ``call(layer)`` raises (under no_grad) for ``module`` compiled and as it is."""
    messages = []
    for layer in (ta.compile(module), module):
        with ta.no_grad(), pytest.raises(error) as err:
            call(layer)
        messages.append(str(err.value))
    return messages


def test_a_wrong_shape_gives_the_teaching_error():
    mha = nn.MultiHeadAttention(8, 2).eval()
    message = "MultiHeadAttention expects (B, T, C) with C = 8, got (5, 8)"
    fast, teaching = error_both_ways(mha, lambda m: m(ta.randn(5, 8), is_causal=True))
    assert fast == teaching and message in fast
    fast, teaching = error_both_ways(mha, lambda m: m(ta.randn(2, 5, 4), is_causal=True))
    assert fast == teaching and "got (2, 5, 4)" in fast
    block = gpt_model(n_embd=8).h[0]
    fast, teaching = error_both_ways(block, lambda m: m(ta.randn(5, 8)))
    assert fast == teaching and message in fast


def test_a_cache_of_another_batch_gives_the_teaching_error():
    def run(model):
        caches = [nn.KVCache() for _ in model.h]
        model(random_ids(3, 10), kv_caches=caches)
        model(random_ids(1, 1), kv_caches=caches)
    fast, teaching = error_both_ways(gpt_model(), run)
    assert fast == teaching and "do not fit the cached (B, H, T, D) = (3, 2, 10, 8)" in fast


def test_a_float64_input_to_float32_weights_gives_the_teaching_error():
    mha = nn.MultiHeadAttention(8, 2).eval()
    fast, teaching = error_both_ways(mha, lambda m: m(ta.randn(2, 5, 8, dtype="float64"), is_causal=True), TypeError)
    assert fast == teaching and "float64" in fast and "float32" in fast


@pytest.mark.parametrize("when", ["before compile", "after a compiled call"])
def test_a_forward_set_on_a_layer_itself_is_called(when, runner_calls):
    """A learner records activations by wrapping one layer's forward: the array path must not skip it."""
    ta.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=11, n_layer=1, n_head=2, n_embd=8)).eval()
    compiled = ta.compile(model)
    idx = ta.tensor(np.zeros((1, 4), dtype=np.int64))
    if when == "after a compiled call":
        with ta.no_grad():
            compiled(idx)
    seen = []
    for layer in (model.h[0].attn.c_attn, model.h[0].mlp.c_fc, model.h[0].ln_1):
        real = layer.forward
        layer.forward = lambda x, real=real, layer=layer: seen.append(layer) or real(x)
    runner_calls.clear()
    with ta.no_grad():
        compiled(idx)
    assert runner_calls["GPT"] == 1                                      # (asked, and each fell back)
    assert {id(layer) for layer in seen} == {id(model.h[0].attn.c_attn), id(model.h[0].mlp.c_fc), id(model.h[0].ln_1)}


# ---------------------------------------------------------------- the GPT's own array path
def test_the_gpt_with_targets_runs_the_teaching_forward_and_its_loss(array_paths):
    model = gpt_model("float64")
    idx, targets = random_ids(3, 20), random_ids(3, 20, seed=4)
    with ta.inference_mode():
        logits, loss = ta.compile(model)(idx, targets)
    assert array_paths["gpt"] == 0 and array_paths["attention"] > 0      # the blocks are still fast
    array_paths.clear()
    with ta.inference_mode():
        want_logits, want_loss = model(idx, targets)
    assert not array_paths
    np.testing.assert_allclose(logits.numpy(), want_logits.numpy(), **TOL["float64"])
    np.testing.assert_allclose(loss.item(), want_loss.item(), **TOL["float64"])


def test_the_gpts_array_path_refuses_ids_out_of_range_as_the_teaching_path_does(runner_calls):
    model = gpt_model()
    compiled = ta.compile(model)
    bad = ta.tensor([[1, 2, 13]])                                       # vocab_size 13
    with ta.inference_mode(), pytest.raises(IndexError) as fast:
        compiled(bad)
    assert runner_calls["GPT"] == 1
    with ta.inference_mode(), pytest.raises(IndexError) as teaching:
        model(bad)
    assert str(fast.value) == str(teaching.value) and "[0, 13)" in str(fast.value)
    with ta.inference_mode(), pytest.raises(ValueError, match="longer than block_size"):
        compiled(random_ids(1, 65))                                     # block_size 64
    assert runner_calls["GPT"] == 2 and ta.autograd.compiled.layers is None     # (put back after an error too)


@pytest.mark.parametrize("what", ["head subclass", "a forward set on wte", "dropout on"])
def test_the_gpt_falls_back_where_it_holds_more_than_the_librarys_parts(what, array_paths):
    model = gpt_model("float64")
    compiled = ta.compile(model)
    idx = random_ids(3, 20)
    if what == "head subclass":                                         # tied weights kept
        model.lm_head = with_adapter(model.lm_head, "Linear subclass")
    elif what == "a forward set on wte":
        wte = model.wte
        wte.forward = lambda ids: nn.Embedding.forward(wte, ids) * 2.0
    else:
        model.drop.p = 0.5
        model.drop.train()
    ta.manual_seed(3)
    with ta.inference_mode():
        fast = compiled(idx)[0].numpy()
    assert array_paths["gpt"] == 0 and array_paths["attention"] > 0
    if what == "head subclass":
        assert model.lm_head.calls == 1 and model.lm_head.weight is model.wte.weight
    array_paths.clear()
    ta.manual_seed(3)
    with ta.inference_mode():
        teaching = model(idx)[0].numpy()
    assert not array_paths
    np.testing.assert_allclose(fast, teaching, **TOL["float64"])


def test_the_gpts_array_path_gives_the_teaching_paths_errors_for_ids_elsewhere_and_a_short_position_table():
    model = gpt_model()
    compiled = ta.compile(model)
    idx = random_ids(1, 8)
    if importlib.util.find_spec("array_api_strict") is not None:      # ids on another device
        elsewhere = idx.to("strict")
        with ta.inference_mode(), pytest.raises(RuntimeError) as fast:
            compiled(elsewhere)
        with ta.inference_mode(), pytest.raises(RuntimeError) as teaching:
            model(elsewhere)
        assert str(fast.value) == str(teaching.value) and "one device" in str(fast.value)
    model.wpe.weight.data = model.wpe.weight.data[:4]                   # fewer positions than block_size
    with ta.inference_mode(), pytest.raises(IndexError) as fast:
        compiled(idx)
    with ta.inference_mode(), pytest.raises(IndexError) as teaching:
        model(idx)
    assert str(fast.value) == str(teaching.value) and "[0, 4)" in str(fast.value)


# ---------------------------------------------------------------- training: each block as one op
def block_ops(loss):
    """How many ops of the graph behind ``loss`` are whole blocks (fast BlockOp)."""
    seen, stack, count = set(), [loss], 0
    while stack:
        t = stack.pop()
        ctx = t.grad_fn
        if ctx is None or id(ctx) in seen:
            continue
        seen.add(id(ctx))
        count += type(ctx) is fast_models.BlockOp
        stack.extend(ctx.parents)
    return count


def training_grads(model, idx, targets, **backward):
    """The loss, the number of fused blocks behind it, and every parameter's gradient."""
    model.zero_grad()
    _, loss = model(idx, targets)
    fused = block_ops(loss)
    loss.backward(**backward)
    return loss.item(), fused, {name: p.grad.numpy() for name, p in model.named_parameters() if p.grad is not None}


def teaching_grads(model, idx, targets):
    """training_grads of the model itself (not compiled): no block runs as one op."""
    assert not isinstance(model, CompiledModule)
    loss, fused, grads = training_grads(model, idx, targets)
    assert fused == 0
    return loss, grads


def assert_same_grads(got, want, dtype):
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], **TOL[dtype], err_msg=name)


needs_block_kernel = pytest.mark.skipif(not get_backend("cpu").kernel("block"),
                                        reason="no CPU kernels here (numba is not installed, or TINYATTN_CPU_KERNELS=0)")


@needs_block_kernel
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("B, head_dropout", [(1, 0.0), (3, 0.0), (6, 0.5)])
def test_training_runs_each_block_as_one_op_with_the_teaching_gradients(dtype, B, head_dropout):
    model = gpt_model(dtype, head_dropout=head_dropout).train()
    idx, targets = random_ids(B, 20), random_ids(B, 20, seed=2)
    ta.manual_seed(5)
    loss, fused, grads = training_grads(ta.compile(model), idx, targets)
    assert fused == 2                                                   # both blocks
    ta.manual_seed(5)                                                   # DropHead: the same heads dropped
    want_loss, want = teaching_grads(model, idx, targets)
    np.testing.assert_allclose(loss, want_loss, **TOL[dtype])
    assert_same_grads(grads, want, dtype)


@needs_block_kernel
def test_a_fused_block_passes_gradcheck():
    ta.manual_seed(0)
    block = gpt.Block(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=6, dropout=0.0))
    compiled = ta.compile(block)
    params = list(block.parameters())
    for p in params:
        p.data = p.data.astype("float64") + 0.1
    x = ta.randn(2, 6, 8, dtype="float64", requires_grad=True)
    assert block_ops(compiled(x).sum()) == 1 and block_ops(block(x).sum()) == 0
    assert ta.gradcheck(lambda x, *ps: compiled(x), [x] + params)


def unusual_block(model, how, monkeypatch):
    """Make the model's blocks something the fused op does not take (each runs op by op)."""
    for block in model.h:
        if how == "dropout":
            block.mlp.dropout.p = 0.3
        elif how == "keep_weights":
            block.attn.keep_weights = True
        elif how == "exact gelu":
            block.mlp.gelu.approximate = "none"
        elif how == "an adapter":
            block.attn.c_proj = with_adapter(block.attn.c_proj, "LoRALinear")


@contextlib.contextmanager
def every_length_long():
    """attention.TILED_MIN_SCORES at 1: every length takes the tiled path. A constant of the library
    set while it runs counts as a change of its code (the compiled paths would step aside), so for
    the block the setting is noted as the library's (checked.note), and the library's after it."""
    was = attention.TILED_MIN_SCORES
    attention.TILED_MIN_SCORES = 1
    checked.note()
    try:
        yield
    finally:
        attention.TILED_MIN_SCORES = was
        checked.note()


@needs_block_kernel
@pytest.mark.parametrize("how", ["dropout", "keep_weights", "exact gelu", "an adapter", "no biases",
                                 "long attention", "no kernels", "a profiler"])
def test_a_block_the_fused_op_does_not_take_trains_op_by_op(how, monkeypatch):
    model = gpt_model("float64", bias=how != "no biases").train()
    compiled = ta.compile(model)                                        # (the changes come after it)
    unusual_block(model, how, monkeypatch)
    if how == "no kernels":
        monkeypatch.setattr(get_backend("cpu"), "use_kernels", False)
    idx, targets = random_ids(3, 20), random_ids(3, 20, seed=2)
    with every_length_long() if how == "long attention" else contextlib.nullcontext():
        assert checked.allowed() == set(checked.DEPENDS)                # (op by op for its own reason)
        ta.manual_seed(5)
        with ta.profile() if how == "a profiler" else contextlib.nullcontext():
            loss, fused, grads = training_grads(compiled, idx, targets)
        assert fused == 0
        ta.manual_seed(5)
        want_loss, want = teaching_grads(model, idx, targets)
    np.testing.assert_allclose(loss, want_loss, **TOL["float64"])
    assert_same_grads(grads, want, "float64")


@needs_block_kernel
@pytest.mark.parametrize("head_dropout", [0.0, 0.5])
def test_a_fused_block_differentiates_twice_op_by_op(head_dropout):
    """create_graph=True: the fused op's backward runs the layers op by op, whose backward is
    differentiable (with DropHead, on the heads that the fused forward dropped)."""
    model = gpt_model("float64", n_layer=1, head_dropout=head_dropout).train()
    idx, targets = random_ids(6, 10), random_ids(6, 10, seed=2)

    def grad_norm_grads(run):
        model.zero_grad()
        ta.manual_seed(5)
        _, loss = run(idx, targets)
        fused = block_ops(loss)
        grads = ta.autograd.grad(loss, list(model.parameters()), create_graph=True)
        sum((g * g).sum() for g in grads).backward()
        return fused, {name: p.grad.numpy() for name, p in model.named_parameters()}
    fused, got = grad_norm_grads(ta.compile(model))
    assert fused == 1
    fused, want = grad_norm_grads(model)
    assert fused == 0
    assert_same_grads(got, want, "float64")


@needs_block_kernel
def test_the_graph_drawing_shows_a_fused_blocks_ops():
    model = gpt_model(n_layer=1).train()
    _, loss = ta.compile(model)(random_ids(2, 10), random_ids(2, 10, seed=2))
    assert block_ops(loss) == 1
    fused = ta.viz.graph(loss)
    _, teaching_loss = model(random_ids(2, 10), random_ids(2, 10, seed=2))
    assert block_ops(teaching_loss) == 0
    teaching = ta.viz.graph(teaching_loss)
    assert "BlockOp" not in fused and "Attention" in fused and "GeluTanh" in fused
    labels = lambda dot: sorted(line.split('label="')[1].split("\\n")[0] for line in dot.splitlines() if 'label="' in line)   # noqa: E731
    assert labels(fused) == labels(teaching)


def a_block(dtype="float64", C=8, H=2, **kw):
    """A lone GPT block (training mode, not compiled) with weights moved off their initial values."""
    ta.manual_seed(0)
    block = gpt.Block(GPTConfig(n_layer=1, n_head=H, n_embd=C, block_size=16, **kw))
    rng = np.random.default_rng(3)
    for p in block.parameters():
        p.data = (p.data + 0.1 * rng.standard_normal(p.shape)).astype(dtype)
    return block


@needs_block_kernel
def test_a_fused_blocks_second_backward_differentiates_the_block_as_it_ran():
    """The modes switched between forward and backward: the backward still differentiates the forward
    that ran (DropHead on), as op by op."""
    block = a_block(head_dropout=0.5)
    x = ta.randn(2, 5, 8, dtype="float64", requires_grad=True)

    def second(run):
        block.train()
        ta.manual_seed(1)
        y = run(x)
        fused = block_ops(y.sum())
        block.eval()
        (gx,) = ta.autograd.grad((y * y).sum(), [x], create_graph=True)
        (ggx,) = ta.autograd.grad((gx * gx).sum(), [x])
        return fused, gx.numpy(), ggx.numpy()
    fused, gx, ggx = second(ta.compile(block))
    assert fused == 1
    fused, want_gx, want_ggx = second(block)
    assert fused == 0
    np.testing.assert_allclose(gx, want_gx, **TOL["float64"])
    np.testing.assert_allclose(ggx, want_ggx, **TOL["float64"])


@needs_block_kernel
def test_drawing_a_fused_block_leaves_the_generator_and_draws_what_ran():
    block = a_block(head_dropout=0.5)
    x = ta.randn(2, 5, 8, dtype="float64", requires_grad=True)
    block.eval()                                                        # no DropHead in this forward
    y = ta.compile(block)(x)
    assert block_ops(y.sum()) == 1
    block.train()
    backend = get_backend("cpu")
    before = backend.get_rng_state()
    dot = ta.viz.graph(y.sum())
    assert str(backend.get_rng_state()) == str(before)
    assert "Attention" in dot and "Mul" not in dot                      # (DropHead would be a Mul)
    assert block.training                                               # the modes are put back


@needs_block_kernel
def test_a_fused_block_split_over_three_threads_gives_the_same_gradients_every_time(monkeypatch):
    from tinyattn.fast import threads
    monkeypatch.setattr(threads, "MIN_WORK", 0)
    monkeypatch.setattr(threads, "FLOOR", 0)
    monkeypatch.setattr(threads, "_num_threads", 3)
    block = a_block("float32", C=16, H=4)
    compiled = ta.compile(block)
    x = ta.randn(6, 6, 16, requires_grad=True)
    g = ta.tensor(np.random.default_rng(0).standard_normal((6, 6, 16)).astype(np.float32))
    runs = []
    for _ in range(8):
        block.zero_grad()
        y = compiled(x)
        assert block_ops(y.sum()) == 1
        y.backward(g)
        runs.append(b"".join(p.grad.numpy().tobytes() for p in block.parameters()))
    assert len(set(runs)) == 1                                          # the parts' sums added in one order


@needs_block_kernel
@pytest.mark.parametrize("watch", ["profile", "detect_anomaly"])
def test_a_tool_watching_only_the_backward_sees_the_blocks_ops(watch):
    model = gpt_model("float64", n_layer=1).train()
    idx, targets = random_ids(2, 10), random_ids(2, 10, seed=2)
    _, loss = ta.compile(model)(idx, targets)
    assert block_ops(loss) == 1
    with ta.profile() if watch == "profile" else ta.detect_anomaly() as watching:
        loss.backward()
    grads = {name: p.grad.numpy() for name, p in model.named_parameters()}
    if watch == "profile":
        backward_ops = {name for name, row in watching.key_averages().items() if row["backward_s"] > 0}
        assert {"Linear", "LayerNorm", "Attention", "GeluTanh"} <= backward_ops, backward_ops
    _, want = teaching_grads(model, idx, targets)
    assert_same_grads(grads, want, "float64")


@needs_block_kernel
@pytest.mark.parametrize("B", [0, 3])
def test_an_empty_batch_or_one_that_does_not_share_evenly_runs_op_by_op(B, monkeypatch, runner_calls):
    from tinyattn.fast import threads
    monkeypatch.setattr(threads, "MIN_WORK", 0)                         # (3 sequences would split)
    monkeypatch.setattr(threads, "FLOOR", 0)
    monkeypatch.setattr(threads, "_num_threads", 2)
    monkeypatch.delenv("TINYATTN_BLOCK_SCHEDULE", raising=False)        # (the rows schedule: whole sequences)
    block = a_block()
    x = ta.randn(B, 5, 8, dtype="float64", requires_grad=True)
    y = ta.compile(block)(x)
    assert runner_calls["Block"] == 1                                   # (asked, and it declined)
    assert y.shape == (B, 5, 8) and block_ops(y.sum()) == 0


def test_only_a_compiled_call_runs_erfs_kernel(monkeypatch):
    """Ops outside any model: a function compiled by ta.compile runs the fast ops (erf's kernel),
    the same function as it is runs the formula, before and after the compiled call."""
    cpu = get_backend("cpu")
    calls = collections.Counter()
    kernels = ("erf", "gelu_erf") if cpu.kernel("erf") is not None else ()
    for name in kernels:
        monkeypatch.setitem(cpu.kernels, name, lambda a, fn=cpu.kernels[name], name=name: calls.update([name]) or fn(a))
    x = ta.randn(4, 6, dtype="float64")

    def erf_and_gelu(x):
        return x.erf().numpy(), nn.functional.gelu(x).numpy()
    teaching = erf_and_gelu(x)
    assert not calls
    fast = ta.compile(erf_and_gelu)(x)
    assert calls == collections.Counter(kernels)                        # one call each, compiled
    assert not ta.autograd.compiled.ops
    again = erf_and_gelu(x)
    assert calls == collections.Counter(kernels)                        # and none after
    for a, b, c in zip(fast, teaching, again):
        np.testing.assert_allclose(a, b, **TOL["float64"])
        np.testing.assert_array_equal(b, c)


# ---------------------------------------------------------------- the compiled model, as the model
def test_a_compiled_call_runs_fast_ops_in_its_own_thread_only():
    """A compiled call in one thread leaves another thread's ops their formulas, and calls that
    overlap and end out of order leave nothing on."""
    import threading
    x = ta.randn(3, 8, requires_grad=True)
    inside, go_on, seen = threading.Event(), threading.Event(), {}

    def long_compiled_call():
        seen["there"] = type(nn.functional.gelu(x, "tanh").grad_fn).__module__
        inside.set()
        go_on.wait(10)
    worker = threading.Thread(target=ta.compile(long_compiled_call))
    worker.start()
    inside.wait(10)
    here = ta.compile(lambda: type(nn.functional.gelu(x, "tanh").grad_fn).__module__)()   # (overlaps, ends first)
    plain = type(nn.functional.gelu(x, "tanh").grad_fn).__module__
    go_on.set()
    worker.join(10)
    assert seen["there"] == here == "tinyattn.fast.ops" and plain == "tinyattn.ops"
    assert type(nn.functional.gelu(x, "tanh").grad_fn).__module__ == "tinyattn.ops"
    assert not ta.autograd.compiled.ops and ta.autograd.compiled.layers is None


def test_the_compiled_model_is_the_model_in_every_way_a_user_reaches_for():
    import copy

    class Named(nn.Module):                          # a layer of yours with a __repr__ and an optimizer of its own
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(x)

        def configure_optimizer(self, lr):
            return ta.optim.AdamW(self.parameters(), lr=lr)

        def __repr__(self):
            return "Named!"
    outer = nn.Sequential(Named(), nn.Linear(2, 2))
    compiled = ta.compile(outer)
    assert repr(outer) == "Sequential(\n  (0): Named!\n  (1): Linear(in_features=2, out_features=2, bias=True)\n)"
    assert "(0): Named!" in repr(compiled)
    assert len(compiled) == 2 and compiled[0] is outer[0] and list(compiled) == list(outer)
    assert ta.compile(outer[0]).configure_optimizer(1e-3).fused is False     # (its own takes no fused=)
    assert copy.copy(compiled)._orig_mod is outer
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=4, vocab_size=5))
    compiled = ta.compile(model)
    assert compiled.num_parameters() == model.num_parameters() and "generate" in dir(compiled)
    model.num_parameters = lambda **kwargs: 42                              # (looked up on the model each time)
    assert compiled.num_parameters() == 42
    assert compiled.eval() is compiled and not model.training and compiled.train() is compiled and model.training
    assert list(compiled.state_dict()) == list(model.state_dict())
