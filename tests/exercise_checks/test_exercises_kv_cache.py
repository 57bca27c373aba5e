"""EXERCISES.md, exercise 16: KV cache. Skipped until you start exercises/kv_cache.py.

    pytest tests/exercise_checks/test_exercises_kv_cache.py -v
"""
from exercises.checking import common, kv_cache

test_kv_cache = common.pytest_tests("kv_cache", kv_cache.CHECKS)
