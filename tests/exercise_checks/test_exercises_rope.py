"""EXERCISES.md, exercise 2: Rotary position embeddings. Skipped until you write exercises/rope.py.

    pytest tests/exercise_checks/test_exercises_rope.py -v
"""
from exercises.checking import common, rope

test_rope = common.pytest_tests("rope", rope.CHECKS)
