"""Turn a text file into token files for training: train.bin, val.bin, the tokenizer, meta.json.

    python -m data.prepare data/shakespeare_char/input.txt --tokenizer bpe --vocab_size 1024
    python -m train --data data/shakespeare_char/bpe1024

The first 90% of the text (by characters) is the train split, the rest val, as with
--data FILE.txt. A BPE tokenizer is learned on the train split only (byte-level, GPT-2's
split pattern; --vocab_size counts its ids, <|endoftext|> included); a char tokenizer
takes the characters of the whole text.

The folder then holds:
  train.bin, val.bin   the token ids, raw: uint16 while the vocabulary has at most 65,536
                       ids, else uint32 (np.memmap reads them without loading them)
  tokenizer.bpe        the BPE merges (tinyattn.tokenizers.BPE.load reads it), or
  tokenizer.json       the char tokenizer's characters
  meta.json            the tokenizer's kind and file, vocab_size, dtype, and the token and
                       byte counts of each split (the bytes give bits per byte)
"""
import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

VAL_FRACTION = 0.1
TOKEN_FILES = ("train.bin", "val.bin", "meta.json", "tokenizer.bpe", "tokenizer.json")   # what a folder holds
MIN_CHARS = 20   # a shorter text file is refused: both splits need a few tokens


def read_text(path):
    """A UTF-8 text file's text; a ValueError in one line when it is missing, not UTF-8, or too short."""
    return read_text_and_bytes(path)[0]


def read_text_and_bytes(path):
    """(text, raw bytes) of a UTF-8 text file, with read_text's checks."""
    try:
        raw = Path(path).read_bytes()
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
    return text, raw


class CharTokenizer:
    """One id per character of the sorted set (train.data.CharTokenizer reads its dict)."""

    def __init__(self, chars):
        self.chars = chars
        self.stoi = {c: i for i, c in enumerate(chars)}
        self.vocab_size = len(chars)

    def encode(self, text):
        return [self.stoi[c] for c in text]

    def to_dict(self):
        return {"kind": "char", "chars": self.chars}


def chunks(text, size=1 << 20):
    """text in pieces of about size characters, each cut after a newline that a non-space
    follows: no piece of GPT-2's split pattern crosses such a cut, so encoding the chunks
    one by one gives the ids of the whole text."""
    start = 0
    while start < len(text):
        cut = text.find("\n", start + size)
        while cut >= 0 and cut + 1 < len(text) and text[cut + 1].isspace():
            cut = text.find("\n", cut + 1)
        end = len(text) if cut < 0 else cut + 1
        yield text[start:end]
        start = end


def default_out_dir(path, tokenizer, vocab_size):
    """data/NAME/input.txt -> data/NAME/bpe1024 (or .../char); other files: FOLDER/STEM-bpe1024."""
    path = Path(path)
    kind = f"bpe{vocab_size}" if tokenizer == "bpe" else "char"
    return path.parent / (kind if path.stem == "input" else f"{path.stem}-{kind}")


def dtype_for(vocab_size):
    return np.uint16 if vocab_size <= 2 ** 16 else np.uint32


def file_mode():
    """The mode a new file gets from the user's umask (mkstemp's own is 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomically(path, write):
    """Call write(file) on a temporary file beside path, then move it into place, with the
    mode the user's umask gives a new file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def refuse_to_replace(out_dir, overwrite):
    """A token folder is never replaced without --overwrite: a ValueError in one line that
    names the folder and the flag. -> the token and tokenizer files it holds (to delete)."""
    found = [name for name in TOKEN_FILES if (out_dir / name).exists()]
    if found and not overwrite:
        raise ValueError(f"--out_dir {out_dir} already holds token files ({', '.join(found)}): "
                         f"replace them with --overwrite, or pick another --out_dir")
    return found


