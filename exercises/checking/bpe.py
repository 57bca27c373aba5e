"""The checks of exercise 18 (EXERCISES.md): write BPE.

The learner's pair count and merge are checked on small cases, then training and
encoding against the library's (tinyattn.tokenizers.bpe) on a generated text the
learner does not see: the same merges, in the same order, and the same ids.
"""
import collections
import random
import re

from tinyattn.tokenizers import bpe as library

from .common import ExerciseFailure, need

# a simple split (words with their leading space, numbers, punctuation runs, spaces):
# the checks hand pieces to train(), so the exercise does not need the regex module
SPLIT = re.compile(r" ?[^\W\d_]+| ?\d+| ?[^\w\s]+|\s+")


def hidden_text(seed=17, n_words=1500):
    rng = random.Random(seed)
    syllables = ["th", "e", "an", "re", "on", "at", "en", "nd", "st", "es", "or", "te", "of", "ed", "is"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(120)]
    out = []
    for _ in range(n_words):
        w = rng.choice(words[:rng.randint(1, len(words))])             # earlier words more often
        out.append(w.capitalize() if rng.random() < 0.1 else w)
        out.append(rng.choice([" ", " ", " ", ", ", ". ", "\n", " 42 ", "  "]))
    return "".join(out)


def pieces_of(text):
    return [p.encode("utf-8") for p in SPLIT.findall(text)]


def expect(got, want, what, hint=""):
    if got != want:
        raise ExerciseFailure(f"{what}: you give {short(got)}, expected {short(want)}. {hint}".strip())


def short(x, n=120):
    s = repr(x)
    return s if len(s) <= n else s[:n] + "..."


def bpe_pair_counts(mod):
    pair_counts = need(mod, "pair_counts")
    got = pair_counts([[1, 2, 3], [1, 2], [3], [2, 3, 2, 3]])
    expect(dict(got), {(1, 2): 2, (2, 3): 3, (3, 2): 1}, "pair_counts of the words [1, 2, 3], [1, 2], [3], [2, 3, 2, 3]",
           "Count each adjacent pair inside each word, never across two words.")
    expect(list(got), [(1, 2), (2, 3), (3, 2)], "the order of pair_counts' keys",
           "Keep the order in which pairs are first met: it decides ties in train.")


def bpe_merge(mod):
    merge = need(mod, "merge")
    for ids, pair, want in [([5, 6, 5, 6, 7], (5, 6), [300, 300, 7]), ([1, 1, 1], (1, 1), [300, 1]),
                            ([1, 1, 1, 1], (1, 1), [300, 300]), ([7, 5], (5, 6), [7, 5]), ([], (5, 6), []),
                            ([5, 6], (6, 5), [5, 6])]:
        expect(merge(list(ids), pair, 300), want, f"merge({ids}, {pair}, 300)",
               "Scan from the left; after a match skip both ids, so [1, 1, 1] gives [300, 1].")


def bpe_train(mod):
    train = need(mod, "train")
    pieces = pieces_of(hidden_text())
    want = library.train_merges(collections.Counter(pieces), 400)[1]
    got = train(list(pieces), 400)
    if not isinstance(got, dict):
        raise ExerciseFailure(f"train returned a {type(got).__name__}, expected a dict {{token bytes: id}}")
    ours = sorted(got.items(), key=lambda kv: kv[1])
    for i, tok in enumerate(want):
        if i >= len(ours) or ours[i] != (tok, i):
            got_i = ours[i] if i < len(ours) else "nothing"
            hint = ("The first 256 are the bytes: bytes([b]) -> b." if i < 256 else
                    "The most frequent pair wins; of equally frequent ones, the one met first in the text "
                    "(max over pair_counts' dict keeps it). Recount after every merge.")
            raise ExerciseFailure(f"train on the hidden text, token {i}: you give {short(got_i)}, "
                                  f"expected {short((tok, i))}. {hint}")
    if len(ours) != len(want):
        raise ExerciseFailure(f"train on the hidden text made {len(ours)} tokens, expected {len(want)} "
                              "(stop at vocab_size)")


def bpe_encode(mod):
    encode = need(mod, "encode")
    ranks = {bytes([b]): b for b in range(256)}
    ranks.update({b"bc": 256, b"ab": 257, b"abc": 258})
    expect(encode(b"abc", ranks), [258], "encode(b'abc') with bc=256, ab=257, abc=258",
           "Join the pair of lowest id first: bc (256), then a+bc (258).")
    ranks = {bytes([b]): b for b in range(256)}
    ranks.update({b"bc": 256, b"ab": 257})
    expect(encode(b"abc", ranks), [ord("a"), 256], "encode(b'abc') with bc=256, ab=257",
           "Join the pair of lowest id first (bc), not the leftmost (ab): then nothing joins a+bc.")
    expect(encode(b"", ranks), [], "encode(b'')")
    ranks = {bytes([b]): b for b in range(256)}
    ranks.update({b"aa": 256})
    expect(encode(b"aaa", ranks), [256, ord("a")], "encode(b'aaa') with aa=256",
           "Both pairs are aa (256): of equal ids join the leftmost, as the library does, giving [256, 97].")
    pieces = pieces_of(hidden_text())
    ranks = {tok: i for i, tok in enumerate(library.train_merges(collections.Counter(pieces), 400)[1])}
    for piece in dict.fromkeys(pieces_of(hidden_text(seed=71))):
        expect(encode(piece, ranks), library.encode_piece(piece, ranks), f"encode({piece!r}) with the hidden text's ranks",
               "Join the pair of lowest id first, the leftmost of equal ones; repeat until no pair joins.")


CHECKS = [bpe_pair_counts, bpe_merge, bpe_train, bpe_encode]
