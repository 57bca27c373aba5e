"""The same command gives the same numbers: how busy the machine is must not change them.

The fast layer's threads (tinyattn/fast/threads.py) hand an op to the pool only
from MIN_WORK on, and MIN_WORK is measured on the machine, so it differs from one
process to the next. Here it is forced to two extremes, every op (from FLOOR, set
to 0 so that the tiny model's ops count) on the threads or none, and the weights,
AdamW's state and every loss must agree to the bit; a run interrupted under one
and resumed under the other too. Only the thread count may change the numbers.
"""

import numpy as np
import pytest

from tinyattn.fast import threads
from train import checkpoint
from train.command import main
from training_data import TEXT, TINY, ctrl_c_in_backward

RUN = [*TINY, "--dropout", "0.1", "--eval_interval", "5", "--log_interval", "1", "--max_iters", "12"]
FLOOR = threads.FLOOR                                                # (the fixture below sets it to 0)
ON_THE_THREADS, ON_THE_CALLER = 0, 10 ** 15                         # MIN_WORK: every op on the threads, or none

pytestmark = pytest.mark.skipif(not threads.blas_controllers(), reason="threadpoolctl is not installed: no threads")


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text(TEXT)
    return str(path)


@pytest.fixture(autouse=True)
def three_threads(monkeypatch):
    """Three threads (parts of unequal size), and every op of the tiny model large enough to share."""
    monkeypatch.setattr(threads, "_num_threads", 3)
    monkeypatch.setattr(threads, "FLOOR", 0)


def final_state(out):
    """Weights and AdamW's state by name, every step's loss and every evaluation."""
    model, optim, meta = checkpoint.load(str(out / "ckpt.npz"))
    arrays = dict(model)
    arrays.update({f"adamw/{i}/{k}": v for i, values in optim["state"].items() for k, v in values.items()})
    evals = [(r["step"], r["train_loss"], r["val_loss"]) for r in meta["log"]]
    return arrays, meta["train_losses"], evals, meta["step"]


def train_with(min_work, monkeypatch, argv):
    monkeypatch.setattr(threads, "MIN_WORK", min_work)
    return main(argv)


def assert_same_bits(got, want):
    arrays, losses, evals, step = got
    want_arrays, want_losses, want_evals, want_step = want
    assert step == want_step
    assert losses == want_losses
    assert evals == want_evals
    assert arrays.keys() == want_arrays.keys()
    for key in arrays:
        np.testing.assert_array_equal(arrays[key], want_arrays[key], err_msg=key)


def runs_under(thresholds, text_file, tmp_path, monkeypatch, flags):
    """The final state of the same run under each MIN_WORK of thresholds."""
    runs = []
    for min_work in thresholds:
        out = tmp_path / str(min_work)
        assert train_with(min_work, monkeypatch, ["--data", text_file, "--out_dir", str(out), *flags]) == 0
        runs.append(final_state(out))
    return runs


def test_a_run_gives_the_same_bits_whether_its_ops_run_on_the_threads_or_not(text_file, tmp_path, monkeypatch):
    assert_same_bits(*runs_under((ON_THE_CALLER, ON_THE_THREADS), text_file, tmp_path, monkeypatch, RUN))


def test_a_larger_model_with_the_real_floor_gives_the_same_bits(text_file, tmp_path, monkeypatch):
    """Ops above and below FLOOR, on two threads: MIN_WORK as low as it can be measured, or never reached."""
    monkeypatch.setattr(threads, "FLOOR", FLOOR)
    monkeypatch.setattr(threads, "_num_threads", 2)
    model = ["--n_layer", "2", "--n_head", "4", "--n_embd", "64", "--block_size", "32", "--batch_size", "8",
             "--eval_iters", "2", "--eval_interval", "4", "--max_iters", "8", "--quiet", "--sample_tokens", "0"]
    assert_same_bits(*runs_under((ON_THE_CALLER, FLOOR), text_file, tmp_path, monkeypatch, model))


def test_a_run_resumed_under_the_other_threshold_is_exact(text_file, tmp_path, monkeypatch):
    """Ctrl-C in step 8's backward, where every op ran on the calling thread; resumed with every op on the threads."""
    straight = tmp_path / "straight"
    assert train_with(ON_THE_THREADS, monkeypatch, ["--data", text_file, "--out_dir", str(straight), *RUN]) == 0
    out = tmp_path / "stopped"
    with pytest.MonkeyPatch.context() as mp:
        ctrl_c_in_backward(mp, 8)
        assert train_with(ON_THE_CALLER, mp, ["--data", text_file, "--out_dir", str(out), *RUN]) == 130
    assert 0 < checkpoint.read_meta(str(out / "ckpt.npz"))["step"] < 12
    assert train_with(ON_THE_THREADS, monkeypatch,
                      ["--data", text_file, "--out_dir", str(out), "--resume", "--max_iters", "12"]) == 0
    assert_same_bits(final_state(out), final_state(straight))


def test_a_resume_under_another_thread_count_says_its_numbers_differ(text_file, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    stop = [*RUN[:-1], "6"]
    assert main(["--data", text_file, "--out_dir", str(out), *stop]) == 0
    assert checkpoint.read_meta(str(out / "ckpt.npz"))["cpu_threads"] == 3
    resume = ["--data", text_file, "--out_dir", str(out), "--resume", "--max_iters", "8"]
    capsys.readouterr()
    assert main(resume) == 0                                         # the same count: no note
    assert "CPU threads" not in capsys.readouterr().err
    monkeypatch.setattr(threads, "_num_threads", 2)
    assert main([*resume[:-1], "10"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "CPU threads" in line]
    assert notes == ["python -m train: note: the run used 3 CPU threads and this one uses 2 (TINYATTN_NUM_THREADS): "
                     "ops cut into other parts round differently, so the resumed run is not the uninterrupted run "
                     "to the bit"]
