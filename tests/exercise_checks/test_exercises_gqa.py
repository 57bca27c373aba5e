"""EXERCISES.md, exercise 3: Grouped-query attention. Skipped until you write exercises/gqa.py.

    pytest tests/exercise_checks/test_exercises_gqa.py -v
"""
from exercises import checks

test_gqa = checks.pytest_tests("gqa", checks.GQA)
