"""python -m train.chat_eval --out_dir RUN: how well a model answers the tasks of data/tasks.py.

For each task, --n held-out prompts (the task's test split: words, or operand pairs, that
fine-tuning never saw), answered greedily with the KV cache until <|end|>. Two numbers a task:
accuracy (the exact answer) and format rate (an answer of the right form, right or wrong).
With --text FILE, also the language model's val loss and bits per byte on the file's last 10%
(the val split python -m train uses): what fine-tuning did to the model's knowledge of the text.

    python -m train.chat_eval --out_dir out-sft --text input.txt
    python -m train.chat_eval --out_dir out-base --text input.txt --tasks spell,reverse --n 100

(--tasks takes the names separated by commas or spaces: spell,reverse and spell reverse alike.)

A base model, pretrained on text alone, has no ids for the chat tokens (nor for characters the
text lacks, such as "+"). It is evaluated as fine-tuning starts from it: its embedding is grown
with a row for each missing token, at the mean of its rows (train/finetune.py's grow_vocab), and
it reads the same prompts as the fine-tuned model. The output says so. With the head tied to the
embedding, a new row's logit is the mean of the others', never the largest: greedy decoding never
writes <|end|>, so a base model's answers never end and score 0, which is what it knows of the
format. Its language-model loss is the model's own, before the growth.
"""
import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

import tinyattn as ta
from data.chat import END, answer_text, chat_tokenizer, render_prompt
from data.tasks import TASKS, WORD_TASKS, make_task, task_list

from .config import OneLineParser, add_compile_flag, at_least
from .data import load_text
from .finetune import grow_vocab
from .chat import system_messages
from .sample import load_model


def build_parser():
    p = OneLineParser(prog="python -m train.chat_eval", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out_dir", required=True, help="the run (a folder with ckpt.npz)")
    p.add_argument("--checkpoint", default="ckpt", choices=["ckpt", "best"])
    p.add_argument("--tasks", nargs="+", default=list(TASKS), metavar="TASK",
                   help=f"which tasks, separated by commas or spaces, of {','.join(TASKS)} (default: all)")
    p.add_argument("--n", type=at_least(1), default=400, help="held-out prompts a task (default 400)")
    p.add_argument("--text", help="a text file: the language model's val loss on its last 10%%; also the text "
                                  "the word tasks take their words from")
    p.add_argument("--task_text", help="the text the word tasks take their words from (default: --text)")
    p.add_argument("--seed", type=int, default=0, help="which test prompts, in which order (default 0)")
    p.add_argument("--split_seed", type=int, default=0,
                   help="the train/test split of the tasks (default 0, as python -m data.tasks's)")
    p.add_argument("--max_new_tokens", type=at_least(1), default=32, help="the longest answer read (default 32)")
    p.add_argument("--batch_size", type=at_least(1), default=64, help="prompts answered together (default 64)")
    p.add_argument("--device", default="cpu")
    add_compile_flag(p)
    p.add_argument("--system", metavar="TEXT",
                   help="a system message before each prompt (the model must have been fine-tuned with them)")
    p.add_argument("--json", metavar="PATH", help="also write the numbers to PATH as JSON")
    return p


def answer(model, tokenizer, prompts, max_new_tokens, batch_size, device):
    """Greedy answers (text up to <|end|>) to prompts (lists of ids). Prompts of one length go
    through generate together: the KV cache needs no padding."""
    block, end = model.config.block_size, tokenizer.special_tokens[END]
    answers = [None] * len(prompts)
    by_length = {}
    for i, ids in enumerate(prompts):
        by_length.setdefault(len(ids), []).append(i)
    for length, rows in sorted(by_length.items()):
        if length >= block:
            raise ValueError(f"a prompt of {length} tokens does not fit the model's block_size {block}")
        new = min(max_new_tokens, block - length)              # no sliding window: the cache stays exact
        for start in range(0, len(rows), batch_size):
            chunk = rows[start:start + batch_size]
            idx = ta.tensor([prompts[i] for i in chunk], device=device)               # (B, T)
            out = model.generate(idx, new, temperature=0.0, stop=[end])               # (B, T + new)
            for i, ids in zip(chunk, out.numpy()[:, length:].tolist()):
                answers[i] = answer_text(tokenizer, ids)
    return answers


@ta.no_grad()
def text_loss(model, tokenizer, path, device, batch_size=64):
    """The mean next-token loss over the val split (last 10%) of a text, in windows of
    block_size laid end to end, and its bits per byte -> (loss, bpb)."""
    data = load_text(path, tokenizer)
    val, block = data.val, model.config.block_size
    starts = np.arange(0, len(val) - block, block)                                   # (W,)
    if not len(starts):
        raise ValueError(f"--text {path}: its val split has {len(val)} tokens, fewer than block_size + 1")
    total = 0.0
    for b in range(0, len(starts), batch_size):
        idx = starts[b:b + batch_size, None] + np.arange(block)                     # (B, T)
        x, y = ta.tensor(val[idx], device=device), ta.tensor(val[idx + 1], device=device)
        total += model(x, y)[1].item() * len(idx)
    loss = total / len(starts)
    return loss, data.bits_per_byte(loss)


def task_names(given):
    """--tasks's values (["spell,add"], ["spell", "add"] or ["spell, add"]) -> ["spell", "add"]
    (data/tasks.py's task_list), or a ValueError in one line naming the flag."""
    try:
        return task_list(given)
    except ValueError as e:
        raise ValueError(f"--tasks {' '.join(given)}: {e}") from None


def check_json_path(path):
    """A ValueError in one line unless --json's PATH can be written: its folder exists and it is
    not a folder itself (checked before the evaluation, not after it)."""
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        raise ValueError(f"--json {path}: is a folder; give a file name (such as {path / 'eval.json'})")
    if not folder.is_dir():
        raise ValueError(f"--json {path}: the folder {folder} does not exist (make it first)")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"--json {path}: the folder {folder} is not writable")


