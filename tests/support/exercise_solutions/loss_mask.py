"""Exercise 19 (EXERCISES.md): the loss mask of a conversation, and a row's targets."""

USER, ASSISTANT, END = "<|user|>", "<|assistant|>", "<|end|>"
ROLES = {"user": USER, "assistant": ASSISTANT}


def render(tokenizer, messages):
    ids, mask = [], []
    for m in messages:
        said = [tokenizer.special_tokens[ROLES[m["role"]]], *tokenizer.encode(m["content"]),
                tokenizer.special_tokens[END]]
        ids += said
        trained = 1 if m["role"] == "assistant" else 0
        mask += [0] + [trained] * (len(said) - 1)       # the role's token is given, never predicted
    return ids, mask


def targets(ids, mask):
    x = list(ids[:-1])
    y = [i if m == 1 else -1 for i, m in zip(ids[1:], mask[1:])]   # the target at t is ids[t + 1]
    return x, y
