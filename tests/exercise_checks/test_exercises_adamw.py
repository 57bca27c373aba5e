"""EXERCISES.md, exercise 15: AdamW step. Skipped until you start exercises/adamw.py.

    pytest tests/exercise_checks/test_exercises_adamw.py -v
"""
from exercises import checks
from exercises import checks_core as core

test_adamw = checks.pytest_tests("adamw", core.ADAMW)
