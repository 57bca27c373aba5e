"""The learner tools: ta.viz.graph, ta.detect_anomaly, ta.profile, and their training flags."""
import json
import sys
import warnings

import numpy as np
import pytest

import tinyattn as ta
import tinyattn.nn as nn
import tinyattn.nn.functional as F
from tinyattn import viz
from tinyattn.models import GPT, GPTConfig
from training_data import error_lines

ENGINE = sys.modules["tinyattn.autograd"]


def tiny_gpt(n_layer=2):
    ta.manual_seed(0)
    return GPT(GPTConfig(n_layer=n_layer, n_head=2, n_embd=16, block_size=8, vocab_size=11))


def gpt_loss(model):
    idx = ta.tensor(np.arange(16).reshape(2, 8) % 11)
    return model(idx, idx)[1]


def neuron():
    x = ta.tensor([1.0, -2.0], requires_grad=True)
    w = ta.tensor([0.5, 0.3], requires_grad=True)
    b = ta.tensor(0.1, requires_grad=True)
    return ((x * w).sum() + b).tanh(), dict(x=x, w=w, b=b)


def labels(dot):
    """The first line of each node's label, in the DOT text."""
    return [line.split('label="')[1].split("\\n")[0] for line in dot.splitlines() if 'label="' in line]


# --- ta.viz.graph ---------------------------------------------------------
def test_graph_of_a_neuron_names_each_op_and_leaf():
    y, params = neuron()
    dot = ta.viz.graph(y, params=params)
    assert dot.startswith("digraph {")
    assert sorted(labels(dot)) == ["Add", "Mul", "Sum", "Tanh", "b", "w", "x"]
    assert dot.count("->") == 6
    assert "Mul\\n(2,) float32" in dot and "requires grad" in dot
    assert "penwidth=2" in dot.split("Tanh")[1].splitlines()[0]      # the output is marked


def test_graph_marks_inputs_that_get_no_gradient():
    x = ta.tensor([1.0, 2.0])                                  # no grad
    w = ta.tensor([3.0, 4.0], requires_grad=True)
    dot = ta.viz.graph((x * w).sum())
    assert "input\\n(2,) float32\\nno grad" in dot
    assert dot.count("[style=dashed]") == 1                    # x -> Mul
    assert "input\\n(2,) float32\\nrequires grad" in dot        # not an nn.Parameter: an input


def test_graph_names_leaves_after_the_module_parameters():
    model = nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.Linear(4, 1))
    out = model(ta.randn(5, 3)).sum()
    names = labels(ta.viz.graph(out))
    for name in ("0.weight", "0.bias", "2.weight", "2.bias"):
        assert name in names
    gpt = labels(ta.viz.graph(gpt_loss(tiny_gpt())))
    assert "h.0.attn.c_attn.weight" in gpt and "wte.weight" in gpt and "h.1.mlp.c_fc.bias" in gpt


def test_graph_depth_folds_modules_into_boxes():
    model = tiny_gpt()
    loss = gpt_loss(model)
    full, one, two = (labels(ta.viz.graph(loss, depth=d)) for d in (None, 1, 2))
    # an op inside attention: the causal naive path is one Attention op, with or without the kernels
    inner = "Attention"
    assert inner in full and "h.0" not in full
    assert sorted(n for n in one if n.startswith("h.")) == ["h.0", "h.1"]
    assert inner not in one and "ln_f" in one and "wte" in one and "lm_head" in one
    assert "wte.weight" in one             # tied to lm_head: used by two boxes, so drawn on its own
    assert "h.0.attn.c_attn.weight" not in one
    assert {"h.0.attn", "h.0.mlp", "h.0.ln_1", "h.1.attn"} <= set(two) and "h.0" not in two
    assert len(one) < len(two) < len(full)
    assert ta.viz.graph(loss, depth=0).count("GPT") == 1          # the whole model as one box


