"""The training program never loses work or answers wrong without a word: a new run into a
folder that holds one, an interrupted run and its --resume, a different text file, a schedule
that ended, a model too large for memory, a bad sampling flag."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from train import checkpoint
from train.loop import main

from test_train import REPO, TEXT, TINY      # the tiny text and model the training tests use


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text(TEXT)
    return str(path)


def one_error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# ---------------------------------------------------------------- a folder that holds a run
@pytest.mark.parametrize("max_iters", ["4", "0"])
def test_a_new_run_never_replaces_another_runs_checkpoints(text_file, tmp_path, capsys, max_iters):
    out = tmp_path / "run"
    assert main(["--data", text_file, "--out_dir", str(out), *TINY, "--max_iters", "10", "--eval_interval", "5"]) == 0
    before = {name: (out / name).read_bytes() for name in ("ckpt.npz", "best.npz")}
    capsys.readouterr()
    assert main(["--data", text_file, "--out_dir", str(out), *TINY, "--max_iters", max_iters]) == 1
    line = one_error_line(capsys)
    assert line.startswith(f"python -m train: error: --out_dir {out} already holds a run (ckpt.npz at step 10, "
                           "best val loss "), line
    assert line.endswith("continue it with --resume, replace it with --overwrite, or pick another --out_dir")
    for name, data in before.items():
        assert (out / name).read_bytes() == data


def test_overwrite_replaces_the_run_and_its_best_checkpoint(text_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["--data", text_file, "--out_dir", str(out), *TINY, "--max_iters", "10", "--eval_interval", "5"]) == 0
    capsys.readouterr()
    assert main(["--data", text_file, "--out_dir", str(out), *TINY, "--max_iters", "3", "--eval_interval", "5",
                 "--overwrite"]) == 0
    assert f"note: --overwrite: the run in {out} (ckpt.npz at step 10, best val loss" in capsys.readouterr().out
    assert checkpoint.read_meta(str(out / "ckpt.npz"))["step"] == 3
    assert checkpoint.read_meta(str(out / "best.npz"))["step"] == 3
    # a run with no step writes no best.npz: the old run's must not stay as if it were the new one's
    assert main(["--data", text_file, "--out_dir", str(out), *TINY, "--max_iters", "0", "--overwrite"]) == 0
    assert checkpoint.read_meta(str(out / "ckpt.npz"))["step"] == 0
    assert not (out / "best.npz").exists()


def test_resume_and_overwrite_together_are_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--resume", "--overwrite", "--out_dir", "nowhere"])
    assert e.value.code == 2
    assert "--resume continues the run in --out_dir, --overwrite replaces it: give one of them" in one_error_line(capsys)


def test_the_refusal_is_one_line_from_the_command(text_file, tmp_path):
    out = tmp_path / "run"
    assert main(["--data", text_file, "--out_dir", str(out), *TINY, "--max_iters", "2"]) == 0
    proc = subprocess.run([sys.executable, "-m", "train", "--data", text_file, "--out_dir", str(out), *TINY,
                           "--max_iters", "2"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "--overwrite" in proc.stderr
