"""The exercise checks pass on the reference solutions (tests/support/exercise_solutions/),
so a learner's failing test points at the learner's code, not at the test; and
``python -m exercises`` reports them as the learner will see them."""
import subprocess
import sys

import pytest

from exercises.checking import common
from exercises.__main__ import main as exercises_main
from exercises.checking.common import SOLUTIONS, load_exercise, run_check
from exercises.checking.progress import EXERCISES


CASES = [(e, c) for e in EXERCISES for c in e.checks]


@pytest.mark.parametrize("exercise, check_fn", CASES, ids=[f"{e.name}-{c.__name__}" for e, c in CASES])
def test_solution(exercise, check_fn):
    outcome, message = run_check(check_fn, load_exercise(exercise.name, SOLUTIONS))
    assert outcome == "pass", message          # a skip would hide a missing name: it fails too


def test_python_m_exercises_solutions_passes_all():
    run = subprocess.run([sys.executable, "-m", "exercises", "--solutions"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.strip().splitlines()
    assert lines[-1] == f"{len(EXERCISES)} of {len(EXERCISES)} passing"
    assert len(lines) == len(EXERCISES) + 1 and all(line.endswith("passing") for line in lines)


def test_python_m_exercises_on_the_starters():
    """One row per exercise, with its file and status, then the count; one exercise in full."""
    run = subprocess.run([sys.executable, "-m", "exercises"], capture_output=True, text=True,
                         timeout=600)
    rows = run.stdout.strip().splitlines()
    for e in EXERCISES:
        row = next(r for r in rows if f"exercises/{e.name}.py" in r)
        assert e.title in row and (row.endswith("not started") or "passing" in row or "failing" in row), row
    assert rows[-1].endswith(f"of {len(EXERCISES)} passing")
    one = subprocess.run([sys.executable, "-m", "exercises", "softmax"], capture_output=True,
                         text=True, timeout=600)
    assert "softmax_gradcheck" in one.stdout and one.stdout.strip().endswith("of 1 passing"), one.stdout
    bad = subprocess.run([sys.executable, "-m", "exercises", "softmaks"], capture_output=True,
                         text=True, timeout=600)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "softmaks" in bad.stderr


def test_the_solutions_are_found_from_any_folder(tmp_path):
    """Installed with pip install -e ., the exercises and their solutions need no particular working folder."""
    run = subprocess.run([sys.executable, "-m", "exercises", "--solutions", "sum_to"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("1 of 1 passing"), run.stdout + run.stderr


def test_missing_solutions_are_one_line(tmp_path, monkeypatch, capsys):
    """An install without the repository's tests/ folder says where it looked, in one line."""
    monkeypatch.setattr(common, "SOLUTIONS_DIR", tmp_path / "tests" / SOLUTIONS)
    monkeypatch.delitem(sys.modules, SOLUTIONS, raising=False)
    with pytest.raises(SystemExit) as stopped:
        exercises_main(["--solutions"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and len(err.strip().splitlines()) == 1 and "no reference solutions" in err, err


def test_an_error_is_placed_in_the_answer_not_in_the_checks():
    """unwritten() names the learner's (or a solution's) line, never the checking machinery's."""
    assert common.is_learner_code(common.HERE / "softmax.py")
    assert common.is_learner_code(common.SOLUTIONS_DIR / "softmax.py")
    assert not any(common.is_learner_code(common.HERE / f"{m}.py") for m in common.MACHINERY)
    assert not common.is_learner_code(common.__file__)                  # the checks, in exercises/checking/
