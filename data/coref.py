"""A generated corpus for the attention lesson's "it" experiment.

    the animal didn't cross the street because it was too tired . it = animal <eos>
    the animal didn't cross the street because it was too wide . it = street <eos>

"it" means the animal when the adjective describes animals (tired, hungry...)
and the place when it describes places (wide, icy...). The question "it = ?"
comes after the adjective, so a causal (left-to-right) model has seen
everything it needs when it predicts the answer. A second template puts the
place first, so the answer's position alone does not give it away.

Two more templates put the "because" clause first:

    because it was too tired , the animal didn't cross the street . it = animal <eos>

There the adjective comes before the nouns. A causal model's word sees only
the words before it, so the adjective cannot pick the noun itself: the
choice has to be made later, by attention from "=". With only the first two
templates a model can instead pick the noun with a head at the adjective,
and then merely copy its pick from there to "=".

The test split holds (noun, adjective) combinations never seen in training,
e.g. "dog" with "hungry": the model must have learned the rule, not the pairs.
Every word still appears in training.

    python data/coref.py [--seed N] [--out FILE]
"""
import argparse
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

ANIMALS = ("animal", "dog", "cat", "horse", "cow", "fox", "sheep", "goat",
           "pig", "rabbit", "deer", "wolf", "bear", "mouse")
PLACES = ("street", "river", "road", "bridge", "field", "lake", "valley",
          "hill", "path", "canal", "stream", "highway", "square", "track")
# Each adjective fits one kind of noun only. Words that fit both were left out
# on purpose ("old": an old bridge; "busy": a busy dog).
ANIMAL_ADJECTIVES = ("tired", "hungry", "scared", "sleepy", "lazy", "weak", "timid")
PLACE_ADJECTIVES = ("wide", "icy", "long", "muddy", "steep", "flooded", "crowded")

TEMPLATES = (
    "the {animal} didn't cross the {place} because it was too {adjective} . it = {referent}",
    "the {place} was not crossed by the {animal} because it was too {adjective} . it = {referent}",
    "because it was too {adjective} , the {animal} didn't cross the {place} . it = {referent}",
    "because it was too {adjective} , the {place} was not crossed by the {animal} . it = {referent}",
)
EOS = "<eos>"   # ends every sentence, so a stream of sentences is well delimited

# The lesson's two sentences use these pairs: they are never held out.
LESSON_PAIRS = frozenset({("animal", "tired"), ("street", "wide")})


@dataclass
class Example:
    """One sentence, its parts and where the answer is."""
    words: list          # every token, ending with "=", the answer and EOS
    animal: str
    place: str
    adjective: str
    referent: str        # what "it" means: the animal or the place
    template: int        # index into TEMPLATES
    answer_index: int    # words[answer_index] == referent (the token after "=")
    it_index: int        # position of the pronoun "it" in the sentence body

    @property
    def text(self):
        return " ".join(self.words)


@dataclass
class Corpus:
    """Train and test sentences, the vocabulary and the held-out pairs."""
    train: list
    test: list
    vocab: list                                          # sorted words
    heldout_pairs: list = field(default_factory=list)    # sorted (noun, adjective)
    seed: int = 0


def kind_of(adjective):
    """'animal' or 'place': the kind of noun this adjective fits."""
    if adjective in ANIMAL_ADJECTIVES:
        return "animal"
    if adjective in PLACE_ADJECTIVES:
        return "place"
    raise ValueError(f"unknown adjective {adjective!r}")


def make_example(animal, place, adjective, template=0):
    """Build one sentence from its parts."""
    referent = animal if kind_of(adjective) == "animal" else place
    sentence = TEMPLATES[template].format(animal=animal, place=place,
                                          adjective=adjective, referent=referent)
    words = sentence.split() + [EOS]
    return Example(words=words, animal=animal, place=place, adjective=adjective,
                   referent=referent, template=template,
                   answer_index=words.index("=") + 1, it_index=words.index("it"))


LESSON_SENTENCES = [make_example("animal", "street", "tired"),
                    make_example("animal", "street", "wide")]


def all_words():
    """Every word any sentence can use, sorted."""
    words = {EOS, *ANIMALS, *PLACES, *ANIMAL_ADJECTIVES, *PLACE_ADJECTIVES}
    for template in TEMPLATES:
        words.update(w for w in template.split() if not w.startswith("{"))
    return sorted(words)


def choose_heldout(rng, nouns, adjectives):
    """Hold out one adjective per noun, each adjective about equally often.

    Every noun keeps all its other adjectives in training and every adjective
    keeps most of its nouns, so each word still appears in training.
    """
    while True:   # reshuffle (deterministically) until no lesson pair is held out
        cycle = [adjectives[i % len(adjectives)] for i in range(len(nouns))]
        rng.shuffle(cycle)
        pairs = set(zip(nouns, cycle))
        if not pairs & LESSON_PAIRS:
            return pairs


def sample(rng, items, n):
    """n items: distinct ones while there are enough, then repeats."""
    items = list(items)
    rng.shuffle(items)
    if n <= len(items):
        return items[:n]
    return items + rng.choices(items, k=n - len(items))


def make_corpus(seed=0, n_train=4000, n_test=500):
    """Generate the corpus; the same seed always gives the same corpus."""
    if n_train < 0 or n_test < 0:
        raise ValueError(f"n_train and n_test must be >= 0, got {n_train} and {n_test}")
    rng = random.Random(seed)
    heldout = (choose_heldout(rng, ANIMALS, ANIMAL_ADJECTIVES)
               | choose_heldout(rng, PLACES, PLACE_ADJECTIVES))
    train, test = [], []
    for template in range(len(TEMPLATES)):
        for animal in ANIMALS:
            for place in PLACES:
                for adjective in ANIMAL_ADJECTIVES + PLACE_ADJECTIVES:
                    ex = make_example(animal, place, adjective, template)
                    split = test if (ex.referent, adjective) in heldout else train
                    split.append(ex)
    return Corpus(train=sample(rng, train, n_train), test=sample(rng, test, n_test),
                  vocab=all_words(), heldout_pairs=sorted(heldout), seed=seed)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Write the generated 'it' corpus as text.")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--n-train", type=int, default=4000, help="training sentences")
    parser.add_argument("--n-test", type=int, default=500, help="test sentences")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "coref.txt"),
                        metavar="FILE", help="one sentence a line: train, a blank line, test "
                                             "(default: data/coref.txt)")
    args = parser.parse_args(argv)
    if args.n_train < 1 or args.n_test < 1:
        print("error: --n-train and --n-test must be at least 1", file=sys.stderr)
        return 1
    corpus = make_corpus(args.seed, args.n_train, args.n_test)
    lines = [ex.text for ex in corpus.train] + [""] + [ex.text for ex in corpus.test]
    try:
        Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    except OSError as e:
        print(f"error: cannot write {args.out}: {e.strerror}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: {len(corpus.train)} train and {len(corpus.test)} test sentences, "
          f"{len(corpus.vocab)} words, {len(corpus.heldout_pairs)} held-out pairs")
    print("held out:", ", ".join(f"{n}+{a}" for n, a in corpus.heldout_pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
