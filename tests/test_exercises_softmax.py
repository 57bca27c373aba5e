"""EXERCISES.md, exercise 8: Softmax backward (a JVP). Skipped until you start exercises/softmax.py.

    pytest tests/test_exercises_softmax.py -v
"""
import exercise_checks as checks
import exercise_checks_core as core

test_softmax = checks.pytest_tests("softmax", core.SOFTMAX)
