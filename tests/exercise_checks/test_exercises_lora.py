"""EXERCISES.md, exercise 17: LoRA, low-rank adapters. Skipped until you write exercises/lora.py.

    pytest tests/exercise_checks/test_exercises_lora.py -v
"""
from exercises.checking import common, lora

test_lora = common.pytest_tests("lora", lora.CHECKS)
