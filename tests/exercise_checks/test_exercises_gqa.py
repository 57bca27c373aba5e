"""EXERCISES.md, exercise 3: Grouped-query attention. Skipped until you write exercises/gqa.py.

    pytest tests/exercise_checks/test_exercises_gqa.py -v
"""
from exercises.checking import common, gqa

test_gqa = common.pytest_tests("gqa", gqa.CHECKS)
