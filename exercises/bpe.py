"""Exercise 18 (EXERCISES.md): write BPE, the tokenizer of GPT-2: the pair count, the merge,
training, and encoding by rank.

    python -m exercises bpe

Tokens are ints. A piece of text (a word with its leading space, say) starts as its
UTF-8 bytes, ids 0..255; each merge learned makes one new id, 256, 257, ...
"""


def pair_counts(words):
    """How often each adjacent pair occurs: {(a, b): count}, over words (lists of ids).

    The dict's order is the order in which each pair is first met (words in order,
    left to right in each): a plain dict keeps it.
    pair_counts([[1, 2, 3], [1, 2]]) -> {(1, 2): 2, (2, 3): 1}
    """
    raise NotImplementedError


def merge(ids, pair, new_id):
    """ids with each occurrence of pair replaced by new_id, from the left.

    merge([5, 6, 5, 6, 7], (5, 6), 300) -> [300, 300, 7];  merge([1, 1, 1], (1, 1), 300) -> [300, 1]
    """
    raise NotImplementedError


def train(pieces, vocab_size):
    """Learn merges from pieces (a list of bytes, the text split, in order, repeats kept)
    until there are vocab_size tokens, or no pair is left. Returns ranks: {token bytes: id},
    with bytes([b]) -> b for the 256 bytes, then each new token in the order learned.

    Each step: count the pairs over all pieces, merge the most frequent into a new id
    everywhere. Ties go to the pair met first (max over a dict in first-met order does
    that). A token's bytes are its two parts' bytes joined.
    """
    raise NotImplementedError


def encode(piece, ranks):
    """One piece's bytes -> ids: start from single bytes, and while some adjacent pair
    joins into a token of ranks, join the pair whose token has the lowest id (the
    leftmost of equals). Returns [ranks[part] for each part].
    """
    raise NotImplementedError
