"""python -m train --use_exercises: the learner's passing pieces run inside the library.

With every reference solution swapped in, a short training run gives the same
losses as the library's own run of its formulas (--compile False), to the last bit,
and the solutions' code is what ran: compiled, the identity check sees the swapped
functions and the fast paths step aside, with one line on stderr.
"""
import collections
import pathlib
import shutil
import sys

import numpy as np
import pytest

import tinyattn as ta
import tinyattn.nn.functional as F
from tinyattn import ops
from tinyattn.fast import checked
from tinyattn.models import GPT, GPTConfig
from train.command import main
from train.config import parse_args
from train.loop import train

from exercise_solutions import (attention, cross_entropy, elementwise, embedding, engine, kv_cache, layernorm,
                                matmul, softmax, sum_to, adamw, gqa, rmsnorm, rope, swiglu)
from exercises.checking.common import SOLUTIONS
from exercises.checking.swap import SWAPS, use_exercises
from training_data import TEXT, TINY
from conftest import record_applied_ops

SHORT = ["--max_iters", "6", "--eval_interval", "3", "--sample_tokens", "12"]
FORMULAS = ["--compile", "False"]


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text(TEXT)
    return str(path)


def short_run(text_file, out_dir, *flags):
    return train(*parse_args(["--data", text_file, "--out_dir", str(out_dir), *TINY, *SHORT, *flags]))


def notices(err):
    """The identity check's lines in a run's stderr ('tinyattn: ... step aside, and your code runs')."""
    return [line for line in err.splitlines() if line.startswith("tinyattn: ") and line.endswith("your code runs")]


@pytest.fixture
def library_code_seen():
    """A compiled call that finds the library's code: the check speaks again when the same
    functions are swapped in as in a test before (it says only what differs from its last call)."""
    assert checked.allowed() == set(checked.DEPENDS)


def counting(calls, name, fn):
    def wrapper(*args, **kwargs):
        calls[name] += 1
        return fn(*args, **kwargs)
    return wrapper


def test_with_every_solution_swapped_in_the_run_matches_the_library(text_file, tmp_path, monkeypatch, capsys,
                                                                     library_code_seen):
    library = short_run(text_file, tmp_path / "library", *FORMULAS)     # the library's formulas
    capsys.readouterr()

    calls = collections.Counter()                 # the solutions' plain functions and methods, counted
    monkeypatch.setattr(sum_to, "sum_to", counting(calls, "sum_to", sum_to.sum_to))
    monkeypatch.setattr(engine, "backward", counting(calls, "engine", engine.backward))
    monkeypatch.setattr(adamw.AdamW, "step", counting(calls, "adamw", adamw.AdamW.step))
    monkeypatch.setattr(kv_cache.KVCache, "append", counting(calls, "kv_cache", kv_cache.KVCache.append))
    said = []
    with use_exercises(SOLUTIONS, say=said.append) as swapped:
        applied = record_applied_ops(monkeypatch)      # every Function class applied during the run
        yours = short_run(text_file, tmp_path / "yours")               # compiled (the default)
    assert swapped == list(SWAPS)
    assert len(notices(capsys.readouterr().err)) == 1     # a dozen functions swapped: one line says so
    assert "15 of 15 pieces are yours" in said[0]
    assert "softmax passes, but this GPT does not call it" in said[0]     # named, and why it did not run
    assert "Exp and Log pass, but this GPT does not call them" in said[0]
    assert "your Tanh runs in GELU's backward" in said[0] and elementwise.Tanh in applied

    for key in ("val_loss", "train_loss", "best_val_loss"):
        assert yours[key] == library[key], key            # the same numbers to the last bit
    assert all(calls[name] > 0 for name in ("sum_to", "engine", "adamw", "kv_cache")), calls
    ran = {matmul.MatMul, layernorm.LayerNorm, cross_entropy.CrossEntropy, embedding.Embedding, attention.Attention}
    assert ran <= applied, f"not run: {ran - applied}"
    assert not {ops.MatMul, F.LayerNorm, F.CrossEntropy, F.Embedding} & applied


MODERN = ["--pos", "rope", "--norm", "rmsnorm", "--mlp", "swiglu", "--n_head", "4", "--n_kv_head", "2", "--bias", "false"]


def test_the_modern_pieces_train_a_modern_model_as_the_library_does(text_file, tmp_path, monkeypatch, capsys,
                                                                     library_code_seen):
    """Your RMSNorm, RoPE, GQA and SwiGLU run in a model with those choices, and train it as the library's
    formulas do (to float32 rounding: your RMSNorm divides where the library multiplies)."""
    library = short_run(text_file, tmp_path / "library", *FORMULAS, *MODERN)
    calls = collections.Counter()
    monkeypatch.setattr(rmsnorm, "rms_norm", counting(calls, "rmsnorm", rmsnorm.rms_norm))
    monkeypatch.setattr(rope, "apply_rotary", counting(calls, "rope", rope.apply_rotary))
    monkeypatch.setattr(gqa, "grouped_query_attention", counting(calls, "gqa", gqa.grouped_query_attention))
    monkeypatch.setattr(swiglu, "silu", counting(calls, "swiglu", swiglu.silu))
    said = []
    with use_exercises(SOLUTIONS, say=said.append):
        yours = short_run(text_file, tmp_path / "yours", *MODERN)
    capsys.readouterr()
    assert "rmsnorm (--norm rmsnorm), rope (--pos rope), gqa (--n_kv_head below --n_head), swiglu (--mlp swiglu): " \
        "run in a model with those choices" in said[0]
    assert all(calls[name] > 0 for name in ("rmsnorm", "rope", "gqa", "swiglu")), calls
    for key in ("val_loss", "train_loss", "best_val_loss"):
        assert yours[key] == pytest.approx(library[key], rel=1e-5), key
    from train import checkpoint                                         # (the checkpoint: the library's names)
    names = set(checkpoint.load(str(tmp_path / "yours" / "ckpt.npz"))[0])
    assert names == set(checkpoint.load(str(tmp_path / "library" / "ckpt.npz"))[0]) and "h.0.mlp.c_gate.weight" in names


