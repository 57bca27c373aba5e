"""--init_from PATH: a new run that starts from a trained model.

PATH is a tinyattn checkpoint (a .npz written by python -m train, or a folder
holding ckpt.npz) or a Hugging Face GPT-2 folder (config.json, model.safetensors,
and the character vocabulary in tokenizer.json, as GPT.export_hf writes them).

What comes from the model: its weights, its architecture and its vocabulary (the
new text is encoded with it; a character it has never seen is refused). What is
new: the optimizer state, the step (0), the data and every training flag,
dropout included. That is the difference from --resume, which continues one run
exactly, optimizer and data streams and all.
"""
import os
from dataclasses import dataclass

from tinyattn.models import GPT, GPTConfig
from tinyattn.models.hf import read_chars

from . import checkpoint
from .data import CharTokenizer, tokenizer_from_json, tokenizer_to_json

FIXED = ("n_layer", "n_head", "n_embd", "bias", "init")   # the weights decide these; block_size is at most the model's


@dataclass
class Pretrained:
    model: GPT
    tokenizer: object
    where: str          # the file or folder it came from, for messages


def load_pretrained(args):
    """--init_from's model (with this run's dropout and head dropout) and its tokenizer."""
    pretrained = _load(args)
    if args.data and pretrained.tokenizer.kind != "char":
        raise ValueError(f"--init_from {pretrained.where}: the model reads {pretrained.tokenizer.kind}s (the lesson "
                         "corpus), not the characters of --data: drop --data")
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
    """The CharTokenizer of a Hugging Face folder that GPT.export_hf wrote, or a ValueError."""
    chars = read_chars(folder)
    if chars is None:
        raise ValueError(f"{folder}: no character vocabulary in tokenizer.json (as GPT.export_hf writes it): "
                         "the training program works with characters and cannot use this model's tokenizer")
    return CharTokenizer(chars)


def fit_args(args, pretrained, dataset):
    """Check the run's flags and data against the model; set the model flags to the model's.
    -> a note for the log. Raises a ValueError (one line) on a conflict."""
    where, config = pretrained.where, pretrained.model.config
    if pretrained.tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"--init_from {where}: the vocabulary has {pretrained.tokenizer.vocab_size} tokens, "
                         f"more than the model's {config.vocab_size}")
    if not args.data and tokenizer_to_json(dataset.tokenizer) != tokenizer_to_json(pretrained.tokenizer):
        raise ValueError(f"--init_from {where}: the model's vocabulary ({pretrained.tokenizer.vocab_size} "
                         f"{pretrained.tokenizer.kind}s) is not the lesson corpus's: pass --data FILE")
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
            f"vocabulary of {config.vocab_size}), with a fresh optimizer at step 0")


def resumed_tokenizer(ckpt_path):
    """A fine-tuned run keeps its model's vocabulary: --resume encodes its text with it.
    -> the tokenizer, or None for a run that made its own from its text."""
    try:
        meta = checkpoint.read_meta(ckpt_path)
    except (ValueError, OSError):
        return None                             # setup's checkpoint.load says what is wrong
    return tokenizer_from_json(meta["tokenizer"]) if (meta.get("args") or {}).get("init_from") else None