def test_graph_draws_png_and_svg_without_graphviz(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(viz, "_dot_program", lambda: None)
    y, params = neuron()
    ta.viz.graph(y, str(tmp_path / "n.png"), params=params)
    assert (tmp_path / "n.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ta.viz.graph(gpt_loss(tiny_gpt()), str(tmp_path / "g.svg"), depth=1)
    svg = (tmp_path / "g.svg").read_text()
    assert "<svg" in svg


def test_graph_after_backward_says_the_inputs_were_freed():
    y, _ = neuron()
    y.backward()
    dot = ta.viz.graph(y)
    assert "inputs freed by backward" in dot and dot.count("->") == 0


def test_graph_errors_are_clear():
    y, _ = neuron()
    with pytest.raises(ValueError, match="png or .svg"):
        ta.viz.graph(y, "graph.pdf")
    with pytest.raises(TypeError, match="needs a Tensor"):
        ta.viz.graph(np.ones(3))


# --- ta.detect_anomaly ----------------------------------------------------
def test_detect_anomaly_names_the_forward_op_and_the_line():
    x = ta.tensor([1.0, -1.0, 2.0], requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError) as info:
            with ta.detect_anomaly():
                y = x * 2.0
                z = y.log()  # the bad op
    message = str(info.value)
    assert "Log forward" in message and "NaN" in message and "(3,) float32" in message
    assert "test_learner_tools.py" in message and "y.log()  # the bad op" in message
    assert ENGINE.hooks is None                          # the block is over, even after the error


def test_detect_anomaly_names_the_backward_op():
    x = ta.tensor([0.0, 1.0], requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with ta.detect_anomaly():
            y = x.sqrt() * 3.0                          # sqrt'(0) = inf
            with pytest.raises(RuntimeError) as info:
                y.sum().backward()
    message = str(info.value)
    assert "Sqrt backward" in message and "Inf" in message and "input 0 (2,)" in message
    assert "y = x.sqrt() * 3.0" in message


def test_detect_anomaly_points_into_the_library_and_at_your_line():
    x = ta.tensor([[1.0, float("inf")]], requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with ta.detect_anomaly(), pytest.raises(RuntimeError) as info:
            F.layer_norm(x, (2,))
    assert "LayerNorm forward" in str(info.value)
    assert "F.layer_norm(x, (2,))" in str(info.value) and "nn/functional.py" in str(info.value)


def test_detect_anomaly_passes_finite_work_and_costs_nothing_outside():
    assert ENGINE.hooks is None
    model = tiny_gpt()
    with ta.detect_anomaly():
        assert ENGINE.hooks is not None
        gpt_loss(model).backward()
    assert ENGINE.hooks is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (ta.tensor([-1.0], requires_grad=True).log() * 1.0).sum().backward()   # no block: no check


def test_detect_anomaly_checks_learners_own_ops():
    class Bad(ta.Function):
        def forward(self, x):
            return x * 0.0

        def backward(self, g):
            return g * float("nan")

    x = ta.randn(3, requires_grad=True)
    with ta.detect_anomaly(), pytest.raises(RuntimeError, match="Bad backward.*NaN"):
        Bad.apply(x).sum().backward()


def test_detect_anomaly_lets_a_hand_written_causal_mask_through():
    """masked_fill(mask, -inf) then softmax: the -inf is intended (an input of the op), and the
    softmax of the row is finite, so nothing is an anomaly."""
    scores = ta.randn(2, 4, 4, requires_grad=True)
    mask = ta.tensor(np.triu(np.ones((4, 4), bool), 1))
    with ta.detect_anomaly():
        weights = F.softmax(scores.masked_fill(mask, float("-inf")), -1)
        (weights * ta.randn(2, 4, 4)).sum().backward()
    assert np.isfinite(scores.grad.numpy()).all()


def test_detect_anomaly_still_stops_an_op_that_makes_inf_from_finite_inputs():
    x = ta.tensor([1.0, 1000.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="Exp forward: its output .* holds Inf"):
        with warnings.catch_warnings(), ta.detect_anomaly():
            warnings.simplefilter("ignore")
            x.exp()


def test_detect_anomaly_names_the_parameter_that_already_holds_nan():
    model = tiny_gpt()
    weight = dict(model.named_parameters())["h.0.attn.c_attn.weight"]
    weight.data[0, 0] = np.nan
    with pytest.raises(RuntimeError, match=r"parameter 'h.0.attn.c_attn.weight' \(\d+, \d+\) holds NaN before GPT's forward"):
        with ta.detect_anomaly():
            gpt_loss(model)


def test_detect_anomaly_blames_no_op_for_a_leaf_that_arrives_with_nan():
    w = ta.tensor([1.0, float("nan")], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"Mul forward: its input 0 \(2,\), a leaf tensor, already holds NaN"):
        with ta.detect_anomaly():
            w * 2.0


def test_detect_anomaly_stops_a_forward_that_writes_into_a_library_input():
    """Inside the block every op gets read-only inputs (on the CPU), the library's too."""
    class Centre(ta.Function):
        def forward(self, x):
            x -= x.mean()
            return x

        def backward(self, g):
            return g - g.mean()

    Centre.guard_inputs = False                          # as if it were one of the library's ops
    x = ta.randn(3)
    before = x.numpy().copy()
    Centre.apply(ta.tensor(before.copy()))               # outside the block: not checked
    with pytest.raises(RuntimeError, match="Centre.forward wrote into one of its input arrays"):
        with ta.detect_anomaly():
            Centre.apply(x)
    np.testing.assert_array_equal(x.numpy(), before)


def test_gradgradcheck_explains_a_backward_on_raw_arrays():
    class Cube(ta.Function):
        def forward(self, x):
            return x * x * x

        def backward(self, g):                           # right first derivative, but no graph
            return self.constant(3 * self.parents[0].data ** 2 * g.data)

    x = ta.randn(3, dtype="float64", requires_grad=True)
    assert ta.gradcheck(Cube.apply, (x,))
    with pytest.raises(ta.GradcheckError, match="Cube.backward returned a gradient with no graph: it works on raw "
                                                "arrays.*differentiable_backward = False"):
        ta.gradgradcheck(Cube.apply, (x,))


def test_gradcheck_puts_its_inputs_back_when_fn_raises():
    calls = []

    def fn(x):
        calls.append(1)
        if len(calls) > 2:                               # the value and the analytic pass work
            raise ValueError("boom")
        return x * 2.0

    x = ta.randn(3, dtype="float64", requires_grad=True)
    before = x.numpy().copy()
    with pytest.raises(ValueError, match="boom"):
        ta.gradcheck(fn, (x,))
    np.testing.assert_array_equal(x.numpy(), before)


# --- ta.profile -----------------------------------------------------------
def test_profile_counts_ops_and_bytes():
    x = ta.randn(4, 3, requires_grad=True)
    w = ta.randn(3, 2, requires_grad=True)
    with ta.profile() as p:
        y = (x @ w).tanh()
        y.sum().backward()
    rows = p.key_averages()
    assert rows["MatMul"]["calls"] == 1 and rows["Tanh"]["calls"] == 1 and rows["Sum"]["calls"] == 1
    assert rows["MatMul"]["forward_s"] > 0 and rows["MatMul"]["backward_s"] > 0
    # bytes returned: the (4, 2) float32 output, then gradients (4, 3) and (3, 2)
    assert rows["MatMul"]["bytes"] == 4 * 2 * 4 + (4 * 3 + 3 * 2) * 4
    assert ENGINE.hooks is None
    with ta.no_grad():
        x @ w
    assert rows == p.key_averages()                     # nothing recorded after the block


def test_profile_table_and_chrome_trace(tmp_path):
    model = tiny_gpt()
    with ta.profile() as p:
        gpt_loss(model).backward()
    table = p.table(row_limit=3)
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["op", "calls"] and "more ops" in lines[4]
    assert lines[1].split()[0] == max(p.key_averages().items(), key=lambda kv: kv[1]["total_s"])[0]
    assert "host clock" in table
    path = p.chrome_trace(str(tmp_path / "trace.json"))
    events = json.load(open(path))["traceEvents"]
    assert len(events) == len(p.events)
    assert {e["cat"] for e in events} == {"forward", "backward"}
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in events)
    assert any(e["name"] == "Linear.backward" for e in events)
    starts = [e["ts"] for e in events]
    assert starts == sorted(starts)


def test_profile_table_row_limit_minus_one_shows_every_op():
    """As in PyTorch, row_limit=-1 means no limit (it showed two rows of three and "... 4 more ops")."""
    x = ta.randn(4, 3, requires_grad=True)
    with ta.profile() as p:
        (x * 2.0).exp().sum()
    table = p.table(row_limit=-1)
    assert all(name in table for name in ("Mul", "Exp", "Sum")) and "more ops" not in table
    assert "1 more ops" in p.table(row_limit=2)


def test_graph_calls_a_leaf_a_parameter_only_when_it_is_one():
    x = ta.randn(3, requires_grad=True)                  # an input that needs a gradient
    w = nn.Parameter(ta.randn(3))
    dot = viz.graph((x * w).sum())
    assert dot.count('label="parameter') == 1 and dot.count('label="input') == 1


def test_profile_and_detect_anomaly_nest():
    x = ta.randn(3, requires_grad=True)
    with ta.profile() as p, ta.detect_anomaly():
        (x * 2.0).sum().backward()
    with ta.detect_anomaly(), ta.profile() as q:
        (x * 2.0).sum().backward()
    assert p.key_averages()["Mul"]["calls"] == q.key_averages()["Mul"]["calls"] == 1
    assert ENGINE.hooks is None


# --- the training flags ---------------------------------------------------
SMALL = ["--n_layer", "1", "--n_head", "1", "--n_embd", "16", "--block_size", "20", "--batch_size", "4",
         "--max_iters", "7", "--eval_interval", "7", "--eval_iters", "1", "--sample_tokens", "0", "--quiet"]


def test_train_profile_and_detect_anomaly_flags(tmp_path, capsys):
    from train.command import main
    assert main(SMALL + ["--out_dir", str(tmp_path), "--profile", "--detect_anomaly"]) == 0
    out = capsys.readouterr().out
    assert "profile of steps 1-5" in out and "Linear" in out and "backward ms" in out
    assert json.load(open(tmp_path / "trace.json"))["traceEvents"]
    assert ENGINE.hooks is None


def test_train_detect_anomaly_stops_a_diverging_run_in_one_line(tmp_path, capsys):
    from train.command import main
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(SMALL + ["--out_dir", str(tmp_path), "--detect_anomaly", "--learning_rate", "1e30",
                             "--grad_clip", "0", "--max_iters", "3"])
    err = "\n".join(error_lines(capsys.readouterr().err))
    assert code == 1 and len(err.splitlines()) == 1
    assert err.startswith("python -m train: error: detect_anomaly:") and ("NaN" in err or "Inf" in err)


def test_train_logs_perplexity(tmp_path):
    from train.command import main
    assert main(SMALL + ["--out_dir", str(tmp_path)]) == 0
    summary = json.load(open(tmp_path / "summary.json"))
    assert summary["best_val_perplexity"] == pytest.approx(np.exp(summary["best_val_loss"]), rel=1e-4)
    header, *rows = (tmp_path / "log.csv").read_text().splitlines()
    assert header.split(",")[:5] == ["step", "train_loss", "val_loss", "train_perplexity", "val_perplexity"]
    step, train_loss, val_loss, train_ppl, val_ppl = map(float, rows[-1].split(",")[:5])
    assert val_ppl == pytest.approx(np.exp(val_loss), rel=1e-4)
    assert train_ppl == pytest.approx(np.exp(train_loss), rel=1e-4)


# --- other devices --------------------------------------------------------
def test_tools_on_the_stand_in_device():
    pytest.importorskip("array_api_strict")
    x = ta.tensor([1.0, -1.0], device="strict", requires_grad=True)
    with ta.profile() as p:
        (x * 2.0).sum().backward()
    assert p.key_averages()["Mul"]["calls"] == 1 and "host clock" in p.table()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with ta.detect_anomaly(), pytest.raises(RuntimeError, match="Log forward"):
            x.log()
    assert "Mul" in ta.viz.graph((x * 2.0).sum())


@pytest.mark.gpu
def test_profile_times_gpu_ops_with_cuda_events(tmp_path):
    model = tiny_gpt().to("cuda")
    idx = ta.tensor(np.arange(16).reshape(2, 8) % 11, device="cuda")
    with ta.profile() as p:
        model(idx, idx)[1].backward()
    rows = p.key_averages()
    assert "CUDA events" in p.table() and rows["MatMul"]["forward_s"] > 0 and rows["MatMul"]["backward_s"] > 0
    events = json.load(open(p.chrome_trace(str(tmp_path / "t.json"))))["traceEvents"]
    assert all(e["pid"] == "cuda" and e["dur"] >= 0 for e in events)
    x = ta.tensor([-1.0], device="cuda", requires_grad=True)
    with ta.detect_anomaly(), pytest.raises(RuntimeError, match="Log forward"):
        x.log()


def test_graph_uses_the_dot_program_when_there_is_one(tmp_path, monkeypatch):
    fake = tmp_path / "dot"                 # stands in for Graphviz: writes what it reads, with its flags
    fake.write_text('#!/bin/sh\n{ echo "$1 $2"; cat; } > "$3"\n')
    fake.chmod(0o755)
    monkeypatch.setattr(viz, "_dot_program", lambda: str(fake))
    y, params = neuron()
    dot = ta.viz.graph(y, str(tmp_path / "n.svg"), params=params)
    assert (tmp_path / "n.svg").read_text() == f"-Tsvg -o\n{dot}"


class _ForwardReturnsNone(ta.Function):
    def forward(self, x):
        return None

    def backward(self, g):
        return g


class _BackwardReturnsArray(ta.Function):
    def forward(self, x):
        return x * 2

    def backward(self, g):
        return g.data * 2                          # a raw array: the contract wants a Tensor


@pytest.mark.parametrize("tool", [ta.detect_anomaly, ta.profile], ids=["detect_anomaly", "profile"])
def test_a_broken_op_gets_the_engine_s_error_inside_a_tool(tool):
    x = ta.randn(3, requires_grad=True)
    with tool(), pytest.raises(TypeError, match="_ForwardReturnsNone.forward returned None"):
        _ForwardReturnsNone.apply(x)
    with tool(), pytest.raises(TypeError, match="_BackwardReturnsArray.backward returned a numpy.ndarray"):
        _BackwardReturnsArray.apply(x).sum().backward()
    assert ENGINE.hooks is None


def test_profile_keeps_counting_after_an_op_raised():
    x = ta.randn(3, requires_grad=True)
    with ta.profile() as p:
        with pytest.raises(TypeError):
            _ForwardReturnsNone.apply(x)
        (x * 2).sum().backward()
    rows = p.key_averages()
    assert rows["Mul"]["calls"] == 1 and rows["Sum"]["calls"] == 1
    assert "_ForwardReturnsNone" not in rows and p._open == []
