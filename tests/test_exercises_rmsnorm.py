"""EXERCISES.md: RMSNorm. Skipped until you write exercises/rmsnorm.py.

    pytest tests/test_exercises_rmsnorm.py -v
"""
import pytest

import exercise_checks as checks


@pytest.mark.parametrize("check", checks.RMSNORM, ids=lambda f: f.__name__)
def test_rmsnorm(check):
    check(checks.load_exercise("rmsnorm"))
