"""EXERCISES.md: every exercise's checks on your code in exercises/, one test per check. An
exercise you have not started is skipped; once started, a wrong answer fails and says why.

    python -m exercises softmax                                 one exercise, check by check
    pytest tests/exercise_checks/test_exercises.py -v -rs       all of them
"""
import pytest

from exercises.checking import common
from exercises.checking.progress import EXERCISES

CASES = [(e.name, check) for e in EXERCISES for check in e.checks]


@pytest.mark.parametrize("name, check", CASES, ids=[f"{name}-{check.__name__}" for name, check in CASES])
def test_exercise(name, check):
    common.pytest_check(check, lambda: common.load_exercise(name))


def test_every_command_the_exercises_quote_names_an_exercise():
    """The starters and EXERCISES.md quote `python -m exercises NAME`: each NAME is one it knows,
    and each starter quotes its own."""
    import re
    from pathlib import Path

    from exercises.checking.progress import BY_NAME
    root = Path(__file__).resolve().parents[2]
    texts = {path: path.read_text() for path in [root / "EXERCISES.md", *sorted((root / "exercises").glob("*.py"))]}
    quoted = {(path, name) for path, text in texts.items() for name in re.findall(r"python -m exercises (\w+)", text)}
    assert {name for _, name in quoted} - {"NAME"} <= set(BY_NAME), quoted
    for path in (root / "exercises").glob("*.py"):
        if path.stem in BY_NAME:
            assert (path, path.stem) in quoted, f"{path.name} does not quote python -m exercises {path.stem}"
    assert not [path for path, text in texts.items() if "test_exercises_" in text]
