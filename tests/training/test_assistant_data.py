"""The assistant lesson's data as TRL's users bring it: system messages, TRL's three preference
forms from one file, JSON lines known by their content, special tokens' text inside messages,
long examples truncated to --max_length, and refusals of what trains nothing."""
import json

import numpy as np
import pytest

import tinyattn as ta
from data.chat import CHAT_TOKENS, SYSTEM, render
from data.conversations import read_conversations
from data.pairs import main as pairs_main
from data.pairs import read_pairs, write_pairs
from data.prepare import main as prepare_main
from data.tasks import make_task
from tinyattn.models import GPT, GPTConfig
from tinyattn.tokenizers import CharTokenizer
from train import checkpoint
from train.command import main
from train.data import load_conversations, tokenizer_to_json, truncate
from train.dpo import load_pairs

from training_data import TEXT, error_lines

SMALL = ["--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--block_size", "48", "--batch_size", "8",
         "--eval_iters", "2", "--warmup_iters", "2", "--lr_decay_iters", "20", "--learning_rate", "3e-3",
         "--quiet", "--sample_tokens", "0"]
DPO = ["--batch_size", "8", "--eval_iters", "2", "--eval_interval", "4", "--learning_rate", "3e-3",
       "--warmup_iters", "2", "--quiet"]


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def one_line_error(capsys, code, expected_code=1):
    err = error_lines(capsys.readouterr().err)
    assert code == expected_code and len(err) == 1, err
    return err[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The text, spell conversations on its words (train and test), and the same with a system message."""
    folder = tmp_path_factory.mktemp("assistant-data")
    (folder / "text.txt").write_text(TEXT)
    spell = make_task("spell", TEXT)
    for split, n in (("train", 40), ("test", 10)):
        convs = spell.conversations(split, n)
        jsonl(folder / f"{split}.jsonl", convs)
        jsonl(folder / f"{split}-system.jsonl",
              [{"messages": [{"role": "system", "content": "spell it"}, *c["messages"]]} for c in convs])
    return folder


@pytest.fixture(scope="module")
def base(files, tmp_path_factory):
    """A char model trained a little on the text: no chat tokens yet."""
    out = tmp_path_factory.mktemp("base")
    assert main(["--data", str(files / "text.txt"), "--out_dir", str(out), *SMALL, "--max_iters", "4",
                 "--eval_interval", "4"]) == 0
    return out


@pytest.fixture(scope="module")
def sft(files, base, tmp_path_factory):
    """A chat model fine-tuned on conversations without a system message: it has no <|system|>."""
    folder = tmp_path_factory.mktemp("sft")
    assert prepare_main([str(files / "train.jsonl"), "--tokenizer_from", str(base), "--val",
                         str(files / "test.jsonl"), "--out_dir", str(folder / "convs")]) == 0
    assert main(["--init_from", str(base), "--data", str(folder / "convs"), "--out_dir", str(folder / "run"), *SMALL,
                 "--max_iters", "4", "--eval_interval", "4"]) == 0
    return folder / "run"


# ---------------------------------------------------------------- system messages
def test_conversations_with_a_system_message_prepare_and_train(files, base, tmp_path, capsys):
    out = tmp_path / "convs"
    assert prepare_main([str(files / "train-system.jsonl"), "--tokenizer_from", str(base), "--val",
                         str(files / "test-system.jsonl"), "--out_dir", str(out)]) == 0
    data = load_conversations(out)
    assert list(data.tokenizer.special_tokens) == [*CHAT_TOKENS, SYSTEM]
    system = data.tokenizer.special_tokens[SYSTEM]
    assert (data.rows["train"][:, 0] == system).all() and (data.masks["train"][:, :10] == 0).all()
    first = read_conversations(files / "train-system.jsonl")[0]
    ids, mask = render(data.tokenizer, first)
    assert data.rows["train"][0, :len(ids)].tolist() == ids and data.masks["train"][0, :len(ids)].tolist() == mask
    capsys.readouterr()
    assert main(["--init_from", str(base), "--data", str(out), "--out_dir", str(tmp_path / "run"), *SMALL,
                 "--max_iters", "2", "--eval_interval", "2"]) == 0
    assert "--data adds 4 special tokens" in capsys.readouterr().err


def test_a_chat_model_from_before_the_system_token_gets_it_grown_with_a_note(files, sft, tmp_path, capsys):
    out = tmp_path / "convs"
    assert prepare_main([str(files / "train-system.jsonl"), "--tokenizer_from", str(sft), "--val",
                         str(files / "test-system.jsonl"), "--out_dir", str(out)]) == 0
    old = checkpoint.load(str(sft / "ckpt.npz"))
    data = load_conversations(out)
    assert data.tokenizer.vocab_size == old[2]["config"]["vocab_size"] + 1           # <|system|> alone is new
    capsys.readouterr()
    assert main(["--init_from", str(sft), "--data", str(out), "--out_dir", str(tmp_path / "run"), *SMALL,
                 "--max_iters", "2", "--eval_interval", "2"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "<|system|>" in line]
    assert len(notes) == 1 and "fine-tuned before it existed" in notes[0] and "mean of the others" in notes[0]
    state = checkpoint.load(str(tmp_path / "run" / "ckpt.npz"))[0]
    assert state["wte.weight"].shape[0] == data.tokenizer.vocab_size


# ---------------------------------------------------------------- special tokens' text inside messages
@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_a_message_that_mentions_special_tokens_is_prepared_as_text(files, base, tmp_path, kind):
    said = [{"messages": [user("what ends a turn? <|end|> or <|endoftext|>"), assistant("<|end|>, then <|user|>")]}]
    path = jsonl(tmp_path / "mentions.jsonl", said * 12)
    model = base
    if kind == "bpe":                                  # a BPE token folder, <|endoftext|> one of its special tokens
        model = tmp_path / "bpe"
        assert prepare_main([str(files / "text.txt"), "--tokenizer", "bpe", "--vocab_size", "300", "--out_dir",
                             str(model)]) == 0
    assert prepare_main([str(path), "--tokenizer_from", str(model), "--out_dir", str(tmp_path / "c")]) == 0
    data = load_conversations(tmp_path / "c")
    specials = set(data.tokenizer.special_tokens.values())
    row = data.rows["train"][0]
    assert [int(i) for i in row if i in specials] == [data.tokenizer.special_tokens[t] for t in
                                                       ("<|user|>", "<|end|>", "<|assistant|>", "<|end|>")]
    assert data.tokenizer.decode(row[row >= 0]).startswith("<|user|>what ends a turn? <|end|> or <|endoftext|><|end|>")


# ---------------------------------------------------------------- JSON lines known by their content
@pytest.mark.parametrize("name", ["convs.json", "convs.JSONL", "convs.txt"])
def test_conversations_are_prepared_as_conversations_whatever_the_name(files, tmp_path, name):
    path = tmp_path / name
    path.write_text((files / "train.jsonl").read_text())
    assert prepare_main([str(path), "--out_dir", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["kind"] == "conversations"


def test_training_on_a_conversations_file_renders_them_as_prepare_does_and_resumes(files, base, tmp_path, capsys):
    path = tmp_path / "convs.json"                     # any name: the content says conversations
    path.write_text((files / "train.jsonl").read_text())
    assert prepare_main([str(path), "--tokenizer_from", str(base), "--val", str(files / "test.jsonl"),
                         "--out_dir", str(tmp_path / "folder")]) == 0
    folder = load_conversations(tmp_path / "folder")
    from train.data import load_data
    from train.sample import load_model
    direct = load_data(str(path), load_model(str(base))[1], str(files / "test.jsonl"))
    assert direct.tokenizer.to_dict() == folder.tokenizer.to_dict()
    for split in ("train", "val"):
        np.testing.assert_array_equal(direct.rows[split], folder.rows[split])
        np.testing.assert_array_equal(direct.masks[split], folder.masks[split])
    flags = ["--data", str(path), "--val", str(files / "test.jsonl"), *SMALL, "--eval_interval", "3"]
    assert main(["--init_from", str(base), *flags, "--out_dir", str(tmp_path / "a"), "--max_iters", "6"]) == 0
    assert main(["--init_from", str(base), *flags, "--out_dir", str(tmp_path / "b"), "--max_iters", "3",
                 "--lr_decay_iters", "20"]) == 0
    assert main([*flags, "--out_dir", str(tmp_path / "b"), "--resume", "--max_iters", "6"]) == 0
    a, b = (checkpoint.load(str(tmp_path / r / "ckpt.npz")) for r in ("a", "b"))
    assert a[2]["train_losses"] == b[2]["train_losses"] and all(np.array_equal(a[0][k], b[0][k]) for k in a[0])
    assert a[2]["log"][-1]["val_loss"] > 0                           # the masked loss on the assistant's tokens
    capsys.readouterr()
    err = one_line_error(capsys, main(["--data", str(files / "text.txt"), "--val", str(path), "--out_dir",
                                       str(tmp_path / "t"), *SMALL]))
    assert "--val is for a file of conversations or pairs" in err


def test_preparing_pairs_or_a_json_document_is_refused_in_one_line(tmp_path, capsys):
    pairs = jsonl(tmp_path / "pairs.jsonl", [{"prompt": "hi", "chosen": "yo", "rejected": "no"}])
    assert prepare_main([str(pairs), "--out_dir", str(tmp_path / "a")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "preference pairs" in err[0] and str(pairs) in err[0]
    doc = tmp_path / "data.json"
    doc.write_text(json.dumps([{"messages": [user("hi"), assistant("yo")]}], indent=2))
    assert prepare_main([str(doc), "--out_dir", str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "one JSON document, not JSON lines" in err[0]


# ---------------------------------------------------------------- nothing to train on
def test_conversations_without_an_answer_are_refused_naming_file_count_and_lines(tmp_path, capsys):
    good = {"messages": [user("hi"), assistant("yo")]}
    path = jsonl(tmp_path / "convs.jsonl", [good, {"messages": [user("hi")]}, good, good,
                                            {"messages": [{"role": "system", "content": "s"}, user("a")]}])
    assert prepare_main([str(path), "--out_dir", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path}: 2 of 5 conversations have no assistant message (lines 2, 5)" in err[0]


def test_a_folder_with_a_conversation_without_assistant_tokens_is_refused_at_training(files, tmp_path, capsys):
    out = tmp_path / "convs"
    assert prepare_main([str(files / "train.jsonl"), "--out_dir", str(out)]) == 0
    mask = np.load(out / "train_mask.npy")
    mask[3] = 0                                          # as a folder of before this check could hold it
    np.save(out / "train_mask.npy", mask)
    capsys.readouterr()
    err = one_line_error(capsys, main(["--data", str(out), "--out_dir", str(tmp_path / "r"), *SMALL]))
    assert f"{out}/train_mask.npy: 1 of 36 conversations have no assistant tokens" in err


def chat_model_file(folder, block_size=48):
    """A tiny chat model with random weights (the chat tokens and the letters in its vocabulary)."""
    tok = CharTokenizer(sorted(set("abcdefghijklmnopqrstuvwxyz :?+0123456789"))).extended(special_tokens=CHAT_TOKENS)
    ta.manual_seed(0)
    config = GPTConfig(block_size=block_size, vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16)
    model = GPT(config)
    path = folder / "chat.npz"
    checkpoint.save(str(path), model, model.configure_optimizer(0.1, 1e-3, (0.9, 0.99)),
                    dict(config=config.to_dict(), tokenizer=tokenizer_to_json(tok), step=0))
    return path, tok


def spell_pairs(n=30):
    return [{"prompt": [user(f"spell: {w}")], "chosen": [assistant(" ".join(w))],
             "rejected": [assistant(" ".join(w[::-1]))]}
            for w in ("cat", "dog", "bird", "fish", "horse", "mouse", "sheep", "goat", "lion", "bear")] * (n // 10)


def test_identical_pairs_are_noted_and_all_identical_refused(tmp_path, capsys):
    model, tok = chat_model_file(tmp_path)
    rows = spell_pairs()
    same = [dict(r, rejected=r["chosen"]) for r in rows]
    some = jsonl(tmp_path / "some.jsonl", same[:2] + rows[2:])
    data = load_pairs(str(some), tok)
    assert len(data.examples["train"]) == 25 and data.notes == [
        f"{some}: 2 of 27 train pairs have the same chosen and rejected (lines 1, 2): they train nothing, and are "
        "left out"]
    capsys.readouterr()
    assert main(["--stage", "dpo", "--init_from", str(model), "--data", str(some), "--out_dir", str(tmp_path / "r"),
                 *DPO, "--max_iters", "2"]) == 0
    assert "2 of 27 train pairs have the same chosen and rejected" in capsys.readouterr().err
    alike = jsonl(tmp_path / "alike.jsonl", same)
    err = one_line_error(capsys, main(["--stage", "dpo", "--init_from", str(model), "--data", str(alike),
                                       "--out_dir", str(tmp_path / "s"), *DPO, "--max_iters", "2"]))
    assert f"{alike}: chosen and rejected are the same in each of its 27 train pairs" in err


# ---------------------------------------------------------------- TRL's preference forms
def test_trls_three_preference_forms_read_as_the_same_pairs(tmp_path):
    conversational = spell_pairs(10)
    standard = [{"prompt": p["prompt"][0]["content"], "chosen": p["chosen"][0]["content"],
                 "rejected": p["rejected"][0]["content"]} for p in conversational]
    implicit = [{"chosen": p["prompt"] + p["chosen"], "rejected": p["prompt"] + p["rejected"]} for p in conversational]
    read = [read_pairs(jsonl(tmp_path / f"{name}.jsonl", rows)) for name, rows in
            (("conversational", conversational), ("standard", standard), ("implicit", implicit))]
    want = [dict(p, line=i) for i, p in enumerate(conversational, 1)]
    assert read[0] == read[1] == read[2] == want
    system = [{"chosen": [{"role": "system", "content": "s"}, *p["prompt"], *p["chosen"]],
               "rejected": [{"role": "system", "content": "s"}, *p["prompt"], *p["rejected"]]} for p in conversational]
    assert read_pairs(jsonl(tmp_path / "system.jsonl", system))[0]["prompt"] == \
        [{"role": "system", "content": "s"}, *conversational[0]["prompt"]]


@pytest.mark.parametrize("row, said", [
    ({"prompt": "hi", "chosen": "a"}, "a pair is"),
    ({"chosen": "a", "rejected": "b"}, "a pair without \"prompt\""),
    ({"chosen": [user("x"), assistant("a")], "rejected": [user("y"), assistant("b")]}, "share no first message"),
    ({"prompt": "hi", "chosen": [user("a")], "rejected": "b"}, "chosen begins with the user's message"),
])
def test_a_malformed_pair_is_refused_naming_file_and_line(tmp_path, row, said):
    path = jsonl(tmp_path / "p.jsonl", [spell_pairs(10)[0], row])
    with pytest.raises(ValueError, match=f"{path} line 2: .*{said}"):
        read_pairs(path)


def test_dpo_on_one_file_of_pairs_holds_out_a_tenth_or_reads_val(tmp_path):
    model, tok = chat_model_file(tmp_path)
    standard = [{"prompt": p["prompt"][0]["content"], "chosen": p["chosen"][0]["content"],
                 "rejected": p["rejected"][0]["content"]} for p in spell_pairs(30)]
    path = jsonl(tmp_path / "pairs.jsonl", standard)
    data = load_pairs(str(path), tok)
    assert len(data.examples["train"]) == 27 and len(data.examples["val"]) == 3
    assert [p["line"] for p in data.examples["val"]] == [28, 29, 30]
    val = jsonl(tmp_path / "val.jsonl", standard[:5])
    data = load_pairs(str(path), tok, str(val))
    assert len(data.examples["train"]) == 30 and len(data.examples["val"]) == 5
    folder = tmp_path / "folder"
    folder.mkdir()
    jsonl(folder / "train.jsonl", spell_pairs(30))
    jsonl(folder / "test.jsonl", spell_pairs(10)[:5])
    as_folder = load_pairs(str(folder), tok)
    for split in ("train", "val"):                     # the strings render as the message lists do
        for a, b in zip(data.arrays[split], as_folder.arrays[split]):
            np.testing.assert_array_equal(a, b)
    assert main(["--stage", "dpo", "--init_from", str(model), "--data", str(path), "--val", str(val),
                 "--out_dir", str(tmp_path / "run"), *DPO, "--max_iters", "2"]) == 0
    from train.dpo import heldout_report
    assert heldout_report(str(tmp_path / "run"), str(path), val=str(val))["spell"]["pairs"] == 5
    assert heldout_report(str(tmp_path / "run"), str(path))["spell"]["pairs"] == 3     # the file's last tenth


def test_val_is_refused_with_a_folder(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--data", str(tmp_path), "--val", "x.jsonl", "--out_dir", str(tmp_path / "r")])
    assert "--val is the held-out file of --data a file of conversations or pairs" in \
        one_line_error(capsys, e.value.code, 2)


# ---------------------------------------------------------------- long examples
def test_truncate_cuts_the_prompt_from_the_left_and_the_answer_from_the_right():
    ids = list(range(20))
    mask = [0] * 8 + [1] * 12                                        # a prompt of 8, an answer of 12
    assert truncate(ids, mask, 19) == (ids, mask)                    # 20 ids: 19 read, it fits
    assert truncate(ids, mask, 15) == (ids[:16], mask[:16])          # the prompt whole (half), the answer's start
    assert truncate(ids, mask, 9) == (ids[3:13], mask[3:13])         # half each: the prompt's end, the answer's start
    long_prompt = [0] * 14 + [1] * 6
    assert truncate(ids, long_prompt, 15) == (ids[4:], long_prompt[4:])      # the answer whole, the prompt's end
    short_prompt = [0] * 2 + [1] * 18
    assert truncate(ids, short_prompt, 9) == (ids[:10], short_prompt[:10])   # the prompt whole, the answer cut


def test_a_long_conversation_is_truncated_and_the_run_finishes(files, base, tmp_path, capsys):
    convs = [json.loads(line) for line in (files / "train.jsonl").read_text().splitlines()]
    long = {"messages": [user("spell: " + "abc" * 30), assistant(" ".join("abc" * 30))]}
    path = jsonl(tmp_path / "convs.jsonl", convs[:20] + [long] + convs[20:])
    capsys.readouterr()
    assert prepare_main([str(path), "--tokenizer_from", str(base), "--val", str(files / "test.jsonl"),
                         "--out_dir", str(tmp_path / "c")]) == 0
    note = [line for line in capsys.readouterr().err.splitlines() if "note" in line]
    assert len(note) == 1 and "1 train and 0 val conversations are longer than the model's block_size 48" in note[0]
    assert f"{path} line 21, 279 tokens" in note[0]
    assert main(["--init_from", str(base), "--data", str(tmp_path / "c"), "--out_dir", str(tmp_path / "r"), *SMALL,
                 "--max_iters", "4", "--eval_interval", "4"]) == 0
    err = capsys.readouterr().err
    assert "--max_length 48: 1 of 41 train and 0 of 10 val conversations were longer and are truncated" in err
    meta = checkpoint.read_meta(str(tmp_path / "r" / "ckpt.npz"))
    assert meta["args"]["max_length"] == 48
    data = load_conversations(tmp_path / "c")
    data.fit_length(48)
    row, row_mask = data.rows["train"][20], data.masks["train"][20]
    assert data.rows["train"].shape[1] == 49 and (row >= 0).all()
    first = int(np.argmax(row_mask == 1))
    assert first == 24 and data.tokenizer.decode(row[:first]).endswith("abcabc<|end|><|assistant|>")  # the prompt's end
    assert data.tokenizer.decode(row[first:]) == " ".join("abc" * 30)[:25]                         # the answer's start
    err = one_line_error(capsys, main(["--data", str(tmp_path / "c"), "--out_dir", str(tmp_path / "r"), "--resume",
                                       "--max_length", "40", "--max_iters", "6", "--quiet"]))
    assert "--resume: --max_length 40 (the run in" in err                # the examples would be cut elsewhere
    assert main(["--data", str(tmp_path / "c"), "--out_dir", str(tmp_path / "r"), "--resume",
                 "--max_iters", "6", "--quiet"]) == 0


def test_a_max_length_past_block_size_is_refused(files, base, tmp_path, capsys):
    assert prepare_main([str(files / "train.jsonl"), "--tokenizer_from", str(base), "--out_dir",
                         str(tmp_path / "c")]) == 0
    capsys.readouterr()
    err = one_line_error(capsys, main(["--init_from", str(base), "--data", str(tmp_path / "c"), "--out_dir",
                                       str(tmp_path / "r"), *SMALL, "--max_length", "60"]))
    assert "--max_length 60 is more than block_size 48" in err


def test_a_long_pair_is_truncated_and_the_dpo_run_finishes(tmp_path, capsys):
    model, tok = chat_model_file(tmp_path, block_size=32)
    rows = spell_pairs(30)
    word = "abcdefghij" * 3
    rows[4] = {"prompt": [user("spell: " + word)], "chosen": [assistant(" ".join(word))],
               "rejected": [assistant(" ".join(word[:-1]) + " x")]}     # they differ at the end only
    rows[7] = {"prompt": [user("spell: " + word)], "chosen": [assistant(" ".join(word))],
               "rejected": [assistant("x " + " ".join(word[1:]))]}      # they differ at the start
    path = jsonl(tmp_path / "pairs.jsonl", rows)
    capsys.readouterr()
    assert main(["--stage", "dpo", "--init_from", str(model), "--data", str(path), "--out_dir", str(tmp_path / "r"),
                 *DPO, "--max_iters", "2"]) == 0
    err = capsys.readouterr().err
    assert "--max_length 32: 2 of 27 train and 0 of 3 val pairs were longer and are truncated" in err
    assert "1 dropped (their answers alike once truncated)" in err
    data = load_pairs(str(path), tok)
    data.fit_length(32)
    assert all(a.shape[1] == 32 for a in data.arrays["train"]) and len(data.rendered["train"]) == 26


# ---------------------------------------------------------------- smaller things
def test_task_lists_take_commas_and_spaces(tmp_path, capsys):
    (tmp_path / "text.txt").write_text(TEXT)
    for i, tasks in enumerate((["spell,reverse"], ["spell", "reverse"], ["spell,", "reverse"])):
        assert pairs_main(["--text", str(tmp_path / "text.txt"), "--tasks", *tasks, "--n", "3", "--n_test", "2",
                           "--out_dir", str(tmp_path / f"p{i}")]) == 0
        assert "(spell, reverse)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        pairs_main(["--tasks", "spell", "poem", "--text", str(tmp_path / "text.txt"), "--out_dir", str(tmp_path / "x")])
    assert "'poem' is not a task" in capsys.readouterr().err
    from train.config import parse_args
    for given in (["spell", "reverse"], ["spell,reverse"], ["spell, reverse"]):
        args, _ = parse_args(["--stage", "rl", "--init_from", "x", "--rl_tasks", *given])
        assert args.rl_tasks == "spell,reverse"


@pytest.mark.parametrize("argv, said", [
    (["--mix_data", "text.txt"], "--mix_data mixes text into conversations: give --data a conversation folder too"),
    (["--stage", "sft", "--data", "convs"], "SFT needs no --stage: it is python -m train --data <conversation folder>"),
])
def test_flag_refusals_say_what_to_do(argv, said, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = one_line_error(capsys, e.value.code, 2)
    assert said in err and "None" not in err


def test_rl_from_a_word_model_says_it_has_no_chat_tokens_first(files, tmp_path, capsys):
    assert main(["--out_dir", str(tmp_path / "coref"), "--max_iters", "1", "--eval_interval", "1", "--eval_iters", "1",
                 "--n_layer", "1", "--n_embd", "16", "--quiet", "--sample_tokens", "0"]) == 0
    capsys.readouterr()
    err = one_line_error(capsys, main(["--stage", "rl", "--init_from", str(tmp_path / "coref"), "--data",
                                       str(files / "text.txt"), "--out_dir", str(tmp_path / "rl"), "--quiet"]))
    assert "--stage rl: the model has no chat tokens" in err and "drop --data" not in err


def test_the_heldout_report_truncates_a_long_pair_as_training_does(tmp_path, capsys):
    """python -m train.dpo scores the held-out pairs as the run's evaluation scored them: a pair
    longer than the run's --max_length is cut the same way (the prompt's start, the answers' ends),
    with the note, and the report finishes."""
    from train.dpo import main as report_main
    from train.dpo import DPOObjective, load_reference
    from types import SimpleNamespace
    model, tok = chat_model_file(tmp_path, block_size=32)
    rows = spell_pairs(30)
    word = "abcdefghij" * 3
    rows[-1] = {"prompt": [user("spell: " + word)], "chosen": [assistant(" ".join(word))],
                "rejected": [assistant("x " + " ".join(word[1:]))]}      # a held-out pair (the last 10%), 70 tokens
    path = jsonl(tmp_path / "pairs.jsonl", rows)
    run = tmp_path / "r"
    assert main(["--stage", "dpo", "--init_from", str(model), "--data", str(path), "--out_dir", str(run),
                 *DPO, "--max_iters", "2"]) == 0
    err = capsys.readouterr().err
    assert "--max_length 32: 0 of 27 train and 1 of 3 val pairs were longer and are truncated" in err
    assert report_main(["--out_dir", str(run), "--data", str(path), "--compile", "False"]) == 0
    out, err = capsys.readouterr()
    assert "--max_length 32: 1 of 3 held-out pairs were longer and are truncated" in err
    report = json.loads(out)["spell"]
    assert report["pairs"] == 3
    # the reward accuracy is the one of the pairs as training cut them: the same numbers, computed here
    data = load_pairs(str(path), tok)
    data.fit_length(32)
    trained, _, _ = checkpoint.load(str(run / "ckpt.npz"))
    policy = GPT(GPTConfig(**checkpoint.read_meta(str(run / "ckpt.npz"))["config"]))
    policy.load_state_dict(trained)
    policy.eval()
    reference = load_reference(str(model), SimpleNamespace(out_dir=str(tmp_path / "e"), dtype="float32",
                                                           device="cpu", compile=False))
    batch = tuple(ta.tensor(a) for a in data.arrays["val"])
    with ta.no_grad():
        pc, pr, rc, rr = (t.numpy() for t in DPOObjective(reference, 0.1).logprobs(policy, batch))
    assert report["reward_accuracy"] == round(float(np.mean((pc - rc) - (pr - rr) > 0)), 4)
    assert abs(report["chosen_drift"] - round(float(np.mean(pc - rc)), 4)) < 2e-4
