"""EXERCISES.md, exercise 9: LayerNorm backward by hand. Skipped until you start exercises/layernorm.py.

    pytest tests/test_exercises_layernorm.py -v
"""
import exercise_checks as checks
import exercise_checks_core as core

test_layernorm = checks.pytest_tests("layernorm", core.LAYERNORM)
