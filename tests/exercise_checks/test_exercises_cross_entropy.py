"""EXERCISES.md, exercise 10: Fused cross-entropy. Skipped until you start exercises/cross_entropy.py.

    pytest tests/exercise_checks/test_exercises_cross_entropy.py -v
"""
from exercises.checking import common, cross_entropy

test_cross_entropy = common.pytest_tests("cross_entropy", cross_entropy.CHECKS)
