"""--init_from: fine-tuning a trained model (a checkpoint or a Hugging Face folder) on another text."""
import json
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest

import tinyattn as ta
from tinyattn.models import GPT
from train import checkpoint
from train.data import load_text, tokenizer_to_json
from train.command import main
from train.loop import estimate_loss
from train.sample import load_model

from training_data import error_lines

FIRST = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
         "All:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n\n") * 40
# the second text uses some of the first one's characters only (no '?', no 'F', ...)
SECOND = ("All:\nresolved. resolved.\n\nCitizen:\nwe know it, we know it.\n\n"
          "All:\nSpeak, and we will have corn at our own price.\n\n") * 40
TINY = ["--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--block_size", "16", "--batch_size", "8",
        "--eval_iters", "3", "--warmup_iters", "5", "--lr_decay_iters", "40", "--learning_rate", "3e-3",
        "--quiet", "--sample_tokens", "0"]


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("texts")
    paths = {}
    for name, text in (("first", FIRST), ("second", SECOND), ("strange", SECOND + "Zébra\n")):
        paths[name] = folder / f"{name}.txt"
        paths[name].write_text(text)
    return {k: str(v) for k, v in paths.items()}


@pytest.fixture(scope="module")
def trained(texts, tmp_path_factory):
    """A char model trained a little on the first text."""
    out = tmp_path_factory.mktemp("first")
    assert main(["--data", texts["first"], "--out_dir", str(out), *TINY, "--max_iters", "100",
                 "--lr_decay_iters", "100", "--eval_interval", "50"]) == 0
    return out


def log_rows(out_dir):
    lines = (out_dir / "log.csv").read_text().splitlines()
    keys = lines[0].split(",")
    return [dict(zip(keys, map(float, line.split(",")))) for line in lines[1:]]


def eval_args(seed=1337):
    return SimpleNamespace(seed=seed, eval_iters=3, batch_size=8, block_size=16, device="cpu")


def finetune(texts, init_from, out, *extra):
    return main(["--data", texts["second"], "--out_dir", str(out), "--init_from", str(init_from), *TINY,
                 "--max_iters", "20", "--eval_interval", "10", *extra])


def test_init_from_checkpoint_starts_from_its_weights(texts, trained, tmp_path):
    assert finetune(texts, trained / "ckpt.npz", tmp_path / "ft") == 0
    rows = log_rows(tmp_path / "ft")
    # the same batches of the second text, through the trained model and through a fresh one
    model, tokenizer = load_model(str(trained))
    second = load_text(texts["second"], tokenizer)
    loaded = estimate_loss(ta.compile(model), second, eval_args())     # (compiled, as the run evaluates it)
    ta.manual_seed(0)
    fresh = estimate_loss(GPT(model.config), second, eval_args())
    assert rows[0]["step"] == 0 and rows[0]["val_loss"] == round(loaded["val"], 6)
    assert rows[0]["train_loss"] == round(loaded["train"], 6)
    assert loaded["val"] < fresh["val"] - 0.5                          # not a fresh model's loss
    assert rows[-1]["val_loss"] < rows[0]["val_loss"]                   # and it trains
    _, optim_state, meta = checkpoint.load(str(tmp_path / "ft" / "ckpt.npz"))
    assert meta["tokenizer"] == tokenizer_to_json(tokenizer)           # the model's vocabulary, not the text's
    assert meta["step"] == 20 and meta["args"]["init_from"].endswith("ckpt.npz")


def test_init_from_starts_the_optimizer_fresh(texts, trained, tmp_path, monkeypatch):
    seen = []
    original = ta.optim.AdamW.load_state_dict
    monkeypatch.setattr(ta.optim.AdamW, "load_state_dict", lambda self, s: seen.append(s) or original(self, s))
    assert finetune(texts, trained, tmp_path / "ft", "--max_iters", "1") == 0      # a folder with ckpt.npz
    assert seen == []


