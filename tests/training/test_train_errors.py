"""The training program and the experiments: a mistyped flag, a bad number, a --resume that
does not fit, a run that blows up. Each gets one line, and no checkpoint ever loses its
last good state."""
import json
import math

import numpy as np
import pytest

import tinyattn as ta
import train.loop as program
from train import checkpoint, report
from train.command import main
from train.config import PRESETS, parse_args

from training_data import TEXT, TINY, error_lines      # the tiny text and model the training tests use


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text(TEXT)
    return str(path)


def refused(capsys, argv, parse=parse_args):
    """The one line a bad command line gets (exit status 2)."""
    with pytest.raises(SystemExit) as e:
        parse(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# ---------------------------------------------------------------- flags
@pytest.mark.parametrize("argv, said", [
    (["--lr", "100"], "unknown flag --lr (did you mean --learning_rate or --lr_decay_iters?)"),
    (["--n_emb", "128"], "unknown flag --n_emb (did you mean --n_embd?)"),
    (["--learning", "1e-3"], "unknown flag --learning (did you mean --learning_rate?)"),
    (["--max_iter", "5"], "unknown flag --max_iter (did you mean --max_iters?)"),
    (["--eval_intervl", "5"], "unknown flag --eval_intervl (did you mean --eval_interval or"),
    (["--lr=3"], "unknown flag --lr (did you mean --learning_rate"),
    (["--bogus"], "unknown flag --bogus"),
    (["100"], "unexpected argument '100': every value follows its flag"),
])
def test_flags_are_never_abbreviated(capsys, argv, said):
    line = refused(capsys, argv)
    assert line.startswith("python -m train: error: " + said), line


@pytest.mark.parametrize("argv, said", [
    (["--init_from=resume"], "--init_from resume is nanoGPT's way to continue a run; here it is --resume"),
    (["--init_from", "scratch"], "here a run starts from scratch without --init_from"),
    (["--compile", "maybe"], "argument --compile: expected true or false, got 'maybe'"),
])
def test_nanogpt_flags_say_what_tinyattn_has(capsys, argv, said):
    line = refused(capsys, argv)
    assert line.startswith("python -m train: error: ") and said in line, line


def test_compile_false_is_what_runs_anyway():
    args, _ = parse_args(["--compile=False", "--max_iters", "5"])
    assert not hasattr(args, "_compile") and "_compile" not in args._given


def test_a_file_given_without_data_is_pointed_at(capsys, text_file):
    assert f"(did you mean --data {text_file}?)" in refused(capsys, [text_file])


def test_the_lr_abbreviation_no_longer_sets_lr_decay_iters():
    """argparse used to expand --lr to --lr_decay_iters; the full name still works."""
    args, notes = parse_args(["--lr_decay_iters", "100", "--learning_rate", "1e-3"])
    assert args.lr_decay_iters == 100 and args.learning_rate == 1e-3


@pytest.mark.parametrize("flag, value, said", [
    ("learning_rate", "0", "must be > 0 and finite"), ("learning_rate", "-0.001", "must be > 0 and finite"),
    ("learning_rate", "nan", "must be > 0 and finite"), ("learning_rate", "inf", "must be > 0 and finite"),
    ("min_lr", "-1", "must be >= 0 and finite"), ("min_lr", "nan", "must be >= 0 and finite"),
    ("weight_decay", "-0.1", "must be >= 0 and finite"), ("grad_clip", "-1", "must be >= 0 and finite"),
    ("grad_clip", "inf", "must be >= 0 and finite"),
    ("beta1", "1", r"must be in [0, 1)"), ("beta2", "-0.5", r"must be in [0, 1)"), ("beta2", "nan", "must be in [0, 1)"),
    ("dropout", "1", "must be in [0, 1)"), ("dropout", "-0.1", "must be in [0, 1)"),
    *[(name, "0", "must be at least 1") for name in ("n_layer", "n_head", "n_embd", "block_size", "batch_size",
                                                     "eval_interval", "eval_iters", "gradient_accumulation_steps",
                                                     "log_interval")],
    *[(name, "-1", "must not be negative") for name in ("max_iters", "warmup_iters", "lr_decay_iters",
                                                        "sample_tokens", "seed")],
])
def test_every_numeric_flag_is_range_checked(capsys, flag, value, said):
    line = refused(capsys, [f"--{flag}", value])
    assert f"--{flag} {said}" in line, line


def test_min_lr_above_learning_rate(capsys):
    assert "--min_lr 0.1 must not exceed --learning_rate 0.01" in refused(
        capsys, ["--learning_rate", "1e-2", "--min_lr", "0.1"])
    args, notes = parse_args(["--learning_rate", "1e-4"])           # the preset's min_lr is 3e-4: adapted
    assert args.min_lr == pytest.approx(1e-5) and any("--min_lr set to 1e-05" in n for n in notes)


# ---------------------------------------------------------------- schedules
def test_a_preset_schedule_is_fitted_to_max_iters_and_says_so():
    args, notes = parse_args(["--max_iters", "20"])
    assert (args.lr_decay_iters, args.warmup_iters) == (20, 2)
    preset = PRESETS["coref"]
    assert f"--lr_decay_iters set to 20 to fit --max_iters (the preset's was {preset['lr_decay_iters']})" in notes
    assert f"--warmup_iters set to 2 to fit --max_iters (the preset's was {preset['warmup_iters']})" in notes
    assert parse_args([])[1] == []                        # the presets fit themselves


def test_a_given_schedule_is_kept_and_explained():
    args, notes = parse_args(["--max_iters", "20", "--lr_decay_iters", "100", "--warmup_iters", "30"])
    assert (args.lr_decay_iters, args.warmup_iters) == (100, 30)
    assert any("--lr_decay_iters 100 is past --max_iters 20" in n for n in notes)
    assert any("--warmup_iters 30 is not below --max_iters 20: the whole run is warmup" in n for n in notes)


def test_warmup_past_decay(capsys):
    assert "--warmup_iters 90 must not exceed --lr_decay_iters 50" in refused(
        capsys, ["--warmup_iters", "90", "--lr_decay_iters", "50"])
    args, notes = parse_args(["--lr_decay_iters", "10"])             # the preset's warmup of 50 is adapted
    assert args.warmup_iters == 1


def test_the_notes_are_printed_as_one_line_each(text_file, tmp_path, capsys):
    no_schedule = [a for i, a in enumerate(TINY) if "_iters" not in a and "_iters" not in TINY[i - 1]]
    assert main(["--data", text_file, "--out_dir", str(tmp_path), *no_schedule, "--eval_iters", "2",
                 "--max_iters", "4", "--eval_interval", "4"]) == 0
    err = capsys.readouterr().err
    assert "python -m train: note: --lr_decay_iters set to 4 to fit --max_iters (the preset's was 2000)" in err


# ---------------------------------------------------------------- resume
@pytest.fixture
def text_run(text_file, tmp_path):
    out = tmp_path / "run"
    assert main(["--data", text_file, "--out_dir", str(out), *TINY, "--max_iters", "10", "--eval_interval", "5"]) == 0
    return out


def resume_error(capsys, out, *argv):
    assert main(["--out_dir", str(out), "--resume", "--max_iters", "20", "--quiet", *argv]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_resume_without_data_for_a_text_checkpoint(text_run, text_file, capsys):
    line = resume_error(capsys, text_run)
    assert f"was trained on a text file ({text_file}): pass --data {text_file} to resume it" in line


def test_resume_with_another_vocabulary(text_run, tmp_path, capsys):
    other = tmp_path / "other.txt"
    other.write_text("completely different letters: xyzqj 0123456789 " * 50)
    line = resume_error(capsys, text_run, "--data", str(other))
    assert f"the vocabulary of {other} (" in line and "differs from the one" in line


@pytest.mark.parametrize("flag, value, theirs", [("n_embd", "32", "16"), ("n_layer", "2", "1"),
                                                 ("block_size", "8", "16"), ("dropout", "0.1", "0.0"),
                                                 ("init", "default", "gpt2")])
def test_resume_with_a_conflicting_model_flag(text_run, text_file, capsys, flag, value, theirs):
    line = resume_error(capsys, text_run, "--data", text_file, f"--{flag}", value,
                        *(["--n_head", "2"] if flag == "n_embd" else []))
    assert f"--resume: --{flag} {value} (the checkpoint has {theirs}): the model in" in line
    assert "drop the flag, or use another --out_dir" in line


def test_resume_takes_the_model_flags_it_was_not_given(text_run, text_file):
    assert main(["--data", text_file, "--out_dir", str(text_run), "--resume", "--max_iters", "12", "--quiet",
                 "--sample_tokens", "0", "--eval_iters", "2"]) == 0
    summary = json.loads((text_run / "summary.json").read_text())
    assert summary["config"]["n_embd"] == 16 and summary["iters"] == 12


def test_resume_a_checkpoint_from_before_the_init_flag(text_run, text_file):
    """Checkpoints written before --init and --head_dropout existed have neither in their config:
    they were gpt2, without head dropout."""
    path = text_run / "ckpt.npz"
    with np.load(path, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    meta = json.loads(str(arrays["meta"]))
    for key in ("init", "head_dropout"):
        del meta["config"][key], meta["args"][key]
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(path, **arrays)
    assert main(["--data", text_file, "--out_dir", str(text_run), "--resume", "--max_iters", "12", "--quiet",
                 "--sample_tokens", "0", "--eval_iters", "2"]) == 0
    config = checkpoint.read_meta(str(path))["config"]
    assert (config["init"], config["head_dropout"]) == ("gpt2", 0.0)


def test_resume_continues_with_the_runs_own_settings(text_run, text_file, capsys):
    """Flags not given to --resume take the checkpoint run's values, not the presets."""
    capsys.readouterr()
    assert main(["--data", text_file, "--out_dir", str(text_run), "--resume", "--max_iters", "12"]) == 0
    ran = checkpoint.read_meta(str(text_run / "ckpt.npz"))["args"]
    assert (ran["learning_rate"], ran["batch_size"], ran["lr_decay_iters"], ran["eval_iters"]) == (3e-3, 8, 40, 2)
    assert "note: --lr_decay_iters 40 is past --max_iters 12" in capsys.readouterr().err
    assert main(["--data", text_file, "--out_dir", str(text_run), "--resume"]) == 0       # its own max_iters: 12
    assert "is at step 12, not below --max_iters 12: nothing to train" in capsys.readouterr().err


def test_resume_a_lesson_checkpoint_with_data(tmp_path, text_file, capsys):
    from tinyattn.models import GPT, GPTConfig
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=4, block_size=4, vocab_size=5))
    meta = dict(dataset="coref", config=model.config.to_dict(), tokenizer="{}", args={}, step=1)
    checkpoint.save(str(tmp_path / "ckpt.npz"), model, model.configure_optimizer(0.0, 1e-3, (0.9, 0.99)), meta)
    line = resume_error(capsys, tmp_path, "--data", text_file)
    assert f"was trained on the lesson corpus, not on --data {text_file}: drop --data" in line


# ---------------------------------------------------------------- non-finite losses
def finite_files(out):
    """Every array in ckpt.npz and best.npz is finite (and both exist)."""
    for name in ("ckpt.npz", "best.npz"):
        with np.load(out / name, allow_pickle=False) as f:
            for key in f.files:
                if f[key].dtype.kind == "f":
                    assert np.isfinite(f[key]).all(), (name, key)


def test_no_checkpoint_ever_holds_nan_or_inf(text_file, tmp_path, monkeypatch, capsys):
    """A run that blows up (learning rate 1e9) stops at its first non-finite loss; every file
    written on the way, checked right after each write, holds only finite numbers."""
    real_save, writes = checkpoint.save, []

    def checked_save(path, *args):
        real_save(path, *args)
        writes.append(path)
        with np.load(path, allow_pickle=False) as f:
            assert all(np.isfinite(f[k]).all() for k in f.files if f[k].dtype.kind == "f"), path
    monkeypatch.setattr(checkpoint, "save", checked_save)
    out = tmp_path / "run"
    assert main(["--data", text_file, "--out_dir", str(out), *TINY, "--max_iters", "10", "--eval_interval", "5"]) == 0
    before = {name: (out / name).read_bytes() for name in ("ckpt.npz", "best.npz")}
    argv = ["--data", text_file, "--out_dir", str(out), *TINY, "--max_iters", "60", "--eval_interval", "5",
            "--learning_rate", "1e9", "--grad_clip", "0", "--resume", "--log_interval", "3"]
    assert main(argv) == 1
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "stopped: ckpt.npz (step 10) and best.npz keep their last finite state" in err[0], err
    assert err[0].startswith("python -m train: error: the training loss is nan at step ") or \
        err[0].startswith("python -m train: error: the eval loss is")
    assert len(writes) >= 3
    finite_files(out)
    for name, data in before.items():                   # the blown-up run wrote nothing
        assert (out / name).read_bytes() == data


def test_the_first_non_finite_training_loss_names_its_step(text_file, tmp_path, monkeypatch, capsys):
    real_step, calls = program.train_step, []

    def step_that_blows_up(*args, **kwargs):
        calls.append(1)
        loss = real_step(*args, **kwargs)
        return loss * math.inf if len(calls) == 8 else loss         # step 7 (counting from 0)
    monkeypatch.setattr(program, "train_step", step_that_blows_up)
    out = tmp_path / "run"
    assert main(["--data", text_file, "--out_dir", str(out), *TINY, "--max_iters", "20", "--eval_interval", "5",
                 "--log_interval", "4"]) == 1
    err = "\n".join(error_lines(capsys.readouterr().err))
    assert err == ("python -m train: error: the training loss is inf at step 7; stopped: ckpt.npz (step 5) and "
                   "best.npz keep their last finite state (try a lower --learning_rate, or --grad_clip)")
    assert checkpoint.load(str(out / "ckpt.npz"))[2]["step"] == 5


def test_a_non_finite_eval_loss_stops_the_run(text_file, tmp_path, monkeypatch, capsys):
    real = program.estimate_loss

    def eval_that_blows_up(*args):
        losses = real(*args)
        return dict(losses, val=math.nan) if len(calls) == 2 else losses
    calls = []
    monkeypatch.setattr(program, "estimate_loss", lambda *a: (calls.append(1), eval_that_blows_up(*a))[1])
    assert main(["--data", text_file, "--out_dir", str(tmp_path), *TINY, "--max_iters", "20",
                 "--eval_interval", "5"]) == 1
    err = capsys.readouterr().err.strip()
    assert "the eval loss is train" in err and "val nan at step 5; stopped: no checkpoint was written" in err
    assert not (tmp_path / "ckpt.npz").exists()


def test_checkpoint_save_refuses_non_finite_values(tmp_path):
    from tinyattn.models import GPT, GPTConfig
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=4, block_size=4, vocab_size=5))
    opt = model.configure_optimizer(0.0, 1e-3, (0.9, 0.99))
    path = str(tmp_path / "ckpt.npz")
    checkpoint.save(path, model, opt, {})
    good = open(path, "rb").read()
    with ta.no_grad():
        model.ln_f.weight *= math.nan
    with pytest.raises(ValueError, match=r"not saving .*ckpt.npz: model/ln_f.weight holds NaN or Inf"):
        checkpoint.save(path, model, opt, {})
    assert open(path, "rb").read() == good


