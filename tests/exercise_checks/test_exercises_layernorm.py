"""EXERCISES.md, exercise 9: LayerNorm backward by hand. Skipped until you start exercises/layernorm.py.

    pytest tests/exercise_checks/test_exercises_layernorm.py -v
"""
from exercises import checks
from exercises import checks_core as core

test_layernorm = checks.pytest_tests("layernorm", core.LAYERNORM)
