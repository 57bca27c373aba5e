"""EXERCISES.md, exercise 18: write BPE. Skipped until you start exercises/bpe.py.

    pytest tests/exercise_checks/test_exercises_bpe.py -v
"""
from exercises.checking import common, bpe

test_bpe = common.pytest_tests("bpe", bpe.CHECKS)
