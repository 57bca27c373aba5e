"""data/tasks.py: tasks with checkable answers, their splits, their checks and their files."""
import json
import subprocess
import sys

import pytest

from data import tasks


TEXT = """The quick brown fox jumps over the lazy dog. A fox, a dog and a cat sat by the river;
the cat was sleepy, the dog was hungry, and the quick fox ran along the muddy bank towards
the old mill, where seven geese and eleven ducks were swimming in the cold water. Thou'rt
welcome, said the miller, who baked bread and sold apples, pears, plums and cherries."""


def all_tasks(split_seed=0):
    return {name: tasks.make_task(name, TEXT, split_seed) for name in tasks.TASKS}


def words_in(conversations):
    return {c["messages"][0]["content"].rstrip("?").split()[-1] for c in conversations}


def test_words_are_distinct_lowercase_letters_within_the_lengths():
    words = tasks.words_of(TEXT)
    assert words == sorted(set(words))
    assert "thou" in words and "rt" in words and "a" not in words      # (one letter is too short)
    assert all(w.isalpha() and w.islower() and 2 <= len(w) <= 10 for w in words)
    assert "cherries" in words and "cherries" not in tasks.words_of(TEXT, max_len=7)


@pytest.mark.parametrize("name", tasks.TASKS)
def test_the_same_seeds_give_the_same_items_and_others_other_items(name):
    one, again = tasks.make_task(name, TEXT), tasks.make_task(name, TEXT)
    assert one.conversations("train", 30, seed=3) == again.conversations("train", 30, seed=3)
    assert one.conversations("train", 30, seed=3) != one.conversations("train", 30, seed=4)
    assert one.splits != tasks.make_task(name, TEXT, split_seed=1).splits


@pytest.mark.parametrize("name", tasks.TASKS)
def test_the_splits_are_80_20_and_share_nothing(name):
    task = all_tasks()[name]
    train, test = task.splits["train"], task.splits["test"]
    assert not set(train) & set(test)
    assert len(test) == round(0.2 * (len(train) + len(test)))


def test_no_test_word_appears_in_any_word_tasks_training_items():
    made = all_tasks()
    train_words = set().union(*(words_in(made[n].conversations("train", 200)) for n in tasks.WORD_TASKS))
    test_words = set().union(*(words_in(made[n].conversations("test", 200)) for n in tasks.WORD_TASKS))
    assert train_words and test_words and not train_words & test_words
    assert test_words == set(made["spell"].splits["test"])    # every test word is used before any repeats


def test_addition_keeps_both_orders_of_a_pair_on_one_side():
    task = tasks.Add()
    assert len(task.splits["train"]) + len(task.splits["test"]) == 100 * 101 // 2
    pairs = lambda split: {tuple(sorted(map(int, c["messages"][0]["content"][8:-1].split("+"))))   # noqa: E731
                           for c in task.conversations(split, 3000)}
    assert not pairs("train") & pairs("test")
    assert pairs("test") <= set(task.splits["test"])


def test_the_answers_are_right():
    made = all_tasks()
    for c in made["spell"].conversations("train", 50):
        word = c["messages"][0]["content"].removeprefix("spell: ")
        assert c["messages"][1]["content"].split(" ") == list(word)
    for c in made["reverse"].conversations("test", 20):
        assert c["messages"][1]["content"] == c["messages"][0]["content"].removeprefix("reverse: ")[::-1]
    counts = []
    for c in made["count"].conversations("train", 100):
        _, _, letter, _, word = c["messages"][0]["content"].rstrip("?").split(" ")
        counts.append(int(c["messages"][1]["content"]))
        assert counts[-1] == word.count(letter)
    assert 0 in counts and max(counts) >= 2
    orders = set()
    for c in made["add"].conversations("train", 50):
        a, b = map(int, c["messages"][0]["content"].removeprefix("what is ").rstrip("?").split("+"))
        assert int(c["messages"][1]["content"]) == a + b and a < 100 and b < 100
        orders.add(a < b)
    assert orders == {True, False}                       # the smaller number first, and last


def test_prompts_and_answers_are_short_and_in_the_chat_format():
    for name, task in all_tasks().items():
        for c in task.conversations("train", 100):
            assert [m["role"] for m in c["messages"]] == ["user", "assistant"] and list(c) == ["messages"]
            assert len(c["messages"][0]["content"]) + len(c["messages"][1]["content"]) <= 48, c
            assert task.in_format(c["messages"][1]["content"]), c


@pytest.mark.parametrize("name, right, wrong, other_form", [
    ("spell", "h e l l o", "h e l o", "hello"),
    ("count", "2", "3", "two"),
    ("reverse", "olleh", "hello", "o l l e h"),
    ("add", "57", "75", "57.0"),
])
def test_evaluate_reward_and_format(name, right, wrong, other_form):
    task = all_tasks()[name]
    conv = tasks.conversation("the question", right)
    assert task.evaluate(conv, right) == 1 and task.evaluate(conv, f"  {right}\n") == 1
    assert task.evaluate(conv, wrong) == 0 and task.evaluate(conv, "") == 0
    assert task.reward(conv, right) == 1.0 and task.reward(conv, wrong) == 0.0
    assert isinstance(task.reward(conv, right), float)
    assert task.in_format(right) and task.in_format(f" {wrong} ") and not task.in_format(other_form)
    assert not task.in_format("")


def test_spelling_with_dashes():
    task = tasks.Spell(tasks.words_of(TEXT), sep="-")
    c = task.conversations("test", 1)[0]
    assert "-" in c["messages"][1]["content"] and task.in_format(c["messages"][1]["content"])
    assert not task.in_format(c["messages"][1]["content"].replace("-", " "))


def test_a_conversation_without_an_answer_is_an_error():
    with pytest.raises(ValueError, match="no assistant message"):
        all_tasks()["add"].evaluate({"messages": [{"role": "user", "content": "what is 1+1?"}]}, "2")


def test_a_text_with_too_few_words_is_refused():
    with pytest.raises(ValueError, match="too few"):
        tasks.make_task("spell", "one two")


@pytest.mark.parametrize("name", tasks.TASKS)
def test_jsonl_round_trip(name, tmp_path):
    task = all_tasks()[name]
    path = tmp_path / f"{name}.jsonl"
    task.write_jsonl(path, "test", 25, seed=2)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 25 and all(json.loads(line)["messages"] for line in lines)
    back = tasks.read_jsonl(path)
    assert back == task.conversations("test", 25, seed=2)
    assert all(task.evaluate(c, c["messages"][-1]["content"]) == 1 for c in back)


def test_the_command_writes_a_split_and_says_what_is_wrong_in_one_line(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "reverse.jsonl"
    run = lambda *args: subprocess.run([sys.executable, "-m", "data.tasks", *args],   # noqa: E731
                                       capture_output=True, text=True)
    done = run("reverse", "--text", str(text), "--split", "test", "--n", "7", "--seed", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert tasks.read_jsonl(out) == tasks.make_task("reverse", TEXT).conversations("test", 7, seed=1)
    for args in (["spell", "--out", str(out)], ["add", "--n", "0", "--out", str(out)],
                 ["count", "--text", str(tmp_path / "missing.txt"), "--out", str(out)]):
        failed = run(*args)
        assert failed.returncode != 0 and len(failed.stderr.strip().splitlines()) == 1, failed.stderr
