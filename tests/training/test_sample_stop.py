"""Generation that stops: GPT.generate(stop=...) and python -m train.sample --stop."""
import os

import numpy as np

import tinyattn as ta
from tinyattn.models import GPT, GPTConfig
from train import checkpoint, sample
from train.data import CharTokenizer, WordTokenizer, tokenizer_to_json


def tiny_gpt(vocab_size):
    ta.manual_seed(3)
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=64, vocab_size=vocab_size)).eval()


def test_generate_stops_after_the_stop_sequence():
    model = tiny_gpt(7)
    start = ta.tensor([[1, 2]])
    full = model.generate(start, 30, temperature=0)[0].tolist()[2:]          # greedy: the same every time
    stop = full[4:6]
    first = next(i for i in range(len(full) - 1) if full[i:i + 2] == stop)
    out = model.generate(start, 30, temperature=0, stop=stop)[0].tolist()[2:]
    assert out == full[:first + 2]
    assert model.generate(start, 30, temperature=0, stop=[99])[0].tolist()[2:] == full   # never produced


def test_generate_with_a_batch_runs_until_every_row_stopped():
    model = tiny_gpt(7)
    start = ta.tensor([[1, 2], [3, 4]])
    full = model.generate(start, 20, temperature=0).numpy()[:, 2:]
    stop = [int(full[0, 0])]
    out = model.generate(start, 20, temperature=0, stop=stop).numpy()[:, 2:]
    ends = [list(row).index(stop[0]) + 1 if stop[0] in row else 20 for row in full]
    assert out.shape[1] == max(ends) and np.array_equal(out, full[:, :out.shape[1]])


def save(folder, tokenizer):
    model = tiny_gpt(tokenizer.vocab_size)
    checkpoint.save(os.path.join(folder, "ckpt.npz"), model, model.configure_optimizer(0.0, 1e-3, (0.9, 0.99)),
                    dict(config=model.config.to_dict(), tokenizer=tokenizer_to_json(tokenizer)))


def run_sample(capsys, folder, *flags):
    assert sample.main(["--out_dir", str(folder), "--num_samples", "1", "--temperature", "0",
                        "--max_new_tokens", "40", *flags]) == 0
    return capsys.readouterr().out.split("\n---------------\n")[0]


def test_sample_cuts_each_sample_at_the_stop_text(tmp_path, capsys):
    tok = CharTokenizer.from_text("abcdefgh \n")
    save(str(tmp_path), tok)
    full = run_sample(capsys, tmp_path, "--start", "ab")
    stop = full[5:7]
    cut = run_sample(capsys, tmp_path, "--start", "ab", "--stop", stop)
    assert cut == full[:full.index(stop, 2) + len(stop)] and len(cut) < len(full)
    assert run_sample(capsys, tmp_path, "--start", "ab", "--stop", "") == full
    assert sample.main(["--out_dir", str(tmp_path), "--stop", "xyz"]) == 1
    assert "'x' is not in the vocabulary" in capsys.readouterr().err


def test_word_model_stops_at_eos_by_default(tmp_path, capsys):
    words = WordTokenizer(["<eos>", "=", "animal", "it", "the", "tired"])
    chars = CharTokenizer.from_text("ab<eos>")
    assert sample.stop_text(None, words) == "<eos>"
    assert sample.stop_text(None, chars) is None                      # a character model has no default
    assert sample.stop_text("\\n\\n", chars) == "\n\n" and sample.stop_text("", words) is None
    save(str(tmp_path), words)
    full = run_sample(capsys, tmp_path, "--start", "the", "--stop", "", "--temperature", "0.8")
    out = run_sample(capsys, tmp_path, "--start", "the", "--temperature", "0.8")     # the same seed: same draws
    assert "<eos>" in full
    assert out == full[:full.index("<eos>") + len("<eos>")] and out.count("<eos>") == 1
