"""Supervised fine-tuning: conversation folders (python -m data.prepare CONVS.jsonl), their
batches with the loss mask, a char model grown for the chat tokens, plain text mixed in,
and python -m train.chat_eval."""
import json

import numpy as np
import pytest

import tinyattn as ta
from data.chat import END, render, render_prompt
from data.conversations import read_conversations
from data.prepare import main as prepare_main
from data.tasks import make_task
from tinyattn.tokenizers import CharTokenizer
from train import checkpoint
from train.chat_eval import answer, text_loss
from train.chat_eval import main as eval_main
from train.command import main
from train.data import load_conversations, load_data, load_text
from train.finetune import added_special_tokens
from train.sample import load_model

from training_data import TEXT, ctrl_c_in_backward, error_lines

SMALL = ["--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--block_size", "48", "--batch_size", "8",
         "--eval_iters", "2", "--warmup_iters", "2", "--lr_decay_iters", "20", "--learning_rate", "3e-3",
         "--quiet", "--sample_tokens", "0"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The text, and spell and add conversations on its words: a train and a test JSONL file."""
    folder = tmp_path_factory.mktemp("sft")
    (folder / "text.txt").write_text(TEXT)
    spell, add = make_task("spell", TEXT), make_task("add")
    for split, n in (("train", 40), ("test", 10)):
        convs = spell.conversations(split, n) + add.conversations(split, n)
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(c) + "\n" for c in convs))
    return folder


@pytest.fixture(scope="module")
def base(files, tmp_path_factory):
    """A char model trained a little on the text: it has no chat tokens, digits or '+'."""
    out = tmp_path_factory.mktemp("base")
    assert main(["--data", str(files / "text.txt"), "--out_dir", str(out), *SMALL, "--max_iters", "20",
                 "--eval_interval", "10"]) == 0
    return out


@pytest.fixture(scope="module")
def conv(files, base, tmp_path_factory):
    out = tmp_path_factory.mktemp("conv") / "folder"
    assert prepare_main([str(files / "train.jsonl"), "--tokenizer_from", str(base), "--val",
                         str(files / "test.jsonl"), "--out_dir", str(out)]) == 0
    return out


def test_prepare_writes_each_conversation_rendered_with_its_mask(files, base, conv):
    meta = json.loads((conv / "meta.json").read_text())
    assert meta["kind"] == "conversations" and meta["train_conversations"] == 80 and meta["val_conversations"] == 20
    data = load_conversations(conv)
    base_tok = load_model(str(base))[1]
    assert data.tokenizer.chars[:base_tok.vocab_size] == base_tok.chars        # the model's ids first
    assert set(data.tokenizer.chars[base_tok.vocab_size:]) >= {"+", "0", "9", "<|user|>", "<|end|>"}
    for split, path in (("train", "train.jsonl"), ("val", "test.jsonl")):
        convs = read_conversations(files / path)
        ids, mask = data.rows[split], data.masks[split]
        for row, messages in enumerate(convs):
            want_ids, want_mask = render(data.tokenizer, messages)
            n = len(want_ids)
            assert ids[row, :n].tolist() == want_ids and mask[row, :n].tolist() == want_mask
            assert (ids[row, n:] == -1).all() and (mask[row, n:] == 0).all()


def test_without_val_the_last_tenth_is_val_and_the_tokenizer_is_its_own(files, tmp_path):
    out = tmp_path / "own"
    assert prepare_main([str(files / "train.jsonl"), "--out_dir", str(out)]) == 0
    data = load_conversations(out)
    convs = read_conversations(files / "train.jsonl")
    assert len(data.rows["train"]) == 72 and len(data.rows["val"]) == 8
    assert render(data.tokenizer, convs[72])[0] == data.rows["val"][0][data.rows["val"][0] >= 0].tolist()
    chars = sorted({c for m in convs for message in m for c in message["content"]})
    assert data.tokenizer.chars == chars + ["<|user|>", "<|assistant|>", "<|end|>"]


@pytest.mark.parametrize("line, said", [
    ("{not json\n", "line 2: not JSON"),
    ('{"text": "hi"}\n', 'line 2: expected an object with "messages"'),
    ('{"messages": [{"role": "assistant", "content": "hi"}]}\n', "line 2: message 0 is from the assistant"),
])
def test_a_bad_line_is_refused_in_one_line_naming_file_and_line(tmp_path, capsys, line, said):
    path = tmp_path / "bad.jsonl"
    good = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n'
    path.write_text(good + line + good)
    assert prepare_main([str(path), "--out_dir", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path} {said}" in err[0], err
    assert not (tmp_path / "out").exists()


def test_prepare_refuses_an_existing_folder_and_text_flags(files, conv, capsys):
    assert prepare_main([str(files / "train.jsonl"), "--out_dir", str(conv)]) == 1
    err = capsys.readouterr().err
    assert "already holds" in err and "--overwrite" in err
    with pytest.raises(SystemExit):
        prepare_main([str(files / "train.jsonl"), "--vocab_size", "300"])
    assert "--vocab_size is for a text file" in capsys.readouterr().err


def test_the_batch_targets_the_assistants_tokens_only(conv):
    data = load_conversations(conv)
    rng = np.random.default_rng(0)
    x, y = data.get_batch("train", 16, 48, rng)
    picked = np.random.default_rng(0).integers(0, len(data.rows["train"]), size=16)
    ids, mask = data.rows["train"][picked], data.masks["train"][picked]       # (B, W)
    assert x.shape == y.shape == (16, ids.shape[1] - 1)
    np.testing.assert_array_equal(x, np.where(ids[:, :-1] < 0, 0, ids[:, :-1]))   # from position 0, padded
    for row in range(16):
        for t in range(ids.shape[1] - 1):
            want = ids[row, t + 1] if mask[row, t + 1] == 1 else -1
            assert y[row, t] == want
    end = data.tokenizer.special_tokens[END]
    assert (y == end).sum() == (mask[:, 1:] * (ids[:, 1:] == end)).sum() > 0     # each answer's <|end|> is a target
    with pytest.raises(ValueError, match="more than block_size 8"):
        data.get_batch("train", 4, 8, rng)


def test_the_masked_loss_is_the_mean_over_the_assistants_tokens(conv):
    data = load_conversations(conv)
    x, y = data.get_batch("val", 6, 48, np.random.default_rng(1))
    ta.manual_seed(0)
    from tinyattn.models import GPT, GPTConfig
    model = GPT(GPTConfig(block_size=48, vocab_size=data.tokenizer.vocab_size, n_layer=1, n_head=2, n_embd=16))
    logits, loss = model(ta.tensor(x), ta.tensor(y))
    z = logits.numpy().astype(np.float64)                                          # (B, T, V)
    logp = z - z.max(-1, keepdims=True) - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True))
    kept = y >= 0
    want = -logp[kept, y[kept]].mean()
    assert abs(loss.item() - want) < 1e-5


def test_char_tokenizers_that_extend_the_models_are_accepted():
    model_tok = CharTokenizer(list("abc"))
    grown = model_tok.extended(chars="+1", special_tokens=("<|user|>",))
    assert added_special_tokens(model_tok, grown) == ["+", "1", "<|user|>"]
    assert added_special_tokens(model_tok, CharTokenizer(list("bac+"))) is None      # ids moved
    assert added_special_tokens(model_tok, CharTokenizer(list("ab"))) is None


def test_sft_grows_the_char_model_and_trains_on_conversations(base, conv, tmp_path, capsys):
    out = tmp_path / "sft"
    assert main(["--init_from", str(base), "--data", str(conv), "--out_dir", str(out), *SMALL,
                 "--max_iters", "10", "--eval_interval", "5"]) == 0
    err = capsys.readouterr().err
    assert "--data adds 3 special tokens and " in err and "'+" in err and "started at the mean" in err
    base_state, _, base_meta = checkpoint.load(str(base / "ckpt.npz"))
    state, _, meta = checkpoint.load(str(out / "ckpt.npz"))
    data = load_conversations(conv)
    assert meta["config"]["vocab_size"] == data.tokenizer.vocab_size > base_meta["config"]["vocab_size"]
    assert json.loads(meta["tokenizer"])["chars"] == data.tokenizer.chars
    assert state["wte.weight"].shape[0] == data.tokenizer.vocab_size
    summary = json.loads((out / "summary.json").read_text())
    assert summary["val_loss"] < meta["log"][0]["val_loss"]            # the masked val loss falls


def test_from_scratch_on_conversations(files, tmp_path):
    folder = tmp_path / "own"
    assert prepare_main([str(files / "train.jsonl"), "--val", str(files / "test.jsonl"),
                         "--out_dir", str(folder)]) == 0
    assert main(["--data", str(folder), "--out_dir", str(tmp_path / "run"), *SMALL, "--max_iters", "5",
                 "--eval_interval", "5"]) == 0
    _, _, meta = checkpoint.load(str(tmp_path / "run" / "ckpt.npz"))
    assert meta["config"]["vocab_size"] == load_conversations(folder).tokenizer.vocab_size


def test_mixed_rows_are_text_windows_drawn_from_the_same_stream(files, conv):
    data = load_conversations(conv)
    text = load_text(files / "text.txt", data.tokenizer)
    data.add_mix(text.train, text.source, 0.25)
    a = data.get_batch("train", 8, 48, np.random.default_rng(3))
    b = data.get_batch("train", 8, 48, np.random.default_rng(3))
    np.testing.assert_array_equal(a[0], b[0])
    x, y = a
    assert x.shape == y.shape == (8, 48)
    assert (y[:6] == -1).any() and (y[6:] >= 0).all()                    # 2 rows of text, every target counts
    np.testing.assert_array_equal(x[6:, 1:], y[6:, :-1])
    starts = [int(np.flatnonzero(np.all(np.lib.stride_tricks.sliding_window_view(text.train, 48) == row, 1))[0])
              for row in x[6:]]
    assert all(s < len(text.train) - 48 for s in starts)                  # from the text's train split
    xv, yv = data.get_batch("val", 8, 48, np.random.default_rng(3))
    assert xv.shape[1] < 48                                              # val: conversations only


@pytest.mark.parametrize("stop", ["max_iters", "ctrl-c"])
def test_sft_with_mixed_text_resumes_exactly(files, base, conv, tmp_path, monkeypatch, stop):
    """Stopped at step 6 (by --max_iters, or by Ctrl-C in step 5's backward), then resumed: the
    uninterrupted run's losses and weights, to the bit."""
    flags = ["--init_from", str(base), "--data", str(conv), *SMALL, "--mix_data", str(files / "text.txt"),
             "--mix_fraction", "0.25", "--eval_interval", "4"]
    assert main([*flags, "--out_dir", str(tmp_path / "a"), "--max_iters", "12"]) == 0
    if stop == "max_iters":
        assert main([*flags, "--out_dir", str(tmp_path / "b"), "--max_iters", "6"]) == 0
    else:
        with monkeypatch.context() as patched:
            ctrl_c_in_backward(patched, 6)                # in step 5
            assert main([*flags, "--out_dir", str(tmp_path / "b"), "--max_iters", "12"]) == 130
        assert checkpoint.read_meta(str(tmp_path / "b" / "ckpt.npz"))["step"] == 6
    assert main(["--data", str(conv), "--out_dir", str(tmp_path / "b"), "--resume", "--max_iters", "12"]) == 0
    a, _, meta_a = checkpoint.load(str(tmp_path / "a" / "ckpt.npz"))
    b, _, meta_b = checkpoint.load(str(tmp_path / "b" / "ckpt.npz"))
    assert meta_b["args"]["mix_data"] == str(files / "text.txt") and meta_b["args"]["mix_fraction"] == 0.25
    assert meta_a["train_losses"] == meta_b["train_losses"]
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.parametrize("flags, said", [
    (["--mix_fraction", "0.5"], "--mix_fraction is the share of --mix_data's rows"),
    (["--mix_data", "TEXT", "--mix_fraction", "1.5"], "--mix_fraction must be in (0, 1)"),
])
def test_mix_flag_refusals_are_one_line(files, conv, tmp_path, capsys, flags, said):
    flags = [str(files / "text.txt") if f == "TEXT" else f for f in flags]
    with pytest.raises(SystemExit):
        main(["--data", str(conv), "--out_dir", str(tmp_path / "r"), *SMALL, *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0]


def test_mixing_into_a_text_is_refused_in_one_line(files, tmp_path, capsys):
    assert main(["--data", str(files / "text.txt"), "--out_dir", str(tmp_path / "r"), *SMALL,
                 "--mix_data", str(files / "text.txt")]) != 0
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "is not a conversation folder" in err[0]


# ---------------------------------------------------------------- python -m train.chat_eval
@pytest.fixture(scope="module")
def sft(base, conv, tmp_path_factory):
    out = tmp_path_factory.mktemp("sft-run")
    assert main(["--init_from", str(base), "--data", str(conv), "--out_dir", str(out), *SMALL,
                 "--max_iters", "10", "--eval_interval", "10"]) == 0
    return out


def test_batched_cached_answers_are_the_one_by_one_uncached_ones(sft, files):
    model, tok = load_model(str(sft))
    convs = make_task("spell", TEXT).conversations("test", 5) + make_task("add").conversations("test", 5)
    prompts = [render_prompt(tok, c["messages"][:-1]) for c in convs]
    batched = answer(model, tok, prompts, 12, 4, "cpu")
    for prompt, got in zip(prompts, batched):
        idx = list(prompt)
        for _ in range(12):                                   # greedy, the whole context each time
            logits, _ = model(ta.tensor([idx]))
            idx.append(int(logits.numpy()[0, -1].argmax()))
            if idx[-1] == tok.special_tokens[END]:
                break
        assert got == tok.decode(idx[len(prompt):]).split(END)[0]


def test_text_loss_is_the_mean_over_the_val_windows(base, files):
    model, tok = load_model(str(base))
    loss, bpb = text_loss(model, tok, files / "text.txt", "cpu", batch_size=3)
    val = load_text(files / "text.txt", tok).val
    losses = [model(ta.tensor(val[None, s:s + 48]), ta.tensor(val[None, s + 1:s + 49]))[1].item()
              for s in range(0, len(val) - 48, 48)]
    assert abs(loss - np.mean(losses)) < 1e-5
    assert abs(bpb - loss * len(val) / len(TEXT[int(0.9 * len(TEXT)):].encode()) / np.log(2)) < 1e-9


def test_chat_eval_prints_each_task_and_writes_json(sft, files, tmp_path, capsys):
    path = tmp_path / "numbers.json"
    assert eval_main(["--out_dir", str(sft), "--tasks", "spell,add", "--n", "6", "--text", str(files / "text.txt"),
                      "--json", str(path)]) == 0
    out = capsys.readouterr().out
    numbers = json.loads(path.read_text())
    assert list(numbers["tasks"]) == ["spell", "add"] and numbers["grown"] is None
    for name, r in numbers["tasks"].items():
        assert r["n"] == 6 and 0 <= r["accuracy"] <= r["format"] + 1e-9 <= 1 + 1e-9
        assert f"{name:<8} {r['accuracy']:>8.3f} {r['format']:>7.3f}" in out
    assert f"val loss {numbers['lm']['val_loss']:.4f}" in out


def test_a_base_model_is_evaluated_grown_and_never_answers(base, files, capsys):
    assert eval_main(["--out_dir", str(base), "--tasks", "spell,add", "--n", "5", "--text",
                      str(files / "text.txt")]) == 0
    captured = capsys.readouterr()
    assert "has no ids for" in captured.err and "grown" in captured.err and "'<|end|>'" in captured.err
    rows = [line.split() for line in captured.out.splitlines()[1:3]]
    assert [r[0] for r in rows] == ["spell", "add"] and all(float(r[1]) == 0 for r in rows)
    # its LM loss is the model's own, not the grown one's
    model, tok = load_model(str(base))
    assert f"val loss {text_loss(model, tok, files / 'text.txt', 'cpu')[0]:.4f}" in captured.out


@pytest.mark.parametrize("argv, said", [
    (["--tasks", "spell,fly"], "--tasks spell,fly: 'fly' is not a task: the tasks are"),
    (["--tasks", "spell", "spell"], "--tasks spell spell: a task is given twice"),
    (["--tasks", "spell"], "the word tasks (spell) take their words from a text"),
    (["--tasks", "add", "--system", "Be brief."], "--system: this model has no system token (<|system|>)"),
])
def test_chat_eval_refusals_are_one_line(sft, capsys, argv, said):
    assert eval_main(["--out_dir", str(sft), *argv]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0]


def test_chat_eval_tasks_take_commas_and_spaces(sft, files, tmp_path):
    def evaluated(*tasks):
        path = tmp_path / "numbers.json"
        assert eval_main(["--out_dir", str(sft), "--tasks", *tasks, "--n", "2", "--text", str(files / "text.txt"),
                          "--json", str(path)]) == 0
        return json.loads(path.read_text())["tasks"]

    by_commas = evaluated("spell,add")
    assert list(by_commas) == ["spell", "add"]
    assert evaluated("spell", "add") == evaluated("spell, add") == by_commas


@pytest.mark.parametrize("where, said", [
    ("missing/numbers.json", "--json {p}: the folder {d} does not exist (make it first)"),
    (".", "--json {p}: is a folder; give a file name"),
])
def test_chat_eval_checks_json_before_it_evaluates(sft, tmp_path, capsys, monkeypatch, where, said):
    import train.chat_eval as chat_eval
    monkeypatch.setattr(chat_eval, "evaluate", lambda args: pytest.fail("evaluated before --json was checked"))
    path = tmp_path / where
    assert eval_main(["--out_dir", str(sft), "--json", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "None" not in err
    assert err.startswith("python -m train.chat_eval: error: " + said.format(p=path, d=path.parent))


def test_load_data_reads_a_conversation_folder(conv):
    assert type(load_data(str(conv))).__name__ == "ConversationDataset"


def test_a_token_folder_of_the_models_characters_mixes_as_its_text(files, base, conv, tmp_path):
    from data.prepare import prepare
    from train.data import load_mix
    folder = tmp_path / "tokens"
    prepare(str(files / "text.txt"), tokenizer=None, out_dir=folder, tokenizer_from=str(base))
    data = load_conversations(conv)
    ids, _ = load_mix(folder, data.tokenizer)
    np.testing.assert_array_equal(ids, load_text(files / "text.txt", data.tokenizer).train)
    (tmp_path / "upper.txt").write_text(TEXT.upper())
    own = tmp_path / "own"
    prepare(str(tmp_path / "upper.txt"), tokenizer="char", out_dir=own)         # other characters, other ids
    with pytest.raises(ValueError, match="is not the one the conversations extend"):
        load_mix(own, data.tokenizer)


def test_sft_with_mixed_text_trains_over_two_processes(files, base, conv, tmp_path, monkeypatch):
    """mpiexec -n 2: each process takes half of each batch's conversations and text rows."""
    import subprocess
    import sys
    from test_distributed import MPIEXEC, TIMEOUT, WHY_NOT
    if MPIEXEC is None:
        pytest.skip(f"needs MPI: {WHY_NOT}")
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, "1")
    out = tmp_path / "two"
    argv = ["--init_from", str(base), "--data", str(conv), *SMALL, "--mix_data", str(files / "text.txt"),
            "--mix_fraction", "0.25", "--eval_interval", "4", "--max_iters", "6", "--out_dir", str(out)]
    done = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "train", *argv],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    meta = checkpoint.read_meta(str(out / "ckpt.npz"))
    assert meta["step"] == 6 and meta["world_size"] == 2 and meta["train_losses"][-1] < meta["train_losses"][0]


def test_a_fine_tuned_run_resumes_twice_with_its_models_vocabulary(files, base, tmp_path):
    """A resumed run saves no --init_from; its second --resume must still encode the text with the
    model's characters, not the text's own (fewer) ones."""
    text = (files / "text.txt").read_text()
    fewer = tmp_path / "lower.txt"
    fewer.write_text("".join(c for c in text if not c.isupper()) * 3)          # a subset of the characters
    out = tmp_path / "run"
    assert main(["--init_from", str(base), "--data", str(fewer), "--out_dir", str(out), *SMALL, "--max_iters", "4"]) == 0
    for steps in ("6", "8"):
        assert main(["--data", str(fewer), "--out_dir", str(out), "--resume", "--max_iters", steps, "--quiet"]) == 0
    meta = checkpoint.read_meta(str(out / "ckpt.npz"))
    assert meta["step"] == 8 and meta["args"]["fine_tuned_from"] == str(base)
