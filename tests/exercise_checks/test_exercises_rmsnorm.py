"""EXERCISES.md, exercise 1: RMSNorm. Skipped until you write exercises/rmsnorm.py.

    pytest tests/exercise_checks/test_exercises_rmsnorm.py -v
"""
from exercises import checks

test_rmsnorm = checks.pytest_tests("rmsnorm", checks.RMSNORM)
