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
from data.chat import chat_tokenizer, describe_json_kind, json_kind
from data.conversations import is_conversation_folder
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

    def fit_length(self, max_length):
        """Truncate the examples to ``max_length`` tokens (--max_length): -> notes for the run's
        log. A stream of text has no examples: nothing to do."""
        return []

    def sample_prompt(self):
        """Text to start a sample from: the lesson's question, or a newline (as nanoGPT does)."""
        if self.name == "coref":
            return "the animal didn't cross the street because it was too tired . it ="
        return "\n" if "\n" in self.tokenizer.stoi else self.tokenizer.decode(self.train[:1])


def truncate(ids, mask, max_length):
    """One example (ids and mask, 1-d lists or arrays) cut to max_length + 1 ids (max_length
    tokens read, the last id a target only), as TRL truncates: the prompt (everything before the
    first trained token) loses its start, the answer (from there) its end. The prompt keeps at
    most half of the room where the answer needs the rest (TRL's defaults, max_prompt_length 512
    of max_length 1024, do the same), all it needs where the answer leaves it more.
    -> (ids, mask), unchanged where they fit."""
    room = max_length + 1
    if len(ids) <= room:
        return ids, mask
    first = int(np.argmax(np.asarray(mask) == 1))         # where the answer starts
    answer = len(ids) - first
    keep_prompt = min(first, max(room - answer, room // 2))
    start, end = first - keep_prompt, first + room - keep_prompt
    return ids[start:end], mask[start:end]


def random_windows(data, what, batch_size, block_size, rng):
    """batch_size random windows of data: x (B, T) int64, and y, x shifted by one token."""
    if len(data) < block_size + 1:
        raise ValueError(f"{what} has {len(data)} tokens, fewer than block_size + 1 = {block_size + 1}")
    starts = rng.integers(0, len(data) - block_size, size=batch_size)   # (B,)
    idx = starts[:, None] + np.arange(block_size)                         # (B, T)
    x = data[idx].astype(np.int64)
    y = data[idx + 1].astype(np.int64)
    return x, y


def load_data(path, tokenizer=None, val=None):
    """--data: a folder of python -m data.prepare's token files or conversations, a file of
    conversations (JSON lines, known by content), or a text file (characters). ``tokenizer``: a
    trained model's, to encode a text file with (fine-tuning); ``val``: --val, the held-out
    conversations of a file of them."""
    if Path(path).is_dir():
        if is_conversation_folder(path):
            return load_conversations(path)
        return load_tokens(path)            # with --init_from, finetune.fit_args compares the tokenizers
    kind = json_kind(path)                  # JSON lines by content, whatever the file's name
    if kind == "conversations":
        return conversation_file(path, tokenizer, val)
    if kind == "pairs":
        raise ValueError(f"--data {path} holds {describe_json_kind(kind)}: DPO trains on them "
                         f"(--stage dpo --init_from MODEL --data {path})")
    if kind is not None:
        raise ValueError(f"--data {path} holds {describe_json_kind(kind)}, not text: python -m train reads a text "
                         "file, a folder of python -m data.prepare, or preference pairs with --stage dpo")
    if val is not None:
        raise ValueError(f"--val {val}: --data {path} is a text, whose val split is its last 10%: --val is for a "
                         "file of conversations or pairs")
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


class ConversationDataset(Dataset):
    """A folder of conversations from python -m data.prepare CONVS.jsonl: one conversation a
    row, from position 0, with the loss mask (data/chat.py). Optionally plain text mixed in.

    get_batch gives x (B, T), the rows padded with pad_id, and y (B, T), the next ids where the
    mask is 1 (the assistant's tokens) and -1 elsewhere: the loss counts the assistant's tokens
    only. With ``mix`` (the ids of a text) and ``mix_fraction``, that fraction of each train
    batch's rows are random windows of the text instead, trained on every token: the model keeps
    its language model while it learns the conversations (T is then block_size).
    """

    def __init__(self, ids, masks, tokenizer, name, source):
        flat = {split: a[a >= 0].astype(np.int64) for split, a in ids.items()}
        super().__init__(train=flat["train"], val=flat["val"], tokenizer=tokenizer, name=name, source=source,
                         rows=ids, pad_id=0)
        self.masks = masks                   # {"train": (N, W), "val": (M, W)} 1 on the assistant's ids
        self.mix, self.mix_fraction = None, 0.0

    def fit_length(self, max_length):
        """Truncate each conversation longer than max_length tokens (truncate: the prompt from the
        left, the answer from the right). -> a note with the counts, or none."""
        cut = {}
        for split in ("train", "val"):
            ids, mask = self.rows[split], self.masks[split]                       # (N, W)
            lengths = (ids >= 0).sum(1)                                           # (N,) ids of each
            long_rows = np.flatnonzero(lengths > max_length + 1)
            cut[split] = len(long_rows)
            if not len(long_rows):
                continue
            width = min(ids.shape[1], max_length + 1)
            new_ids, new_mask = ids[:, :width].copy(), mask[:, :width].copy()
            for r in long_rows:
                row_ids, row_mask = truncate(ids[r, :lengths[r]], mask[r, :lengths[r]], max_length)
                new_ids[r], new_mask[r] = row_ids, row_mask
            self.rows[split], self.masks[split] = new_ids, new_mask
        self.train, self.val = (self.rows[s][self.rows[s] >= 0].astype(np.int64) for s in ("train", "val"))
        if not any(cut.values()):
            return []
        return [f"--max_length {max_length}: {cut['train']:,} of {len(self.rows['train']):,} train and "
                f"{cut['val']:,} of {len(self.rows['val']):,} val conversations were longer and are truncated "
                "(the prompt's start, the answer's end); 0 dropped"]

    def add_mix(self, ids, source, fraction):
        """Mix windows of the text ``ids`` (1-d) into each train batch: round(fraction * B) rows."""
        self.mix, self.mix_fraction = np.asarray(ids, dtype=np.int64), fraction
        self.source = {"conversations": self.source, "mix": source, "mix_fraction": fraction}

    def mixed_rows(self, batch_size):
        """How many rows of a train batch of batch_size are plain text."""
        return int(round(self.mix_fraction * batch_size)) if self.mix is not None else 0

    def get_batch(self, split, batch_size, block_size, rng):
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        ids, mask = self.rows[split], self.masks[split]                       # (N, W)
        width = ids.shape[1] - 1
        if width > block_size:
            raise ValueError(f"a conversation of {self.name} has {width} input tokens, more than block_size "
                             f"{block_size}: truncate them with --max_length {block_size}")
        n_text = self.mixed_rows(batch_size) if split == "train" else 0
        picked = rng.integers(0, len(ids), size=batch_size - n_text)           # (B - n_text,)
        x = np.where(ids[picked, :-1] < 0, self.pad_id, ids[picked, :-1]).astype(np.int64)
        y = np.where(mask[picked, 1:] == 1, ids[picked, 1:], -1).astype(np.int64)
        if not n_text:
            return x, y
        pad = block_size - width                                              # the rows to block_size
        x = np.pad(x, ((0, 0), (0, pad)), constant_values=self.pad_id)
        y = np.pad(y, ((0, 0), (0, pad)), constant_values=-1)
        tx, ty = random_windows(self.mix, "the --mix_data text", n_text, block_size, rng)
        return np.concatenate([x, tx]), np.concatenate([y, ty])

    def sample_ids(self):
        """The first val conversation's prompt: the sample shows how the model answers it."""
        from data.chat import render_prompt
        ids = self.rows["val"][0]
        user_turn = int(np.argmax(self.masks["val"][0] == 1))                 # where the first answer starts
        prompt = ids[:user_turn].tolist()
        return prompt if prompt else render_prompt(self.tokenizer, [{"role": "user", "content": ""}])


def load_conversations(folder):
    """A conversation folder (data/conversations.py) as a ConversationDataset, or a ValueError
    in one line."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        tok_path = folder / meta["tokenizer_file"]
        tok = BPE.load(tok_path) if meta["tokenizer"] == "bpe" else \
            CharTokenizer.from_dict(json.loads(tok_path.read_text(encoding="utf-8")))
        ids = {s: np.load(folder / f"{s}_ids.npy", allow_pickle=False) for s in ("train", "val")}
        masks = {s: np.load(folder / f"{s}_mask.npy", allow_pickle=False) for s in ("train", "val")}
    except FileNotFoundError as e:
        raise ValueError(f"{folder}: no {Path(e.filename).name} (write the folder with python -m data.prepare "
                         "CONVS.jsonl)") from None
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"{folder}/meta.json: not written by python -m data.prepare ({e})") from None
    for split in ("train", "val"):
        a, m = ids[split], masks[split]
        if a.ndim != 2 or a.shape != m.shape or len(a) == 0:
            raise ValueError(f"{folder}: {split}_ids.npy {a.shape} and {split}_mask.npy {m.shape} are not two "
                             "(N, W) arrays of the same shape")
        if a.max() >= tok.vocab_size:
            raise ValueError(f"{folder}/{split}_ids.npy holds token id {int(a.max())}, past the vocabulary of "
                             f"{tok.vocab_size} ids: write the folder again with python -m data.prepare")
        silent = int((m.max(1) == 0).sum())                  # a conversation with nothing to train on
        if silent:
            raise ValueError(f"{folder}/{split}_mask.npy: {silent} of {len(m)} conversations have no assistant "
                             "tokens, nothing to train on: prepare the folder again with python -m data.prepare, "
                             "which names their lines")
    raw = b"".join((folder / name).read_bytes() for name in ("meta.json", "train_ids.npy", "train_mask.npy"))
    return ConversationDataset(ids, masks, tok, name=folder.name, source=fingerprint(raw))


def conversation_file(path, tokenizer=None, val=None):
    """A file of conversations (JSON lines) as a ConversationDataset, rendered as python -m data.prepare
    would write its folder: with ``tokenizer`` (a model's) grown for the chat tokens and any character
    it lacks, else the conversations' own characters; val is --val's file, else the last 10%."""
    from data.conversations import own_tokenizer, rows, split_conversations
    train, held_out, _ = split_conversations(path, val)
    tok = chat_tokenizer(tokenizer, train + held_out) if tokenizer is not None else own_tokenizer(train + held_out)
    ids, masks = {}, {}
    for split, convs in (("train", train), ("val", held_out)):
        ids[split], masks[split] = rows(tok, convs)
    raw = Path(path).read_bytes() + (Path(val).read_bytes() if val is not None else b"")
    return ConversationDataset(ids, masks, tok, name=Path(path).stem, source=fingerprint(raw))


def load_mix(path, tokenizer):
    """--mix_data: a text file (or a char token folder) as 1-d ids of ``tokenizer``, and its fingerprint."""
    path = Path(path)
    if path.is_dir():
        mixed = load_tokens(path)
        if mixed.tokenizer.kind != tokenizer.kind or (tokenizer.kind == "char" and
                                                       tokenizer.chars[:mixed.tokenizer.vocab_size] != mixed.tokenizer.chars) \
                or (tokenizer.kind == "bpe" and mixed.tokenizer.ranks != tokenizer.ranks):
            raise ValueError(f"--mix_data {path}: its tokenizer ({mixed.tokenizer.kind}, {mixed.tokenizer.vocab_size} "
                             f"ids) is not the one the conversations extend: prepare the text with "
                             f"python -m data.prepare FILE --tokenizer_from MODEL")
        return np.asarray(mixed.train, dtype=np.int64), mixed.source
    if tokenizer.kind != "char":
        raise ValueError(f"--mix_data {path}: a {tokenizer.kind} model reads a token folder: write one with "
                         f"python -m data.prepare {path} --tokenizer_from MODEL")
    text = load_text(path, tokenizer)
    return text.train, text.source


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
