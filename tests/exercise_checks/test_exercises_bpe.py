"""EXERCISES.md, exercise 18: write BPE. Skipped until you start exercises/bpe.py.

    pytest tests/exercise_checks/test_exercises_bpe.py -v
"""
from exercises import checks
from exercises import checks_bpe

test_bpe = checks.pytest_tests("bpe", checks_bpe.BPE_CHECKS)
