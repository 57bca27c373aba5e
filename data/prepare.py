"""Turn a text file into token files for training: train.bin, val.bin, the tokenizer, meta.json.

    python -m data.prepare data/shakespeare_char/input.txt --tokenizer bpe --vocab_size 1024
    python -m train --data data/shakespeare_char/bpe1024

The first 90% of the text (by characters) is the train split, the rest val, as with
--data FILE.txt. A BPE tokenizer is learned on the train split only (byte-level, GPT-2's
split pattern; --vocab_size counts its ids, <|endoftext|> included); a char tokenizer
takes the characters of the whole text.

To fine-tune a model (python -m train --init_from RUN) on another text, encode that
text with the model's tokenizer instead of a new one:

    python -m data.prepare other.txt --tokenizer_from out-bpe --out_dir data/other
    python -m train --init_from out-bpe --data data/other --out_dir out-other

A text that holds <|endoftext|> (documents joined by it) needs --special_tokens token
(each is the one end-of-text id) or --special_tokens text (its characters, as text).

The folder then holds:
  train.bin, val.bin   the token ids, raw: uint16 while the vocabulary has at most 65,536
                       ids, else uint32 (np.memmap reads them without loading them)
  tokenizer.bpe        the BPE merges (tinyattn.tokenizers.BPE.load reads it), or
  tokenizer.json       the char tokenizer's characters
  meta.json            the tokenizer's kind and file, vocab_size, dtype, and the token and
                       byte counts of each split (the bytes give bits per byte)
"""
import json
import os
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from tinyattn.tokenizers import ENDOFTEXT, CharTokenizer

from .cli import OneLineParser

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


def read_tokenizer(path):
    """--tokenizer_from's tokenizer: a BPE or a CharTokenizer from a token folder (meta.json),
    a run's out_dir or checkpoint (the tokenizer is JSON in the checkpoint's "meta"), or a
    Hugging Face folder that GPT.export_hf wrote. A ValueError in one line otherwise."""
    from tinyattn.models.hf import read_tokenizer as read_hf_folder
    from tinyattn.tokenizers import BPE
    path = Path(path)
    where = f"--tokenizer_from {path}"
    if (path / "meta.json").is_file():                          # a token folder
        try:
            meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
            kind, file = meta["tokenizer"], path / meta["tokenizer_file"]
            if kind == "bpe":
                return BPE.load(file)
            return CharTokenizer.from_dict(json.loads(file.read_text(encoding="utf-8")))
        except (OSError, KeyError, TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"{where}: meta.json names no tokenizer that data.prepare wrote ({e})") from None
    if (path / "config.json").is_file():                        # an exported Hugging Face folder
        try:
            tok = read_hf_folder(path)
        except OSError:
            tok = None
        if tok is None:
            raise ValueError(f"{where}: no character vocabulary or byte-level BPE in tokenizer.json")
        return tok
    ckpt = path / "ckpt.npz" if path.is_dir() else path
    if not ckpt.is_file():
        raise ValueError(f"{where}: neither a token folder (meta.json), a run (ckpt.npz), a checkpoint file "
                         "nor a Hugging Face folder (config.json)")
    try:
        with np.load(ckpt, allow_pickle=False) as f:
            tok = json.loads(json.loads(str(f["meta"]))["tokenizer"])
    except (ValueError, KeyError, OSError, zipfile.BadZipFile):
        raise ValueError(f"{where}: {ckpt} is not a readable tinyattn checkpoint") from None
    if tok.get("kind") == "bpe":
        return BPE.from_dict(tok)
    if tok.get("kind") == "char":
        return CharTokenizer.from_dict(tok)
    raise ValueError(f"{where}: a {tok.get('kind')} tokenizer (the lesson corpus's) does not encode a text file")


def model_block_size(path):
    """The block_size of the model at --tokenizer_from's path (a run, a checkpoint or a Hugging
    Face folder), or None for a token folder or anything unreadable."""
    path = Path(path)
    try:
        if (path / "config.json").is_file():
            return int(json.loads((path / "config.json").read_text(encoding="utf-8"))["n_positions"])
        ckpt = path / "ckpt.npz" if path.is_dir() else path
        with np.load(ckpt, allow_pickle=False) as f:
            return int(json.loads(str(f["meta"]))["config"]["block_size"])
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile):
        return None


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


