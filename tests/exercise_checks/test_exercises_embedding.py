"""EXERCISES.md, exercise 11: Embedding backward (scatter-add). Skipped until you start exercises/embedding.py.

    pytest tests/exercise_checks/test_exercises_embedding.py -v
"""
from exercises.checking import common, embedding

test_embedding = common.pytest_tests("embedding", embedding.CHECKS)
