"""Conversation folders: what python -m data.prepare CONVS.jsonl writes for supervised fine-tuning.

A JSONL file of conversations (one ``{"messages": [...]}`` a line, as data/tasks.py writes them)
becomes a folder that python -m train --data reads:

    tokenizer.json            the tokenizer that renders them (data/chat.py's chat_tokenizer)
    train_ids.npy             (N, W) int32: each conversation's ids from position 0, -1 after its end
    train_mask.npy            (N, W) int8: 1 where the id is the assistant's (a target of the loss)
    val_ids.npy, val_mask.npy the same for the val conversations
    meta.json                 {"kind": "conversations", ...}

The val conversations are a second file's (--val: the tasks' test split, whose words training
never sees), else the last 10% of the file. A conversation with no assistant message trains
nothing: a file that holds one is refused, naming how many and their lines.
"""
import json
from pathlib import Path

import numpy as np

from .chat import chat_tokenizer, chat_tokens_for, check_messages, jsonl_objects, render

VAL_FRACTION = 0.1
FILES = ("train_ids.npy", "train_mask.npy", "val_ids.npy", "val_mask.npy", "tokenizer.json", "tokenizer.bpe",
         "meta.json")


def read_conversations(path):
    """The message lists of a JSONL file, or a ValueError in one line naming the file and line."""
    return [messages for _, messages in read_numbered(path)]


def read_numbered(path):
    """(line number, message list) for each conversation of a JSONL file; a ValueError in one
    line naming the file and line where one is malformed, or naming the lines of those with no
    assistant message (nothing of them would be trained on)."""
    conversations = []
    for number, item in jsonl_objects(path):
        if not isinstance(item, dict) or "messages" not in item:
            raise ValueError(f"{path} line {number}: expected an object with \"messages\", got "
                             f"{json.dumps(item)[:60]!r}")
        try:
            check_messages(item["messages"])
        except ValueError as e:
            raise ValueError(f"{path} line {number}: {e}") from None
        conversations.append((number, item["messages"]))
    if not conversations:
        raise ValueError(f"{path}: no conversations")
    silent = [number for number, messages in conversations if not any(m["role"] == "assistant" for m in messages)]
    if silent:
        lines = ", ".join(map(str, silent[:5])) + (", ..." if len(silent) > 5 else "")
        raise ValueError(f"{path}: {len(silent)} of {len(conversations)} conversations have no assistant message "
                         f"(line{'s' if len(silent) > 1 else ''} {lines}): nothing of them is trained on; "
                         "remove them or add the answers")
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


def split_conversations(path, val_path=None):
    """(train, val, lines): the conversations of the file at path and of val_path's file (else the
    last 10% of path's), and {"train": [line numbers], "val": [...]}."""
    numbered = read_numbered(path)
    if val_path is not None:
        val_numbered, train_numbered = read_numbered(val_path), numbered
    else:
        n_val = max(1, round(VAL_FRACTION * len(numbered)))
        if n_val >= len(numbered):
            raise ValueError(f"{path}: {len(numbered)} conversation(s) are too few to keep 10% for val: "
                             "pass --val FILE")
        train_numbered, val_numbered = numbered[:-n_val], numbered[-n_val:]
    return ([messages for _, messages in train_numbered], [messages for _, messages in val_numbered],
            {"train": [n for n, _ in train_numbered], "val": [n for n, _ in val_numbered]})


def own_tokenizer(conversations):
    """A tokenizer for a model trained from scratch: the conversations' characters, then the chat tokens."""
    from tinyattn.tokenizers import CharTokenizer
    chars = sorted({c for messages in conversations for m in messages for c in m["content"]})
    return CharTokenizer(chars).extended(special_tokens=chat_tokens_for(conversations))


def prepare_conversations(path, tokenizer_from=None, val_path=None, out_dir=None, overwrite=False):
    """Write a conversation folder from the JSONL file at path (see the top); -> its meta.json
    dict with "out_dir". tokenizer_from: a run, checkpoint or token folder whose tokenizer is
    extended with the chat tokens (and, for characters, the missing ones); None: a character
    tokenizer of the conversations' own."""
    from .prepare import model_block_size, read_tokenizer, write_atomically
    path = Path(path)
    block_size = model_block_size(tokenizer_from) if tokenizer_from is not None else None
    train, val, lines = split_conversations(path, val_path)
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
                val_source=str(val_path) if val_path is not None else None,
                chat_tokens=[t for t in chat_tokens_for(train + val)])
    for split, convs in (("train", train), ("val", val)):
        ids, mask = rows(tok, convs)
        lengths = (ids >= 0).sum(1) - 1                                   # (N,) the tokens the model reads
        meta[f"{split}_longest"] = dict(tokens=int(lengths.max()), line=lines[split][int(lengths.argmax())],
                                        file=str(path if split == "train" or val_path is None else val_path))
        if block_size is not None:                                       # what python -m train will truncate
            meta[f"{split}_longer_than_block_size"] = int((lengths > block_size).sum())
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
    if block_size is not None:
        meta["block_size"] = block_size
    write_atomically(out_dir / "meta.json", lambda f: f.write(json.dumps(meta, indent=2).encode("utf-8")))
    return meta | {"out_dir": str(out_dir)}


def is_conversation_folder(folder):
    """Whether folder/meta.json says "kind": "conversations"."""
    try:
        return json.loads((Path(folder) / "meta.json").read_text(encoding="utf-8")).get("kind") == "conversations"
    except (OSError, ValueError, AttributeError):
        return False
