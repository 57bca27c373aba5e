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

    python -m data.pairs --text input.txt --tasks spell,reverse --out_dir pairs

writes pairs/train.jsonl (from the train words) and pairs/test.jsonl (from the test words),
which python -m train --stage dpo --data pairs reads. DPO reads any file of pairs in TRL's
three forms too (read_pairs): standard (strings), conversational (message lists), and with an
implicit prompt (chosen and rejected whole conversations that begin alike).
"""
import json
import random
import sys
from pathlib import Path

from data.chat import check_messages, jsonl_objects
from data.tasks import TASKS, OneLineParser, make_task, reference, task_list


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


PAIR_FORMS = ('{"prompt": str, "chosen": str, "rejected": str} (standard), {"prompt": [messages], "chosen": '
              '[messages], "rejected": [messages]} (conversational), or {"chosen": [messages], "rejected": '
              '[messages]} (an implicit prompt: the messages they share)')


def as_messages(value, role):
    """A TRL field as a list of messages: a string is one message of ``role``."""
    return [{"role": role, "content": value}] if isinstance(value, str) else value


def normalized(row):
    """One pair in any of TRL's three preference forms -> {"prompt", "chosen", "rejected"}, each a
    list of messages; a ValueError (one line, without the file) where it is none of them.

    A string prompt is the user's message and a string answer the assistant's: DPO here tunes a
    chat model, which reads a question as a user's turn (TRL would feed a base model the raw
    strings). An implicit prompt (no "prompt") is the messages chosen and rejected begin with
    alike, as TRL's extract_prompt takes it."""
    if not isinstance(row, dict) or not all(isinstance(row.get(k), (str, list)) and row.get(k)
                                            for k in ("chosen", "rejected")):
        raise ValueError(f"a pair is {PAIR_FORMS}")
    chosen, rejected = as_messages(row["chosen"], "assistant"), as_messages(row["rejected"], "assistant")
    if "prompt" in row:
        if not isinstance(row["prompt"], (str, list)) or not row["prompt"]:
            raise ValueError(f"\"prompt\" is text or a list of messages; a pair is {PAIR_FORMS}")
        prompt = as_messages(row["prompt"], "user")
    else:
        if isinstance(row["chosen"], str) or isinstance(row["rejected"], str):
            raise ValueError("a pair without \"prompt\" has chosen and rejected as whole conversations (lists of "
                             "messages) that begin alike")
        shared = 0
        while shared < min(len(chosen), len(rejected)) - 1 and chosen[shared] == rejected[shared]:
            shared += 1
        if shared == 0:
            raise ValueError("chosen and rejected share no first message: without \"prompt\" they are whole "
                             "conversations that begin alike (the prompt)")
        prompt, chosen, rejected = chosen[:shared], chosen[shared:], rejected[shared:]
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def read_pairs(path):
    """The pairs of a JSONL file in any of TRL's three forms (PAIR_FORMS), each normalized to
    message lists with its "line" number; a ValueError in one line naming the file and line."""
    rows = []
    for i, row in jsonl_objects(path):
        try:
            pair = normalized(row)
            for part in ("chosen", "rejected"):
                first = pair[part][0]
                if isinstance(first, dict) and first.get("role") != "assistant":
                    raise ValueError(f"{part} begins with the {first.get('role')}'s message: an answer is the "
                                     "assistant's")
                check_messages(pair["prompt"] + pair[part])
        except ValueError as e:
            raise ValueError(f"{path} line {i}: {e}") from None
        rows.append({**pair, "line": i})
    if not rows:
        raise ValueError(f"{path}: no pairs")
    return rows


def identical(pairs):
    """The line numbers of the pairs whose chosen and rejected answers are the same (they train nothing)."""
    return [p["line"] for p in pairs if p["chosen"] == p["rejected"]]


def main(argv=None):
    parser = OneLineParser(prog="python -m data.pairs",
                           description="Write preference pairs (a correct answer, a near miss) for DPO.")
    parser.add_argument("--text", help="the text whose words the word tasks use (not needed for add alone)")
    parser.add_argument("--tasks", nargs="+", default=["spell,reverse"], metavar="TASK[,TASK]",
                        help=f"the tasks, separated by commas or spaces: {', '.join(TASKS)} (default spell,reverse)")
    parser.add_argument("--n", type=int, default=2000, help="train pairs per task (default 2000)")
    parser.add_argument("--n_test", type=int, default=400, help="test pairs per task (default 400)")
    parser.add_argument("--seed", type=int, default=0, help="the items' order and the near misses (default 0)")
    parser.add_argument("--split_seed", type=int, default=0,
                        help="which words (or pairs) are test ones (default 0, as python -m data.tasks)")
    parser.add_argument("--out_dir", required=True, help="the folder for train.jsonl and test.jsonl")
    args = parser.parse_args(argv)
    try:
        args.tasks = task_list(args.tasks)
    except ValueError as e:
        parser.error(f"--tasks: {e}")
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
