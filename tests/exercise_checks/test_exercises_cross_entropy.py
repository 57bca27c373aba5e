"""EXERCISES.md, exercise 10: Fused cross-entropy. Skipped until you start exercises/cross_entropy.py.

    pytest tests/exercise_checks/test_exercises_cross_entropy.py -v
"""
from exercises import checks
from exercises import checks_core as core

test_cross_entropy = checks.pytest_tests("cross_entropy", core.CROSS_ENTROPY)
