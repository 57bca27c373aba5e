"""The training program never loses work or answers wrong without a word: a new run into a
folder that holds one, an interrupted run and its --resume, a different text file, a schedule
that ended, a model too large for memory, a bad sampling flag."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import tinyattn as ta
import train.loop as program
from tinyattn.models import GPT, GPTConfig
from train import checkpoint, stages, start
from train.command import main

from training_data import TEXT, TINY, ctrl_c_in_backward, error_lines      # the tiny text and model the training tests use


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text(TEXT)
    return str(path)


def main_caught(argv):
    """main(argv), with a KeyboardInterrupt that escapes it made a failure (not the end of the test session)."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        pytest.fail("a KeyboardInterrupt escaped python -m train")


def one_error_line(capsys):
    err = error_lines(capsys.readouterr().err)
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
    assert f"note: --overwrite: the run in {out} (ckpt.npz at step 10, best val loss" in capsys.readouterr().err
    assert checkpoint.read_meta(str(out / "ckpt.npz"))["step"] == 3
    assert checkpoint.read_meta(str(out / "best.npz"))["step"] == 3
    # a run with no step writes no best.npz: the old run's must not stay as if it were the new one's
    assert main(["--data", text_file, "--out_dir", str(out), *TINY, "--max_iters", "0", "--overwrite"]) == 0
    assert checkpoint.read_meta(str(out / "ckpt.npz"))["step"] == 0
    assert not (out / "best.npz").exists()
    # and the old run's summary is not left behind when the new run stops before writing its own
    real_setup = program.setup

    def setup_then_crash(args, notes):
        real_setup(args, notes)
        raise OSError("disk failure")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(program, "setup", setup_then_crash)
        assert main(["--data", text_file, "--out_dir", str(out), *TINY, "--max_iters", "4", "--overwrite"]) == 1
    assert sorted(p.name for p in out.iterdir()) == []


def test_resume_and_overwrite_together_are_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--resume", "--overwrite", "--out_dir", "nowhere"])
    assert e.value.code == 2
    assert "--resume continues the run in --out_dir, --overwrite replaces it: give one of them" in one_error_line(capsys)


