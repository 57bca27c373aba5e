"""Tokenizers, data sets and batches for the training program.

Three data sets:
  load_text(path)   any UTF-8 text file, one token per character (nanoGPT's shakespeare_char)
  load_tokens(dir)  train.bin / val.bin written by python -m data.prepare (BPE or char),
                    read through np.memmap, so a corpus larger than memory trains
  load_coref(seed)  the generated "it" corpus of data/coref.py, one token per word

A Dataset holds two 1-d arrays of token ids (train and val); get_batch cuts
random windows out of them, with targets shifted by one token. The coref
corpus can instead give one sentence per row, starting at position 0
(layout="sentence", its default): then get_batch picks whole sentences.
"""
import hashlib
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data import coref
from data.prepare import read_text_and_bytes
from tinyattn.tokenizers import BPE, ENDOFTEXT, CharTokenizer


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


TOKENIZERS = {"char": CharTokenizer, "word": WordTokenizer, "bpe": BPE}


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
    text_bytes: dict | None = None  # {"train": n, "val": m}: the UTF-8 bytes of the text each split covers

    def bits_per_byte(self, loss, split="val"):
        """A mean loss in nats per token of split -> bits per byte of its text.

        Loss per token is not comparable across tokenizers (a BPE token holds several
        characters); per byte it is: total nats (loss * tokens) / bytes / ln 2.
        """
        if not self.text_bytes:
            return None
        n_tokens = len(self.train if split == "train" else self.val)
        return loss * n_tokens / self.text_bytes[split] / math.log(2)

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
        return random_windows(self.train if split == "train" else self.val, f"the {split} split of {self.name}",
                              batch_size, block_size, rng)

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


def random_windows(data, what, batch_size, block_size, rng):
    """batch_size random windows of data: x (B, T) int64, and y, x shifted by one token."""
    if len(data) < block_size + 1:
        raise ValueError(f"{what} has {len(data)} tokens, fewer than block_size + 1 = {block_size + 1}")
    starts = rng.integers(0, len(data) - block_size, size=batch_size)   # (B,)
    idx = starts[:, None] + np.arange(block_size)                         # (B, T)
    x = data[idx].astype(np.int64)
    y = data[idx + 1].astype(np.int64)
    return x, y


def load_data(path, tokenizer=None):
    """--data: a folder of python -m data.prepare's token files, or a text file (characters).
    ``tokenizer``: a trained model's, to encode a text file with (fine-tuning)."""
    if Path(path).is_dir():
        return load_tokens(path)            # with --init_from, finetune.fit_args compares the tokenizers
    if tokenizer is not None and tokenizer.kind != "char":
        raise ValueError(f"--data {path}: the model reads {tokenizer.kind} tokens: write them with python -m "
                         f"data.prepare {path} --tokenizer_from MODEL (the model's run or folder), then pass "
                         "--data with the folder it writes")
    return load_text(path, tokenizer)


class TokenDataset(Dataset):
    """train.bin / val.bin from python -m data.prepare, read through np.memmap.

    Each batch opens the file anew and lets it go: a memmap kept open for the whole run
    holds every page it has read, so resident memory grows toward the size of the
    corpus (nanoGPT#428). Opening one costs microseconds.
    """

    def __init__(self, folder, meta, tokenizer, name, source=None):
        self.folder, self.meta = Path(folder), meta
        self.dtype = np.dtype(meta["dtype"])
        self.tokenizer, self.name, self.source = tokenizer, name, source
        self.text_bytes = {"train": meta["train_bytes"], "val": meta["val_bytes"]}

    def memmap(self, split):
        return np.memmap(self.folder / f"{split}.bin", dtype=self.dtype, mode="r")

    # train and val: a fresh memmap at each use (len(dataset.train) opens and closes one)
    train = property(lambda self: self.memmap("train"))
    val = property(lambda self: self.memmap("val"))

    def get_batch(self, split, batch_size, block_size, rng):
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        return random_windows(self.memmap(split), f"{self.folder / split}.bin", batch_size, block_size, rng)

    def sample_prompt(self):
        return "\n" if self.tokenizer.kind == "bpe" or "\n" in self.tokenizer.stoi else self.tokenizer.decode([0])


