"""Tests for data/ (tiny Shakespeare fetch, the "it" corpus) and train/data.py.

No network: every file is written in tmp_path, a small one (or, where the machine has
a copy, the real tiny Shakespeare, copied there).
"""
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

from data import coref, shakespeare_char
from train.data import (CharTokenizer, Dataset, WordTokenizer, load_coref,
                        load_text, tokenizer_from_json, tokenizer_to_json)


# ---- tiny Shakespeare ------------------------------------------------------

FAKE = b"First Citizen:\nBefore we proceed any further, hear me speak.\n"


@pytest.fixture
def fake_shakespeare(tmp_path, monkeypatch):
    """A small file, and the expected size and hash set to match it."""
    path = tmp_path / "fake.txt"
    path.write_bytes(FAKE)
    monkeypatch.setattr(shakespeare_char, "EXPECTED_SIZE", len(FAKE))
    monkeypatch.setattr(shakespeare_char, "EXPECTED_SHA256", hashlib.sha256(FAKE).hexdigest())
    return path


def test_fetch_from_file_writes_it(fake_shakespeare, tmp_path):
    out = tmp_path / "sub" / "input.txt"
    assert shakespeare_char.fetch(out, source=fake_shakespeare) == out
    assert out.read_bytes() == FAKE
    assert [p.name for p in out.parent.iterdir()] == ["input.txt"]   # no temp file left


def test_fetch_writes_with_the_umask(fake_shakespeare, tmp_path):
    old = os.umask(0o027)
    try:
        out = shakespeare_char.fetch(tmp_path / "input.txt", source=fake_shakespeare)
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == 0o640


