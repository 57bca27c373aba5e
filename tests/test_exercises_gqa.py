"""EXERCISES.md: grouped-query attention. Skipped until you write exercises/gqa.py.

    pytest tests/test_exercises_gqa.py -v
"""
import pytest

import exercise_checks as checks


@pytest.mark.parametrize("check", checks.GQA, ids=lambda f: f.__name__)
def test_gqa(check):
    check(checks.load_exercise("gqa"))
