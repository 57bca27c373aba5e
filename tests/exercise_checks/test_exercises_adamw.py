"""EXERCISES.md, exercise 15: AdamW step. Skipped until you start exercises/adamw.py.

    pytest tests/exercise_checks/test_exercises_adamw.py -v
"""
from exercises.checking import common, adamw

test_adamw = common.pytest_tests("adamw", adamw.CHECKS)
