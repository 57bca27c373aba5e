"""EXERCISES.md, exercise 1: RMSNorm. Skipped until you write exercises/rmsnorm.py.

    pytest tests/test_exercises_rmsnorm.py -v
"""
import exercise_checks as checks

test_rmsnorm = checks.pytest_tests("rmsnorm", checks.RMSNORM)