SPECIAL_TOKENS = ("token", "text")     # --special_tokens: what <|endoftext|> in the text becomes


def prepare(path, tokenizer="bpe", vocab_size=None, out_dir=None, overwrite=False, tokenizer_from=None,
            special_tokens=None, add_special_tokens=()):
    """Write out_dir/{train.bin, val.bin, tokenizer.*, meta.json} from the text file; returns meta.
    An out_dir that holds token files is refused unless overwrite is true.

    tokenizer_from: a token folder, a run (out_dir or checkpoint) or an exported Hugging Face
    folder whose tokenizer encodes the text, instead of a new one (for --init_from).
    special_tokens: "token" encodes a special token's text (<|endoftext|>) as its one id,
    "text" as ordinary text; None refuses a text that holds one, before any training.
    add_special_tokens: more special tokens for a BPE tokenizer (<|user|>, say), after its ids."""
    if special_tokens not in (None, *SPECIAL_TOKENS):
        raise ValueError(f"--special_tokens must be token or text, got {special_tokens!r}")
    if tokenizer_from is not None:
        if vocab_size is not None:
            raise ValueError("--vocab_size is for a new tokenizer; --tokenizer_from's has its own")
        tok = read_tokenizer(tokenizer_from)
        if tokenizer is not None and tokenizer != tok.kind:
            raise ValueError(f"--tokenizer {tokenizer}: --tokenizer_from {tokenizer_from} is a {tok.kind} tokenizer")
        tokenizer = tok.kind
    tokenizer = tokenizer or "bpe"
    if tokenizer not in ("bpe", "char"):
        raise ValueError(f"--tokenizer must be bpe or char, got {tokenizer!r}")
    specials = [ENDOFTEXT, *add_special_tokens]
    if tokenizer == "bpe" and tokenizer_from is None and (vocab_size is None or vocab_size < 256 + len(specials)):
        raise ValueError(f"--vocab_size must be at least {256 + len(specials)} for bpe (256 bytes and "
                         f"{len(specials)} special token{'s' if len(specials) > 1 else ''}), got {vocab_size}")
    if tokenizer == "char" and vocab_size is not None:
        raise ValueError("--vocab_size is for bpe; a char vocabulary is the text's characters")
    if tokenizer == "char" and (add_special_tokens or special_tokens):
        raise ValueError(f"--{'add_special_token' if add_special_tokens else 'special_tokens'} is for bpe; "
                         "a char vocabulary has no special tokens")
    text = read_text(path)
    if tokenizer_from is not None and tokenizer == "bpe":
        tok = tok.with_special_tokens(add_special_tokens)
        specials = list(tok.special_tokens)
    elif tokenizer == "char":
        specials = []
    check_special_tokens(path, text, specials, special_tokens)     # before the slow part, the tokenizer's training
    if tokenizer_from is not None and tokenizer == "char":
        unknown = sorted(set(text) - set(tok.stoi))
        if unknown:
            raise ValueError(f"{path}: {len(unknown)} characters are not in the vocabulary of --tokenizer_from "
                             f"{tokenizer_from}: {', '.join(repr(c) for c in unknown[:5])}")
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(
        path, tokenizer, vocab_size if tokenizer_from is None else tok.vocab_size)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out_dir {out_dir} is a file, not a folder")
    refuse_to_replace(out_dir, overwrite)      # before the slow part, the tokenizer's training
    n = split_point(text, specials)
    splits = {"train": text[:n], "val": text[n:]}

    if tokenizer == "bpe" and tokenizer_from is None:
        from tinyattn.tokenizers import BPE
        if special_tokens == "text":           # learned from the text as it will be encoded: as characters
            tok = BPE.train(splits["train"], vocab_size - len(specials), special_tokens=[])
            tok = tok.with_special_tokens(specials)
        else:                                  # documents are cut at the special tokens before counting
            tok = BPE.train(splits["train"], vocab_size - len(specials), special_tokens=specials)
    elif tokenizer == "char" and tokenizer_from is None:
        tok = CharTokenizer(sorted(set(text)))
    tok_file = "tokenizer.bpe" if tokenizer == "bpe" else "tokenizer.json"
    if tokenizer == "bpe":
        encode = tok.encode_ordinary if special_tokens != "token" else lambda t: tok.encode(t, allowed_special="all")
    else:
        encode = tok.encode
    dtype = dtype_for(tok.vocab_size)
    for name in refuse_to_replace(out_dir, overwrite):   # no old tokenizer file stays beside the new one
        (out_dir / name).unlink()
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = dict(tokenizer=tokenizer, tokenizer_file=tok_file, vocab_size=tok.vocab_size,
                dtype=np.dtype(dtype).name, source=str(path), special_tokens=special_tokens)
    if tokenizer_from is not None:
        meta["tokenizer_from"] = str(tokenizer_from)
    for split, part in splits.items():
        n_tokens = 0

        def write(f):
            nonlocal n_tokens
            for chunk in chunks(part):                 # a list of ids per chunk, not per file
                ids = np.array(encode(chunk), dtype=dtype)
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


