"""EXERCISES.md, exercise 6: Batched matmul backward. Skipped until you start exercises/matmul.py.

    pytest tests/test_exercises_matmul.py -v
"""
import exercise_checks as checks
import exercise_checks_core as core

test_matmul = checks.pytest_tests("matmul", core.MATMUL)
