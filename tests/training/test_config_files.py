"""Two of nanoGPT's habits in python -m train: a config file as the first argument (config/*.py
are the presets, as files to copy), and --dtype float32|float64."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import train
from train import checkpoint
from train.command import main
from train.sample import load_model
from train.config import COMMON, CONFIG_DIR, PRESETS, build_parser, parse_args, read_config_file

from training_data import REPO, TEXT, TINY, error_lines      # the tiny text and model the training tests use


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text(TEXT)
    return str(path)


def config_file(tmp_path, text, name="my_config.py"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def refused(capsys, argv):
    """The one line a bad command line gets (exit status 2)."""
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# ---------------------------------------------------------------- config files
def test_a_config_files_settings_count_as_flags_given_and_flags_after_it_win(tmp_path):
    path = config_file(tmp_path, '"""A docstring is fine."""\n# and comments\nn_layer = 1\nmax_iters = 20\n'
                                 'lr_decay_iters = 100\nlearning_rate = 1\nbias = False\nout_dir = "elsewhere"\n')
    args, notes = parse_args([path, "--max_iters", "30"])
    assert (args.n_layer, args.max_iters, args.bias, args.out_dir) == (1, 30, False, "elsewhere")
    assert args.learning_rate == 1.0 and isinstance(args.learning_rate, float)   # an int for a float setting
    assert {"n_layer", "max_iters", "lr_decay_iters", "learning_rate", "bias", "out_dir"} <= set(args._given)
    # as typed: lr_decay_iters is kept past max_iters (a note says so), not fitted as a preset's would be
    assert args.lr_decay_iters == 100 and any("--lr_decay_iters 100 is past --max_iters 30" in n for n in notes)
    assert args.n_head == PRESETS["coref"]["n_head"]            # what the file does not set: the preset's


def test_data_in_a_config_file_takes_the_text_preset(tmp_path, text_file):
    args, _ = parse_args([config_file(tmp_path, f"data = {text_file!r}\n")])
    assert args.data == text_file
    for key, value in PRESETS["text"].items():
        assert getattr(args, key) == value, key


def test_the_presets_are_the_config_files():
    """One source: the shipped files are what python -m train takes with no file, and every file in
    config/ reads as a config file (the example included)."""
    for name, flags in (("coref", []), ("text", ["--data", os.path.join(REPO, "README.md")])):
        assert PRESETS[name] == read_config_file(CONFIG_DIR / f"{name}.py", build_parser())
        with_file, without = parse_args([str(CONFIG_DIR / f"{name}.py"), *flags])[0], parse_args(flags)[0]
        assert {k: getattr(with_file, k) for k in PRESETS[name]} == {k: getattr(without, k) for k in PRESETS[name]}
    assert not set(PRESETS["coref"]) & {"data", "resume"} and "dtype" in COMMON
    files = sorted(CONFIG_DIR.glob("*.py"))
    assert {"coref.py", "text.py"} <= {f.name for f in files}
    for path in files:
        read_config_file(path, build_parser())


def test_the_config_folder_installs_beside_train():
    """An installed copy reads its presets from config/ next to train/: the package list ships it
    (what setuptools finds with this list is what a wheel holds)."""
    tomllib = pytest.importorskip("tomllib")
    setuptools = pytest.importorskip("setuptools")
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        include = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["include"]
    assert "config" in setuptools.find_namespace_packages(REPO, include=include)
    assert CONFIG_DIR.parent == Path(train.__file__).resolve().parent.parent


@pytest.mark.parametrize("text, said", [
    ("lr = 1e-3\n", "line 1: unknown setting lr (did you mean learning_rate"),
    ("\nn_layers = 2\n", "line 2: unknown setting n_layers (did you mean n_layer"),
    ("n_layer = 4.5\n", "n_layer = 4.5: expected a whole number, got float"),
    ("learning_rate = '1e-3'\n", "learning_rate = '1e-3': expected a number, got str"),
    ("bias = 'no'\n", "bias = 'no': expected True or False"),
    ("init = 'xavier'\n", "init = 'xavier': expected one of 'gpt2', 'default'"),
    ("lora_rank = 0\n", "lora_rank = 0: must be at least 1"),
    ("dtype = 'bfloat16'\n", "the CPU build computes in float32 or float64"),
    ("max_iters = 10 * 2\n", "max_iters = 10 * 2: a value here is a number, a string, True or False"),
    ("import time\n", "line 1: only NAME = value lines are read"),
    ("n_layer = (\n", "not Python that reads (SyntaxError)"),
])
def test_a_bad_config_file_is_refused_in_one_line_naming_it(capsys, tmp_path, text, said):
    path = config_file(tmp_path, text)
    line = refused(capsys, [path, "--max_iters", "1"])
    assert f"config file {path}" in line and said in line, line


def test_a_missing_config_file_and_one_given_late(capsys, tmp_path):
    path = str(tmp_path / "none.py")
    assert f"config file {path}: No such file" in refused(capsys, [path])
    line = refused(capsys, ["--max_iters", "1", "config/text.py"])
    assert "a config file comes first, as in python -m train config/text.py" in line


def test_the_example_config_runs_as_written(tmp_path, text_file):
    """config/train_shakespeare_char.py, from a folder holding the file where it says."""
    folder = tmp_path / "data" / "shakespeare_char"
    folder.mkdir(parents=True)
    os.link(text_file, folder / "input.txt")
    proc = subprocess.run([sys.executable, "-m", "train", os.path.join(REPO, "config", "train_shakespeare_char.py"),
                           *TINY, "--max_iters", "2", "--eval_interval", "2"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "out-shakespeare-char" / "summary.json").read_text())["iters"] == 2


def test_help_names_the_config_file_and_dtype(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m train [CONFIG.py] [flags]") and "--dtype float32|float64" in out


# ---------------------------------------------------------------- --dtype
def run(text_file, out_dir, *extra):
    assert main(["--data", text_file, "--out_dir", str(out_dir), *TINY, *extra]) == 0
    with open(os.path.join(out_dir, "summary.json")) as f:
        return json.load(f)


def step_losses(out_dir):
    return checkpoint.read_meta(os.path.join(out_dir, "ckpt.npz"))["train_losses"]


def test_float64_trains_through_the_loop_as_float32_does(text_file, tmp_path):
    single = run(text_file, tmp_path / "f32", "--max_iters", "20", "--eval_interval", "10")
    double = run(text_file, tmp_path / "f64", "--max_iters", "20", "--eval_interval", "10", "--dtype", "float64")
    model_state, optim_state, meta = checkpoint.load(str(tmp_path / "f64" / "ckpt.npz"))
    assert meta["args"]["dtype"] == "float64"
    assert {a.dtype for a in model_state.values()} == {np.dtype("float64")}
    assert {v.dtype for s in optim_state["state"].values() for v in s.values() if isinstance(v, np.ndarray)} \
        == {np.dtype("float64")}                                # AdamW's moments too
    f32_state = checkpoint.load(str(tmp_path / "f32" / "ckpt.npz"))[0]
    assert {a.dtype for a in f32_state.values()} == {np.dtype("float32")}
    assert double["val_loss"] == pytest.approx(single["val_loss"], abs=1e-3)
    np.testing.assert_allclose(step_losses(tmp_path / "f64"), step_losses(tmp_path / "f32"), atol=1e-3)
    for name, weight in model_state.items():                 # the same weights, to float32's precision
        np.testing.assert_allclose(weight, f32_state[name], atol=1e-3, err_msg=name)


def test_float64_compiled_or_not_is_the_same_run(text_file, tmp_path):
    """The fast layer's float64 paths, or its fallbacks, against the teaching formulas (--compile False)."""
    fast = run(text_file, tmp_path / "fast", "--max_iters", "8", "--eval_interval", "4", "--dtype", "float64")
    slow = run(text_file, tmp_path / "slow", "--max_iters", "8", "--eval_interval", "4", "--dtype", "float64",
               "--compile", "False")
    np.testing.assert_allclose(step_losses(tmp_path / "fast"), step_losses(tmp_path / "slow"), rtol=1e-9)
    assert fast["val_loss"] == pytest.approx(slow["val_loss"], rel=1e-9)