def check_special_tokens(path, text, specials, flag):
    """Without --special_tokens, a text that holds a special token's text is refused in one line:
    its tokens would depend on a choice nobody made."""
    if flag is not None:
        return
    found = [(text.find(s), s) for s in specials if s in text]
    if found:
        at, name = min(found)
        raise ValueError(f"{path} holds the special token {name!r} (at character {at:,}): pass --special_tokens "
                         "token to encode it as one token (a document ends there), or --special_tokens text "
                         "to encode its characters as text")


def split_point(text, specials):
    """Where val begins: 90% of the way (by characters), moved back to the start of a special
    token that the cut would go through."""
    n = int((1 - VAL_FRACTION) * len(text))
    for name in specials:
        at = text.find(name, max(0, n - len(name) + 1))
        if 0 <= at < n:
            n = at
    return n


def main(argv=None):
    parser = OneLineParser(prog="python -m data.prepare",
                                     description="Tokenize a text file into train.bin / val.bin for python -m train --data DIR.")
    parser.add_argument("file", help="a UTF-8 text file, or a file of conversations (JSON lines, one {\"messages\": "
                                     "[...]} a line, whatever its name) for supervised fine-tuning")
    parser.add_argument("--tokenizer", default=None, choices=["bpe", "char"], help="a new tokenizer (default: bpe)")
    parser.add_argument("--vocab_size", type=int, default=None,
                        help="bpe only: the number of token ids, <|endoftext|> included (e.g. 1024)")
    parser.add_argument("--tokenizer_from", metavar="DIR_OR_RUN", default=None,
                        help="encode with an existing tokenizer, to fine-tune a model on this text: a token "
                             "folder, a run's out_dir or checkpoint, or a folder written by train.export_hf")
    parser.add_argument("--special_tokens", choices=SPECIAL_TOKENS, default=None,
                        help="bpe: what <|endoftext|> (any special token) in FILE becomes: token, its one id "
                             "(documents end there), or text, its characters (default: a text holding one is refused)")
    parser.add_argument("--add_special_token", action="append", default=[], metavar="TOKEN",
                        help="bpe: one more special token, after the others (repeat the flag for more), "
                             "e.g. <|user|> for chat fine-tuning")
    parser.add_argument("--out_dir", default=None,
                        help="where the files go (default: beside FILE: data/NAME/bpe1024 for data/NAME/input.txt)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the token files an --out_dir already holds (they are deleted first)")
    parser.add_argument("--val", metavar="JSONL", default=None,
                        help="conversations only: the val conversations (e.g. the tasks' test split); "
                             "default: the last 10%% of FILE")
    args = parser.parse_args(argv)
    from .chat import describe_json_kind, json_kind
    kind = json_kind(args.file)                # by content: a .json, .JSONL or any name
    if kind in ("conversations", "json lines"):        # (other JSON lines: their first line is refused by name)
        return main_conversations(parser, args)
    if kind is not None:
        also = " (python -m train --stage dpo --init_from MODEL --data FILE reads them as they are)" \
            if kind == "pairs" else ""
        print(f"python -m data.prepare: error: {args.file} holds {describe_json_kind(kind)}: data.prepare takes a "
              f"text file or conversations{also}", file=sys.stderr)
        return 1
    if args.val is not None:
        parser.error("--val is for a file of conversations; a text file's val split is its last 10%")
    if args.tokenizer_from is None and args.tokenizer in (None, "bpe") and args.vocab_size is None:
        parser.error("--tokenizer bpe needs --vocab_size (e.g. --vocab_size 1024), or --tokenizer_from DIR_OR_RUN")
    try:
        meta = prepare(args.file, args.tokenizer, args.vocab_size, args.out_dir, args.overwrite,
                       args.tokenizer_from, args.special_tokens, args.add_special_token)
    except (ValueError, ImportError, OSError) as e:
        print(f"python -m data.prepare: error: {e}", file=sys.stderr)
        return 1
    if args.vocab_size is not None and meta["tokenizer"] == "bpe" and meta["vocab_size"] < args.vocab_size:
        print(f"python -m data.prepare: note: the vocabulary has {meta['vocab_size']:,} ids, fewer than --vocab_size "
              f"{args.vocab_size:,}: by then every piece of the train split is one token", file=sys.stderr)
    out = meta["out_dir"]
    print(f"wrote {out}: train.bin ({meta['train_tokens']:,} tokens), val.bin ({meta['val_tokens']:,} tokens), "
          f"{meta['tokenizer_file']} (vocab {meta['vocab_size']:,}, {meta['dtype']}), meta.json")
    if meta.get("tokenizer_from"):
        print("fine-tune a model of that tokenizer on it with:")
        print(f"  python -m train --init_from {meta['tokenizer_from']} --data {out} --out_dir OUT_DIR")
    else:
        print("train on it with:")
        print(f"  python -m train --data {out}")
    return 0


