"""EXERCISES.md: rotary position embeddings (RoPE). Skipped until you write exercises/rope.py.

    pytest tests/test_exercises_rope.py -v
"""
import pytest

import exercise_checks as checks


@pytest.mark.parametrize("check", checks.ROPE, ids=lambda f: f.__name__)
def test_rope(check):
    check(checks.load_exercise("rope"))
