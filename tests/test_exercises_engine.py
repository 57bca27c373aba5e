"""EXERCISES.md, exercise 12: The engine: toposort and backward. Skipped until you start exercises/engine.py.

    pytest tests/test_exercises_engine.py -v
"""
import exercise_checks as checks
import exercise_checks_core as core

test_engine = checks.pytest_tests("engine", core.ENGINE)
