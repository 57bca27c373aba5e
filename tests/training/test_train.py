"""The training program: a tiny run, checkpoints, resume, sampling, CLI errors."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tinyattn as ta
from train import checkpoint
from train.command import main
from train.sample import main as sample_main

from training_data import TEXT, TINY      # the tiny text and model the training tests use


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text(TEXT)
    return str(path)


def run(text_file, out_dir, *extra):
    assert main(["--data", text_file, "--out_dir", str(out_dir), *TINY, *extra]) == 0
    with open(os.path.join(out_dir, "summary.json")) as f:
        return json.load(f)


def test_tiny_run_lowers_val_loss_and_writes_its_files(text_file, tmp_path):
    out = tmp_path / "run"
    summary = run(text_file, out, "--max_iters", "40", "--eval_interval", "20")
    for key in ("best_val_loss", "val_loss", "train_loss", "iters", "tokens_per_s", "wall_s"):
        assert key in summary
    assert summary["iters"] == 40
    rows = (out / "log.csv").read_text().splitlines()
    assert rows[0] == "step,train_loss,val_loss,train_perplexity,val_perplexity,lr,time,val_bpb" and len(rows) == 4
    first_val = float(rows[1].split(",")[2])
    assert summary["val_loss"] < first_val - 0.3
    assert (out / "ckpt.npz").exists()


def test_a_resumed_run_says_where_it_starts_even_when_quiet(text_file, tmp_path, capsys):
    out = tmp_path / "run"
    run(text_file, out, "--max_iters", "15", "--eval_interval", "10")           # TINY has --quiet
    assert "resuming" not in capsys.readouterr().err
    best = checkpoint.read_meta(str(out / "ckpt.npz"))["best_val_loss"]
    run(text_file, out, "--max_iters", "20", "--eval_interval", "10", "--resume")
    lines = [line for line in capsys.readouterr().err.splitlines() if "resuming" in line]
    assert lines == [f"python -m train: resuming {out / 'ckpt.npz'} at step 15 of 20, best val loss {best:.4f}"]


def test_the_resume_line_without_a_best_val_loss():
    from train.start import resuming
    state = dict(step=7, best_val_loss=float("inf"), log=[dict(step=5, val_loss=2.5)])
    assert resuming("out/ckpt.npz", state, 50) == "resuming out/ckpt.npz at step 7 of 50, val loss 2.5000"
    state["log"] = []
    assert resuming("out/ckpt.npz", state, 50) == "resuming out/ckpt.npz at step 7 of 50, not evaluated yet"


def test_checkpoint_loads_without_pickle_and_round_trips(text_file, tmp_path):
    out = tmp_path / "run"
    run(text_file, out, "--max_iters", "10", "--eval_interval", "10")
    with np.load(out / "ckpt.npz", allow_pickle=False) as f:
        assert "meta" in f.files and any(k.startswith("optim/") for k in f.files)
    model_state, optim_state, meta = checkpoint.load(str(out / "ckpt.npz"))
    assert meta["step"] == 10 and meta["config"]["n_embd"] == 16
    assert json.loads(meta["tokenizer"])["kind"] == "char"
    from train.sample import load_model
    model, tokenizer = load_model(str(out))
    for name, t in model.state_dict().items():
        np.testing.assert_array_equal(t.numpy(), model_state[name])
    assert tokenizer.decode(tokenizer.encode("Speak")) == "Speak"


def test_resume_is_exact(text_file, tmp_path):
    straight = run(text_file, tmp_path / "a", "--max_iters", "30", "--eval_interval", "10", "--dropout", "0.1")
    run(text_file, tmp_path / "b", "--max_iters", "15", "--eval_interval", "10", "--dropout", "0.1")
    resumed = run(text_file, tmp_path / "b", "--max_iters", "30", "--eval_interval", "10", "--dropout", "0.1",
                  "--resume")
    assert resumed["iters"] == 30
    assert resumed["val_loss"] == straight["val_loss"] and resumed["train_loss"] == straight["train_loss"]
    a, _, _ = checkpoint.load(str(tmp_path / "a" / "ckpt.npz"))
    b, _, _ = checkpoint.load(str(tmp_path / "b" / "ckpt.npz"))
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_a_failed_save_keeps_the_last_good_checkpoint(text_file, tmp_path, monkeypatch):
    out = tmp_path / "run"
    run(text_file, out, "--max_iters", "10", "--eval_interval", "10")
    before = (out / "ckpt.npz").read_bytes()

    def broken_savez(f, **arrays):
        f.write(b"half a file")
        raise OSError("disk full")
    monkeypatch.setattr(np, "savez", broken_savez)
    with pytest.raises(OSError):
        from train.sample import load_model
        model, _ = load_model(str(out))
        checkpoint.save(str(out / "ckpt.npz"), model, model.configure_optimizer(0.1, 1e-3, (0.9, 0.99)), {})
    assert (out / "ckpt.npz").read_bytes() == before
    assert [p.name for p in out.iterdir() if p.name.startswith(".ckpt-")] == []


def test_sampling_is_deterministic_under_seed(text_file, tmp_path, capsys):
    out = tmp_path / "run"
    run(text_file, out, "--max_iters", "10", "--eval_interval", "10")
    capsys.readouterr()
    args = ["--out_dir", str(out), "--start", "First", "--num_samples", "2", "--max_new_tokens", "30", "--seed", "7"]
    assert sample_main(args) == 0
    first = capsys.readouterr().out
    assert sample_main(args) == 0
    assert capsys.readouterr().out == first
    assert first.startswith("First")
    assert sample_main(args[:-1] + ["8"]) == 0
    assert capsys.readouterr().out != first


@pytest.mark.parametrize("argv, message", [
    (["--n_layer", "two"], "invalid int value"),
    (["--bogus"], "unknown flag --bogus"),
    (["--n_embd", "30", "--n_head", "4"], "divisible"),
    (["--data", "/no/such/file.txt"], "no such file"),
    (["--device", "cuda"], "gpu"),
    (["--resume", "--out_dir", "/no/such/dir"], "no checkpoint"),
])
def test_cli_errors_are_one_line(argv, message):
    if "cuda" in argv and ta.cuda_is_available():
        pytest.skip("CUDA is available here")
    proc = subprocess.run([sys.executable, "-m", "train", *argv, "--max_iters", "1", "--quiet"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert message in lines[0]
    assert "Traceback" not in proc.stderr


def test_sample_cli_error_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "train.sample", "--out_dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1
    assert "no checkpoint" in proc.stderr


def test_gradient_accumulation_equals_one_big_batch():
    """Two half batches with loss/2 each give the same step, clipping included, as one full batch."""
    import tinyattn as ta
    from tinyattn.models import GPT, GPTConfig
    from train.loop import train_step
    rng = np.random.default_rng(0)
    x = ta.tensor(rng.integers(0, 9, (4, 8)))
    y = ta.tensor(rng.integers(0, 9, (4, 8)))
    results = []
    for batches in ([(x, y)], [(x[:2], y[:2]), (x[2:], y[2:])]):
        ta.manual_seed(0)
        model = GPT(GPTConfig(block_size=8, vocab_size=9, n_layer=1, n_head=2, n_embd=8))
        opt = model.configure_optimizer(0.1, 1e-2, (0.9, 0.99))
        loss = train_step(model, opt, batches, grad_clip=0.01)      # a clip that bites
        results.append((loss.item(), [p.numpy().copy() for p in model.parameters()]))
    assert abs(results[0][0] - results[1][0]) < 1e-6
    for a, b in zip(results[0][1], results[1][1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_ctrl_c_saves_a_checkpoint(text_file, tmp_path, monkeypatch):
    import train.loop as program
    real_step = program.train_step
    calls = []

    def interrupted_step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return real_step(*args, **kwargs)
    monkeypatch.setattr(program, "train_step", interrupted_step)
    out = tmp_path / "run"
    assert main(["--data", text_file, "--out_dir", str(out), *TINY, "--max_iters", "20"]) == 130
    _, _, meta = checkpoint.load(str(out / "ckpt.npz"))
    assert meta["step"] == 5
