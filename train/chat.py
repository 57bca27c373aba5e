"""python -m train.chat --out_dir RUN: talk with a fine-tuned model in the terminal.

    > spell: cat
    c a t
    > /clear

Each turn adds your message to the conversation and renders all of it (data/chat.py):

    <|user|>spell: cat<|end|><|assistant|>

The model reads that and writes its answer one token at a time, each token printed as it
comes, until it writes <|end|>; the answer joins the conversation, so the next turn's model
reads both. The first token costs a forward over the whole conversation, every later one a
forward over one position: the keys and values of the tokens before it wait in a KV cache.

A model reads at most block_size tokens (64 for the text preset): a turn that would leave
the answer fewer than --min_room of them is refused in one line, and the conversation stays
as it was (/clear starts a new one). Nothing is dropped behind your back.

Commands: /clear (a new conversation), /quit (or Ctrl-D). Ctrl-C stops an answer as it is
written (what it said so far stays in the conversation); at the prompt it ends the chat.

With stdin not a terminal (a file, a pipe) each line is a question of its own (--conversation:
the turns of one conversation) and exactly one line is printed for each line read: the answer
(its own newlines written \\n), or an empty line for a blank line, a /clear, or a turn refused,
whose reason goes to stderr. The exit status is 1 when some turn was refused. So the answers
pair with the questions:

    python -m train.chat --out_dir out-sft --temperature 0 < questions.txt > answers.txt
    paste questions.txt answers.txt

--system TEXT starts every conversation with a system message, for a model fine-tuned on
conversations that have them.
"""
import io
import sys

import tinyattn as ta
import tinyattn.nn as nn
from data.chat import CHAT_TOKENS, SYSTEM, answer_text, encode_text, render_prompt
from tinyattn.models.gpt import sample_next

from .config import OneLineParser, add_compile_flag, at_least
from .sample import finite_at_least_0, load_model

PROG = "python -m train.chat"


def build_parser():
    p = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--out_dir", required=True,
                   help="the run that holds the fine-tuned model's ckpt.npz (or a Hugging Face folder)")
    p.add_argument("--checkpoint", default="ckpt", choices=["ckpt", "best"],
                   help="ckpt: the latest state (default); best: the state with the best val loss")
    p.add_argument("--temperature", type=finite_at_least_0, default=0.6,
                   help="0: always the likeliest token; higher: more varied (default 0.6)")
    p.add_argument("--top_k", type=at_least(1), default=50,
                   help="sample among the k likeliest tokens only (default 50)")
    p.add_argument("--max_new_tokens", type=at_least(1), default=256,
                   help="the longest answer, in tokens (default 256; never past block_size)")
    p.add_argument("--min_room", type=at_least(1), default=16,
                   help="a turn must leave the answer at least this many of the model's block_size tokens, "
                        "else it is refused (default 16)")
    p.add_argument("--system", metavar="TEXT",
                   help="a system message that starts every conversation (the model must have been fine-tuned "
                        "with system messages)")
    p.add_argument("--conversation", action="store_true",
                   help="input that is not a terminal: the lines are the turns of one conversation (default: "
                        "each line is a conversation of its own)")
    p.add_argument("--seed", type=at_least(0), default=1337)
    p.add_argument("--device", default="cpu")
    add_compile_flag(p)
    return p


def check_chat_model(tokenizer, out_dir):
    """A ValueError in one line unless the tokenizer has the chat tokens: a base model has never
    seen a conversation, and has no ids for <|user|>, <|assistant|> and <|end|>."""
    special = getattr(tokenizer, "special_tokens", {})
    missing = [t for t in CHAT_TOKENS if t not in special]
    if missing:
        raise ValueError(f"the model in {out_dir} has no {missing[0]} token: fine-tune it on conversations first "
                         f"(python -m train --init_from {out_dir} --data CONVERSATIONS --out_dir ...)")


