"""EXERCISES.md, exercise 12: The engine: toposort and backward. Skipped until you start exercises/engine.py.

    pytest tests/exercise_checks/test_exercises_engine.py -v
"""
from exercises import checks
from exercises import checks_core as core

test_engine = checks.pytest_tests("engine", core.ENGINE)
