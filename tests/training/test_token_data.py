"""Token datasets on disk (python -m data.prepare, python -m train --data DIR) and bits per byte."""
import json
import math
import os

import numpy as np
import pytest

pytest.importorskip("regex")           # the BPE tokenizer's split pattern needs it

from data import prepare as prep
from tinyattn.tokenizers import BPE
from train import checkpoint, data as train_data
from train.data import load_coref, load_data, load_text, load_tokens, tokenizer_from_json
from train.command import main as train_main
from train.sample import main as sample_main

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
        "All:\nSpeak, speak. Ça va? 東京 😀\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n\n") * 60
TINY = ["--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--block_size", "16", "--batch_size", "8",
        "--eval_iters", "2", "--warmup_iters", "5", "--lr_decay_iters", "40", "--learning_rate", "3e-3",
        "--quiet", "--sample_tokens", "0"]


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "input.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


@pytest.fixture
def bpe_dir(text_file, tmp_path):
    assert prep.main([str(text_file), "--tokenizer", "bpe", "--vocab_size", "300",
                      "--out_dir", str(tmp_path / "bpe300")]) == 0
    return tmp_path / "bpe300"


def test_prepare_bpe_writes_the_splits_and_the_tokenizer(bpe_dir, capsys):
    meta = json.loads((bpe_dir / "meta.json").read_text())
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 300 and meta["tokenizer"] == "bpe"
    tok = BPE.load(bpe_dir / "tokenizer.bpe")
    assert tok.n_vocab == 300 and len(tok.ranks) == 299                # <|endoftext|> is the 300th id
    n = int(0.9 * len(TEXT))
    for split, part in (("train", TEXT[:n]), ("val", TEXT[n:])):
        ids = np.fromfile(bpe_dir / f"{split}.bin", dtype=np.uint16)
        assert tok.decode(ids.tolist()) == part                          # the files hold exactly the text
        assert meta[f"{split}_tokens"] == len(ids) < len(part)
        assert meta[f"{split}_bytes"] == len(part.encode("utf-8"))
    # the tokenizer was learned on the train split only
    assert tok.ranks == BPE.train(TEXT[:n], 299).ranks


def test_prepare_char_and_default_folder(text_file):
    assert prep.main([str(text_file), "--tokenizer", "char"]) == 0
    folder = text_file.parent / "char"                                 # data/NAME/input.txt -> data/NAME/char
    ds = load_data(folder)
    ref = load_text(text_file)
    assert ds.tokenizer.chars == ref.tokenizer.chars
    assert np.array_equal(ds.train, ref.train) and np.array_equal(ds.val, ref.val)
    assert ds.text_bytes == ref.text_bytes
    assert prep.default_out_dir("books/moby.txt", "bpe", 512) == prep.Path("books/moby-bpe512")


def test_dtype_follows_the_vocabulary():
    assert prep.dtype_for(65_536) == np.uint16 and prep.dtype_for(65_537) == np.uint32


