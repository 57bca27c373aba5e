"""Tokenizers, data sets and batches for the training program.

Two data sets:
  load_text(path)   any UTF-8 text file, one token per character (nanoGPT's shakespeare_char)
  load_coref(seed)  the generated "it" corpus of data/coref.py, one token per word

A Dataset holds two 1-d arrays of token ids (train and val); get_batch cuts
random windows out of them, with targets shifted by one token. The coref
corpus can instead give one sentence per row, starting at position 0
(layout="sentence", its default): then get_batch picks whole sentences.
"""
import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data import coref

MIN_CHARS = 20   # a shorter text file is refused: both splits need a few tokens


class CharTokenizer:
    """One token per character; the vocabulary is the sorted set of characters."""
    kind = "char"

    def __init__(self, chars):
        self.chars = list(chars)
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text):
        return cls(sorted(set(text)))

    @property
    def vocab_size(self):
        return len(self.chars)

    def encode(self, text):
        """str -> list of ids."""
        try:
            return [self.stoi[c] for c in text]
        except KeyError as e:
            raise ValueError(f"character {e.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids):
        """ids -> str."""
        return "".join(self.chars[int(i)] for i in ids)

    def to_dict(self):
        return {"kind": self.kind, "chars": self.chars}

    @classmethod
    def from_dict(cls, d):
        return cls(d["chars"])


class WordTokenizer:
    """One token per whitespace-separated word ("didn't", "." and "=" are words)."""
    kind = "word"

    def __init__(self, words):
        self.words = list(words)
        self.stoi = {w: i for i, w in enumerate(self.words)}

    @classmethod
    def from_text(cls, text):
        return cls(sorted(set(text.split())))

    @property
    def vocab_size(self):
        return len(self.words)

    def encode(self, text):
        """A string (split on whitespace) or a list of words -> list of ids."""
        words = text.split() if isinstance(text, str) else text
        try:
            return [self.stoi[w] for w in words]
        except KeyError as e:
            raise ValueError(f"word {e.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids):
        """ids -> the words joined with spaces."""
        return " ".join(self.words[int(i)] for i in ids)

    def to_dict(self):
        return {"kind": self.kind, "words": self.words}

    @classmethod
    def from_dict(cls, d):
        return cls(d["words"])


TOKENIZERS = {"char": CharTokenizer, "word": WordTokenizer}


def tokenizer_to_json(tok):
    """The tokenizer as a JSON string (checkpoints store it so, without pickle)."""
    return json.dumps(tok.to_dict())


def tokenizer_from_json(s):
    """Rebuild a tokenizer from tokenizer_to_json's string."""
    d = json.loads(s)
    kind = d.get("kind")
    if kind not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer kind {kind!r}, expected one of {sorted(TOKENIZERS)}")
    return TOKENIZERS[kind].from_dict(d)


@dataclass
class Dataset:
    """Token ids for training and validation, and the tokenizer that made them."""
    train: np.ndarray        # (N_train,) int64
    val: np.ndarray          # (N_val,) int64
    tokenizer: object
    name: str
    examples: dict | None = None    # coref only: {"train": [Example...], "test": [Example...]}
    rows: dict | None = None        # one sentence per row: {"train": (N, W), "val": (M, W)} ids, -1 pads the end
    pad_id: int = 0                 # what the model reads at a padded position (its target is -1: no loss)
    source: dict | None = None      # what the data is: {"bytes": size, "sha256": hash} (checkpoints keep it)

    @property
    def layout(self):
        """'sentence' (one sentence per sequence, from position 0) or 'stream' (random windows)."""
        return "stream" if self.rows is None else "sentence"

    def get_batch(self, split, batch_size, block_size, rng):
        """Random windows of block_size tokens: x (B, T) and y (B, T), y is x shifted by one."""
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        if self.rows is not None:
            return self.sentence_batch(split, batch_size, block_size, rng)
        data = self.train if split == "train" else self.val
        if len(data) < block_size + 1:
            raise ValueError(f"the {split} split of {self.name} has {len(data)} tokens, "
                             f"fewer than block_size + 1 = {block_size + 1}")
        starts = rng.integers(0, len(data) - block_size, size=batch_size)   # (B,)
        idx = starts[:, None] + np.arange(block_size)                         # (B, T)
        x = data[idx].astype(np.int64)
        y = data[idx + 1].astype(np.int64)
        return x, y

    def sentence_batch(self, split, batch_size, block_size, rng):
        """batch_size random sentences: x (B, W - 1) starts each at position 0, y is x shifted by one.

        Shorter sentences are padded at the end: x reads pad_id there and y is -1,
        which the loss ignores. W - 1 must fit in block_size.
        """
        rows = self.rows[split]                                             # (N, W)
        if rows.shape[1] - 1 > block_size:
            raise ValueError(f"a sentence of {self.name} has {rows.shape[1] - 1} input tokens, "
                             f"more than block_size {block_size}")
        picked = rows[rng.integers(0, len(rows), size=batch_size)]          # (B, W)
        x = np.where(picked[:, :-1] < 0, self.pad_id, picked[:, :-1])
        y = picked[:, 1:].copy()
        return x, y

    def sample_prompt(self):
        """Text to start a sample from: the lesson's question, or a newline (as nanoGPT does)."""
        if self.name == "coref":
            return "the animal didn't cross the street because it was too tired . it ="
        return "\n" if "\n" in self.tokenizer.stoi else self.tokenizer.decode(self.train[:1])


def load_text(path, tokenizer=None):
    """A UTF-8 text file as a char-level Dataset: first 90% train, last 10% val.

    ``tokenizer``: a trained model's CharTokenizer to encode with (fine-tuning); a text
    with characters outside its vocabulary is refused, naming a few. Else the
    vocabulary is the text's own characters."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (bad byte at offset {e.start})") from None
    if len(text) < MIN_CHARS:
        raise ValueError(f"{path}: too short ({len(text)} characters, need at least {MIN_CHARS})")

    tok = tokenizer if tokenizer is not None else CharTokenizer.from_text(text)
    unknown = sorted(set(text) - set(tok.stoi))
    if unknown:
        shown = ", ".join(repr(c) for c in unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise ValueError(f"{path}: {len(unknown)} characters are not in the model's vocabulary of "
                         f"{tok.vocab_size}: {shown}")
    ids = np.array(tok.encode(text), dtype=np.int64)   # (N,)
    n = int(0.9 * len(ids))
    # data/NAME/input.txt is named NAME, like nanoGPT's data folders; else the file's stem
    name = path.parent.name if path.stem == "input" and path.parent.name else path.stem
    return Dataset(train=ids[:n], val=ids[n:], tokenizer=tok, name=name, source=fingerprint(raw))


def fingerprint(raw):
    """The size and SHA-256 of some bytes: what --resume compares to know the data is the same."""
    return {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}


def load_coref(seed=0, layout="sentence"):
    """The generated "it" corpus as a word-level Dataset.

    train: the training sentences, shuffled and concatenated.
    val: the held-out test sentences (unseen noun/adjective pairs), concatenated.
    layout "sentence": get_batch gives one whole sentence per row, from position 0
    (rows, padded); "stream": random windows of the concatenated sentences.
    """
    if layout not in ("sentence", "stream"):
        raise ValueError(f"layout must be 'sentence' or 'stream', got {layout!r}")
    corpus = coref.make_corpus(seed=seed)
    tok = WordTokenizer(corpus.vocab)
    train_examples = list(corpus.train)
    random.Random(seed).shuffle(train_examples)

    def stream(examples):
        return np.array([i for ex in examples for i in tok.encode(ex.words)], dtype=np.int64)

    def padded(examples):                                                   # (N, W), -1 after the end
        width = max(len(ex.words) for ex in corpus.train + corpus.test)
        out = np.full((len(examples), width), -1, dtype=np.int64)
        for i, ex in enumerate(examples):
            out[i, :len(ex.words)] = tok.encode(ex.words)
        return out

    rows = {"train": padded(train_examples), "val": padded(corpus.test)} if layout == "sentence" else None
    train, val = stream(train_examples), stream(corpus.test)
    return Dataset(train=train, val=val, tokenizer=tok, source=fingerprint(train.tobytes() + val.tobytes()),
                   name="coref", examples={"train": train_examples, "test": list(corpus.test)},
                   rows=rows, pad_id=tok.stoi[coref.EOS])
