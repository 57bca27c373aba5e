"""EXERCISES.md, exercise 16: KV cache. Skipped until you start exercises/kv_cache.py.

    pytest tests/test_exercises_kv_cache.py -v
"""
import exercise_checks as checks
import exercise_checks_core as core

test_kv_cache = checks.pytest_tests("kv_cache", core.KV_CACHE)