def main_conversations(parser, args):
    """python -m data.prepare CONVS.jsonl: a conversation folder (data/conversations.py)."""
    from .conversations import prepare_conversations
    for flag in ("vocab_size", "special_tokens", "tokenizer"):
        if getattr(args, flag) is not None:
            parser.error(f"--{flag} is for a text file; conversations take --tokenizer_from's tokenizer with "
                         "the chat tokens added, or without it the conversations' own characters")
    if args.add_special_token:
        parser.error("--add_special_token is for a text file; conversations get the chat tokens")
    try:
        meta = prepare_conversations(args.file, args.tokenizer_from, args.val, args.out_dir, args.overwrite)
    except (ValueError, OSError) as e:
        print(f"python -m data.prepare: error: {e}", file=sys.stderr)
        return 1
    long_note(meta)
    out = meta["out_dir"]
    print(f"wrote {out}: {meta['train_conversations']:,} train and {meta['val_conversations']:,} val conversations "
          f"(train_ids.npy, train_mask.npy, val_ids.npy, val_mask.npy), {meta['tokenizer_file']} "
          f"(vocab {meta['vocab_size']:,}), meta.json")
    if meta.get("tokenizer_from"):
        print(f"fine-tune on it with:\n  python -m train --init_from {meta['tokenizer_from']} --data {out} "
              "--out_dir OUT_DIR")
    else:
        longest = max(meta["train_longest"]["tokens"], meta["val_longest"]["tokens"])
        print(f"train on it with:\n  python -m train --data {out}\n(the longest conversation reads {longest} tokens: "
              f"--block_size {longest} or more fits each whole; longer ones are truncated to --max_length)")
    return 0


def long_note(meta):
    """A note on stderr about conversations longer than --tokenizer_from's block_size: python -m
    train truncates them."""
    block_size = meta.get("block_size")
    longest = max((meta[f"{split}_longest"] for split in ("train", "val")), key=lambda d: d["tokens"])
    where = f"{longest['file']} line {longest['line']}, {longest['tokens']} tokens"
    if block_size is not None:
        n = {split: meta.get(f"{split}_longer_than_block_size", 0) for split in ("train", "val")}
        if n["train"] or n["val"]:
            print(f"python -m data.prepare: note: {n['train']:,} train and {n['val']:,} val conversations are longer "
                  f"than the model's block_size {block_size} (the longest: {where}): python -m train truncates "
                  "each to --max_length (default: block_size)", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