def test_the_refusal_is_one_line_from_the_command(text_file, tmp_path):
    out = tmp_path / "run"
    assert main(["--data", text_file, "--out_dir", str(out), *TINY, "--max_iters", "2"]) == 0
    proc = subprocess.run([sys.executable, "-m", "train", "--data", text_file, "--out_dir", str(out), *TINY,
                           "--max_iters", "2"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "--overwrite" in proc.stderr


# ---------------------------------------------------------------- Ctrl-C and --resume


RUN = [*TINY, "--dropout", "0.1", "--eval_interval", "5", "--log_interval", "1"]   # dropout: the device generator counts


def final_state(out):
    """Everything a resumed run must reproduce to the bit: weights, AdamW's state, every step's loss, the evals."""
    model, optim, meta = checkpoint.load(str(out / "ckpt.npz"))
    optim_arrays = {f"{i}/{k}": v for i, values in optim["state"].items() for k, v in values.items()}
    evals = [(r["step"], r["train_loss"], r["val_loss"]) for r in meta["log"]]
    return model, optim_arrays, meta["train_losses"], evals, meta["step"]


@pytest.fixture
def uninterrupted(text_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    assert main(["--data", text_file, "--out_dir", str(out), *RUN, "--max_iters", "12"]) == 0
    return final_state(out)


SIGNALS = {"signal": signal.SIGINT, "SIGTERM": signal.SIGTERM, "SIGHUP": signal.SIGHUP}
EXIT = {"signal": 130, "raise": 130, "SIGTERM": 143, "SIGHUP": 129}       # 128 + the signal's number


def ctrl_c(how):
    """What the patched call does at its chosen call: a real signal (SIGINT as Ctrl-C sends it,
    SIGTERM as kill and timeout send it, SIGHUP as a closed terminal sends it), or a
    KeyboardInterrupt raised right there (as a second Ctrl-C would be)."""
    if how in SIGNALS:
        os.kill(os.getpid(), SIGNALS[how])
    else:
        raise KeyboardInterrupt


# (what is patched, which call, how): eval at steps 0, 5, 10 (2 + 2 forwards each), 12 steps
INTERRUPTS = [
    ("forward", 7, "signal"), ("forward", 16, "signal"), ("forward", 12, "signal"),     # steps 2, 7; eval at 5
    ("backward", 3, "signal"), ("backward", 8, "signal"), ("optimizer", 4, "signal"), ("optimizer", 11, "signal"),
    ("batch", 2, "signal"), ("batch", 9, "signal"), ("eval", 2, "signal"), ("save", 1, "signal"), ("save", 2, "signal"),
    ("forward", 6, "raise"), ("forward", 17, "raise"), ("backward", 9, "raise"), ("batch", 6, "raise"),
    ("eval", 3, "raise"),
    ("backward", 3, "SIGTERM"), ("optimizer", 11, "SIGTERM"), ("eval", 2, "SIGTERM"),
    ("forward", 7, "SIGHUP"), ("save", 2, "SIGHUP"),
]
def running_adamw():
    """The AdamW class the training program makes (its step runs the fast layer's flat step, where
    AdamW.step is the library's: patched here, the loop runs, which gives the same bits)."""
    return ta.optim.AdamW


TARGETS = {"forward": (GPT, "forward"), "backward": None, "optimizer": (running_adamw, "step"),
           "batch": (program.parallel, "local_batch"), "eval": (program, "estimate_loss"),
           "save": (checkpoint, "save")}


@pytest.mark.parametrize("what, at_call, how", INTERRUPTS)
def test_resume_after_ctrl_c_is_exact_wherever_it_lands(text_file, tmp_path, uninterrupted, capsys, what, at_call,
                                                         how):
    out = tmp_path / "run"
    with pytest.MonkeyPatch.context() as mp:
        if what == "backward":                                # (in the backward of the at_call-th loss)
            ctrl_c_in_backward(mp, at_call, lambda: ctrl_c(how))
        else:
            owner, name = TARGETS[what]
            owner = running_adamw() if owner is running_adamw else owner
            real, calls = getattr(owner, name), []

            def patched(*args, **kwargs):
                calls.append(1)
                if len(calls) == at_call:
                    ctrl_c(how)
                return real(*args, **kwargs)
            mp.setattr(owner, name, patched)
        assert main_caught(["--data", text_file, "--out_dir", str(out), *RUN, "--max_iters", "12"]) == EXIT[how]
    stopped = checkpoint.read_meta(str(out / "ckpt.npz"))["step"]
    assert 0 < stopped < 12
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["iters"] == stopped
    assert summary["signal"] == {"SIGTERM": "SIGTERM", "SIGHUP": "SIGHUP"}.get(how, "Ctrl-C")
    assert f"python -m train: stopped by {summary['signal']} at step {stopped}: saved {out / 'ckpt.npz'}" in \
        capsys.readouterr().err
    assert main(["--data", text_file, "--out_dir", str(out), "--resume", "--max_iters", "12"]) == 0
    model, optim, losses, evals, step = final_state(out)
    want_model, want_optim, want_losses, want_evals, want_step = uninterrupted
    assert step == want_step == 12
    assert losses == want_losses                     # every step's training loss, to the bit
    assert evals == want_evals
    assert model.keys() == want_model.keys() and optim.keys() == want_optim.keys()
    for key in model:
        np.testing.assert_array_equal(model[key], want_model[key], err_msg=key)
    for key in optim:
        np.testing.assert_array_equal(optim[key], want_optim[key], err_msg=key)


def test_ctrl_c_says_it_stops_after_the_step(text_file, tmp_path, capsys, monkeypatch):
    ctrl_c_in_backward(monkeypatch, 3)
    assert main_caught(["--data", text_file, "--out_dir", str(tmp_path / "run"), *RUN, "--max_iters", "12"]) == 130
    err = capsys.readouterr().err
    assert "Ctrl-C: stopping after this step, then saving (Ctrl-C again to stop at once)" in err
    assert checkpoint.read_meta(str(tmp_path / "run" / "ckpt.npz"))["step"] == 3      # step 2 finished
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler               # put back


def test_ctrl_c_of_a_tee_pipeline_saves_and_resumes_exactly(text_file, tmp_path):
    """python -m train ... | tee log, and Ctrl-C: the terminal sends SIGINT to the whole pipeline,
    tee ends, and the run's next line meets a closed pipe. The run still saves, and --resume
    continues to the bit."""
    out, log = tmp_path / "run", tmp_path / "log.txt"
    flags = [*RUN, "--max_iters", "400", "--sample_tokens", "0"]
    shown = [f for f in flags if f != "--quiet"]              # the eval lines go down the pipe
    command = f"{sys.executable} -m train --data {text_file} --out_dir {out} {' '.join(shown)} | tee {log}"
    pipeline = subprocess.Popen(["bash", "-c", command], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while "step 10:" not in (log.read_text() if log.exists() else "") and time.time() < deadline:
            time.sleep(0.01)
        os.killpg(pipeline.pid, signal.SIGINT)                # Ctrl-C in a terminal: every process of the job
        err = pipeline.communicate(timeout=120)[1]
    finally:
        if pipeline.poll() is None:
            os.killpg(pipeline.pid, signal.SIGKILL)
    assert "Traceback" not in err and "Broken pipe" not in err, err
    stopped = checkpoint.read_meta(str(out / "ckpt.npz"))["step"]
    assert 10 <= stopped < 400, err
    assert json.loads((out / "summary.json").read_text())["iters"] == stopped
    assert f"stopped by Ctrl-C at step {stopped}" in err

    assert main(["--data", text_file, "--out_dir", str(out), "--resume", "--quiet"]) == 0
    straight = tmp_path / "straight"
    assert main(["--data", text_file, "--out_dir", str(straight), *flags]) == 0
    resumed, uninterrupted = final_state(out), final_state(straight)
    assert resumed[2] == uninterrupted[2] and resumed[3] == uninterrupted[3]     # every loss, every eval
    for got, want in zip(resumed[:2], uninterrupted[:2]):
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_a_closed_stream_never_stops_a_save():
    from train.interrupts import SafeStream

    class ClosedPipe:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")
    stream = SafeStream(ClosedPipe())
    assert stream.write("saving\n") == 7 and stream.closed_reader
    stream.flush()                                            # and nothing is tried again


def test_an_update_cut_in_two_is_never_saved(text_file, tmp_path, capsys, monkeypatch):
    """Ctrl-C cannot land inside the optimizer's update; an exception raised there could: the
    half-updated weights are not saved, and the last checkpoint stays."""
    out = tmp_path / "run"
    real, calls = running_adamw().step, []

    def patched(self):
        calls.append(1)
        if len(calls) == 8:                                   # step 7, after the checkpoint of step 5
            with ta.no_grad():
                for p in self.parameters()[:2]:
                    p.data -= 1.0                             # half of an update
            raise KeyboardInterrupt
        return real(self)
    monkeypatch.setattr(running_adamw(), "step", patched)
    assert main_caught(["--data", text_file, "--out_dir", str(out), *RUN, "--max_iters", "12"]) == 130
    note, *rest = error_lines(capsys.readouterr().err)          # (the compiled model's note: AdamW.step is yours)
    assert note.startswith("tinyattn: optim/__init__.py: AdamW.step is not the library's; the fused AdamW steps")
    assert rest == [f"python -m train: interrupted inside the optimizer's update (the weights are half updated): "
                    f"not saved; {out / 'ckpt.npz'} keeps step 5"]
    assert checkpoint.read_meta(str(out / "ckpt.npz"))["step"] == 5


def test_ctrl_c_writes_the_log_and_summary_and_the_clock_runs_on(text_file, tmp_path, monkeypatch):
    out = tmp_path / "run"
    with pytest.MonkeyPatch.context() as mp:
        ctrl_c_in_backward(mp, 8)                             # in step 7
        assert main_caught(["--data", text_file, "--out_dir", str(out), *RUN, "--max_iters", "12"]) == 130
    rows = (out / "log.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["0", "5"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["iters"] == 8 and summary["last_eval_step"] == 5
    assert summary["val_loss"] == float(rows[2].split(",")[2])
    elapsed = checkpoint.read_meta(str(out / "ckpt.npz"))["elapsed"]
    at = rows[0].split(",").index("time")
    assert elapsed >= float(rows[2].split(",")[at]) > 0

    assert main(["--data", text_file, "--out_dir", str(out), "--resume", "--max_iters", "12"]) == 0
    rows = [r.split(",") for r in (out / "log.csv").read_text().splitlines()[1:]]
    assert [r[0] for r in rows] == ["0", "5", "10", "12"]
    times = [float(r[at]) for r in rows]
    assert times == sorted(times) and times[2] > elapsed                   # the clock went on from the checkpoint
    assert "interrupted" not in json.loads((out / "summary.json").read_text())


# ---------------------------------------------------------------- the data of a --resume
def test_resume_refuses_another_text_with_the_same_vocabulary(text_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["--data", text_file, "--out_dir", str(out), *TINY, "--max_iters", "4"]) == 0
    other = tmp_path / "other.txt"
    other.write_text(TEXT[::-1])                        # the same characters, another text
    before = (out / "ckpt.npz").read_bytes()
    capsys.readouterr()
    assert main(["--data", str(other), "--out_dir", str(out), "--resume", "--max_iters", "8"]) == 1
    size = f"{len(TEXT.encode()):,} bytes, sha256 "
    line = one_error_line(capsys)
    assert line.startswith(f"python -m train: error: --resume: {other} ({size}") and \
        f"is not the data {out / 'ckpt.npz'} was trained on ({text_file}: {size}" in line, line
    assert line.endswith("pass that, or use another --out_dir for a new run")
    assert (out / "ckpt.npz").read_bytes() == before
    assert main(["--data", text_file, "--out_dir", str(out), "--resume", "--max_iters", "8"]) == 0


def test_an_older_checkpoint_without_its_data_is_resumed_with_a_note(text_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["--data", text_file, "--out_dir", str(out), *TINY, "--max_iters", "4"]) == 0
    with np.load(out / "ckpt.npz", allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    meta = json.loads(str(arrays["meta"]))
    del meta["data_source"]
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(out / "ckpt.npz", **arrays)
    capsys.readouterr()
    assert main(["--data", text_file, "--out_dir", str(out), "--resume", "--max_iters", "8"]) == 0
    assert (f"python -m train: note: {out / 'ckpt.npz'} does not say which data it was trained on (an older "
            f"checkpoint): {text_file} is taken as that data, unchecked beyond its vocabulary") in capsys.readouterr().err


# ---------------------------------------------------------------- a schedule that ended
def test_a_resume_past_the_schedules_end_says_so(text_file, tmp_path, capsys):
    """The preset's schedule is fitted to a short first run; a --resume with more steps would
    train them all at --min_lr without a word."""
    out = tmp_path / "run"
    no_schedule = [a for i, a in enumerate(TINY) if "_iters" not in a and "_iters" not in TINY[i - 1]]
    assert main(["--data", text_file, "--out_dir", str(out), *no_schedule, "--eval_iters", "2", "--max_iters", "10"]) == 0
    capsys.readouterr()
    assert main(["--data", text_file, "--out_dir", str(out), "--resume", "--max_iters", "20"]) == 0
    assert ("python -m train: note: the learning rate schedule ends at --lr_decay_iters 10: steps 10 to 19 all run "
            "at --min_lr 0.0001 (pass --lr_decay_iters 20 for a schedule that ends at --max_iters)") in capsys.readouterr().err
    assert main(["--data", text_file, "--out_dir", str(out), "--resume", "--max_iters", "30",
                 "--lr_decay_iters", "30"]) == 0
    assert "schedule ends" not in capsys.readouterr().err


def test_a_resume_that_outgrows_a_fitted_schedule_says_so(text_file, tmp_path, capsys, monkeypatch):
    """Stopped at step 6 of 10 (the preset's schedule fitted to 10), resumed to 20: steps 10 to 19
    would run at --min_lr without a word."""
    out = tmp_path / "run"
    no_schedule = [a for i, a in enumerate(TINY) if "_iters" not in a and "_iters" not in TINY[i - 1]]
    with pytest.MonkeyPatch.context() as mp:
        ctrl_c_in_backward(mp, 6)
        assert main_caught(["--data", text_file, "--out_dir", str(out), *no_schedule, "--eval_iters", "2",
                            "--max_iters", "10"]) == 130
    capsys.readouterr()
    assert main(["--data", text_file, "--out_dir", str(out), "--resume", "--max_iters", "20"]) == 0
    assert ("python -m train: note: the learning rate schedule ends at --lr_decay_iters 10: steps 10 to 19 run "
            "at --min_lr 0.0001 (pass --lr_decay_iters 20") in capsys.readouterr().err


# ---------------------------------------------------------------- too large for memory


@pytest.mark.parametrize("choices", [dict(bias=True), dict(bias=False), dict(pos="rope"), dict(norm="rmsnorm"),
                                     dict(mlp="swiglu"), dict(mlp="relu2", mlp_hidden=50), dict(n_kv_head=2),
                                     dict(qk_norm=True), dict(tie_embeddings=False),
                                     dict(pos="rope", norm="rmsnorm", mlp="swiglu", n_kv_head=1, qk_norm=True,
                                          bias=False, tie_embeddings=False)])
def test_the_parameter_count_is_the_models(choices):
    from train import memory
    config = GPTConfig(block_size=16, vocab_size=33, n_layer=3, n_head=4, n_embd=24, **choices)
    assert memory.parameter_count(config) == GPT(config).num_parameters(non_embedding=False)


@pytest.mark.parametrize("n_embd, batch", [(32, 16), (64, 4)])
def test_the_estimate_is_a_lower_bound_of_a_real_step(n_embd, batch):
    """A run is refused only if it could not have fitted: the estimate never exceeds what a
    training step really allocates (numpy's allocations, traced)."""
    import tracemalloc
    from train import memory
    from train.loop import train_step
    config = GPTConfig(block_size=32, vocab_size=40, n_layer=2, n_head=2, n_embd=n_embd)
    rng = np.random.default_rng(0)
    x, y = (ta.tensor(rng.integers(0, 40, (batch, 32))) for _ in range(2))
    tracemalloc.start()
    try:
        model = GPT(config)
        optimizer = model.configure_optimizer(0.1, 1e-3, (0.9, 0.99))
        train_step(model, optimizer, [(x, y)], 1.0)
        train_step(model, optimizer, [(x, y)], 1.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    state, activations = memory.training_bytes(config, batch, 32)
    assert state + activations <= peak, (state, activations, peak)


@pytest.mark.parametrize("flags, said", [
    (["--batch_size", "100000000"], "a step's activations for 100,000,000 rows of 16 tokens"),
    (["--n_embd", "65536", "--n_head", "1"], "the model's {:,} parameters"),
])
def test_a_run_too_large_for_memory_is_one_line(text_file, tmp_path, flags, said):
    from train import memory
    said = said.format(memory.parameter_count(GPTConfig(block_size=16, vocab_size=33, n_layer=1, n_embd=65536)))
    proc = subprocess.run([sys.executable, "-m", "train", "--data", text_file, "--out_dir", str(tmp_path / "run"),
                           *TINY, "--max_iters", "2", *flags], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m train: error: this run needs at least "), proc.stderr
    assert said in lines[0] and "GiB available" in lines[0]
    assert not (tmp_path / "run" / "ckpt.npz").exists()


def test_the_limit_is_the_memory_available(text_file, tmp_path, capsys, monkeypatch):
    from train import memory
    argv = ["--data", text_file, "--out_dir", str(tmp_path / "run"), *TINY, "--max_iters", "2"]
    monkeypatch.setattr(memory, "available_bytes", lambda: 2 ** 16)          # 64 KiB: not even the tiny run
    assert main(argv) == 1
    line = one_error_line(capsys)
    assert "more than the 0.0 GiB available" in line and line.endswith("lower --batch_size or --block_size")
    monkeypatch.setattr(memory, "available_bytes", lambda: None)             # unknown: no check
    assert main(argv) == 0


def test_running_out_of_memory_anyway_is_one_line(text_file, tmp_path, capsys, monkeypatch):
    def no_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 16.0 GiB for an array with shape (65536, 65536) and data type float32")
    monkeypatch.setattr(program, "train_step", no_memory)
    assert main(["--data", text_file, "--out_dir", str(tmp_path / "run"), *TINY, "--max_iters", "2"]) == 1
    assert one_error_line(capsys) == (
        "python -m train: error: out of memory: Unable to allocate 16.0 GiB for an array with shape (65536, 65536) "
        "and data type float32 (lower --batch_size or --block_size, or the model's --n_embd or --n_layer)")


# ---------------------------------------------------------------- sampling flags
@pytest.mark.parametrize("argv, said", [
    (["--temperature", "nan"], "argument --temperature: must be a finite number >= 0, got nan"),
    (["--temperature", "inf"], "argument --temperature: must be a finite number >= 0, got inf"),
    (["--temperature", "-0.5"], "argument --temperature: must be a finite number >= 0, got -0.5"),
    (["--temperature", "hot"], "argument --temperature: invalid float value: 'hot'"),
    (["--top_p", "nan"], "argument --top_p: must be in (0, 1], got nan"),
    (["--top_p", "0"], "argument --top_p: must be in (0, 1], got 0"),
    (["--top_p", "1.5"], "argument --top_p: must be in (0, 1], got 1.5"),
    (["--top_k", "0"], "argument --top_k: must be at least 1, got 0"),
])
def test_sample_refuses_a_bad_temperature_or_top_p(capsys, argv, said):
    from train.sample import main as sample_main
    with pytest.raises(SystemExit) as e:
        sample_main(argv)
    assert e.value.code == 2
    assert said in one_error_line(capsys)


# ---------------------------------------------------------------- --seed and --resume
def test_resume_keeps_the_runs_own_seed(text_file, tmp_path, capsys):
    """The seed also draws the evaluation's batches: a resumed run took the default seed's,
    so its val losses (and best.npz) were measured on other batches than the run's."""
    def evals(out):
        return [(r["step"], r["val_loss"]) for r in checkpoint.read_meta(str(out / "ckpt.npz"))["log"]]
    flags = [*RUN, "--seed", "5"]
    assert main(["--data", text_file, "--out_dir", str(tmp_path / "a"), *flags, "--max_iters", "10"]) == 0
    assert main(["--data", text_file, "--out_dir", str(tmp_path / "b"), *flags, "--max_iters", "5"]) == 0
    assert main(["--data", text_file, "--out_dir", str(tmp_path / "b"), "--resume", "--max_iters", "10"]) == 0
    assert evals(tmp_path / "b") == evals(tmp_path / "a")
    capsys.readouterr()
    assert main(["--data", text_file, "--out_dir", str(tmp_path / "b"), "--resume", "--max_iters", "15",
                 "--seed", "7"]) == 1
    assert one_error_line(capsys) == (
        f"python -m train: error: --resume: --seed 7 (the run in {tmp_path / 'b' / 'ckpt.npz'} has --seed 5): a "
        "resumed run continues its own random streams; drop --seed, or use another --out_dir for a new run")


def test_a_device_whose_generator_cannot_be_saved_says_resume_is_not_exact(text_file, tmp_path, capsys, monkeypatch):
    """CuPy's generator state cannot be exported: with dropout, such a resume is not bit-exact, and says so."""
    out = tmp_path / "run"
    assert main(["--data", text_file, "--out_dir", str(out), *RUN, "--max_iters", "4"]) == 0
    cpu = ta.backend.get_backend("cpu")
    monkeypatch.setattr(type(cpu), "get_rng_state", lambda self: None)
    capsys.readouterr()
    assert main(["--data", text_file, "--out_dir", str(out), "--resume", "--max_iters", "6"]) == 0
    assert ("python -m train: note: the dropout generator's state was not saved (cpu cannot export it): the resumed "
            "run draws its masks from a new stream") in capsys.readouterr().err


def test_resume_keeps_the_lesson_corpus_layout(tmp_path):
    """A run on the 'it' corpus with --layout stream was resumed with the preset's sentence layout."""
    out = tmp_path / "run"
    flags = ["--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--eval_iters", "1", "--eval_interval", "100",
             "--quiet", "--sample_tokens", "0"]
    assert main(["--out_dir", str(out), "--layout", "stream", "--max_iters", "3", *flags]) == 0
    assert main(["--out_dir", str(out), "--resume", "--max_iters", "4", "--quiet"]) == 0
    assert checkpoint.read_meta(str(out / "ckpt.npz"))["args"]["layout"] == "stream"


def test_a_second_ctrl_c_in_the_final_evaluation_still_saves_every_step(text_file, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    real, calls = program.estimate_loss, []

    def patched(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:                                   # the final evaluation, at step 12
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)
    monkeypatch.setattr(program, "estimate_loss", patched)
    assert main_caught(["--data", text_file, "--out_dir", str(out), *RUN, "--max_iters", "12"]) == 130
    assert checkpoint.read_meta(str(out / "ckpt.npz"))["step"] == 12
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["iters"] == 12 and summary["last_eval_step"] == 10


def test_ctrl_c_before_training_began_is_one_line(text_file, tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(stages, "load_data", interrupted)
    assert main_caught(["--data", text_file, "--out_dir", str(tmp_path / "run"), *TINY, "--max_iters", "4"]) == 130
    assert one_error_line(capsys) == "python -m train: interrupted before training began: nothing was saved"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_log_and_summary_are_written_atomically(tmp_path, monkeypatch):
    """log.csv is rewritten at every evaluation: a run killed while writing it keeps the last whole one."""
    path = tmp_path / "log.csv"
    checkpoint.write_text(str(path), "step\n0\n")

    def killed(src, dst):
        raise OSError("killed")
    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(OSError):
        checkpoint.write_text(str(path), "step\n0\n5\n")
    assert path.read_text() == "step\n0\n" and [p.name for p in tmp_path.iterdir()] == ["log.csv"]


# ---------------------------------------------------------------- saving more often
def saved_steps(monkeypatch):
    """The step of every ckpt.npz written from here on."""
    steps, real = [], checkpoint.save_run

    def recorded(path, model, optimizer, state, *args):
        if os.path.basename(path) == "ckpt.npz":
            steps.append(state["step"])
        return real(path, model, optimizer, state, *args)
    monkeypatch.setattr(checkpoint, "save_run", recorded)
    return steps


def worse_every_time(monkeypatch):
    """Evaluations whose val loss rises: only the first one is ever the best."""
    real, calls = program.estimate_loss, []

    def rising(*args, **kwargs):
        calls.append(1)
        losses = real(*args, **kwargs)
        return dict(losses, val=losses["val"] + len(calls))
    monkeypatch.setattr(program, "estimate_loss", rising)


@pytest.mark.parametrize("always", [False, True])
def test_always_save_checkpoint_writes_ckpt_at_every_evaluation(text_file, tmp_path, monkeypatch, always):
    worse_every_time(monkeypatch)
    steps = saved_steps(monkeypatch)
    flags = ["--always_save_checkpoint"] if always else []
    assert main(["--data", text_file, "--out_dir", str(tmp_path), *TINY, "--max_iters", "12", "--eval_interval", "4",
                 *flags]) == 0
    assert steps == ([4, 8, 12] if always else [12])      # step 0 is never saved; 12 is the end of the run
    assert not (tmp_path / "best.npz").exists()           # no evaluation after step 0 was the best


def test_save_interval_s_writes_ckpt_between_evaluations(text_file, tmp_path, monkeypatch):
    steps = saved_steps(monkeypatch)
    flags = ["--data", text_file, "--out_dir", str(tmp_path), *TINY, "--max_iters", "10", "--eval_interval", "100"]
    assert main([*flags, "--save_interval_s", "1e-9"]) == 0
    assert steps[:10] == list(range(1, 11))               # after every step, then after the final evaluation
    steps.clear()
    clock = iter(range(0, 100_000, 3))                    # every reading of the clock 3 s after the one before
    monkeypatch.setattr(program.time, "time", lambda: float(next(clock)))
    assert main([*flags, "--save_interval_s", "30", "--overwrite"]) == 0
    assert 1 < len(steps) - 1 < 9 and steps == sorted(set(steps)) and steps[-1] == 10, steps
    steps.clear()
    assert main([*flags, "--overwrite"]) == 0
    assert steps == [10]


def test_eval_only_prints_the_losses_and_writes_nothing(text_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["--data", text_file, "--out_dir", str(out), *TINY, "--max_iters", "6", "--eval_interval", "3"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    last = json.loads((out / "summary.json").read_text())
    capsys.readouterr()
    assert main(["--data", text_file, "--out_dir", str(out), "--resume", "--eval_only"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip().splitlines()[-1] == (f"eval at step 6: train loss {last['train_loss']:.4f}, val loss "
                                    f"{last['val_loss']:.4f} (perplexity {last['val_perplexity']:.2f}, "
                                    f"{last['val_bpb']:.4f} bits per byte)")      # as each evaluation says it
    assert f"python -m train: evaluating {out / 'ckpt.npz'} at step 6 of " in captured.err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    fresh = tmp_path / "fresh"                            # a new model: the loss at initialisation, nothing written
    assert main(["--data", text_file, "--out_dir", str(fresh), *TINY, "--eval_only"]) == 0
    line = capsys.readouterr().out
    assert line.startswith("eval at step 0: train loss ") and not fresh.exists()
    assert float(line.split("val loss ")[1].split()[0]) == pytest.approx(np.log(33), abs=0.1)    # vocab 33


# ---------------------------------------------------------------- a disk that fills up
def test_a_full_disk_mid_save_names_the_file_and_keeps_the_last_checkpoint(text_file, tmp_path, capsys,
                                                                            monkeypatch):
    import errno
    out, real, calls = tmp_path / "run", np.savez, []

    def savez(file, **arrays):               # the third checkpoint write (ckpt.npz at step 10) fills the disk
        calls.append(1)
        if len(calls) == 3:
            file.write(b"half a checkpoint")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(file, **arrays)
    monkeypatch.setattr(checkpoint.np, "savez", savez)
    code = main_caught(["--data", text_file, "--out_dir", str(out), *TINY, "--max_iters", "10",
                        "--eval_interval", "5"])
    assert code == 1
    assert one_error_line(capsys) == (f"python -m train: error: could not write {out / 'ckpt.npz'}: no space left "
                                      "on device; the previous ckpt.npz is intact")
    assert checkpoint.read_meta(str(out / "ckpt.npz"))["step"] == 5
    assert sorted(os.listdir(out)) == ["best.npz", "ckpt.npz", "log.csv"]      # no temporary file left behind
