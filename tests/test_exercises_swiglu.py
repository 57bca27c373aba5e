"""EXERCISES.md: the SwiGLU feed-forward block. Skipped until you write exercises/swiglu.py.

    pytest tests/test_exercises_swiglu.py -v
"""
import pytest

import exercise_checks as checks


@pytest.mark.parametrize("check", checks.SWIGLU, ids=lambda f: f.__name__)
def test_swiglu(check):
    check(checks.load_exercise("swiglu"))
