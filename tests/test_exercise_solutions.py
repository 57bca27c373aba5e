"""The exercise checks pass on the reference solutions (tests/exercise_solutions/),
so a learner's failing test points at the learner's code, not at the test; and
``python -m exercises`` reports them as the learner will see them."""
import subprocess
import sys

import pytest

from exercise_checks import load_exercise, run_check
from exercises.progress import EXERCISES, REPO_ROOT, SOLUTIONS

CASES = [(e, c) for e in EXERCISES for c in e.checks]


@pytest.mark.parametrize("exercise, check_fn", CASES, ids=[f"{e.name}-{c.__name__}" for e, c in CASES])
def test_solution(exercise, check_fn):
    outcome, message = run_check(check_fn, load_exercise(exercise.name, SOLUTIONS))
    assert outcome == "pass", message          # a skip would hide a missing name: it fails too


def test_python_m_exercises_solutions_passes_all():
    run = subprocess.run([sys.executable, "-m", "exercises", "--solutions"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.strip().splitlines()
    assert lines[-1] == f"{len(EXERCISES)} of {len(EXERCISES)} passing"
    assert len(lines) == len(EXERCISES) + 1 and all(line.endswith("passing") for line in lines)


def test_python_m_exercises_on_the_starters():
    """One row per exercise, with its file and status, then the count; one exercise in full."""
    run = subprocess.run([sys.executable, "-m", "exercises"], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=600)
    rows = run.stdout.strip().splitlines()
    for e in EXERCISES:
        row = next(r for r in rows if f"exercises/{e.name}.py" in r)
        assert e.title in row and (row.endswith("not started") or "passing" in row or "failing" in row), row
    assert rows[-1].endswith(f"of {len(EXERCISES)} passing")
    one = subprocess.run([sys.executable, "-m", "exercises", "softmax"], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=600)
    assert "softmax_gradcheck" in one.stdout and one.stdout.strip().endswith("of 1 passing"), one.stdout
    bad = subprocess.run([sys.executable, "-m", "exercises", "softmaks"], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=600)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "softmaks" in bad.stderr
