"""--init_from PATH: a new run that starts from a trained model.

PATH is a tinyattn checkpoint (a .npz written by python -m train, or a folder
holding ckpt.npz) or a Hugging Face GPT-2 folder (config.json, model.safetensors,
and the tokenizer in tokenizer.json, as GPT.export_hf writes them).

What comes from the model: its weights, its architecture and its vocabulary. A
character model encodes a text file with its characters (one it has never seen is
refused); a BPE model reads a token folder that python -m data.prepare FILE
--tokenizer_from PATH wrote with its tokenizer. A folder whose tokenizer only adds
special tokens to the model's (chat fine-tuning's <|user|>, say), or for a character
model characters and special tokens after the model's (a conversation folder of
python -m data.prepare CONVS.jsonl --tokenizer_from PATH), is accepted: the model gets
an embedding row for each, started at the mean of the others. What is
new: the optimizer state, the step (0), the data and every training flag,
dropout included. That is the difference from --resume, which continues one run
exactly, optimizer and data streams and all.
"""
import os
from dataclasses import dataclass

import numpy as np

from data.chat import CHAT_TOKENS, SYSTEM
from tinyattn.models import GPT, GPTConfig
from tinyattn.models.hf import read_tokenizer

from . import checkpoint
from .data import tokenizer_from_json, tokenizer_to_json

FIXED = ("n_layer", "n_head", "n_embd", "bias", "init", "pos", "rope_theta", "norm", "mlp", "n_kv_head", "qk_norm",
         "tie_embeddings")   # the weights decide these; block_size is at most the model's


@dataclass
class Pretrained:
    model: GPT
    tokenizer: object
    where: str          # the file or folder it came from, for messages


def load_pretrained(args, chat_stage=None):
    """--init_from's model (with this run's dropout and head dropout) and its tokenizer.
    ``chat_stage``: the stage (its name) that fine-tunes an assistant, which needs the chat tokens."""
    pretrained = _load(args)
    missing = [t for t in CHAT_TOKENS if t not in getattr(pretrained.tokenizer, "special_tokens", {})]
    if chat_stage and missing:                  # said first: it is why the run cannot go on
        raise ValueError(f"--stage {chat_stage}: the model has no chat tokens: start from a fine-tuned assistant "
                         "(--init_from a run of chat fine-tuning)")
    if args.data and pretrained.tokenizer.kind == "word":
        raise ValueError(f"--init_from {pretrained.where}: the model reads words (the lesson "
                         "corpus), not the tokens of --data: drop --data")
    return pretrained


def _load(args):
    path = args.init_from
    drops = dict(dropout=args.dropout, head_dropout=args.head_dropout)
    if is_hf_folder(path):
        return Pretrained(GPT.from_hf(path, **drops), hf_tokenizer(path), path)
    if os.path.isdir(path):
        path = os.path.join(path, "ckpt.npz")
    if not os.path.isfile(path):
        raise ValueError(f"--init_from {args.init_from}: neither a checkpoint file, nor a folder with ckpt.npz "
                         "or a Hugging Face config.json")
    if os.path.abspath(path) == os.path.abspath(os.path.join(args.out_dir, "ckpt.npz")):
        raise ValueError(f"--init_from {path} is the checkpoint this run would write over: use another --out_dir")
    state, _, meta = checkpoint.load(path)
    model = GPT(GPTConfig(**{**meta["config"], **drops}))
    model.load_state_dict(state)
    return Pretrained(model, tokenizer_from_json(meta["tokenizer"]), path)


def is_hf_folder(path):
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json"))


def hf_tokenizer(folder):
    """The tokenizer of a Hugging Face folder that GPT.export_hf wrote (characters or a
    byte-level BPE), or a ValueError."""
    tok = read_tokenizer(folder)
    if tok is None:
        raise ValueError(f"{folder}: no character vocabulary or byte-level BPE in tokenizer.json (as GPT.export_hf "
                         "writes them): the training program cannot use this model's tokenizer")
    return tok


def describe(tok):
    """'bpe, 300 ids': a tokenizer in a few words, for messages."""
    return f"{tok.kind}, {tok.vocab_size} ids"


def added_special_tokens(model_tok, data_tok):
    """The tokens data_tok adds to model_tok ([] when they are the same), or None when data_tok
    is another tokenizer. Added tokens must take ids after the model's: a BPE may add special
    tokens; a character tokenizer characters and special tokens (data/chat.py's chat_tokenizer),
    its first ids being the model's tokens."""
    if tokenizer_to_json(model_tok) == tokenizer_to_json(data_tok):
        return []
    if model_tok.kind == "char" and data_tok.kind == "char":
        n = model_tok.vocab_size
        if data_tok.chars[:n] != model_tok.chars or \
                any(data_tok.special_tokens.get(s) != i for s, i in model_tok.special_tokens.items()):
            return None
        return data_tok.chars[n:]
    if model_tok.kind != "bpe" or data_tok.kind != "bpe" or model_tok.pattern != data_tok.pattern \
            or model_tok.ranks != data_tok.ranks:
        return None
    if any(data_tok.special_tokens.get(s) != i for s, i in model_tok.special_tokens.items()):
        return None
    added = {s: i for s, i in data_tok.special_tokens.items() if s not in model_tok.special_tokens}
    if any(i < model_tok.vocab_size for i in added.values()):
        return None
    return sorted(added, key=added.get)


