"""Small tasks whose answers a program can check: the material for turning a language
model into a small assistant (supervised fine-tuning, preferences, RL with a 0/1 reward).

    spell    user: spell: hello             assistant: h e l l o
    count    user: how many l in hello?     assistant: 2
    reverse  user: reverse: hello           assistant: olleh
    add      user: what is 45+12?           assistant: 57

Each item is a conversation, as TRL and nanochat read them (one JSON object a line):

    {"messages": [{"role": "user", "content": "spell: hello"},
                  {"role": "assistant", "content": "h e l l o"}]}

The word tasks take their words from a text. Words are split 80/20 into train and test
by a split seed, the same way for every word task, so no test item's word is seen in
training, in any of the tasks. Addition splits its operand pairs instead, {a, b} as one pair, so
that 12+45 and 45+12 fall on the same side. Items are deterministic by seed (a second
seed, of their order and choices, which does not move the split).

A task checks an answer by exact match after stripping spaces at both ends:
``task.evaluate(conversation, answer_text)`` is 0 or 1 (``task.reward`` the same as a
float, for RL), and ``task.in_format(answer_text)`` says whether an answer at least has
the right form (letters for reverse, digits for count and add), for a "format rate".

    python -m data.tasks spell --text input.txt --split train --n 1000 --out spell_train.jsonl
"""
import json
import random
import re
import string
import sys
from pathlib import Path

from .cli import OneLineParser

TEST_FRACTION = 0.2


def words_of(text, min_len=2, max_len=10):
    """The distinct words of ``text``, lowercased, made of the letters a-z only, sorted.
    ("Thou'rt" gives "thou" and "rt"; words shorter than min_len or longer than max_len
    are left out, so every prompt and answer stays short.)"""
    return sorted({w for w in re.findall(r"[a-z]+", text.lower()) if min_len <= len(w) <= max_len})


def split(material, seed=0, test_fraction=TEST_FRACTION):
    """{"train": [...], "test": [...]}: ``material`` (distinct items) shuffled by ``seed``,
    the last ``test_fraction`` of it the test split. The same material and seed always give
    the same split."""
    items = sorted(material)
    random.Random(seed).shuffle(items)
    n_test = round(len(items) * test_fraction)
    if n_test == 0 or n_test == len(items):
        raise ValueError(f"{len(items)} distinct items are too few for an {1 - test_fraction:.0%}/"
                         f"{test_fraction:.0%} split (a longer text gives more words)")
    return {"train": items[:len(items) - n_test], "test": items[len(items) - n_test:]}


def conversation(question, answer):
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


def reference(conv):
    """The answer a conversation holds: its last assistant message."""
    for message in reversed(conv["messages"]):
        if message["role"] == "assistant":
            return message["content"]
    raise ValueError("the conversation has no assistant message to check an answer against")


class Task:
    """One kind of question. A subclass says how to ask about one item of its material
    (``make``) and what an answer looks like (``answer_format``, a regular expression)."""

    name = ""
    answer_format = ""

    def __init__(self, material, split_seed=0):
        self.splits = split(material, split_seed)

    def make(self, item, rng):
        """(question, answer) about ``item``; ``rng`` for any choice the question makes."""
        raise NotImplementedError

    def conversations(self, split_name, n, seed=0):
        """``n`` conversations from one split. Each item of the split is used once before
        any is used again; ``seed`` gives the order (and every choice within an item)."""
        if split_name not in self.splits:
            raise ValueError(f"split must be 'train' or 'test', got {split_name!r}")
        rng = random.Random(f"{self.name}:{split_name}:{seed}")
        out, order = [], []
        while len(out) < n:
            if not order:
                order = list(self.splits[split_name])
                rng.shuffle(order)
            out.append(conversation(*self.make(order.pop(), rng)))
        return out

    def evaluate(self, conv, answer_text):
        """1 if ``answer_text`` is the conversation's answer (spaces at either end aside), else 0."""
        return int(answer_text.strip() == reference(conv).strip())

    def reward(self, conv, answer_text):
        """evaluate's 0 or 1 as a float: the reward for RL."""
        return float(self.evaluate(conv, answer_text))

    def in_format(self, answer_text):
        """Whether the answer has the form of one (right or wrong): the "format rate"."""
        return re.fullmatch(self.answer_format, answer_text.strip()) is not None

    def write_jsonl(self, path, split_name, n, seed=0):
        """Write ``n`` conversations of one split to ``path``, one JSON object a line."""
        with open(path, "w", encoding="utf-8") as f:
            for conv in self.conversations(split_name, n, seed):
                f.write(json.dumps(conv) + "\n")