def test_init_from_an_exported_hugging_face_folder(texts, trained, tmp_path):
    model, tokenizer = load_model(str(trained))
    model.export_hf(tmp_path / "hf", chars=tokenizer.chars)
    assert finetune(texts, tmp_path / "hf", tmp_path / "a", "--max_iters", "0") == 0
    assert finetune(texts, trained / "ckpt.npz", tmp_path / "b", "--max_iters", "0") == 0
    assert log_rows(tmp_path / "a")[0]["val_loss"] == log_rows(tmp_path / "b")[0]["val_loss"]


def test_resume_of_a_fine_tuned_run_is_exact(texts, trained, tmp_path):
    assert finetune(texts, trained / "ckpt.npz", tmp_path / "a") == 0
    assert finetune(texts, trained / "ckpt.npz", tmp_path / "b", "--max_iters", "10") == 0
    assert main(["--data", texts["second"], "--out_dir", str(tmp_path / "b"), "--resume", "--max_iters", "20",
                 "--quiet", "--sample_tokens", "0"]) == 0
    a = json.loads((tmp_path / "a" / "summary.json").read_text())
    b = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert a["val_loss"] == b["val_loss"] and a["iters"] == b["iters"] == 20


def test_the_same_command_with_resume_appended_resumes_it(texts, trained, tmp_path, capsys):
    """nanoGPT's habit: the command that started a fine-tuning run, --resume appended, continues it;
    its --init_from is checked against the run's and then ignored, with one line."""
    assert finetune(texts, trained / "ckpt.npz", tmp_path / "a") == 0
    assert finetune(texts, trained / "ckpt.npz", tmp_path / "b", "--max_iters", "10") == 0
    capsys.readouterr()
    assert finetune(texts, trained / "ckpt.npz", tmp_path / "b", "--resume") == 0
    err = capsys.readouterr().err
    assert f"--init_from {trained / 'ckpt.npz'} is the model the run started from" in err
    a = json.loads((tmp_path / "a" / "summary.json").read_text())
    b = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert a["val_loss"] == b["val_loss"] and a["iters"] == b["iters"] == 20
    # another model is refused in one line
    with pytest.raises(SystemExit) as e:
        finetune(texts, trained / "best.npz", tmp_path / "b", "--resume", "--max_iters", "30")
    code = e.value.code
    assert "is not the model the run in" in one_line_error(capsys, 2, code)


def test_a_config_file_that_sets_init_from_resumes_its_run(texts, trained, tmp_path, capsys):
    config = tmp_path / "my_ft.py"
    config.write_text(f"init_from = {str(trained)!r}\ndata = {texts['second']!r}\nout_dir = {str(tmp_path / 'b')!r}\n")
    tiny = [flag for flag in TINY]
    assert main([str(config), *tiny, "--max_iters", "10"]) == 0
    assert main([str(config), *tiny, "--max_iters", "20", "--resume"]) == 0
    assert "the run continues from" in capsys.readouterr().err
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["iters"] == 20


def one_line_error(capsys, code, returned):
    assert returned == code
    err = "\n".join(error_lines(capsys.readouterr().err))
    assert "\n" not in err and "Traceback" not in err
    return err


def test_unknown_characters_are_refused(texts, trained, tmp_path, capsys):
    code = main(["--data", texts["strange"], "--out_dir", str(tmp_path / "x"), "--init_from", str(trained), "--quiet"])
    err = one_line_error(capsys, 1, code)
    assert "3 characters are not in the model's vocabulary" in err and "'Z'" in err and "'é'" in err


