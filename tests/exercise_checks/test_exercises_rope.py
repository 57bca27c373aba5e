"""EXERCISES.md, exercise 2: Rotary position embeddings. Skipped until you write exercises/rope.py.

    pytest tests/exercise_checks/test_exercises_rope.py -v
"""
from exercises import checks

test_rope = checks.pytest_tests("rope", checks.ROPE)
