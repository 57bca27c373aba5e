"""The checks of exercise 19 (EXERCISES.md): the loss mask of a conversation.

The learner's render is checked against the library's (data/chat.py) on conversations of
one and of several turns, with messages for the usual mistakes; then the targets of a row,
and the two together against what the training program's batches hold.
"""
import numpy as np

from data import chat
from tinyattn.tokenizers import CharTokenizer

from .common import ExerciseFailure, need

CONVERSATIONS = [
    [{"role": "user", "content": "spell: cat"}, {"role": "assistant", "content": "c a t"}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
     {"role": "user", "content": "what is 2+2?"}, {"role": "assistant", "content": "4"}],
    [{"role": "user", "content": "reverse: ab"}, {"role": "assistant", "content": ""}],
]


def tokenizer():
    text = "".join(m["content"] for c in CONVERSATIONS for m in c)
    return CharTokenizer(sorted(set(text))).extended(special_tokens=chat.CHAT_TOKENS)


def shown(tok, ids, mask):
    """'<|user|>hi<|end|>' with the masked part in [brackets]: a row as a learner reads it."""
    out, inside = [], False
    for i, m in zip(ids, mask):
        if m and not inside:
            out.append("[")
        if not m and inside:
            out.append("]")
        inside = bool(m)
        out.append(tok.decode([i]))
    return "".join(out) + ("]" if inside else "")


def why(tok, messages, got_mask, want_ids, want_mask):
    """The usual mistake a wrong mask makes, in words."""
    got, want = np.array(got_mask), np.array(want_mask)
    ids = np.array(want_ids)
    user_text = np.zeros(len(ids), bool)
    pos = 0
    for m in messages:
        n = len(tok.encode(m["content"])) + 2
        if m["role"] == "user":
            user_text[pos:pos + n] = True
        pos += n
    if (got[user_text] == 1).any():
        return "it is 1 on the user's turn: the model is not trained to write what the user says"
    role = np.isin(ids, [tok.special_tokens[chat.ASSISTANT], tok.special_tokens[chat.USER]])
    if (got[role] == 1).any():
        return "it is 1 on <|assistant|>: the role's token is given (the prompt ends with it), never predicted"
    end = ids == tok.special_tokens[chat.END]
    if (got[end & (want == 1)] == 0).any():
        return "it is 0 on the assistant's <|end|>: the model must learn to stop, so its <|end|> is 1"
    if (got != want).any() and (np.roll(want, 1)[1:] == got[1:]).all():
        return "it is shifted by one: mask[t] says whether ids[t] is the assistant's, not ids[t + 1]"
    return "1 exactly on the assistant's text and its <|end|>"


def loss_mask_render(mod):
    render, tok = need(mod, "render"), tokenizer()
    for messages in CONVERSATIONS:
        want_ids, want_mask = chat.render(tok, messages)
        got = render(tok, messages)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise ExerciseFailure(f"render returned {type(got).__name__}, expected a tuple (ids, mask)")
        ids, mask = (list(map(int, a)) for a in got)
        turns = len(messages) // 2
        if ids != want_ids:
            raise ExerciseFailure(f"render of a {turns}-turn conversation: the ids are {tok.decode(ids)!r}, expected "
                                  f"{tok.decode(want_ids)!r} (each message: its role's token, its text, <|end|>)")
        if mask != want_mask:
            raise ExerciseFailure(f"render of a {turns}-turn conversation: your mask {shown(tok, ids, mask)!r} "
                                  f"(1 in brackets) should be {shown(tok, ids, want_mask)!r}: "
                                  f"{why(tok, messages, mask, want_ids, want_mask)}")


def loss_mask_targets(mod):
    targets, tok = need(mod, "targets"), tokenizer()
    for messages in CONVERSATIONS[:2]:
        ids, mask = chat.render(tok, messages)
        want_x = ids[:-1]
        want_y = [i if m else -1 for i, m in zip(ids[1:], mask[1:])]
        got = targets(list(ids), list(mask))
        x, y = (list(map(int, a)) for a in got)
        if x != want_x:
            raise ExerciseFailure(f"targets: x has {len(x)} ids, expected the {len(want_x)} ids but the last "
                                  "(the model reads ids[:-1] and predicts ids[1:])")
        if y == [i if m else 0 for i, m in zip(ids[1:], mask[1:])]:
            raise ExerciseFailure("targets: y is 0 where the mask is 0, but 0 is a token id that the loss would "
                                  "train on; write -1 there (the loss ignores -1)")
        if y == [i if m else -1 for i, m in zip(ids[1:], mask[:-1])]:
            raise ExerciseFailure("targets: y[t] is ids[t + 1] where mask[t] is 1, but the mask belongs to the "
                                  "id predicted: use mask[t + 1]")
        if y != want_y:
            raise ExerciseFailure(f"targets: y is {y}, expected {want_y}: ids[t + 1] where mask[t + 1] is 1, "
                                  "else -1")


def loss_mask_as_training_batches(mod):
    """render and targets together give the rows python -m train trains on for a conversation folder."""
    from data.conversations import rows
    from train.data import ConversationDataset
    render, targets, tok = need(mod, "render"), need(mod, "targets"), tokenizer()
    ids, masks = rows(tok, CONVERSATIONS)
    data = ConversationDataset({"train": ids, "val": ids}, {"train": masks, "val": masks}, tok, "check", None)
    x, y = data.get_batch("train", 6, ids.shape[1], np.random.default_rng(0))
    picked = np.random.default_rng(0).integers(0, len(ids), size=6)
    for row, k in enumerate(picked):
        got_x, got_y = targets(*render(tok, CONVERSATIONS[k]))
        n = len(got_y)
        if list(map(int, got_y)) != y[row, :n].tolist() or list(map(int, got_x)) != x[row, :n].tolist():
            raise ExerciseFailure("your render and targets do not give the row python -m train trains on for "
                                  f"conversation {k} (see train/data.py, ConversationDataset.get_batch)")


CHECKS = [loss_mask_render, loss_mask_targets, loss_mask_as_training_batches]