def load_tokens(folder, check_ids=True):
    """A folder written by python -m data.prepare as a TokenDataset. check_ids: read the token
    files once to refuse an id past the vocabulary (one line naming the id and the file)."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        kind, tok_path = meta["tokenizer"], folder / meta["tokenizer_file"]
        dtype = np.dtype(meta["dtype"])
        if kind == "bpe":
            tok = BPE.load(tok_path)
        elif kind == "char":
            tok = CharTokenizer.from_dict(json.loads(tok_path.read_text(encoding="utf-8")))
        else:
            raise ValueError(f"unknown tokenizer {kind!r}")
        for split in ("train", "val"):
            size = (folder / f"{split}.bin").stat().st_size
            if size != meta[f"{split}_tokens"] * dtype.itemsize:
                raise ValueError(f"{split}.bin has {size:,} bytes, meta.json says {meta[f'{split}_tokens']:,} "
                                 f"{dtype.name} tokens")
    except FileNotFoundError as e:
        raise ValueError(f"{folder}: no {Path(e.filename).name} (write the folder with python -m data.prepare)") from None
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"{folder}/meta.json: not written by python -m data.prepare ({e})") from None
    except ValueError as e:
        raise ValueError(f"{folder}: {e}") from None
    if tok.vocab_size != meta["vocab_size"]:
        raise ValueError(f"{folder}: the tokenizer has {tok.vocab_size} ids, meta.json says {meta['vocab_size']}")
    if check_ids:
        for split in ("train", "val"):
            check_token_ids(folder / f"{split}.bin", dtype, tok.vocab_size, meta["tokenizer_file"])
    # what --resume compares: meta.json (the tokenizer, the token counts, the text's bytes)
    return TokenDataset(folder, meta, tok, name=f"{folder.name}",
                        source=fingerprint((folder / "meta.json").read_bytes()))


def check_token_ids(path, dtype, vocab_size, tokenizer_file, chunk=1 << 24):
    """A ValueError naming the first id in the token file at path that is not below vocab_size
    (an embedding lookup would fail deep inside a training step, or read garbage on a GPU)."""
    ids = np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype)
    for start in range(0, len(ids), chunk):
        part = np.asarray(ids[start:start + chunk])                        # (chunk,)
        if len(part) and part.max() >= vocab_size:
            at = int(np.argmax(part >= vocab_size))
            raise ValueError(f"{path} holds token id {int(part[at])} (at token {start + at:,}), past the "
                             f"vocabulary of {vocab_size} ids of {tokenizer_file}: write the folder again "
                             "with python -m data.prepare")


def encode_prompt(tokenizer, text):
    """A prompt's ids. A BPE prompt may hold the tokenizer's special tokens (<|endoftext|>):
    each is its one id, as in the token files that data.prepare --special_tokens token writes."""
    if tokenizer.kind == "bpe":
        return tokenizer.encode(text, allowed_special="all")
    return tokenizer.encode(text)


def default_start(tokenizer):
    """The ids a sample starts from without a prompt: a BPE model's end-of-text token (a new
    document begins after it), else a newline; the first token of any other vocabulary."""
    if tokenizer.kind == "bpe":
        eot = tokenizer.special_tokens.get(ENDOFTEXT)
        return [eot] if eot is not None else tokenizer.encode_ordinary("\n")
    return [0]


def load_text(path, tokenizer=None):
    """A UTF-8 text file as a char-level Dataset: first 90% train, last 10% val.

    ``tokenizer``: a trained model's CharTokenizer to encode with (fine-tuning); a text
    with characters outside its vocabulary is refused, naming a few. Else the
    vocabulary is the text's own characters."""
    path = Path(path)
    text, raw = read_text_and_bytes(path)
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
    return Dataset(train=ids[:n], val=ids[n:], tokenizer=tok, name=name, source=fingerprint(raw),
                   text_bytes={"train": len(text[:n].encode("utf-8")), "val": len(text[n:].encode("utf-8"))})


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
    # the text a word model covers: the words with a space after each
    text_bytes = {split: sum(len(w.encode("utf-8")) + 1 for ex in examples for w in ex.words)
                  for split, examples in (("train", train_examples), ("val", corpus.test))}
    train, val = stream(train_examples), stream(corpus.test)
    return Dataset(train=train, val=val, tokenizer=tok, source=fingerprint(train.tobytes() + val.tobytes()),
                   name="coref", examples={"train": train_examples, "test": list(corpus.test)},
                   rows=rows, pad_id=tok.stoi[coref.EOS], text_bytes=text_bytes)
