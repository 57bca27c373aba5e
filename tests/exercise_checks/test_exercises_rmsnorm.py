"""EXERCISES.md, exercise 1: RMSNorm. Skipped until you write exercises/rmsnorm.py.

    pytest tests/exercise_checks/test_exercises_rmsnorm.py -v
"""
from exercises.checking import common, rmsnorm

test_rmsnorm = common.pytest_tests("rmsnorm", rmsnorm.CHECKS)