def test_fetch_wrong_size(fake_shakespeare, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(FAKE + b"x")
    out = tmp_path / "input.txt"
    with pytest.raises(shakespeare_char.FetchError, match="bytes, expected"):
        shakespeare_char.fetch(out, source=bad)
    assert not out.exists()


def test_fetch_wrong_hash(fake_shakespeare, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(FAKE.upper())   # same size, other bytes
    with pytest.raises(shakespeare_char.FetchError, match="sha256"):
        shakespeare_char.fetch(tmp_path / "input.txt", source=bad)


def test_fetch_real_constants_refuse_a_small_file(tmp_path):
    small = tmp_path / "small.txt"
    small.write_bytes(FAKE)
    with pytest.raises(shakespeare_char.FetchError, match="1,115,394"):
        shakespeare_char.fetch(tmp_path / "input.txt", source=small)


def test_fetch_missing_source(tmp_path):
    with pytest.raises(shakespeare_char.FetchError, match="cannot read"):
        shakespeare_char.fetch(tmp_path / "input.txt", source=tmp_path / "nope.txt")


def test_fetch_download_checked(fake_shakespeare, tmp_path, monkeypatch):
    monkeypatch.setattr(shakespeare_char, "download", lambda url: FAKE)
    out = shakespeare_char.fetch(tmp_path / "input.txt")
    assert out.read_bytes() == FAKE
    monkeypatch.setattr(shakespeare_char, "download", lambda url: FAKE[:-1])
    with pytest.raises(shakespeare_char.FetchError):
        shakespeare_char.fetch(tmp_path / "again.txt")


def test_fetch_keeps_a_checked_file_and_does_not_download(fake_shakespeare, tmp_path, monkeypatch, capsys):
    def no_network(url, timeout=None):
        raise AssertionError("downloaded again")
    monkeypatch.setattr(shakespeare_char, "download", no_network)
    out = tmp_path / "input.txt"
    out.write_bytes(FAKE)
    assert shakespeare_char.fetch(out) == out and out.read_bytes() == FAKE
    assert shakespeare_char.main(["--out", str(out)]) == 0
    assert "already there" in capsys.readouterr().out
    out.write_bytes(FAKE.upper())                 # a file that does not check is fetched again
    with pytest.raises(AssertionError, match="downloaded again"):
        shakespeare_char.fetch(out)


REAL_COPY = shakespeare_char.DEFAULT_OUT                        # where the fetcher puts it (git ignores it)


@pytest.mark.skipif(not REAL_COPY.exists(), reason="tiny Shakespeare not fetched here (python data/shakespeare_char.py)")
def test_fetch_keeps_the_real_file_offline(tmp_path, monkeypatch):
    def no_network(url, timeout=None):
        raise OSError("no route to host")
    monkeypatch.setattr(shakespeare_char.urllib.request, "urlopen", no_network)
    out = tmp_path / "input.txt"
    out.write_bytes(REAL_COPY.read_bytes())                   # the real constants check it
    assert shakespeare_char.main(["--out", str(out)]) == 0


def test_fetch_network_failure(tmp_path, monkeypatch):
    def no_network(url, timeout=None):
        raise OSError("no route to host")
    monkeypatch.setattr(shakespeare_char.urllib.request, "urlopen", no_network)
    with pytest.raises(shakespeare_char.FetchError, match="could not download.*--from"):
        shakespeare_char.fetch(tmp_path / "input.txt")


def test_fetch_cli_error_is_one_line(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(FAKE)
    result = subprocess.run([sys.executable, str(REPO_ROOT / "data" / "shakespeare_char.py"),
                             "--from", str(bad), "--out", str(tmp_path / "input.txt")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_fetch_cli_prints_training_command(fake_shakespeare, tmp_path, capsys):
    out = tmp_path / "input.txt"
    assert shakespeare_char.main(["--from", str(fake_shakespeare), "--out", str(out)]) == 0
    assert f"python -m train --data {out.resolve()}" in capsys.readouterr().out


# ---- the "it" corpus -------------------------------------------------------

@pytest.fixture(scope="module")
def corpus():
    return coref.make_corpus(seed=0)


def texts(examples):
    return [ex.text for ex in examples]


def test_corpus_deterministic_and_seeded(corpus):
    again = coref.make_corpus(seed=0)
    assert texts(again.train) == texts(corpus.train) and texts(again.test) == texts(corpus.test)
    assert again.heldout_pairs == corpus.heldout_pairs and again.vocab == corpus.vocab
    other = coref.make_corpus(seed=1)
    assert texts(other.train) != texts(corpus.train)
    assert other.heldout_pairs != corpus.heldout_pairs


def test_corpus_sizes(corpus):
    assert len(corpus.train) == 4000 and len(corpus.test) == 500
    assert corpus.vocab == sorted(set(corpus.vocab))
    small = coref.make_corpus(seed=3, n_train=10, n_test=5)
    assert len(small.train) == 10 and len(small.test) == 5


def pair(ex):
    return (ex.referent, ex.adjective)


def test_heldout_split_shares_no_pair(corpus):
    heldout = set(corpus.heldout_pairs)
    assert {pair(ex) for ex in corpus.test} <= heldout
    assert not {pair(ex) for ex in corpus.train} & heldout
    kinds = {coref.kind_of(adj) for _, adj in heldout}
    assert kinds == {"animal", "place"}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_test_word_appears_in_training(seed):
    c = coref.make_corpus(seed=seed)
    train_words = {w for ex in c.train for w in ex.words}
    assert {w for ex in c.test for w in ex.words} <= train_words
    assert train_words == set(c.vocab)
    # and every noun and adjective is also a referent / adjective pair in training
    assert {ex.referent for ex in c.train} == set(coref.ANIMALS) | set(coref.PLACES)
    assert {ex.adjective for ex in c.train} == set(coref.ANIMAL_ADJECTIVES + coref.PLACE_ADJECTIVES)


def test_each_adjective_fits_one_kind(corpus):
    assert not set(coref.ANIMAL_ADJECTIVES) & set(coref.PLACE_ADJECTIVES)
    assert not set(coref.ANIMALS) & set(coref.PLACES)
    assert len(coref.ANIMALS) >= 12 and len(coref.PLACES) >= 12
    assert len(coref.ANIMAL_ADJECTIVES) >= 5 and len(coref.PLACE_ADJECTIVES) >= 5
    for ex in corpus.train + corpus.test:
        expected = ex.animal if ex.adjective in coref.ANIMAL_ADJECTIVES else ex.place
        assert ex.referent == expected


def test_both_templates_with_both_referent_kinds(corpus):
    for split in (corpus.train, corpus.test):
        seen = {(ex.template, coref.kind_of(ex.adjective)) for ex in split}
        assert seen == {(t, kind) for t in range(len(coref.TEMPLATES)) for kind in ("animal", "place")}


def test_answer_token_is_the_referent(corpus):
    for ex in corpus.train[:200] + corpus.test[:200]:
        assert ex.words[ex.answer_index] == ex.referent
        assert ex.words[ex.answer_index - 1] == "="
        assert ex.words[ex.it_index] == "it" and ex.it_index < ex.words.index(ex.adjective)
        assert ex.words[-1] == coref.EOS
    # the animal comes first in templates 0 and 2, the place in 1 and 3;
    # in 2 and 3 the adjective comes before both nouns
    for t in range(4):
        ex = next(ex for ex in corpus.train if ex.template == t)
        assert (ex.words.index(ex.animal) < ex.words.index(ex.place)) == (t % 2 == 0)
        assert (ex.words.index(ex.adjective) < min(ex.words.index(ex.animal), ex.words.index(ex.place))) == (t >= 2)


def test_lesson_sentences(corpus):
    tired, wide = coref.LESSON_SENTENCES
    assert tired.text == ("the animal didn't cross the street because it was too tired "
                          ". it = animal <eos>")
    assert wide.referent == "street" and wide.words[wide.answer_index] == "street"
    for seed in range(5):
        assert not set(coref.LESSON_PAIRS) & set(coref.make_corpus(seed=seed).heldout_pairs)
    tok = WordTokenizer(corpus.vocab)
    assert tok.decode(tok.encode(wide.words)) == wide.text


def test_coref_cli(tmp_path):
    out = tmp_path / "coref.txt"
    assert coref.main(["--seed", "1", "--n-train", "30", "--n-test", "7", "--out", str(out)]) == 0
    train, test = out.read_text().strip("\n").split("\n\n")
    assert len(train.splitlines()) == 30 and len(test.splitlines()) == 7


# ---- tokenizers ------------------------------------------------------------

def test_char_tokenizer_round_trip():
    text = "Hello, wörld!\n"
    tok = CharTokenizer.from_text(text)
    assert tok.vocab_size == len(set(text)) and tok.chars == sorted(set(text))
    ids = tok.encode(text)
    assert tok.decode(ids) == text and tok.decode(np.array(ids)) == text
    again = tokenizer_from_json(tokenizer_to_json(tok))
    assert isinstance(again, CharTokenizer) and again.encode(text) == ids
    with pytest.raises(ValueError, match="'z'"):
        tok.encode("z")


def test_word_tokenizer_round_trip():
    tok = WordTokenizer.from_text("the cat didn't cross . it = cat")
    assert tok.vocab_size == 7
    ids = tok.encode("the cat didn't cross .")
    assert ids == tok.encode(["the", "cat", "didn't", "cross", "."])
    assert tok.decode(ids) == "the cat didn't cross ."
    again = tokenizer_from_json(tokenizer_to_json(tok))
    assert isinstance(again, WordTokenizer) and again.words == tok.words
    with pytest.raises(ValueError, match="'dog'"):
        tok.encode("the dog")


def test_tokenizer_from_json_unknown_kind():
    with pytest.raises(ValueError, match="unknown tokenizer kind"):
        tokenizer_from_json('{"kind": "unigram"}')


# ---- datasets and batches ---------------------------------------------------

def test_get_batch_shapes_and_shift():
    tok = CharTokenizer.from_text("abc")
    data = np.arange(50, dtype=np.int64)
    ds = Dataset(train=data, val=data[:9], tokenizer=tok, name="t")
    x, y = ds.get_batch("train", batch_size=4, block_size=8, rng=np.random.default_rng(0))
    assert x.shape == y.shape == (4, 8) and x.dtype == y.dtype == np.int64
    assert (y[:, :-1] == x[:, 1:]).all() and (y[:, -1] == x[:, -1] + 1).all()
    x, y = ds.get_batch("val", 2, 8, np.random.default_rng(0))   # exactly block_size + 1 tokens
    assert (x[0] == np.arange(8)).all() and (y[0] == np.arange(1, 9)).all()
    with pytest.raises(ValueError, match="has 9 tokens.*block_size \\+ 1 = 10"):
        ds.get_batch("val", 2, 9, np.random.default_rng(0))
    with pytest.raises(ValueError, match="split must be"):
        ds.get_batch("test", 2, 4, np.random.default_rng(0))


def test_load_text_split(tmp_path):
    text = "".join(chr(ord("a") + i % 26) for i in range(1000))
    folder = tmp_path / "letters"
    folder.mkdir()
    (folder / "input.txt").write_text(text, encoding="utf-8")
    ds = load_text(folder / "input.txt")
    assert ds.name == "letters" and ds.tokenizer.vocab_size == 26
    assert len(ds.train) == 900 and len(ds.val) == 100
    assert ds.train.dtype == np.int64
    assert ds.tokenizer.decode(np.concatenate([ds.train, ds.val])) == text


def test_load_text_errors(tmp_path):
    with pytest.raises(ValueError, match="nope.txt: no such file"):
        load_text(tmp_path / "nope.txt")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("café au lait, s'il vous plaît".encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.txt: not UTF-8"):
        load_text(latin1)
    short = tmp_path / "short.txt"
    short.write_text("hi\n")
    with pytest.raises(ValueError, match="short.txt: too short"):
        load_text(short)
    with pytest.raises(ValueError, match="cannot read"):
        load_text(tmp_path)


def test_load_coref():
    ds = load_coref(seed=0)
    assert ds.name == "coref" and isinstance(ds.tokenizer, WordTokenizer)
    assert ds.tokenizer.words == coref.make_corpus(seed=0).vocab
    train, test = ds.examples["train"], ds.examples["test"]
    assert len(ds.train) == sum(len(ex.words) for ex in train)
    assert len(ds.val) == sum(len(ex.words) for ex in test)
    first = ds.tokenizer.decode(ds.train[:len(train[0].words)])
    assert first == train[0].text
    assert ds.tokenizer.decode(ds.val[:len(test[0].words)]) == test[0].text
    assert (load_coref(seed=0).train == ds.train).all()
    stream = load_coref(seed=0, layout="stream")
    assert stream.layout == "stream" and (stream.train == ds.train).all()
    x, y = stream.get_batch("val", 3, 16, np.random.default_rng(0))
    assert x.shape == (3, 16)
    with pytest.raises(ValueError, match="layout must be"):
        load_coref(seed=0, layout="words")


def test_coref_sentence_batches_start_at_zero():
    """layout='sentence': each row is one whole sentence from position 0, padded at the end with no loss."""
    ds = load_coref(seed=0)
    assert ds.layout == "sentence"
    width = max(len(ex.words) for ex in ds.examples["train"] + ds.examples["test"])
    x, y = ds.get_batch("train", 64, 32, np.random.default_rng(0))
    assert x.shape == y.shape == (64, width - 1)
    texts = {ex.text for ex in ds.examples["train"]}
    for xr, yr in zip(x, y):
        n = int((yr >= 0).sum())                                   # real targets: the sentence minus one
        assert (yr[n:] == -1).all() and (xr[n:] == ds.pad_id).all()
        assert (yr[:n - 1] == xr[1:n]).all()
        assert ds.tokenizer.decode(list(xr[:n]) + [yr[n - 1]]) in texts
    with pytest.raises(ValueError, match=f"has {width - 1} input tokens, more than block_size 16"):
        ds.get_batch("val", 2, 16, np.random.default_rng(0))


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_load_text_with_a_models_tokenizer_counts_the_bytes_each_split_covers(tmp_path, kind):
    """Bits per byte divide by the bytes of the split's text: a BPE's 90% of tokens is not 90% of
    the characters (chat_eval --text with a BPE model)."""
    from tinyattn.tokenizers import BPE
    text = "héllo wörld, the quick brown fox jumps over the lazy dog.\n" * 40
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    tok = CharTokenizer.from_text(text) if kind == "char" else BPE.train(text, 300)
    data = load_text(path, tok)
    decode = (lambda ids: tok.decode(ids).encode("utf-8")) if kind == "char" else tok.decode_bytes
    assert data.text_bytes == {"train": len(decode(data.train)), "val": len(decode(data.val))}
    assert data.text_bytes["train"] + data.text_bytes["val"] == len(text.encode("utf-8"))
