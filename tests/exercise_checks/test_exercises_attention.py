"""EXERCISES.md, exercise 13: Attention backward by hand. Skipped until you start exercises/attention.py.

    pytest tests/exercise_checks/test_exercises_attention.py -v
"""
from exercises.checking import common, attention

test_attention = common.pytest_tests("attention", attention.CHECKS)