def prepare(path, tokenizer="bpe", vocab_size=None, out_dir=None, overwrite=False):
    """Write out_dir/{train.bin, val.bin, tokenizer.*, meta.json} from the text file; returns meta.
    An out_dir that holds token files is refused unless overwrite is true."""
    if tokenizer not in ("bpe", "char"):
        raise ValueError(f"--tokenizer must be bpe or char, got {tokenizer!r}")
    if tokenizer == "bpe" and (vocab_size is None or vocab_size < 257):
        raise ValueError(f"--vocab_size must be at least 257 for bpe (256 bytes and <|endoftext|>), got {vocab_size}")
    if tokenizer == "char" and vocab_size is not None:
        raise ValueError("--vocab_size is for bpe; a char vocabulary is the text's characters")
    text = read_text(path)
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(path, tokenizer, vocab_size)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out_dir {out_dir} is a file, not a folder")
    refuse_to_replace(out_dir, overwrite)      # before the slow part, the tokenizer's training
    n = int((1 - VAL_FRACTION) * len(text))
    splits = {"train": text[:n], "val": text[n:]}

    if tokenizer == "bpe":
        from tinyattn.tokenizers import BPE, ENDOFTEXT
        tok = BPE.train(splits["train"], vocab_size - 1, special_tokens=[ENDOFTEXT])
        tok_file = "tokenizer.bpe"
    else:
        tok = CharTokenizer(sorted(set(text)))
        tok_file = "tokenizer.json"
    dtype = dtype_for(tok.vocab_size)
    for name in refuse_to_replace(out_dir, overwrite):   # no old tokenizer file stays beside the new one
        (out_dir / name).unlink()
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = dict(tokenizer=tokenizer, tokenizer_file=tok_file, vocab_size=tok.vocab_size,
                dtype=np.dtype(dtype).name, source=str(path))
    for split, part in splits.items():
        n_tokens = 0

        def write(f):
            nonlocal n_tokens
            for chunk in chunks(part):                 # a list of ids per chunk, not per file
                ids = np.array(tok.encode(chunk), dtype=dtype)
                ids.tofile(f)
                n_tokens += len(ids)
        write_atomically(out_dir / f"{split}.bin", write)
        meta[f"{split}_tokens"] = n_tokens
        meta[f"{split}_bytes"] = len(part.encode("utf-8"))
    if tokenizer == "bpe":
        tok.save(out_dir / tok_file)
        os.chmod(out_dir / tok_file, file_mode())      # BPE.save writes it as mkstemp does, 0600
    else:
        write_atomically(out_dir / tok_file, lambda f: f.write(json.dumps(tok.to_dict()).encode("utf-8")))
    write_atomically(out_dir / "meta.json", lambda f: f.write(json.dumps(meta, indent=2).encode("utf-8")))
    return meta | {"out_dir": str(out_dir)}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m data.prepare",
                                     description="Tokenize a text file into train.bin / val.bin for python -m train --data DIR.")
    parser.add_argument("file", help="a UTF-8 text file")
    parser.add_argument("--tokenizer", default="bpe", choices=["bpe", "char"])
    parser.add_argument("--vocab_size", type=int, default=None,
                        help="bpe only: the number of token ids, <|endoftext|> included (e.g. 1024)")
    parser.add_argument("--out_dir", default=None,
                        help="where the files go (default: beside FILE: data/NAME/bpe1024 for data/NAME/input.txt)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the token files an --out_dir already holds (they are deleted first)")
    args = parser.parse_args(argv)
    if args.tokenizer == "bpe" and args.vocab_size is None:
        parser.error("--tokenizer bpe needs --vocab_size (e.g. --vocab_size 1024)")
    try:
        meta = prepare(args.file, args.tokenizer, args.vocab_size, args.out_dir, args.overwrite)
    except (ValueError, ImportError, OSError) as e:
        print(f"python -m data.prepare: error: {e}", file=sys.stderr)
        return 1
    if args.tokenizer == "bpe" and meta["vocab_size"] < args.vocab_size:
        print(f"python -m data.prepare: note: the vocabulary has {meta['vocab_size']:,} ids, fewer than --vocab_size "
              f"{args.vocab_size:,}: by then every piece of the train split is one token", file=sys.stderr)
    out = meta["out_dir"]
    print(f"wrote {out}: train.bin ({meta['train_tokens']:,} tokens), val.bin ({meta['val_tokens']:,} tokens), "
          f"{meta['tokenizer_file']} (vocab {meta['vocab_size']:,}, {meta['dtype']}), meta.json")
    print("train on it with:")
    print(f"  python -m train --data {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
