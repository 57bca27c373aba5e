"""The tests do not depend on what the user's checkout holds: README's commands, in any order,
leave pytest green, and the tests leave nothing in the checkout.

README's first command, python -m train, writes out-coref/ in the repository; python -m train
--device cuda, run there by a CLI test, then met "--out_dir out-coref already holds a run"
before the one-line error it checks. Every test now runs in a folder of its own (conftest.py),
so this runs that first command in a copy of the checkout, then the tests that run the
training, sampling and chat commands with their default folders, in that copy.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PARTS = ["tinyattn", "train", "data", "config", "exercises", "tests", "pyproject.toml"]      # what the tests below need
COMMAND_TESTS = ["tests/training/test_train.py::test_cli_errors_are_one_line",
                 "tests/training/test_train.py::test_sample_cli_error_is_one_line",
                 "tests/training/test_chat_cli.py::test_a_base_model_and_a_missing_run_are_refused_in_one_line"]


def copy_of_the_checkout(to):
    for part in PARTS:
        source = REPO / part
        if source.is_dir():
            shutil.copytree(source, to / part, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
        else:
            shutil.copy2(source, to / part)
    return to


def files_under(folder):
    return {p.relative_to(folder) for p in folder.rglob("*")
            if "__pycache__" not in p.parts and not p.is_relative_to(folder / "out-coref")}


def test_readme_first_command_then_the_command_tests_pass(tmp_path):
    checkout = copy_of_the_checkout(tmp_path / "checkout")
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    try:
        first = subprocess.run([sys.executable, "-m", "train", "--max_iters", "1", "--quiet"], cwd=checkout, env=env,
                               capture_output=True, text=True, timeout=300)
        assert first.returncode == 0, first.stderr
        assert (checkout / "out-coref" / "ckpt.npz").exists()
        before = files_under(checkout)
        tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                "--basetemp", str(tmp_path / "basetemp"), *COMMAND_TESTS],
                               cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
        assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
        assert " passed" in tests.stdout.strip().splitlines()[-1], tests.stdout[-1000:]
        left = sorted(str(p) for p in files_under(checkout) - before)
        assert not left, f"the tests left these in the checkout: {left}"
    finally:
        shutil.rmtree(checkout, ignore_errors=True)