def test_resume_keeps_the_runs_dtype_and_refuses_another(text_file, tmp_path, capsys):
    out = tmp_path / "run"
    run(text_file, out, "--max_iters", "6", "--eval_interval", "3", "--dtype", "float64")
    assert main(["--data", text_file, "--out_dir", str(out), *TINY, "--max_iters", "8", "--resume",
                 "--dtype", "float32"]) == 1
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "--dtype float32 (the run in" in err[0] and "computes in float64" in err[0], err
    run(text_file, out, "--max_iters", "9", "--eval_interval", "3", "--resume")     # not given: the run's own
    model_state, _, meta = checkpoint.load(str(out / "ckpt.npz"))
    assert meta["step"] == 9 and meta["args"]["dtype"] == "float64"
    assert {a.dtype for a in model_state.values()} == {np.dtype("float64")}
    model, _ = load_model(str(out))                            # python -m train.sample: the run's dtype too
    assert {p.dtype for p in model.parameters()} == {np.dtype("float64")}


def test_nanogpts_half_precision_is_refused_in_one_line(capsys):
    for name in ("float16", "bfloat16"):
        line = refused(capsys, ["--dtype", name])
        assert f"--dtype: {name} is not available: the CPU build computes in float32 or float64" in line
    assert "expected float32 or float64, got 'int8'" in refused(capsys, ["--dtype", "int8"])