# ---------------------------------------------------------------- cosmetics
def test_max_iters_0_prints_no_none(text_file, tmp_path, capsys):
    assert main(["--data", text_file, "--out_dir", str(tmp_path), *TINY, "--max_iters", "0"]) == 0
    out = capsys.readouterr().out
    assert "None" not in out and "no steps timed" in out


def test_every_training_step_loss_is_kept_and_drawn(text_file, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    assert main(["--data", text_file, "--out_dir", str(tmp_path), *TINY, "--max_iters", "12",
                 "--eval_interval", "6", "--log_interval", "5"]) == 0
    meta = checkpoint.load(str(tmp_path / "ckpt.npz"))[2]
    losses = meta["train_losses"]
    assert len(losses) == 12 and all(math.isfinite(v) for v in losses)
    fig = report.loss_figure(plt, meta["log"], losses)
    lines = {line.get_label(): line for line in fig.axes[0].lines}
    assert len(lines["train (each step)"].get_xdata()) == 12
    np.testing.assert_allclose(lines["train (each step)"].get_ydata(), losses)
    assert list(lines["val (eval)"].get_xdata()) == [0, 6, 12]
    plt.close(fig)
    assert (tmp_path / "loss.png").exists()


# ---------------------------------------------------------------- experiments and sampling
def test_an_experiment_says_how_to_make_its_checkpoint(tmp_path, capsys):
    from train.experiments import heads
    assert heads.main(["--out_dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    for part in ("no checkpoint at", "`python -m train` (it writes out-coref/ckpt.npz",
                 "`python -m train --data FILE --out_dir DIR` and pass --out_dir DIR", "--tiny"):
        assert part in err[0]


def test_an_experiment_warns_when_the_model_is_barely_trained(text_run, text_file, capsys):
    from train.experiments import sinks
    capsys.readouterr()
    assert sinks.main(["--out_dir", str(text_run), "--n_windows", "4", "--no_plot"]) == 0
    err = capsys.readouterr().err
    assert f"warning: the model in {text_run} is barely trained (10 steps; a full run is 2000)" in err
    assert f"`python -m train --data {text_file} --out_dir {text_run} --resume --max_iters 2000`" in err


@pytest.mark.parametrize("module, argv, said", [
    ("heads", ["--n_sent", "3"], "unknown flag --n_sent (did you mean --n_sentences?)"),
    ("heads", ["--n_sentences", "0"], "argument --n_sentences: must be at least 1, got 0"),
    ("sinks", ["--steps", "-5"], "argument --steps: must be at least 0, got -5"),
    ("scaling", ["--d_k", "0"], "argument --d_k: must be at least 1, got 0"),
    ("quadratic", ["--sizes", "64", "0"], "argument --sizes: must be at least 1, got 0"),
    ("causal", ["--t", "-1"], "argument --t: must be at least 0, got -1"),
    ("causal", ["--tin"], "unknown flag --tin (did you mean --tiny?)"),
])
def test_experiment_flags(capsys, module, argv, said):
    import importlib
    mod = importlib.import_module(f"train.experiments.{module}")
    line = refused(capsys, argv, mod.main)
    assert line.startswith(f"python -m train.experiments.{module}: error: {said}"), line


@pytest.mark.parametrize("argv, said", [
    (["--num_samples", "0"], "argument --num_samples: must be at least 1"),
    (["--max_new", "5"], "unknown flag --max_new (did you mean --max_new_tokens?)"),
    (["--top_k", "0"], "argument --top_k: must be at least 1"),
])
def test_sample_flags(capsys, argv, said):
    from train.sample import main as sample_main
    assert said in refused(capsys, argv, sample_main)


# ---------------------------------------------------------------- more probes
def test_bias_takes_true_or_false(capsys):
    assert "argument --bias: expected true or false, got 'maybe'" in refused(capsys, ["--bias", "maybe"])
    assert parse_args(["--bias", "false"])[0].bias is False and parse_args(["--bias", "1"])[0].bias is True


def test_a_single_dash_flag_is_pointed_at_its_full_name(capsys):
    assert "unknown flag -n_layer (did you mean --n_layer?)" in refused(capsys, ["-n_layer", "2"])


def test_out_dir_that_is_a_file(text_file, capsys):
    assert main(["--data", text_file, "--out_dir", text_file, *TINY, "--max_iters", "1"]) == 1
    assert capsys.readouterr().err.strip() == f"python -m train: error: --out_dir {text_file} is a file, not a folder"


def test_a_damaged_checkpoint_is_one_line_everywhere(tmp_path, capsys):
    (tmp_path / "ckpt.npz").write_bytes(b"not a checkpoint")
    said = f"{tmp_path / 'ckpt.npz'} is not a readable tinyattn checkpoint: damaged, or not written by python -m train"
    assert main(["--out_dir", str(tmp_path), "--resume", "--max_iters", "1", "--quiet"]) == 1
    from train.experiments import heads
    from train.sample import main as sample_main
    assert sample_main(["--out_dir", str(tmp_path)]) == 1
    assert heads.main(["--out_dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(said in line for line in err), err
