"""Conversations as token ids: the chat format of tinyattn's assistant lesson.

A conversation is a list of messages, as TRL and nanochat read them (one JSON object a line,
``{"messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}]}``).
Rendered, each message is its role's token, its text and ``<|end|>``:

    <|user|>spell cat<|end|><|assistant|>c a t<|end|>

and the loss mask is 1 on what the assistant says, its ``<|end|>`` included (the model must
learn to stop), 0 on everything else: the model is not trained to write the user's turns.
To answer, the model reads the conversation up to ``<|assistant|>`` and writes until ``<|end|>``.

The three chat tokens are special tokens: one id each, never made from the text's characters.
A base model pretrained on plain text has no ids for them: they are added to its vocabulary
at fine-tuning (``chat_tokenizer``), with the characters the conversations use that the text
never had (tiny Shakespeare has no "+" and one digit), and the model's embedding grows a row
for each (train/finetune.py). Grown, not reserved at pretraining: the base model stays any
nanoGPT model, and which characters a later task needs is not known when it is trained.
"""
import json

USER, ASSISTANT, END = "<|user|>", "<|assistant|>", "<|end|>"
CHAT_TOKENS = (USER, ASSISTANT, END)
ROLES = {"user": USER, "assistant": ASSISTANT}


def check_messages(messages):
    """A ValueError in one line unless messages alternate user, assistant, ..., from the user."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("a conversation is a non-empty list of messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} is not {{'role': 'user' or 'assistant', 'content': text}}: {m!r}")
        want = "user" if i % 2 == 0 else "assistant"
        if m["role"] != want:
            raise ValueError(f"message {i} is from the {m['role']}; messages alternate user, assistant, ... "
                             "from the user")
        if any(token in m["content"] for token in CHAT_TOKENS):
            raise ValueError(f"message {i} holds a chat token's text ({m['content']!r})")


def render(tokenizer, messages):
    """A conversation -> (ids, mask), two lists of the same length: mask 1 where the ids are
    the assistant's (its text and its <|end|>), 0 elsewhere."""
    check_messages(messages)
    ids, mask = [], []
    for m in messages:
        said = [tokenizer.special_tokens[ROLES[m["role"]]], *tokenizer.encode(m["content"]),
                tokenizer.special_tokens[END]]
        ids += said
        train_on = 1 if m["role"] == "assistant" else 0
        mask += [0] + [train_on] * (len(said) - 1)       # the role's own token is never a target
    return ids, mask


def render_prompt(tokenizer, messages):
    """The ids the model reads to answer: the conversation so far (ending with the user's
    message), then <|assistant|>."""
    check_messages(messages)
    if messages[-1]["role"] != "user":
        raise ValueError("the conversation must end with the user's message for the assistant to answer")
    ids, _ = render(tokenizer, messages)
    return ids + [tokenizer.special_tokens[ASSISTANT]]


def answer_text(tokenizer, ids):
    """The text of the ids an assistant wrote, up to its <|end|> (all of them without one)."""
    ids = list(ids)
    end = tokenizer.special_tokens[END]
    if end in ids:
        ids = ids[:ids.index(end)]
    return tokenizer.decode(ids)


def chat_tokenizer(tokenizer, conversations):
    """The tokenizer that renders ``conversations``: ``tokenizer`` with the chat tokens added
    and, for characters, every character the messages use that it lacks (after its last id).
    A byte-level BPE encodes any text: it gets the chat tokens only."""
    if tokenizer.kind == "bpe":
        missing = [t for t in CHAT_TOKENS if t not in tokenizer.special_tokens]
        return tokenizer.with_special_tokens(missing) if missing else tokenizer
    chars = {c for conversation in conversations for m in conversation for c in m["content"]}
    return tokenizer.extended(chars=chars, special_tokens=CHAT_TOKENS)


def jsonl_objects(path):
    """(line number, object) for each non-blank line of a JSONL file; a ValueError in one line
    naming the file (and the line) where it is not UTF-8 or a line is not JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = list(f)
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (bad byte at offset {e.start})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} line {number}: not JSON ({e.msg})") from None
