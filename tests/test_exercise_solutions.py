"""The exercise checks pass on the reference solutions (tests/exercise_solutions/),
so a learner's failing test points at the learner's code, not at the test."""
import importlib

import pytest

import exercise_checks as checks

CASES = [(name, check) for name, group in checks.ALL.items() for check in group]


@pytest.mark.parametrize("name, check", CASES, ids=[f"{n}-{c.__name__}" for n, c in CASES])
def test_solution(name, check):
    check(importlib.import_module(f"exercise_solutions.{name}"))


def test_every_check_runs_on_a_solution():
    """No check skips on the solutions (a skip would hide a missing name)."""
    for name, group in checks.ALL.items():
        module = importlib.import_module(f"exercise_solutions.{name}")
        for check in group:
            try:
                check(module)
            except pytest.skip.Exception as e:
                pytest.fail(f"{name}: {check.__name__} skipped on the solution: {e}")
