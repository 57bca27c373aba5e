"""EXERCISES.md, exercise 9: LayerNorm backward by hand. Skipped until you start exercises/layernorm.py.

    pytest tests/exercise_checks/test_exercises_layernorm.py -v
"""
from exercises.checking import common, layernorm

test_layernorm = common.pytest_tests("layernorm", layernorm.CHECKS)
