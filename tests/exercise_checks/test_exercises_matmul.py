"""EXERCISES.md, exercise 6: Batched matmul backward. Skipped until you start exercises/matmul.py.

    pytest tests/exercise_checks/test_exercises_matmul.py -v
"""
from exercises.checking import common, matmul

test_matmul = common.pytest_tests("matmul", matmul.CHECKS)