def grow_vocab(model, vocab_size):
    """A copy of model with vocab_size token rows: the new rows of wte (tied to the output
    head, or the head's own too when untied) start at the mean of the model's rows, so the new
    tokens begin as an average one."""
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    wte = state["wte.weight"]                                           # (V, C)
    extra = np.repeat(wte.mean(0, keepdims=True), vocab_size - len(wte), axis=0)
    state["wte.weight"] = np.concatenate([wte, extra]).astype(wte.dtype)
    if "lm_head.weight" in state:                                       # an untied head: its rows too
        head = state["lm_head.weight"]
        extra = np.repeat(head.mean(0, keepdims=True), vocab_size - len(head), axis=0)
        state["lm_head.weight"] = np.concatenate([head, extra]).astype(head.dtype)
    grown = GPT(GPTConfig(**{**model.config.to_dict(), "vocab_size": vocab_size}))
    grown.load_state_dict(state)
    return grown


def fit_args(args, pretrained, dataset):
    """Check the run's flags and data against the model; set the model flags to the model's.
    -> a note for the log. Raises a ValueError (one line) on a conflict."""
    where, config = pretrained.where, pretrained.model.config
    if pretrained.tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"--init_from {where}: the vocabulary has {pretrained.tokenizer.vocab_size} tokens, "
                         f"more than the model's {config.vocab_size}")
    if not args.data and tokenizer_to_json(dataset.tokenizer) != tokenizer_to_json(pretrained.tokenizer):
        raise ValueError(f"--init_from {where}: the model's vocabulary ({pretrained.tokenizer.vocab_size} "
                         f"{pretrained.tokenizer.kind}s) is not the lesson corpus's: pass --data FILE or DIR")
    added = added_special_tokens(pretrained.tokenizer, dataset.tokenizer) if args.data else []
    if added is None:
        raise ValueError(f"--init_from {where}: --data {args.data} was made with another tokenizer "
                         f"({describe(dataset.tokenizer)}) than the model's ({describe(pretrained.tokenizer)}): "
                         f"prepare the text with python -m data.prepare FILE --tokenizer_from {where}")
    notes = []
    if added and dataset.tokenizer.vocab_size > config.vocab_size:
        old = config.vocab_size
        pretrained.model = grow_vocab(pretrained.model, dataset.tokenizer.vocab_size)
        config = pretrained.model.config
        rows = f"row {old} is" if len(added) == 1 else f"rows {old} to {config.vocab_size - 1} are"
        specials = [t for t in added if t in dataset.tokenizer.special_tokens]
        chars = "".join(t for t in added if t not in dataset.tokenizer.special_tokens)
        counts = [f"{n} {kind}{'s' if n > 1 else ''}" for n, kind in ((len(specials), "special token"),
                                                                      (len(chars), "character")) if n]
        listed = "; ".join(part for part in (", ".join(specials), repr(chars) if chars else "") if part)
        had_chat = all(t in pretrained.tokenizer.special_tokens for t in CHAT_TOKENS)
        if had_chat and SYSTEM in specials:          # a chat model from before the system token
            notes.append(f"; --data's system messages need {SYSTEM}, which the model (fine-tuned before it "
                         f"existed) lacks: --data adds {' and '.join(counts)} ({listed}), embedding {rows} new, "
                         "started at the mean of the others as the chat tokens' were")
        else:
            notes.append(f"; --data adds {' and '.join(counts)} to the model's tokenizer ({listed}): embedding "
                         f"{rows} new, started at the mean of the others")
    given = set(args._given)
    conflicts = [f"--{k} {getattr(args, k)} (the model has {getattr(config, k)})" for k in FIXED
                 if k in given and getattr(args, k) != getattr(config, k)]
    if "block_size" in given and args.block_size > config.block_size:
        conflicts.append(f"--block_size {args.block_size} (the model has {config.block_size} positions)")
    if conflicts:
        raise ValueError(f"--init_from: {', '.join(conflicts)}: the model in {where} is fixed; drop "
                         f"{'these flags' if len(conflicts) > 1 else 'the flag'}")
    for k in FIXED:
        setattr(args, k, getattr(config, k))
    if "block_size" not in given:
        args.block_size = config.block_size
    return (f"--init_from: starting from {where} ({pretrained.model.num_parameters() / 1e6:.2f}M parameters, "
            f"vocabulary of {config.vocab_size}), with a fresh optimizer at step 0" + "".join(notes))


def max_length(args):
    """--max_length, the longest example in tokens the model reads (default: block_size, set in args
    so that the checkpoint keeps it); a ValueError in one line where it is more than block_size."""
    if args.max_length is None:
        args.max_length = args.block_size
    elif args.max_length > args.block_size:
        raise ValueError(f"--max_length {args.max_length} is more than block_size {args.block_size}: the model reads "
                         f"at most {args.block_size} tokens; pass --max_length {args.block_size} or less")
    return args.max_length


def resumed_tokenizer(ckpt_path):
    """A fine-tuned run keeps its model's vocabulary: --resume encodes its text with it.
    -> the tokenizer, or None for a run that made its own from its text."""
    try:
        meta = checkpoint.read_meta(ckpt_path)
    except (ValueError, OSError):
        return None                             # setup's checkpoint.load says what is wrong
    ran = meta.get("args") or {}
    fine_tuned = ran.get("init_from") or ran.get("fine_tuned_from") or ran.get("dpo_reference")
    return tokenizer_from_json(meta["tokenizer"]) if fine_tuned else None
