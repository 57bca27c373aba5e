"""EXERCISES.md, exercise 6: Batched matmul backward. Skipped until you start exercises/matmul.py.

    pytest tests/exercise_checks/test_exercises_matmul.py -v
"""
from exercises import checks
from exercises import checks_core as core

test_matmul = checks.pytest_tests("matmul", core.MATMUL)