def read_jsonl(path):
    """The conversations of a JSONL file, as write_jsonl wrote them."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class Spell(Task):
    """spell: hello -> h e l l o (the letters with ``sep`` between them)."""

    name = "spell"

    def __init__(self, words, split_seed=0, sep=" "):
        super().__init__(words, split_seed)
        self.sep = sep
        self.answer_format = f"[a-z]({re.escape(sep)}[a-z])*"

    def make(self, word, rng):
        return f"spell: {word}", self.sep.join(word)


class CountLetter(Task):
    """how many l in hello? -> 2. The letter is one of the word's three times in four,
    else any letter (so 0 is an answer too)."""

    name = "count"
    answer_format = r"[0-9]+"

    def make(self, word, rng):
        letter = rng.choice(word) if rng.random() < 0.75 else rng.choice(string.ascii_lowercase)
        return f"how many {letter} in {word}?", str(word.count(letter))


class Reverse(Task):
    """reverse: hello -> olleh"""

    name = "reverse"
    answer_format = "[a-z]+"

    def make(self, word, rng):
        return f"reverse: {word}", word[::-1]


class Add(Task):
    """what is 45+12? -> 57, for two numbers below ``limit``. The material is the pairs
    {a, b} (a <= b); each question puts the pair in a random order."""

    name = "add"
    answer_format = r"[0-9]+"

    def __init__(self, split_seed=0, limit=100):
        super().__init__([(a, b) for a in range(limit) for b in range(a, limit)], split_seed)

    def make(self, pair, rng):
        a, b = pair if rng.random() < 0.5 else pair[::-1]
        return f"what is {a}+{b}?", str(a + b)


WORD_TASKS = {"spell": Spell, "count": CountLetter, "reverse": Reverse}
TASKS = [*WORD_TASKS, "add"]


def task_list(values):
    """Task names as a flag gives them, separated by commas, spaces or both ("spell,reverse",
    "spell reverse", or argparse's list of either) -> the list of names; a ValueError in one line
    naming what is not a task, or a task given twice."""
    if isinstance(values, str):
        values = [values]
    names = [n for value in values for n in re.split(r"[,\s]+", value) if n]
    unknown = [n for n in names if n not in TASKS]
    if unknown or not names or len(set(names)) != len(names):
        what = f"{unknown[0]!r} is not a task" if unknown else "a task is given twice" if names else "no task given"
        raise ValueError(f"{what}: the tasks are {', '.join(TASKS)}, each once, separated by commas or spaces")
    return names


def make_task(name, text=None, split_seed=0):
    """A task by name; the word tasks take their words from ``text``."""
    if name == "add":
        return Add(split_seed)
    if name not in WORD_TASKS:
        raise ValueError(f"unknown task {name!r} (one of {', '.join(TASKS)})")
    if text is None:
        raise ValueError(f"the {name} task needs a text to take its words from")
    return WORD_TASKS[name](words_of(text), split_seed)


def main(argv=None):
    parser = OneLineParser(prog="python -m data.tasks",
                           description="Write conversations of one task's train or test split as JSONL.")
    parser.add_argument("task", choices=TASKS)
    parser.add_argument("--text", help="the text whose words the word tasks use (not needed for add)")
    parser.add_argument("--split", choices=["train", "test"], default="train")
    parser.add_argument("--n", type=int, default=1000, help="how many conversations")
    parser.add_argument("--seed", type=int, default=0, help="the items' order and choices (default 0)")
    parser.add_argument("--split_seed", type=int, default=0,
                        help="which words (or pairs) are test ones (default 0; keep it for train and test files)")
    parser.add_argument("--out", required=True, help="the JSONL file to write")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error(f"--n must be at least 1, got {args.n}")
    if args.task != "add" and args.text is None:
        parser.error(f"the {args.task} task needs --text FILE, the text whose words it uses")
    try:
        text = None if args.text is None else Path(args.text).read_text(encoding="utf-8")
        task = make_task(args.task, text, args.split_seed)
        task.write_jsonl(args.out, args.split, args.n, args.seed)
    except OSError as e:
        parser.exit(1, f"{parser.prog}: error: {e.filename}: {e.strerror}\n")
    except ValueError as e:
        parser.exit(1, f"{parser.prog}: error: {e}\n")
    print(f"wrote {args.n} {args.task} conversations ({args.split}) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
