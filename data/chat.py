"""Conversations as token ids: the chat format of tinyattn's assistant lesson.

A conversation is a list of messages, as TRL and nanochat read them (one JSON object a line,
``{"messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}]}``).
Rendered, each message is its role's token, its text and ``<|end|>``:

    <|user|>spell cat<|end|><|assistant|>c a t<|end|>

and the loss mask is 1 on what the assistant says, its ``<|end|>`` included (the model must
learn to stop), 0 on everything else: the model is not trained to write the user's turns.
To answer, the model reads the conversation up to ``<|assistant|>`` and writes until ``<|end|>``.
A conversation may begin with a system message (``{"role": "system", ...}``, as in TRL's
conversational format), rendered ``<|system|>TEXT<|end|>`` and never trained on; several
turns are fine, and every assistant turn is trained on.

What a message says is text, whatever it holds: ``<|end|>`` or ``<|endoftext|>`` in a
message is encoded as its characters (a BPE's ordinary pieces), never as the special id,
as nanochat does. Only the roles' tokens and ``<|end|>`` that the rendering puts in are special.

The three chat tokens are special tokens: one id each, never made from the text's characters.
A base model pretrained on plain text has no ids for them: they are added to its vocabulary
at fine-tuning (``chat_tokenizer``; ``<|system|>`` too, after them, where a conversation has a
system message), with the characters the conversations use that the text never had (tiny
Shakespeare has no "+" and one digit), and the model's embedding grows a row for each
(train/finetune.py). Grown, not reserved at pretraining: the base model stays any
nanoGPT model, and which characters a later task needs is not known when it is trained.
"""
import json
from pathlib import Path

USER, ASSISTANT, END = "<|user|>", "<|assistant|>", "<|end|>"
SYSTEM = "<|system|>"
CHAT_TOKENS = (USER, ASSISTANT, END)          # every chat model has these; <|system|> comes after, where used
ROLES = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT}


def check_messages(messages):
    """A ValueError in one line unless messages are an optional system message, then user,
    assistant, user, ... alternating, from the user."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("a conversation is a non-empty list of messages")
    first = 1 if isinstance(messages[0], dict) and messages[0].get("role") == "system" else 0
    if first and len(messages) == 1:
        raise ValueError("the conversation is a system message alone: a user's message follows it")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} is not {{'role': 'system', 'user' or 'assistant', 'content': text}}: "
                             f"{m!r}")
        want = "user" if (i - first) % 2 == 0 else "assistant"
        if i >= first and m["role"] != want:
            where = "only the first message may be the system's" if m["role"] == "system" else \
                "messages alternate user, assistant, ... from the user (after a system message, if any)"
            raise ValueError(f"message {i} is from the {m['role']}; {where}")


def uses_system(conversations):
    """Whether any of the conversations (lists of messages) begins with a system message."""
    return any(messages and messages[0].get("role") == "system" for messages in conversations)


def encode_text(tokenizer, text):
    """A message's text as ids: ordinary text, a special token's text included (its characters,
    or a BPE's ordinary pieces), never a special id: what a message says cannot end a turn."""
    return tokenizer.encode_ordinary(text) if tokenizer.kind == "bpe" else tokenizer.encode(text)


def role_id(tokenizer, role):
    """The id of a role's token, or a ValueError in one line where the tokenizer lacks it."""
    token = ROLES[role]
    if token not in tokenizer.special_tokens:
        if token == SYSTEM:
            raise ValueError("a system message needs the <|system|> token, which this model's tokenizer lacks: "
                             "fine-tune it (python -m train --init_from MODEL --data CONVERSATIONS) on "
                             "conversations with a system message first")
        raise ValueError(f"the tokenizer has no {token} token: fine-tune the model on conversations first")
    return tokenizer.special_tokens[token]


def render(tokenizer, messages):
    """A conversation -> (ids, mask), two lists of the same length: mask 1 where the ids are
    the assistant's (its text and its <|end|>), 0 elsewhere (a system message is never trained on)."""
    check_messages(messages)
    ids, mask = [], []
    for m in messages:
        said = [role_id(tokenizer, m["role"]), *encode_text(tokenizer, m["content"]), tokenizer.special_tokens[END]]
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


def chat_tokens_for(conversations):
    """The special tokens that render ``conversations``: the chat tokens, and <|system|> after
    them where one has a system message."""
    return CHAT_TOKENS + ((SYSTEM,) if uses_system(conversations) else ())


def chat_tokenizer(tokenizer, conversations):
    """The tokenizer that renders ``conversations``: ``tokenizer`` with the chat tokens added
    (<|system|> too where a conversation has a system message) and, for characters, every
    character the messages use that it lacks (after its last id). A byte-level BPE encodes
    any text: it gets the special tokens only."""
    wanted = chat_tokens_for(conversations)
    if tokenizer.kind == "bpe":
        missing = [t for t in wanted if t not in tokenizer.special_tokens]
        return tokenizer.with_special_tokens(missing) if missing else tokenizer
    chars = {c for conversation in conversations for m in conversation for c in m["content"]}
    return tokenizer.extended(chars=chars, special_tokens=wanted)


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


JSON_NAMES = (".jsonl", ".json")


def json_kind(path):
    """What a file holds, judged by its content (its name only where the content is not JSON):
    "conversations" (JSON lines of {"messages": [...]}), "pairs" (JSON lines of TRL's preference
    pairs, with "chosen" and "rejected"), "json lines" (other JSON objects, one a line), "json" (one
    JSON document, not lines), or None: text. A file named .json or .jsonl (any case) is JSON lines
    whatever its first line holds (a bad line is then reported as such)."""
    named = Path(path).suffix.lower() in JSON_NAMES
    try:
        with open(path, encoding="utf-8") as f:
            first = next((line for line in f if line.strip()), "")
    except (OSError, UnicodeDecodeError):
        return "json lines" if named else None
    if not first.lstrip().startswith(("{", "[")):
        return "json lines" if named else None
    try:
        item = json.loads(first)
    except json.JSONDecodeError:
        item = None
    if not isinstance(item, dict):
        try:                                   # a document: a list, or pretty-printed over lines
            json.loads(Path(path).read_text(encoding="utf-8"))
            return "json"
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return "json lines" if named else None
    if "messages" in item:
        return "conversations"
    if "chosen" in item and "rejected" in item:
        return "pairs"
    return "json lines"


def describe_json_kind(kind):
    """A few words for json_kind's answer, for messages."""
    return {"conversations": "conversations (JSON lines of {\"messages\": [...]})",
            "pairs": "preference pairs (JSON lines with \"chosen\" and \"rejected\")",
            "json lines": "JSON lines", "json": "one JSON document, not JSON lines (one object a line)"}[kind]
