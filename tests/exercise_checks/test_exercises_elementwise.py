"""EXERCISES.md, exercise 7: exp, log, tanh (twice differentiable). Skipped until you start exercises/elementwise.py.

    pytest tests/exercise_checks/test_exercises_elementwise.py -v
"""
from exercises.checking import common, elementwise

test_elementwise = common.pytest_tests("elementwise", elementwise.CHECKS)