def test_init_from_refusals(texts, trained, tmp_path, capsys):
    def refused(*flags, code=1):
        try:
            returned = main(["--data", texts["second"], "--out_dir", str(tmp_path / "x"), "--quiet", *flags])
        except SystemExit as e:
            returned = e.code
        return one_line_error(capsys, code, returned)

    assert "started from scratch" in refused("--init_from", str(trained), "--out_dir", str(trained), "--resume",
                                             code=2)
    assert "--n_embd 32 (the model has 16)" in refused("--init_from", str(trained), "--n_embd", "32")
    assert "--block_size 64 (the model has 16 positions)" in refused("--init_from", str(trained), "--block_size", "64")
    assert "neither a checkpoint" in refused("--init_from", str(tmp_path / "nothing"))
    model, _ = load_model(str(trained))
    model.export_hf(tmp_path / "no-vocab")
    assert "no character vocabulary" in refused("--init_from", str(tmp_path / "no-vocab"))
    out = tmp_path / "same"
    os.makedirs(out)
    (out / "ckpt.npz").write_bytes((trained / "ckpt.npz").read_bytes())
    assert "would write over" in refused("--init_from", str(out), "--out_dir", str(out))


def test_a_shorter_block_size_is_allowed(texts, trained, tmp_path):
    assert finetune(texts, trained, tmp_path / "ft", "--block_size", "8", "--max_iters", "2") == 0
    _, _, meta = checkpoint.load(str(tmp_path / "ft" / "ckpt.npz"))
    assert meta["config"]["block_size"] == 16 and meta["args"]["block_size"] == 8
    assert math.isfinite(log_rows(tmp_path / "ft")[-1]["val_loss"])


def test_export_command_writes_a_folder_that_init_from_reads(texts, trained, tmp_path, capsys):
    from train.export_hf import main as export_main
    assert export_main(["--out_dir", str(trained), "--to", str(tmp_path / "hf")]) == 0
    assert "tokenizer.json" in capsys.readouterr().out
    model, tokenizer = load_model(str(trained))
    back = GPT.from_hf(tmp_path / "hf").eval()
    idx = ta.tensor([tokenizer.encode("Speak, speak.")])
    assert np.array_equal(back(idx)[0].numpy(), model(idx)[0].numpy())
    assert finetune(texts, tmp_path / "hf", tmp_path / "ft", "--max_iters", "0") == 0
    assert export_main(["--out_dir", str(tmp_path / "nothing"), "--to", str(tmp_path / "x")]) == 1
    assert "no checkpoint" in capsys.readouterr().err


def test_sample_and_explore_read_an_exported_folder(trained, tmp_path, capsys):
    from train.explore import main as explore_main
    from train.sample import main as sample_main
    model, tokenizer = load_model(str(trained))
    model.export_hf(tmp_path / "hf", chars=tokenizer.chars)
    argv = ["--start", "Speak", "--num_samples", "1", "--max_new_tokens", "20", "--seed", "3"]
    assert sample_main(["--out_dir", str(trained), *argv]) == 0
    from_checkpoint = capsys.readouterr().out
    assert sample_main(["--out_dir", str(tmp_path / "hf"), *argv]) == 0
    assert capsys.readouterr().out == from_checkpoint and from_checkpoint.startswith("Speak")
    assert explore_main(["--out_dir", str(tmp_path / "hf"), "--text", "Speak, speak."]) == 0
    assert (tmp_path / "hf" / "attention.html").exists()


def test_a_vocabulary_larger_than_the_model_is_refused(texts, trained, tmp_path, capsys):
    model, tokenizer = load_model(str(trained))
    model.export_hf(tmp_path / "hf", chars=tokenizer.chars)
    path = tmp_path / "hf" / "tokenizer.json"
    tok = json.loads(path.read_text())
    tok["model"]["vocab"]["\u00e9"] = len(tokenizer.chars)
    path.write_text(json.dumps(tok))
    code = finetune(texts, tmp_path / "hf", tmp_path / "ft")
    assert "more than the model's" in one_line_error(capsys, 1, code)


def test_a_word_model_is_not_fine_tuned_on_characters(texts, tmp_path, capsys):
    assert main(["--out_dir", str(tmp_path / "coref"), "--max_iters", "2", "--eval_interval", "2", "--eval_iters", "1",
                 "--n_layer", "1", "--n_embd", "16", "--quiet", "--sample_tokens", "0"]) == 0
    capsys.readouterr()
    code = main(["--data", texts["second"], "--out_dir", str(tmp_path / "x"), "--init_from", str(tmp_path / "coref"),
                 "--quiet"])
    assert "the model reads words" in one_line_error(capsys, 1, code)


