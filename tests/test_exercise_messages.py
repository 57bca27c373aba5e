"""Tried as a new learner would: each typical wrong answer (tests/exercise_wrong_answers.py)
fails its exercise, and the first failure says what is wrong in the exercise's terms."""
import pytest

from exercises.checks import run_check
from exercise_wrong_answers import WRONG
from exercises.progress import BY_NAME

CASES = [(name, what, module, words) for name, answers in WRONG.items() for what, module, words in answers]


def first_failure(name, module):
    for check in BY_NAME[name].checks:
        outcome, message = run_check(check, module)
        if outcome == "fail":
            return message
        assert outcome == "pass", f"{check.__name__} skipped on a finished (wrong) answer: {message}"
    return None


@pytest.mark.parametrize("name, what, module, words", CASES, ids=[f"{c[0]}: {c[1]}" for c in CASES])
def test_a_typical_wrong_answer_gets_a_useful_message(name, what, module, words):
    message = first_failure(name, module)
    assert message is not None, f"{name}: the wrong answer '{what}' passes every check"
    missing = [w for w in (words if isinstance(words, tuple) else (words,)) if w not in message]
    assert not missing, f"{name}: for '{what}' the first failure lacks {missing}: {message}"
    assert "[[" not in message and "array(" not in message, f"the message dumps an array: {message}"
    assert len(message.splitlines()) == 1, f"the message is not one line: {message}"


def test_every_exercise_of_part_two_has_wrong_answers():
    part_two = [e.name for e in BY_NAME.values() if e.number > 4]
    assert set(part_two) <= set(WRONG) <= set(BY_NAME)
