"""EXERCISES.md, exercise 11: Embedding backward (scatter-add). Skipped until you start exercises/embedding.py.

    pytest tests/exercise_checks/test_exercises_embedding.py -v
"""
from exercises import checks
from exercises import checks_core as core

test_embedding = checks.pytest_tests("embedding", core.EMBEDDING)
