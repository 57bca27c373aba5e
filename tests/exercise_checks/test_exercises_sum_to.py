"""EXERCISES.md, exercise 5: Broadcasting backward: sum_to. Skipped until you start exercises/sum_to.py.

    pytest tests/exercise_checks/test_exercises_sum_to.py -v
"""
from exercises import checks
from exercises import checks_core as core

test_sum_to = checks.pytest_tests("sum_to", core.SUM_TO)
