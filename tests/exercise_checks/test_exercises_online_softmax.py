"""EXERCISES.md, exercise 14: Online softmax (tiled attention). Skipped until you start exercises/online_softmax.py.

    pytest tests/exercise_checks/test_exercises_online_softmax.py -v
"""
from exercises.checking import common, online_softmax

test_online_softmax = common.pytest_tests("online_softmax", online_softmax.CHECKS)
