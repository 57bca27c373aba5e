"""EXERCISES.md, exercise 13: Attention backward by hand. Skipped until you start exercises/attention.py.

    pytest tests/exercise_checks/test_exercises_attention.py -v
"""
from exercises import checks
from exercises import checks_core as core

test_attention = checks.pytest_tests("attention", core.ATTENTION)
