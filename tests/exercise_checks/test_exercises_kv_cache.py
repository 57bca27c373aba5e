"""EXERCISES.md, exercise 16: KV cache. Skipped until you start exercises/kv_cache.py.

    pytest tests/exercise_checks/test_exercises_kv_cache.py -v
"""
from exercises import checks
from exercises import checks_core as core

test_kv_cache = checks.pytest_tests("kv_cache", core.KV_CACHE)