def evaluate(args):
    """The numbers: {"tasks": {name: {accuracy, format, n}}, "lm": {...} or None, "grown": note or None}."""
    names = task_names(args.tasks)
    words_from = args.task_text or args.text
    if words_from is None and any(t in WORD_TASKS for t in names):
        raise ValueError(f"the word tasks ({', '.join(t for t in names if t in WORD_TASKS)}) take their words from "
                         "a text: pass --text FILE (or --task_text FILE)")
    model, tokenizer = load_model(args.out_dir, args.device, args.checkpoint)
    system = system_messages(tokenizer, args.system)
    model = ta.compile(model, disable=not args.compile)
    lm = None
    if args.text:
        loss, bpb = text_loss(model, tokenizer, args.text, args.device)
        lm = dict(text=str(args.text), val_loss=round(loss, 6), val_bpb=round(bpb, 6))
    words = Path(words_from).read_text(encoding="utf-8") if words_from else None
    tasks = [make_task(name, words, args.split_seed) for name in names]
    items = {task.name: task.conversations("test", args.n, args.seed) for task in tasks}
    chat = chat_tokenizer(tokenizer, [c["messages"] for convs in items.values() for c in convs])
    grown = None
    if chat.vocab_size > tokenizer.vocab_size:           # a base model: prompted as fine-tuning starts from it
        added = chat.chars[tokenizer.vocab_size:] if chat.kind == "char" else \
            [t for t in chat.special_tokens if t not in tokenizer.special_tokens]
        grown = (f"{args.out_dir} has no ids for {', '.join(map(repr, added))}: evaluated with its embedding grown "
                 f"by {len(added)} rows at the mean of its rows, as fine-tuning starts from it (such a row's logit "
                 "is the mean of the others': greedy never writes it, so the model cannot end an answer)")
        dtype = model.wte.weight.numpy().dtype.name
        model = grow_vocab(model, chat.vocab_size).to(dtype).to(args.device).eval()
        model = ta.compile(model, disable=not args.compile)
        tokenizer = chat
    results = {}
    for task in tasks:
        convs = items[task.name]
        prompts = [render_prompt(tokenizer, system + c["messages"][:-1]) for c in convs]
        answers = answer(model, tokenizer, prompts, args.max_new_tokens, args.batch_size, args.device)
        correct = sum(task.evaluate(c, a) for c, a in zip(convs, answers))
        in_format = sum(task.in_format(a) for a in answers)
        results[task.name] = dict(accuracy=round(correct / len(convs), 4), format=round(in_format / len(convs), 4),
                                  n=len(convs), example=dict(prompt=convs[0]["messages"][-2]["content"],
                                                             answer=answers[0]))
    return dict(out_dir=str(args.out_dir), checkpoint=args.checkpoint, seed=args.seed, split_seed=args.split_seed,
                tasks=results, lm=lm, grown=grown)


def table(numbers):
    """The numbers as a few lines of text."""
    lines = [f"{'task':<8} {'accuracy':>8} {'format':>7} {'n':>5}   first answer"]
    for name, r in numbers["tasks"].items():
        lines.append(f"{name:<8} {r['accuracy']:>8.3f} {r['format']:>7.3f} {r['n']:>5}   "
                     f"{r['example']['prompt']!r} -> {r['example']['answer']!r}")
    if numbers["lm"]:
        lm = numbers["lm"]
        lines.append(f"language model on {lm['text']} (last 10%): val loss {lm['val_loss']:.4f}, "
                     f"{lm['val_bpb']:.4f} bits per byte")
    return "\n".join(lines)


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        if args.json:
            check_json_path(args.json)
        numbers = evaluate(args)
    except (ValueError, OSError, KeyError, RuntimeError) as e:
        print(f"python -m train.chat_eval: error: {e}", file=sys.stderr)
        return 1
    if numbers["grown"]:
        print(f"python -m train.chat_eval: note: {numbers['grown']}", file=sys.stderr)
    print(table(numbers))
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(numbers, indent=2) + "\n", encoding="utf-8")
        except OSError as e:
            print(f"python -m train.chat_eval: error: --json {args.json}: {e.strerror or e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