def stream(model, prompt, max_new_tokens, temperature=0.0, top_k=None, stop=()):
    """Yield the ids the model writes after ``prompt`` (a list of ids), one at a time, up to
    ``max_new_tokens`` of them or up to one in ``stop`` (which is yielded too).

    The same tokens as ``model.generate`` (from the same seed), written so that each can be
    shown as soon as it is drawn. The prompt and the new tokens must fit block_size (all but
    the last, which the model never reads): the window never slides, so the cache is filled
    once and only ever grows."""
    if len(prompt) + max_new_tokens - 1 > model.config.block_size:
        raise ValueError(f"{len(prompt)} prompt tokens and {max_new_tokens} new ones do not fit block_size "
                         f"{model.config.block_size}")
    device = model.wte.weight.device
    caches = [nn.KVCache() for _ in model.h]           # one a block: the keys and values read so far
    idx = ta.tensor([prompt], device=device)           # (1, T): the whole conversation, once
    with ta.inference_mode():
        for i in range(max_new_tokens):
            logits, _ = model(idx, kv_caches=caches)                       # (1, T, V)
            token = int(sample_next(logits[:, -1, :], temperature, top_k)[0, 0])
            yield token
            if token in stop or i == max_new_tokens - 1:
                return
            idx = ta.tensor([[token]], device=device)                      # (1, 1): only the new token


def refusal(n_tokens, block_size, min_room, new_conversation):
    """The line that refuses a turn whose rendered conversation (n_tokens, up to <|assistant|>)
    leaves the answer fewer than min_room of block_size tokens; None when it fits."""
    if n_tokens + min_room <= block_size:
        return None
    said = f"this message is {n_tokens} tokens" if new_conversation else \
        f"with this message the conversation is {n_tokens} tokens"
    how = "write a shorter one" if new_conversation else "/clear to start again"
    return f"not sent: {said}; the model reads {block_size}, {min_room} of them kept for the answer: {how}"


def show(tokenizer, ids, shown):
    """The new text of the answer ``ids`` since ``shown`` (the text printed so far). A BPE token
    can hold part of a character's bytes: that waits for the rest of the character."""
    text = answer_text(tokenizer, ids)
    return "" if text.endswith("\ufffd") else text[len(shown):]


def answer(model, tokenizer, prompt, limit, temperature, top_k, out=None):
    """Write the model's answer to ``prompt`` on ``out`` as it comes, at most ``limit`` tokens.
    -> (its text, how it ended: "end", "cut" at the limit, or "stopped" by Ctrl-C)."""
    out = sys.stdout if out is None else out
    stop = {tokenizer.special_tokens[t] for t in CHAT_TOKENS}   # <|end|>; a role token ends it too
    ids, shown, ended = [], "", "cut"
    tokens = stream(model, prompt, limit, temperature, top_k, stop)
    try:
        for token in tokens:
            if token in stop:
                ended = "end"
                break
            ids.append(token)
            new = show(tokenizer, ids, shown)
            shown += new                              # before the write: a Ctrl-C between the two
            out.write(new)                            # must not print it again below
            out.flush()
    except KeyboardInterrupt:
        ended = "stopped"
    finally:
        tokens.close()
    text = answer_text(tokenizer, ids)
    out.write(text[len(shown):] + "\n")               # a character still waiting for its bytes
    out.flush()
    return text, ended