@pytest.mark.parametrize("argv, message", [
    (["missing.txt", "--tokenizer", "char"], "no such file"),
    (["{text}", "--tokenizer", "bpe", "--vocab_size", "100"], "at least 257"),
    (["{text}", "--tokenizer", "char", "--vocab_size", "300"], "for bpe"),
])
def test_prepare_errors_are_one_line(text_file, tmp_path, capsys, argv, message):
    argv = [a.replace("{text}", str(text_file)) for a in argv]
    assert prep.main(argv + ["--out_dir", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("argv, message", [
    (["{text}"], "--tokenizer bpe needs --vocab_size"),
    (["{text}", "--tokenizer", "words"], "invalid choice: 'words'"),
    (["{text}", "--vocab"], "unrecognized arguments: --vocab"),       # never taken for --vocab_size
])
def test_prepare_command_line_errors_are_one_line(text_file, tmp_path, capsys, argv, message):
    argv = [a.replace("{text}", str(text_file)) for a in argv]
    with pytest.raises(SystemExit) as e:
        prep.main(argv + ["--out_dir", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()


def test_prepare_refuses_a_token_folder_without_overwrite(bpe_dir, text_file, capsys):
    before = (bpe_dir / "train.bin").read_bytes()
    capsys.readouterr()
    assert prep.main([str(text_file), "--tokenizer", "char", "--out_dir", str(bpe_dir)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bpe_dir) in err and "--overwrite" in err
    assert (bpe_dir / "train.bin").read_bytes() == before                # nothing was touched
    assert prep.main([str(text_file), "--tokenizer", "char", "--out_dir", str(bpe_dir), "--overwrite"]) == 0
    assert not (bpe_dir / "tokenizer.bpe").exists()                      # the old tokenizer file is gone
    assert json.loads((bpe_dir / "meta.json").read_text())["tokenizer"] == "char"
    assert load_data(bpe_dir).tokenizer.chars == sorted(set(TEXT))


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["umask022", "umask077"])
def test_prepared_files_follow_the_umask(text_file, tmp_path, umask):
    old = os.umask(umask)
    try:
        for tokenizer in ("bpe", "char"):
            out = tmp_path / tokenizer
            extra = ["--vocab_size", "280"] if tokenizer == "bpe" else []
            assert prep.main([str(text_file), "--tokenizer", tokenizer, "--out_dir", str(out)] + extra) == 0
            modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
            assert len(modes) == 4 and set(modes.values()) == {0o666 & ~umask}, modes
    finally:
        os.umask(old)


def test_prepare_notes_a_vocabulary_smaller_than_asked(text_file, tmp_path, capsys):
    assert prep.main([str(text_file), "--vocab_size", "70000", "--out_dir", str(tmp_path / "big")]) == 0
    n = json.loads((tmp_path / "big" / "meta.json").read_text())["vocab_size"]
    err = capsys.readouterr().err
    assert n < 70_000 and err.count("\n") == 1
    assert "data.prepare: note:" in err and "70,000" in err and f"{n:,}" in err
    prep.main([str(text_file), "--vocab_size", "280", "--out_dir", str(tmp_path / "small")])
    assert capsys.readouterr().err == ""                                # as asked: no note


def test_token_dataset_opens_a_memmap_per_batch(bpe_dir, monkeypatch):
    ds = load_data(bpe_dir)
    opened = []
    real = np.memmap

    def counting(*args, **kwargs):
        opened.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(train_data.np, "memmap", counting)
    rng = np.random.default_rng(0)
    for _ in range(3):
        x, y = ds.get_batch("train", 4, 8, rng)
    assert len(opened) == 3 and all(str(p).endswith("train.bin") for p in opened)
    assert x.shape == y.shape == (4, 8) and x.dtype == np.int64
    assert np.array_equal(x[:, 1:], y[:, :-1])
    ids = np.fromfile(bpe_dir / "train.bin", dtype=np.uint16)
    assert any(np.array_equal(ids[s:s + 8], x[0]) for s in range(len(ids) - 8))   # real windows of the file


def test_load_tokens_errors(bpe_dir, tmp_path):
    with pytest.raises(ValueError, match="no meta.json"):
        load_tokens(tmp_path)
    with open(bpe_dir / "val.bin", "ab") as f:
        f.write(b"\0")                                                 # a torn file
    with pytest.raises(ValueError, match="val.bin has"):
        load_tokens(bpe_dir)


def test_bits_per_byte_char_and_word(text_file):
    ds = load_text(text_file)
    assert ds.text_bytes["val"] > len(ds.val)                           # multi-byte characters
    assert ds.bits_per_byte(2.0) == pytest.approx(2.0 * len(ds.val) / ds.text_bytes["val"] / math.log(2))
    coref = load_coref()
    val_text = " ".join(" ".join(ex.words) for ex in coref.examples["test"]) + " "
    assert coref.text_bytes["val"] == len(val_text.encode("utf-8"))
    assert coref.bits_per_byte(1.0) == pytest.approx(len(coref.val) / len(val_text.encode()) / math.log(2))


def test_train_from_a_token_folder_then_sample(bpe_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_main(["--data", str(bpe_dir), "--out_dir", str(out), *TINY,
                       "--max_iters", "30", "--eval_interval", "15"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    meta = json.loads((bpe_dir / "meta.json").read_text())
    ratio = meta["val_tokens"] / meta["val_bytes"] / math.log(2)
    assert summary["val_bpb"] == pytest.approx(summary["val_loss"] * ratio, rel=1e-5)
    rows = (out / "log.csv").read_text().splitlines()
    assert rows[0].endswith(",val_bpb") and all(r.split(",")[-1] for r in rows[1:])
    _, _, ckpt_meta = checkpoint.load(str(out / "ckpt.npz"))
    tok = tokenizer_from_json(ckpt_meta["tokenizer"])                   # the checkpoint carries the tokenizer
    assert isinstance(tok, BPE) and tok.ranks == BPE.load(bpe_dir / "tokenizer.bpe").ranks
    capsys.readouterr()
    assert sample_main(["--out_dir", str(out), "--start", "First Citizen:", "--num_samples", "1",
                        "--max_new_tokens", "10"]) == 0
    assert capsys.readouterr().out.startswith("First Citizen:")


def test_explorer_shows_bpe_tokens_escaped(tmp_path):
    from train import explore
    import tinyattn as ta
    from tinyattn.models import GPT, GPTConfig
    from train.data import tokenizer_to_json
    text = 'a <b>&amp; "q" </script><script>alert(1)</script> \n' * 20
    tok = BPE.train(text, 320)
    assert any(b"</" in t for t in tok.ranks)                           # a token holds "</"
    ta.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=64, vocab_size=tok.vocab_size))
    checkpoint.save(str(tmp_path / "ckpt.npz"), model, model.configure_optimizer(0.1, 1e-3, (0.9, 0.99)),
                    dict(config=model.config.to_dict(), tokenizer=tokenizer_to_json(tok)))
    prompt = text[:50]
    assert explore.main(["--out_dir", str(tmp_path), "--text", prompt]) == 0
    page = (tmp_path / "attention.html").read_text()
    labels = explore.token_labels(tok, tok.encode(prompt))
    assert "".join(labels) == prompt.replace(" ", "\u2423")            # every token, spaces made visible
    assert page.count("</script>") == 1                                  # only the page's own
    assert '"tokens": ' + json.dumps(labels).replace("</", "<\\/") in page   # the labels, "</" escaped
    assert "<script>alert" not in page


def test_chunked_encoding_equals_whole(text_file):
    n = int(0.9 * len(TEXT))
    tok = BPE.train(TEXT[:n], 299)
    text = TEXT + "\n\n\n   \n x\n\ny \n" * 50
    parts = list(prep.chunks(text, size=100))
    assert "".join(parts) == text and len(parts) > 10
    assert [i for p in parts for i in tok.encode(p)] == tok.encode(text)


def test_resume_names_both_vocabularies(bpe_dir, text_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_main(["--data", str(bpe_dir), "--out_dir", str(out), *TINY, "--max_iters", "4"]) == 0
    other = tmp_path / "bpe280"
    assert prep.main([str(text_file), "--vocab_size", "280", "--out_dir", str(other)]) == 0
    capsys.readouterr()
    assert train_main(["--data", str(other), "--out_dir", str(out), "--resume", "--max_iters", "8"]) == 1
    err = capsys.readouterr().err
    assert "(280 tokens) differs from the one" in err and "trained with (300 tokens)" in err
