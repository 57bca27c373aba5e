"""EXERCISES.md, exercise 5: Broadcasting backward: sum_to. Skipped until you start exercises/sum_to.py.

    pytest tests/exercise_checks/test_exercises_sum_to.py -v
"""
from exercises.checking import common, sum_to

test_sum_to = common.pytest_tests("sum_to", sum_to.CHECKS)
