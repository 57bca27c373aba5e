"""EXERCISES.md, exercise 14: Online softmax (tiled attention). Skipped until you start exercises/online_softmax.py.

    pytest tests/exercise_checks/test_exercises_online_softmax.py -v
"""
from exercises import checks
from exercises import checks_core as core

test_online_softmax = checks.pytest_tests("online_softmax", core.ONLINE_SOFTMAX)
