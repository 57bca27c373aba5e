"""EXERCISES.md, exercise 7: exp, log, tanh (twice differentiable). Skipped until you start exercises/elementwise.py.

    pytest tests/test_exercises_elementwise.py -v
"""
import exercise_checks as checks
import exercise_checks_core as core

test_elementwise = checks.pytest_tests("elementwise", core.ELEMENTWISE_CHECKS)
