"""EXERCISES.md, exercise 12: The engine: toposort and backward. Skipped until you start exercises/engine.py.

    pytest tests/exercise_checks/test_exercises_engine.py -v
"""
from exercises.checking import common, engine

test_engine = common.pytest_tests("engine", engine.CHECKS)