def test_a_rope_of_neighbouring_pairs_computes_the_librarys_rotation():
    """The reference solution pairs (2i, 2i + 1); swapped in, it is given the channels in its order and
    gives them back in the library's, so both compute the same function (a checkpoint means the same)."""
    x = ta.tensor(np.random.default_rng(0).normal(size=(2, 3, 5, 8)), dtype="float64")
    want = F.rotary_embedding(x, range(3, 8))
    with use_exercises(SOLUTIONS, say=lambda line: None):
        from tinyattn.nn import attention
        got = attention.rotary_embedding(x, range(3, 8))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=1e-12)


def test_the_swap_is_undone_after_the_run():
    before = (F.cross_entropy, ops.MatMul, ta.Tensor.backward, ta.optim.AdamW, ta.nn.KVCache)
    with use_exercises(SOLUTIONS, say=lambda line: None):
        assert F.cross_entropy is cross_entropy.cross_entropy and ta.nn.KVCache is kv_cache.KVCache
    assert (F.cross_entropy, ops.MatMul, ta.Tensor.backward, ta.optim.AdamW, ta.nn.KVCache) == before


def test_compiled_the_swapped_pieces_run_and_one_line_says_so(capsys, monkeypatch, library_code_seen):
    """ta.compile in a swapped-in run: the identity check finds the solutions in place of the
    library's functions; the fast ops, the fused layers and AdamW's flat step step aside, one
    line on stderr says so, and the solutions run. After the swap the compiled paths run again."""
    config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=11, dropout=0.0)
    idx = ta.tensor(np.arange(16).reshape(2, 8) % 11)
    capsys.readouterr()
    with use_exercises(SOLUTIONS, say=lambda line: None):
        applied = record_applied_ops(monkeypatch)       # (a replaced Function.apply: named too)
        model = ta.compile(GPT(config))
        optimizer = model.configure_optimizer(0.1, 1e-3, (0.9, 0.95))    # fused=True: yours takes it, aside
        for _ in range(2):
            _, loss = model(idx, idx)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        model.generate(idx[:, :2], 3)
    said = notices(capsys.readouterr().err)
    assert len(said) == 1, said
    assert all(name in said[0] for name in ("ops.py", "MatMul", "tensor.py", "Tensor.backward", "optim/__init__.py"))
    assert all(path in said[0] for path in checked.DEPENDS)          # every compiled path steps aside
    assert {matmul.MatMul, layernorm.LayerNorm, cross_entropy.CrossEntropy, attention.Attention} <= applied
    assert not {cls for cls in applied if cls.__module__.startswith("tinyattn.fast")}
    assert isinstance(optimizer, adamw.AdamW)

    monkeypatch.undo()                                   # (Function.apply, recorded above, is the library's again)
    ta.compile(GPT(config))
    assert checked.allowed() == set(checked.DEPENDS)     # every compiled path runs again
    assert not notices(capsys.readouterr().err)


def test_the_flag_says_what_it_swapped(text_file, tmp_path, capsys):
    """On the starter files (or a learner's work in progress) the run goes ahead and says what is whose."""
    assert main(["--data", text_file, "--out_dir", str(tmp_path / "run"), *TINY, "--max_iters", "2",
                 "--use_exercises"]) == 0
    out = capsys.readouterr().out
    assert "--use_exercises:" in out and "pieces are yours (exercises/)" in out


def test_pieces_that_no_op_of_the_gpt_is_made_of_run_where_the_librarys_formulas_call_them(text_file, tmp_path,
                                                                                           monkeypatch):
    """With softmax and Exp/Log/Tanh yours but attention and cross-entropy the library's (whose fused
    ops compute their own softmax and exp), attention and cross-entropy are written with yours:
    every piece the line names as running runs (by trace), and the losses are the library's to
    float32 rounding."""
    package = tmp_path / "some_solutions"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("softmax", "elementwise"):
        shutil.copy(pathlib.Path(softmax.__file__).parent / f"{name}.py", package / f"{name}.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    library = short_run(text_file, tmp_path / "library", *FORMULAS)
    said, calls = [], collections.Counter()
    with use_exercises("some_solutions", say=said.append) as swapped, pytest.MonkeyPatch.context() as inside:
        inside.setattr(ta.ops, "softmax", counting(calls, "softmax", ta.ops.softmax))   # (undone before the swap is)
        applied = record_applied_ops(inside)
        yours = short_run(text_file, tmp_path / "yours")
    assert sorted(swapped) == ["elementwise", "softmax"]
    line = said[0]
    assert "attention runs as scores, your softmax, and the weighted sum" in line
    assert "cross-entropy runs as -(x[target] - max - log(sum(exp(x - max)))), with your Exp and Log" in line
    assert "your Tanh runs in GELU's backward" in line
    mine = sys.modules["some_solutions.elementwise"]
    assert {mine.Exp, mine.Log, mine.Tanh, sys.modules["some_solutions.softmax"].Softmax} <= applied
    assert calls["softmax"] > 0
    assert not {F.CrossEntropy, ta.nn.attention.Attention} & applied          # the fused ops did not run
    for key in ("val_loss", "train_loss"):
        assert yours[key] == pytest.approx(library[key], rel=1e-5), key
