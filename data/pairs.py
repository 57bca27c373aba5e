"""Preference pairs for DPO: a task's question with a correct answer and a near miss.

    {"prompt": [{"role": "user", "content": "reverse: hello"}],
     "chosen": [{"role": "assistant", "content": "olleh"}],
     "rejected": [{"role": "assistant", "content": "olelh"}]}

One JSON object a line, in TRL's format for DPO. The rejected answer is a near miss of the
correct one, the kind of mistake a model that almost knows the task makes: for spell and
reverse two neighbouring letters swapped, one letter dropped or one repeated; for count
and add the number one off. A near miss teaches more than a random wrong answer: the two
answers share most of their tokens, so the preference is about the few that differ.

The words (and addition's operand pairs) are split into train and test as data/tasks.py
splits them, so no test pair's word is in a train pair:

    python -m data.pairs --text input.txt --tasks spell reverse --out_dir pairs

writes pairs/train.jsonl (from the train words) and pairs/test.jsonl (from the test words),
which python -m train --stage dpo --data pairs reads.
"""
import json
import random
import sys
from pathlib import Path

from data.chat import jsonl_objects
from data.tasks import TASKS, OneLineParser, make_task, reference


def near_miss_letters(letters, rng):
    """A list of letters one small edit away from ``letters`` (never equal to it): two
    neighbours that differ swapped, one letter dropped, or one letter repeated."""
    swaps = [i for i in range(len(letters) - 1) if letters[i] != letters[i + 1]]
    edits = ["drop", "repeat"] + (["swap"] if swaps else [])
    edit = rng.choice(edits) if len(letters) > 1 else "repeat"
    out = list(letters)
    if edit == "swap":
        i = rng.choice(swaps)
        out[i], out[i + 1] = out[i + 1], out[i]
    elif edit == "drop":
        del out[rng.randrange(len(out))]
    else:
        i = rng.randrange(len(out))
        out.insert(i, out[i])
    return out


def near_miss(task, answer, rng):
    """A wrong answer close to the correct ``answer`` of ``task`` (see the module's docstring)."""
    if task.name == "spell":
        return task.sep.join(near_miss_letters(answer.split(task.sep), rng))
    if task.name == "reverse":
        return "".join(near_miss_letters(list(answer), rng))
    if task.name in ("count", "add"):
        n = int(answer)
        return str(n + 1 if n == 0 or rng.random() < 0.5 else n - 1)
    raise ValueError(f"no near miss for the {task.name} task")


def pairs(task, split_name, n, seed=0):
    """``n`` preference pairs of one split of ``task``, as dicts in TRL's format."""
    rng = random.Random(f"pairs:{task.name}:{split_name}:{seed}")
    out = []
    for conv in task.conversations(split_name, n, seed):
        answer = reference(conv)
        out.append({"prompt": conv["messages"][:-1],
                    "chosen": [{"role": "assistant", "content": answer}],
                    "rejected": [{"role": "assistant", "content": near_miss(task, answer, rng)}]})
    return out


def write_pairs(folder, text, task_names, n_train, n_test, seed=0, split_seed=0):
    """train.jsonl and test.jsonl in ``folder``: n_train (n_test) pairs of each task, shuffled
    together. -> {split: number of pairs written}."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for split_name, n in (("train", n_train), ("test", n_test)):
        rows = [p for name in task_names for p in pairs(make_task(name, text, split_seed), split_name, n, seed)]
        random.Random(f"pairs:{split_name}:{seed}").shuffle(rows)
        with open(folder / f"{split_name}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        written[split_name] = len(rows)
    return written


def read_pairs(path):
    """The pairs of a JSONL file, each checked for its three keys (a ValueError in one line)."""
    rows = []
    for i, row in jsonl_objects(path):
        if not isinstance(row, dict) or not all(isinstance(row.get(k), list) and row.get(k)
                                                for k in ("prompt", "chosen", "rejected")):
            raise ValueError(f"{path} line {i}: a pair is {{\"prompt\": [messages], \"chosen\": [message], "
                             "\"rejected\": [message]}")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no pairs")
    return rows


def main(argv=None):
    parser = OneLineParser(prog="python -m data.pairs",
                           description="Write preference pairs (a correct answer, a near miss) for DPO.")
    parser.add_argument("--text", help="the text whose words the word tasks use (not needed for add alone)")
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=["spell", "reverse"])
    parser.add_argument("--n", type=int, default=2000, help="train pairs per task (default 2000)")
    parser.add_argument("--n_test", type=int, default=400, help="test pairs per task (default 400)")
    parser.add_argument("--seed", type=int, default=0, help="the items' order and the near misses (default 0)")
    parser.add_argument("--split_seed", type=int, default=0,
                        help="which words (or pairs) are test ones (default 0, as python -m data.tasks)")
    parser.add_argument("--out_dir", required=True, help="the folder for train.jsonl and test.jsonl")
    args = parser.parse_args(argv)
    for name in ("n", "n_test"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.text is None and any(t != "add" for t in args.tasks):
        parser.error("the word tasks need --text FILE, the text whose words they use")
    try:
        text = None if args.text is None else Path(args.text).read_text(encoding="utf-8")
        written = write_pairs(args.out_dir, text, args.tasks, args.n, args.n_test, args.seed, args.split_seed)
    except OSError as e:
        parser.exit(1, f"{parser.prog}: error: {e.filename}: {e.strerror}\n")
    except ValueError as e:
        parser.exit(1, f"{parser.prog}: error: {e}\n")
    print(f"wrote {written['train']} train and {written['test']} test pairs ({', '.join(args.tasks)}) "
          f"to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
