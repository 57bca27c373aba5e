"""EXERCISES.md, exercise 4: SwiGLU. Skipped until you write exercises/swiglu.py.

    pytest tests/exercise_checks/test_exercises_swiglu.py -v
"""
from exercises.checking import common, swiglu

test_swiglu = common.pytest_tests("swiglu", swiglu.CHECKS)