# ---------------------------------------------------------------- --lora_rank
@pytest.fixture
def reference_lora(monkeypatch):
    """--lora_rank trains the learner's LoRALinear once exercise 17 passes: here, the reference solution's."""
    from exercise_solutions import lora as solution
    from train import lora
    monkeypatch.setattr(lora, "lora_linear", lambda: solution.LoRALinear)
    return solution.LoRALinear


def test_lora_trains_only_the_adapters_and_saves_a_plain_gpt(texts, trained, tmp_path, reference_lora, capsys):
    out = tmp_path / "lora"
    assert finetune(texts, trained / "ckpt.npz", out, "--lora_rank", "2", "--lora_alpha", "4") == 0
    assert "--lora_rank 2: 128 adapter parameters train" in capsys.readouterr().err   # 2 * (16 + 48) a block
    before, _, _ = checkpoint.load(str(trained / "ckpt.npz"))
    after, _, meta = checkpoint.load(str(out / "ckpt.npz"))
    assert set(after) == set(before)                     # a plain GPT's names: sample, explore, export read it
    changed = sorted(k for k in before if not np.array_equal(before[k], after[k]))
    assert changed == ["h.0.attn.c_attn.weight"]         # frozen everywhere else; the adapters merged in there
    model, tokenizer = load_model(str(out))              # the merged model scores what the run measured
    dataset = load_text(texts["second"], tokenizer)
    final = log_rows(out)[-1]
    assert estimate_loss(model, dataset, eval_args())["val"] == pytest.approx(final["val_loss"], abs=2e-6)


def test_lora_needs_init_from_and_a_lora_run_is_not_resumed(texts, trained, tmp_path, reference_lora, capsys):
    with pytest.raises(SystemExit) as refused:             # a flag problem: one line, as argparse's
        main(["--data", texts["second"], "--out_dir", str(tmp_path / "a"), *TINY, "--lora_rank", "2"])
    assert refused.value.code == 2
    assert "--lora_rank adapts a trained model: give it with --init_from PATH" in capsys.readouterr().err
    out = tmp_path / "lora"
    assert finetune(texts, trained / "ckpt.npz", out, "--lora_rank", "2") == 0
    capsys.readouterr()
    assert main(["--data", texts["second"], "--out_dir", str(out), "--resume", "--max_iters", "30"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds the merged weights of a LoRA run" in err and "--init_from" in err


def test_lora_waits_for_the_learners_exercise(texts, trained, tmp_path, capsys):
    """Without a passing exercises/lora.py, the flag says what to write, in one line."""
    code = finetune(texts, trained / "ckpt.npz", tmp_path / "lora", "--lora_rank", "2")
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1
    assert "--lora_rank trains your LoRALinear (exercise 17 of EXERCISES.md, exercises/lora.py)" in err


def test_a_char_run_reads_a_token_folder_prepared_with_its_tokenizer(texts, trained, tmp_path, capsys):
    from data.prepare import main as prepare_main
    assert prepare_main([texts["second"], "--tokenizer_from", str(trained), "--out_dir", str(tmp_path / "tok")]) == 0
    assert finetune({"second": str(tmp_path / "tok")}, trained, tmp_path / "a", "--max_iters", "0") == 0
    assert finetune(texts, trained, tmp_path / "b", "--max_iters", "0") == 0         # the text file itself
    assert log_rows(tmp_path / "a")[0]["val_loss"] == log_rows(tmp_path / "b")[0]["val_loss"]
    capsys.readouterr()
    assert prepare_main([texts["strange"], "--tokenizer_from", str(trained), "--out_dir", str(tmp_path / "x")]) == 1
    assert "3 characters are not in the vocabulary of --tokenizer_from" in one_line_error(capsys, 1, 1)