def converse(model, tokenizer, args, interactive, system=()):
    """The loop: read a line, answer it, until /quit or the end of the input. ``system``: the
    messages every conversation starts with (a system message, or none).
    -> exit status: 0, or 1 when some turn was refused (input that is not a terminal)."""
    block = model.config.block_size
    system = list(system)
    messages = list(system)
    prompt_text = "> " if interactive else ""
    refused_lines, lines = 0, 0

    def refuse(why):
        """A turn not sent: its reason on stderr and, from a pipe, an empty line for its answer."""
        nonlocal refused_lines
        note(why)
        if not interactive:
            print(flush=True)
            refused_lines += 1

    while True:
        try:
            line = input(prompt_text)
        except EOFError:                               # Ctrl-D, or the end of a file
            if interactive:
                print()
            elif refused_lines:
                note(f"{PROG}: {refused_lines} of {lines} lines refused (an empty line for each)")
            return 1 if refused_lines else 0
        except KeyboardInterrupt:                      # Ctrl-C at the prompt: the end, without a traceback
            print()
            return 0
        lines += 1
        text = line.strip()
        if text in ("/quit", "/exit"):
            return 1 if refused_lines else 0
        if text == "/clear":
            messages = list(system)
            note("(a new conversation)")
            if not interactive:
                print(flush=True)                      # one line out for each line in
            continue
        if text.startswith("/"):
            refuse(f"unknown command {text.split()[0]}: /clear starts a new conversation, /quit ends")
            continue
        if not text:
            if not interactive:
                print(flush=True)
            continue
        if not interactive and not args.conversation:
            messages = list(system)                    # each line its own conversation
        asked = messages + [{"role": "user", "content": text}]
        try:
            prompt = render_prompt(tokenizer, asked)
        except ValueError as e:                        # a character outside the vocabulary, a chat token's text
            refuse(f"not sent: {e}")
            continue
        refused = refusal(len(prompt), block, args.min_room, len(messages) == len(system))
        if refused:
            refuse(refused)
            continue
        limit = min(args.max_new_tokens, block - len(prompt))
        if interactive:
            said, ended = answer(model, tokenizer, prompt, limit, args.temperature, args.top_k)
        else:                                          # one line an answer: its own newlines written \n
            said, ended = answer(model, tokenizer, prompt, limit, args.temperature, args.top_k, out=io.StringIO())
            print(said.replace("\n", "\\n"), flush=True)
        if ended == "stopped":
            note("(stopped: what it said so far stays in the conversation)")
        elif ended == "cut":
            why = "--max_new_tokens" if limit == args.max_new_tokens else f"the model reads {block} tokens"
            note(f"(cut at {limit} tokens: {why})")
        messages = asked + [{"role": "assistant", "content": said}]


def system_messages(tokenizer, text):
    """--system TEXT as the messages a conversation starts with ([] without it), or a
    ValueError when the model has no system token (it never saw a system message) or cannot
    encode TEXT (a character outside its vocabulary): refused once, not at every turn."""
    if text is None:
        return []
    if SYSTEM not in tokenizer.special_tokens:
        raise ValueError(f"--system: this model has no system token ({SYSTEM}): fine-tune it on conversations "
                         "with system messages first")
    try:
        encode_text(tokenizer, text)
    except ValueError as e:
        raise ValueError(f"--system: {e}") from None
    return [{"role": "system", "content": text}]


def note(text):
    """A line about the chat, not from the model: on stderr, so that piped answers stay clean."""
    print(text, file=sys.stderr, flush=True)


def line_editing():
    """Arrow keys and history at the prompt, where Python has readline."""
    try:
        import readline  # noqa: F401  (input() uses it once it is imported)
    except ImportError:
        pass


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        model, tokenizer = load_model(args.out_dir, args.device, args.checkpoint)
        check_chat_model(tokenizer, args.out_dir)
        system = system_messages(tokenizer, args.system)
        model = ta.compile(model, disable=not args.compile)
    except (ValueError, FileNotFoundError, KeyError, RuntimeError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    ta.manual_seed(args.seed)
    interactive = sys.stdin.isatty()
    if interactive:
        line_editing()
        note(f"{args.out_dir}: a model of {model.num_parameters() / 1e6:.2f}M parameters that reads "
             f"{model.config.block_size} tokens. /clear starts a new conversation, /quit (or Ctrl-D) ends.")
    try:
        return converse(model, tokenizer, args, interactive, system)
    except KeyboardInterrupt:                          # Ctrl-C between the prompt and the answer
        print()
        return 0


if __name__ == "__main__":
    sys.exit(main())
