"""EXERCISES.md, exercise 8: Softmax backward (a JVP). Skipped until you start exercises/softmax.py.

    pytest tests/exercise_checks/test_exercises_softmax.py -v
"""
from exercises.checking import common, softmax

test_softmax = common.pytest_tests("softmax", softmax.CHECKS)
