"""Exercise 19 (EXERCISES.md, "the assistant"): write the loss mask of a conversation, and the
targets a batch row trains on.

    python -m exercises loss_mask

A conversation is a list of messages {"role": "user" or "assistant", "content": text}.
``tokenizer.encode(text)`` gives a text's ids; ``tokenizer.special_tokens`` maps
"<|user|>", "<|assistant|>" and "<|end|>" to their ids.
"""

USER, ASSISTANT, END = "<|user|>", "<|assistant|>", "<|end|>"


def render(tokenizer, messages):
    """A conversation -> (ids, mask), two lists of the same length.

    Each message is its role's token, its text's ids, then <|end|>:
        <|user|>spell: cat<|end|><|assistant|>c a t<|end|>
    mask is 1 where the id is one the assistant writes (its text and its <|end|>), 0 elsewhere.
    """
    raise NotImplementedError


def targets(ids, mask):
    """One row of a batch from a rendered conversation: (x, y), each len(ids) - 1 long.

    x is what the model reads (ids but the last); y[t] is the id it must predict after x[:t + 1]
    where the mask says that id is trained on, else -1 (the loss ignores -1).
    """
    raise NotImplementedError
