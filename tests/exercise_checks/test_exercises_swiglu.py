"""EXERCISES.md, exercise 4: SwiGLU. Skipped until you write exercises/swiglu.py.

    pytest tests/exercise_checks/test_exercises_swiglu.py -v
"""
from exercises import checks

test_swiglu = checks.pytest_tests("swiglu", checks.SWIGLU)
