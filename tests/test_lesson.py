"""Tests for train/lesson.py: the "it" report, its heatmaps, and a short training run that beats chance."""
import json
import sys

import numpy as np
import pytest

import tinyattn as ta
from tinyattn.models import GPT, GPTConfig
from data import coref
from train import lesson
from train.loop import main
from train.data import load_coref

WORDS = ["the", "animal", "was", "tired", ".", "it", "="]


def fake_rows(n_layer=2, n_head=3):
    """(L, H, 2, T) attention rows that each add up to one."""
    rows = np.random.default_rng(0).random((n_layer, n_head, 2, len(WORDS)))
    return rows / rows.sum(-1, keepdims=True)


def test_plot_attention_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "attention_test.png"
    written = lesson.plot_attention(fake_rows(), WORDS, ['"=" looks at', '"it" looks at'], str(path), "a title")
    assert written == "attention_test.png"
    assert path.stat().st_size > 1000


def test_plot_attention_without_matplotlib_prints_text(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)         # import matplotlib now raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    lines = []
    path = tmp_path / "attention_test.png"
    written = lesson.plot_attention(fake_rows(), WORDS, ['"=" looks at', '"it" looks at'], str(path), "a title",
                                    say=lines.append)
    assert written is None and not path.exists()
    text = "\n".join(lines)
    assert "matplotlib is not installed" in text
    assert "L1 H2" in text and "animal" in text
    assert sum("most:" in line for line in lines) == 2 * 3 * 2      # one line per layer, head and query


@pytest.fixture(scope="module")
def untrained():
    """A small untrained model and the corpus, with fewer examples so the test is quick."""
    dataset = load_coref(seed=0)
    dataset.examples = {"train": dataset.examples["train"][:200], "test": dataset.examples["test"][:100]}
    ta.manual_seed(0)
    config = GPTConfig(block_size=20, vocab_size=dataset.tokenizer.vocab_size, n_layer=2, n_head=2, n_embd=16)
    return GPT(config), dataset


def test_measures_have_the_right_shapes(untrained):
    model, dataset = untrained
    examples = dataset.examples["test"][:30]
    acc = lesson.referent_accuracy(model, examples, dataset.tokenizer, "cpu")
    att = lesson.attention_to_nouns(model, examples, dataset.tokenizer, "cpu")
    assert 0.0 <= acc <= 1.0
    assert att.shape == (30, 2, 2, 2)
    assert np.all((att >= 0) & (att <= 1))
    layer, head, fraction = lesson.pick_referent_head(att)
    assert 0 <= layer < 2 and 0 <= head < 2 and 0.0 <= fraction <= 1.0


def test_attention_to_nouns_reads_the_right_positions(untrained):
    """Checked against the model's own weights for one sentence."""
    model, dataset = untrained
    ex = coref.LESSON_SENTENCES[1]                       # "... too wide . it = street"
    att = lesson.attention_to_nouns(model, [ex], dataset.tokenizer, "cpu")[0]    # (L, H, 2)
    rows, words, labels, _ = lesson.lesson_rows(model, ex, dataset.tokenizer, "cpu")
    assert words[-1] == "=" and words[ex.it_index] == "it"
    assert np.allclose(att[..., 0], rows[:, :, 0, words.index("street")])
    assert np.allclose(att[..., 1], rows[:, :, 0, words.index("animal")])


def test_report_keys_and_state_restored(untrained, tmp_path):
    model, dataset = untrained
    model.train()
    summary = lesson.report(model, dataset, str(tmp_path), "cpu", say=lambda msg: None)
    for key in ("heldout_accuracy", "heldout_attention_correct", "referent_head", "attention_plots"):
        assert key in summary
    assert len(summary["referent_head"]) == 2
    json.dumps(summary)                                  # it goes into summary.json
    assert model.training                                # train mode is back
    assert all(not block.attn.keep_weights for block in model.h)


def test_short_training_beats_chance(tmp_path):
    """A 1-layer model trained for 300 steps (a few seconds) already tells animals from places (chance: 0.5)."""
    out = tmp_path / "out"
    argv = ["--quiet", "--out_dir", str(out), "--n_layer", "1", "--n_head", "2", "--n_embd", "32",
            "--block_size", "20", "--batch_size", "16", "--max_iters", "300", "--lr_decay_iters", "300",
            "--warmup_iters", "10", "--learning_rate", "1e-2", "--eval_interval", "1000", "--eval_iters", "1"]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["heldout_accuracy"] > 0.6
    assert {"heldout_attention_correct", "referent_head"} <= summary.keys()
    if summary["attention_plots"]:
        assert (out / "attention_tired.png").exists() and (out / "attention_wide.png").exists()
