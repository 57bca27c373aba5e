"""Conversation folders: what python -m data.prepare CONVS.jsonl writes for supervised fine-tuning.

A JSONL file of conversations (one ``{"messages": [...]}`` a line, as data/tasks.py writes them)
becomes a folder that python -m train --data reads:

    tokenizer.json            the tokenizer that renders them (data/chat.py's chat_tokenizer)
    train_ids.npy             (N, W) int32: each conversation's ids from position 0, -1 after its end
    train_mask.npy            (N, W) int8: 1 where the id is the assistant's (a target of the loss)
    val_ids.npy, val_mask.npy the same for the val conversations
    meta.json                 {"kind": "conversations", ...}

The val conversations are a second file's (--val: the tasks' test split, whose words training
never sees), else the last 10% of the file.
"""
import json
from pathlib import Path

import numpy as np

from .chat import CHAT_TOKENS, check_messages, chat_tokenizer, jsonl_objects, render

VAL_FRACTION = 0.1
FILES = ("train_ids.npy", "train_mask.npy", "val_ids.npy", "val_mask.npy", "tokenizer.json", "tokenizer.bpe",
         "meta.json")


def read_conversations(path):
    """The message lists of a JSONL file, or a ValueError in one line naming the file and line."""
    conversations = []
    for number, item in jsonl_objects(path):
        if not isinstance(item, dict) or "messages" not in item:
            raise ValueError(f"{path} line {number}: expected an object with \"messages\", got "
                             f"{json.dumps(item)[:60]!r}")
        try:
            check_messages(item["messages"])
        except ValueError as e:
            raise ValueError(f"{path} line {number}: {e}") from None
        conversations.append(item["messages"])
    if not conversations:
        raise ValueError(f"{path}: no conversations")
    return conversations


def rows(tokenizer, conversations):
    """Rendered conversations as two (N, W) arrays: ids (int32, -1 after each one's end) and
    the loss mask (int8, 0 after the end); W is the longest conversation's length."""
    rendered = [render(tokenizer, messages) for messages in conversations]
    width = max(len(ids) for ids, _ in rendered)
    ids = np.full((len(rendered), width), -1, dtype=np.int32)            # (N, W)
    mask = np.zeros((len(rendered), width), dtype=np.int8)               # (N, W)
    for i, (row_ids, row_mask) in enumerate(rendered):
        ids[i, :len(row_ids)] = row_ids
        mask[i, :len(row_mask)] = row_mask
    return ids, mask


def own_tokenizer(conversations):
    """A tokenizer for a model trained from scratch: the conversations' characters, then the chat tokens."""
    from tinyattn.tokenizers import CharTokenizer
    chars = sorted({c for messages in conversations for m in messages for c in m["content"]})
    return CharTokenizer(chars).extended(special_tokens=CHAT_TOKENS)


def prepare_conversations(path, tokenizer_from=None, val_path=None, out_dir=None, overwrite=False):
    """Write a conversation folder from the JSONL file at path (see the top); -> its meta.json
    dict with "out_dir". tokenizer_from: a run, checkpoint or token folder whose tokenizer is
    extended with the chat tokens (and, for characters, the missing ones); None: a character
    tokenizer of the conversations' own."""
    from .prepare import read_tokenizer, write_atomically
    path = Path(path)
    conversations = read_conversations(path)
    if val_path is not None:
        train, val = conversations, read_conversations(val_path)
    else:
        n_val = max(1, round(VAL_FRACTION * len(conversations)))
        if n_val >= len(conversations):
            raise ValueError(f"{path}: {len(conversations)} conversation(s) are too few to keep 10% for val: "
                             "pass --val FILE")
        train, val = conversations[:-n_val], conversations[-n_val:]
    if tokenizer_from is not None:
        tok = chat_tokenizer(read_tokenizer(tokenizer_from), train + val)
    else:
        tok = own_tokenizer(train + val)
    out_dir = Path(out_dir) if out_dir is not None else path.parent / f"{path.stem}-chat"
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out_dir {out_dir} is a file, not a folder")
    found = [name for name in FILES if (out_dir / name).exists()]
    if found and not overwrite:
        raise ValueError(f"--out_dir {out_dir} already holds {', '.join(found)}: replace them with --overwrite, "
                         "or pick another --out_dir")
    for name in found:
        (out_dir / name).unlink()
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = dict(kind="conversations", tokenizer=tok.kind, vocab_size=tok.vocab_size, source=str(path),
                val_source=str(val_path) if val_path is not None else None, chat_tokens=list(CHAT_TOKENS))
    for split, convs in (("train", train), ("val", val)):
        ids, mask = rows(tok, convs)
        write_atomically(out_dir / f"{split}_ids.npy", lambda f: np.save(f, ids))
        write_atomically(out_dir / f"{split}_mask.npy", lambda f: np.save(f, mask))
        meta[f"{split}_conversations"], meta[f"{split}_width"] = len(convs), ids.shape[1]
        meta[f"{split}_assistant_tokens"] = int(mask.sum())
    if tok.kind == "bpe":
        meta["tokenizer_file"] = "tokenizer.bpe"
        tok.save(out_dir / "tokenizer.bpe")
    else:
        meta["tokenizer_file"] = "tokenizer.json"
        write_atomically(out_dir / "tokenizer.json", lambda f: f.write(json.dumps(tok.to_dict()).encode("utf-8")))
    if tokenizer_from is not None:
        meta["tokenizer_from"] = str(tokenizer_from)
    write_atomically(out_dir / "meta.json", lambda f: f.write(json.dumps(meta, indent=2).encode("utf-8")))
    return meta | {"out_dir": str(out_dir)}


def is_conversation_folder(folder):
    """Whether folder/meta.json says "kind": "conversations"."""
    try:
        return json.loads((Path(folder) / "meta.json").read_text(encoding="utf-8")).get("kind") == "conversations"
    except (OSError, ValueError, AttributeError):
        return False
