"""EXERCISES.md, exercise 7: exp, log, tanh (twice differentiable). Skipped until you start exercises/elementwise.py.

    pytest tests/exercise_checks/test_exercises_elementwise.py -v
"""
from exercises import checks
from exercises import checks_core as core

test_elementwise = checks.pytest_tests("elementwise", core.ELEMENTWISE_CHECKS)
