"""The host allocator setting that the training program applies (tinyattn.fast.tune_host_allocator);
`import tinyattn` alone leaves the allocator as it is."""
import os
import platform
import subprocess
import sys

import pytest

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
REPORT = ("import tinyattn.fast.allocator as a; before = a.host_allocator; import train.command; "
          "train.command.setup_process(); print(before, '|', a.host_allocator)")


def note_in_fresh_process(**env):
    clean = {k: v for k, v in os.environ.items()
             if k not in ("TINYATTN_HOST_ALLOCATOR", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")}
    run = subprocess.run([sys.executable, "-c", REPORT], env={**clean, **env}, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    before, after = run.stdout.strip().split(" | ")
    assert before == "not set up yet"                      # import tinyattn did not touch it
    return after


@pytest.mark.skipif(not GLIBC, reason="the thresholds are glibc's")
def test_the_training_program_sets_glibc_thresholds():
    assert note_in_fresh_process() == "glibc mallopt: mmap threshold 64 MiB, trim threshold 256 MiB"


def test_the_environment_variable_turns_it_off():
    assert note_in_fresh_process(TINYATTN_HOST_ALLOCATOR="0") == "default (TINYATTN_HOST_ALLOCATOR=0)"


@pytest.mark.parametrize("env", [{"MALLOC_TRIM_THRESHOLD_": "131072"}, {"MALLOC_MMAP_THRESHOLD_": "131072"},
                                 {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"}])
def test_the_users_own_malloc_settings_win(env):
    assert note_in_fresh_process(**env).startswith("left to the environment")
