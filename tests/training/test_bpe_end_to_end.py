"""A BPE model from start to finish: prepare, train, prepare another text with its tokenizer,
fine-tune (--init_from), sample, explore, export to Hugging Face's format and load it back."""
import json

import numpy as np
import pytest

pytest.importorskip("regex")           # the BPE tokenizer's split pattern needs it

from data import prepare as prep
from tinyattn.tokenizers import BPE, ENDOFTEXT
from train import checkpoint, explore
from train.command import main as train_main
from train.export_hf import main as export_main
from train.sample import load_model, main as sample_main

FIRST = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
         "All:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n\n") * 40
SECOND = ("MENENIUS:\nWhy, masters, my good friends, mine honest neighbours,\nWill you undo yourselves?\n\n"
          "First Citizen:\nWe cannot, sir, we are undone already.\n\n") * 30
DOCS = "".join(f"Document {i}: the end is near.\n{ENDOFTEXT}" for i in range(60))
TINY = ["--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--block_size", "32", "--batch_size", "8",
        "--eval_iters", "2", "--warmup_iters", "5", "--lr_decay_iters", "40", "--learning_rate", "3e-3",
        "--quiet", "--sample_tokens", "0"]


def one_line(capsys):
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("texts")
    for name, text in (("first", FIRST), ("second", SECOND), ("docs", DOCS)):
        (folder / f"{name}.txt").write_text(text, encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def run(texts, tmp_path_factory):
    """A BPE model trained a little on the first text: (its token folder, its out_dir)."""
    root = tmp_path_factory.mktemp("run")
    assert prep.main([str(texts / "first.txt"), "--vocab_size", "300", "--out_dir", str(root / "tokens")]) == 0
    assert train_main(["--data", str(root / "tokens"), "--out_dir", str(root / "out"), *TINY,
                       "--max_iters", "60", "--eval_interval", "30"]) == 0
    return root / "tokens", root / "out"


@pytest.fixture(scope="module")
def second(texts, run, tmp_path_factory):
    """The second text, prepared with the run's tokenizer."""
    out = tmp_path_factory.mktemp("second") / "tokens"
    assert prep.main([str(texts / "second.txt"), "--tokenizer_from", str(run[1]), "--out_dir", str(out)]) == 0
    return out


# ---------------------------------------------------------------- data.prepare --tokenizer_from
def test_tokenizer_from_a_run_a_token_folder_and_a_checkpoint(texts, run, second, tmp_path):
    tokens, out = run
    first_tok = BPE.load(tokens / "tokenizer.bpe")
    assert BPE.load(second / "tokenizer.bpe").to_dict() == first_tok.to_dict()
    meta = json.loads((second / "meta.json").read_text())
    n = int(0.9 * len(SECOND))
    ids = np.fromfile(second / "train.bin", dtype=meta["dtype"]).tolist()
    assert ids == first_tok.encode(SECOND[:n]) and meta["tokenizer_from"] == str(out)
    for source in (tokens, out / "ckpt.npz"):
        assert prep.main([str(texts / "second.txt"), "--tokenizer_from", str(source),
                          "--out_dir", str(tmp_path / source.name)]) == 0
        assert (tmp_path / source.name / "train.bin").read_bytes() == (second / "train.bin").read_bytes()


def test_tokenizer_from_refusals_are_one_line(texts, run, tmp_path, capsys):
    def refused(*flags):
        assert prep.main([str(texts / "second.txt"), "--out_dir", str(tmp_path / "x"), *flags]) == 1
        return one_line(capsys)

    assert "--vocab_size is for a new tokenizer" in refused("--tokenizer_from", str(run[1]), "--vocab_size", "400")
    assert "--tokenizer char: --tokenizer_from" in refused("--tokenizer_from", str(run[1]), "--tokenizer", "char")
    assert "neither a token folder" in refused("--tokenizer_from", str(tmp_path / "nothing"))


# ---------------------------------------------------------------- --init_from RUN --data DIR
def test_init_from_a_bpe_run_on_data_prepared_with_its_tokenizer(run, second, tmp_path):
    out = tmp_path / "ft"
    assert train_main(["--init_from", str(run[1]), "--data", str(second), "--out_dir", str(out), *TINY,
                       "--max_iters", "10", "--eval_interval", "5"]) == 0
    before, _, _ = checkpoint.load(str(run[1] / "ckpt.npz"))
    after, _, meta = checkpoint.load(str(out / "ckpt.npz"))
    assert json.loads(meta["tokenizer"]) == BPE.load(run[0] / "tokenizer.bpe").to_dict()
    assert meta["config"]["vocab_size"] == 300 and not np.array_equal(before["wte.weight"], after["wte.weight"])
    # and --resume of it reads the same folder
    assert train_main(["--data", str(second), "--out_dir", str(out), "--resume", "--max_iters", "12",
                       "--quiet", "--sample_tokens", "0"]) == 0


def test_init_from_refuses_another_tokenizer_naming_both(texts, run, tmp_path, capsys):
    other = tmp_path / "other"
    assert prep.main([str(texts / "second.txt"), "--vocab_size", "280", "--out_dir", str(other)]) == 0
    capsys.readouterr()
    assert train_main(["--init_from", str(run[1]), "--data", str(other), "--out_dir", str(tmp_path / "x"),
                       *TINY]) == 1
    err = one_line(capsys)
    assert "(bpe, 280 ids) than the model's (bpe, 300 ids)" in err and "--tokenizer_from" in err
    # a text file: the model's tokens are written by data.prepare, which the message names
    assert train_main(["--init_from", str(run[1]), "--data", str(texts / "second.txt"),
                       "--out_dir", str(tmp_path / "x"), *TINY]) == 1
    assert "data.prepare" in one_line(capsys)


def test_added_special_tokens_grow_the_embedding_with_a_note(texts, run, tmp_path, capsys):
    chat = tmp_path / "chat"
    assert prep.main([str(texts / "second.txt"), "--tokenizer_from", str(run[1]), "--out_dir", str(chat),
                      "--add_special_token", "<|user|>", "--add_special_token", "<|assistant|>"]) == 0
    tok = BPE.load(chat / "tokenizer.bpe")
    assert tok.special_tokens == {ENDOFTEXT: 299, "<|user|>": 300, "<|assistant|>": 301}
    capsys.readouterr()
    out = tmp_path / "ft"
    assert train_main(["--init_from", str(run[1]), "--data", str(chat), "--out_dir", str(out), *TINY,
                       "--max_iters", "0"]) == 0
    printed = capsys.readouterr().err
    assert "adds 2 special tokens to the model's tokenizer (<|user|>, <|assistant|>)" in printed
    assert "embedding rows 300 to 301 are new" in printed
    before, _, _ = checkpoint.load(str(run[1] / "ckpt.npz"))
    after, _, meta = checkpoint.load(str(out / "ckpt.npz"))
    assert meta["config"]["vocab_size"] == 302 and after["wte.weight"].shape == (302, 16)
    assert np.array_equal(after["wte.weight"][:300], before["wte.weight"])
    assert np.allclose(after["wte.weight"][300:], before["wte.weight"].mean(0), atol=1e-6)


# ---------------------------------------------------------------- special tokens in the text
def test_a_text_with_endoftext_is_refused_before_training(texts, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(BPE, "train", classmethod(lambda *a, **k: pytest.fail("trained before refusing")))
    assert prep.main([str(texts / "docs.txt"), "--vocab_size", "300", "--out_dir", str(tmp_path / "x")]) == 1
    err = one_line(capsys)
    assert "'<|endoftext|>'" in err and "--special_tokens token" in err and "--special_tokens text" in err


def test_special_tokens_token_and_text(texts, tmp_path):
    n_docs = DOCS.count(ENDOFTEXT)
    folders = {}
    for how in ("token", "text"):
        folders[how] = tmp_path / how
        assert prep.main([str(texts / "docs.txt"), "--vocab_size", "300", "--out_dir", str(folders[how]),
                          "--special_tokens", how]) == 0
    seen = {}
    for how, folder in folders.items():
        tok = BPE.load(folder / "tokenizer.bpe")
        ids = np.concatenate([np.fromfile(folder / f"{s}.bin", dtype=np.uint16) for s in ("train", "val")]).tolist()
        assert tok.decode(ids) == DOCS                                   # the whole text, either way
        seen[how] = ids.count(tok.special_tokens[ENDOFTEXT])
    assert seen == {"token": n_docs, "text": 0}


# ---------------------------------------------------------------- sample and explore
def test_sample_starts_from_endoftext_and_reads_special_tokens(run, capsys):
    argv = ["--out_dir", str(run[1]), "--num_samples", "1", "--max_new_tokens", "5", "--temperature", "0"]
    assert sample_main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith(ENDOFTEXT) and "\x00" not in out
    assert sample_main([*argv, "--start", f"{ENDOFTEXT}First"]) == 0
    assert capsys.readouterr().out.startswith(f"{ENDOFTEXT}First")


def test_explore_reads_special_tokens_and_joins_a_characters_bytes(run, tmp_path, capsys):
    assert explore.main(["--out_dir", str(run[1]), "--text", f"All:{ENDOFTEXT}Speak", "--out",
                         str(tmp_path / "a.html")]) == 0
    page = (tmp_path / "a.html").read_text(encoding="utf-8")
    assert json.dumps(ENDOFTEXT) in page
    _, tokenizer = load_model(str(run[1]))
    text = "Ünïcode → 日本"
    ids = tokenizer.encode(text)
    labels = explore.token_labels(tokenizer, ids)
    assert len(labels) == len(ids) and not any("\ufffd" in label for label in labels)
    assert "日 (1/3)" in labels and "日 (3/3)" in labels                 # three byte tokens, one character


# ---------------------------------------------------------------- token ids past the vocabulary
def test_a_token_file_with_an_id_past_the_vocabulary_is_refused(run, tmp_path, capsys):
    folder = tmp_path / "bad"
    folder.mkdir()
    for name in ("meta.json", "tokenizer.bpe", "val.bin"):
        (folder / name).write_bytes((run[0] / name).read_bytes())
    ids = np.fromfile(run[0] / "train.bin", dtype=np.uint16)
    ids[123] = 5000
    ids.tofile(folder / "train.bin")
    assert train_main(["--data", str(folder), "--out_dir", str(tmp_path / "x"), *TINY, "--max_iters", "2"]) == 1
    err = one_line(capsys)
    assert "token id 5000 (at token 123)" in err and str(folder / "train.bin") in err and "300 ids" in err


# ---------------------------------------------------------------- Hugging Face
def test_exported_bpe_tokenizer_gives_the_same_ids_in_transformers(run, tmp_path):
    transformers = pytest.importorskip("transformers")
    assert export_main(["--out_dir", str(run[1]), "--to", str(tmp_path / "hf")]) == 0
    ours = BPE.load(run[0] / "tokenizer.bpe")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert len(theirs) == ours.vocab_size
    for text in (FIRST[:300], SECOND, "Ünïcode → 日本 😀\n\n  x\t y", f"All:{ENDOFTEXT}Speak  {ENDOFTEXT}\n"):
        ids = theirs(text)["input_ids"]
        assert ids == ours.encode(text, allowed_special="all")
        assert theirs(text, split_special_tokens=True)["input_ids"] == ours.encode_ordinary(text)
        assert theirs.decode(ids) == text


def test_an_exported_bpe_folder_loads_back(texts, run, second, tmp_path, capsys):
    assert export_main(["--out_dir", str(run[1]), "--to", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    argv = ["--num_samples", "1", "--max_new_tokens", "8", "--temperature", "0", "--start", "First"]
    assert sample_main(["--out_dir", str(run[1]), *argv]) == 0
    from_checkpoint = capsys.readouterr().out
    assert sample_main(["--out_dir", str(tmp_path / "hf"), *argv]) == 0
    assert capsys.readouterr().out == from_checkpoint
    assert train_main(["--init_from", str(tmp_path / "hf"), "--data", str(second), "--out_dir",
                       str(tmp_path / "ft"), *TINY, "--max_iters", "0"]) == 0
    assert prep.main([str(texts / "second.txt"), "--tokenizer_from", str(tmp_path / "hf"),
                      "--out_dir", str(tmp_path / "tokens")]) == 0
    assert (tmp_path / "tokens" / "train.bin").read_bytes() == (second / "train.bin").read_bytes()


def test_bpe_end_to_end_in_transformers(run, second, tmp_path, capsys):
    """Train, prepare a second text with the run's tokenizer, fine-tune, export: transformers'
    AutoTokenizer and GPT2LMHeadModel continue a prompt greedily as python -m train.sample does."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "ft"
    assert train_main(["--init_from", str(run[1]), "--data", str(second), "--out_dir", str(out), *TINY,
                       "--max_iters", "30", "--eval_interval", "15"]) == 0
    assert export_main(["--out_dir", str(out), "--to", str(tmp_path / "hf")]) == 0
    prompt = "First Citizen:\nWe"
    capsys.readouterr()
    assert sample_main(["--out_dir", str(out), "--start", prompt, "--num_samples", "1", "--max_new_tokens", "20",
                        "--temperature", "0"]) == 0
    ours = capsys.readouterr().out.split("---------------")[0][:-1]     # the sample, without print's newline
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    x = torch.tensor([tok(prompt)["input_ids"]])
    with torch.no_grad():
        y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=20, min_new_tokens=20,
                           do_sample=False, pad_token_id=0)
    assert y.shape == (1, x.shape[1] + 20)
    assert tok.decode(y[0].tolist()) == ours
