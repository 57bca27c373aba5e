"""EXERCISES.md, exercise 8: Softmax backward (a JVP). Skipped until you start exercises/softmax.py.

    pytest tests/exercise_checks/test_exercises_softmax.py -v
"""
from exercises import checks
from exercises import checks_core as core

test_softmax = checks.pytest_tests("softmax", core.SOFTMAX)
