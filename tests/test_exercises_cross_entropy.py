"""EXERCISES.md, exercise 10: Fused cross-entropy. Skipped until you start exercises/cross_entropy.py.

    pytest tests/test_exercises_cross_entropy.py -v
"""
import exercise_checks as checks
import exercise_checks_core as core

test_cross_entropy = checks.pytest_tests("cross_entropy", core.CROSS_ENTROPY)
