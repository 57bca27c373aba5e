"""Tried as a new learner would: each typical wrong answer (tests/support/exercise_wrong_answers.py)
fails its exercise, and the first failure says what is wrong in the exercise's terms."""
import re
import types

import numpy as np
import pytest

from exercises.checking.common import ExerciseFailure, compare, run_check
from exercises.checking.common import strict_advice
from exercise_wrong_answers import GRADIENT_KIND, NOT_DIFFERENTIABLE, WRONG
from exercises.checking.progress import BY_NAME

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
    for given, expected in re.findall(r"you give (-?[0-9][0-9.e+-]*), expected (-?[0-9][0-9.e+-]*)", message):
        assert given.rstrip(".") != expected.rstrip("."), f"the message rounds the difference away: {message}"


def test_a_message_shows_both_numbers_to_the_digits_that_differ():
    """Exercise 21 once said 'you give 2, expected 2 (largest error 5e-08)'."""
    with pytest.raises(ExerciseFailure) as failure:
        compare(np.array([[0.8 / (0.4 + 1e-8)]]), np.array([[2.0]]), "the advantages")
    message = str(failure.value)
    assert "you give 1.99999995, expected 2 (an error of 5e-08 where 3e-10 is allowed)" in message, message
    with pytest.raises(ExerciseFailure) as failure:
        compare(np.array([1.0, 5.0]), np.array([1.0, 2.0]), "x", why="the reason")
    assert "you give 5, expected 2 (an error of 3 where 3e-10 is allowed: the reason)" in str(failure.value)


def _std_plus(eps, under_the_root=False):
    def group_advantages(rewards, normalize=False):
        rewards = np.asarray(rewards, dtype=np.float64)
        out = rewards - rewards.mean(1, keepdims=True)
        if not normalize:
            return out
        return out / (np.sqrt(rewards.var(1, keepdims=True) + eps) if under_the_root
                      else rewards.std(1, keepdims=True) + eps)
    return types.SimpleNamespace(group_advantages=group_advantages)


@pytest.mark.parametrize("eps, under_the_root", [(1e-8, False), (1e-6, False), (1e-4, False), (1e-8, True)])
def test_an_eps_added_to_the_std_passes_exercise_21(eps, under_the_root):
    """GRPO code divides by std + 1e-8 (1e-6, 1e-4): a numerical guard, not a mistake, so it passes."""
    module = _std_plus(eps, under_the_root)
    for check in BY_NAME["group_advantages"].checks:
        assert run_check(check, module) == ("pass", ""), check.__name__


def test_every_exercise_of_part_two_has_wrong_answers():
    part_two = [e.name for e in BY_NAME.values() if e.number > 4]
    assert set(part_two) <= set(WRONG) <= set(BY_NAME)


def test_every_differentiable_exercise_has_a_wrong_answer_of_the_gradient_kind():
    """Right values, wrong gradient: such an answer must fail, and say it is the gradient that is wrong
    (exercise 20 once passed one, its checks comparing values only)."""
    assert set(GRADIENT_KIND) | set(NOT_DIFFERENTIABLE) == set(BY_NAME)
    assert not set(GRADIENT_KIND) & set(NOT_DIFFERENTIABLE)
    for name, whats in GRADIENT_KIND.items():
        answers = {what: module for what, module, _ in WRONG.get(name, [])}
        assert whats and set(whats) <= set(answers), f"{name}: {set(whats) - set(answers)} not in WRONG"
        for what in whats:
            message = first_failure(name, answers[what])
            about_gradients = re.search(r"gradient|backward|\.grad\b|\bd[A-Zxw]", message or "")   # dx, dQ, dweight
            assert about_gradients, f"{name}, {what}: {message}"


def _strict_error(make):
    """The exception array_api_strict raises for make(xp, an array on its stand-in GPU)."""
    xp = pytest.importorskip("array_api_strict")
    a = xp.asarray(np.arange(6.0).reshape(2, 3), device=xp.Device("device1"))
    try:
        make(xp, a)
    except Exception as e:
        return e
    raise AssertionError("no error was raised")


STRICT_CAUSES = [   # (a learner's line that numpy accepts, the rule the advice must name)
    ("np.exp(a)", lambda xp, a: np.exp(a), "never numpy by name"),
    ("a + a numpy array", lambda xp, a: a + np.ones(3), "never numpy by name"),
    ("(a > 0) * a", lambda xp, a: (a > 0) * a, "no arithmetic on booleans"),
    ("int ids + a float array", lambda xp, a: xp.astype(a, xp.int64) + a, "does not mix or convert dtypes"),
    ("exp of int ids", lambda xp, a: xp.exp(xp.astype(a, xp.int64)), "does not mix or convert dtypes"),
    ("~ on a float array", lambda xp, a: ~a, "does not mix or convert dtypes"),
    ("take with 2-d ids", lambda xp, a: xp.take(a, xp.astype(a, xp.int64)[:, :2] // 3, axis=0), "1-d indices"),
    ("a[ids] with 2-d ids", lambda xp, a: a[xp.astype(a, xp.int64)[:, :2] // 3], "xp.take"),
    ("a[ids] = 0", lambda xp, a: a.__setitem__(xp.astype(a, xp.int64)[0, :2] // 3, 0.0), "no writes through"),
    ("a[..., 2:5]", lambda xp, a: a[..., 2:5], "slice must stay inside"),
    ("xp.zeros without device=", lambda xp, a: a + xp.zeros((2, 3)), "device="),
]


@pytest.mark.parametrize("what, make, rule", STRICT_CAUSES, ids=[c[0] for c in STRICT_CAUSES])
def test_the_stand_in_device_advice_names_the_rule_broken(what, make, rule):
    advice = strict_advice(_strict_error(make))
    assert rule in advice, f"{what}: {advice}"
