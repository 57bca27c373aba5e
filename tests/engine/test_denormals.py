"""ta.set_flush_denormal (tinyattn/fast/denormals.py): subnormal floats read and made as zero in
every thread that computes: the caller, tinyattn's CPU threads, numba's kernels and OpenBLAS's threads."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import tinyattn as ta
from tinyattn.fast import denormals, threads

SUPPORTED = denormals._fenv_layout() is not None
needs_support = pytest.mark.skipif(not SUPPORTED, reason="flushing subnormals is supported on x86-64 Linux and macOS")
needs_threadpoolctl = pytest.mark.skipif(not threads.blas_controllers(),
                                         reason="threadpoolctl is not installed (the fast extra)")


@pytest.fixture
def split_everything(monkeypatch):
    """Every split runs in 3 parts, however small: the caller and two pool threads."""
    monkeypatch.setattr(threads, "MIN_WORK", 0)
    monkeypatch.setattr(threads, "FLOOR", 0)
    monkeypatch.setattr(threads, "_num_threads", 3)


def bits(a):
    """A float32 array's bit patterns: 0 is exactly +0.0 (a comparison with 0 would read a subnormal as 0
    while flushing)."""
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def times_one_in_each_thread():
    """{thread name: the bits of a subnormal times 1.0, computed in that thread}, over three threads."""
    seen = {}

    def part(i, j):
        seen[threading.current_thread().name] = int(bits(denormals.subnormals(1) * np.float32(1.0))[0])
    threads.split(part, 3, work=1)
    return seen


def test_a_subnormal_is_what_its_bits_say():
    tiny = denormals.subnormals(2)
    assert tiny.dtype == np.float32 and tiny[0] == 2.0 ** -129        # (compared in float64: never flushed)
    assert 0 < float(tiny[0]) < np.finfo(np.float32).tiny


@needs_support
def test_flushing_makes_a_subnormal_times_one_zero_in_the_calling_thread():
    assert ta.set_flush_denormal(True) is True
    assert (bits(denormals.subnormals(8) * np.float32(1.0)) == 0).all()
    assert (bits((ta.tensor(denormals.subnormals(8)) * 1.0).numpy()) == 0).all()     # through a Tensor op


@needs_support
def test_after_flushing_is_turned_off_subnormals_come_back():
    ta.set_flush_denormal(True)
    assert ta.set_flush_denormal(False) is True
    assert (bits(denormals.subnormals(8) * np.float32(1.0)) == denormals.SUBNORMAL_BITS).all()
    assert not denormals.flushes_here()


@needs_support
@needs_threadpoolctl
def test_tinyattn_threads_follow_the_mode_each_time_it_changes(split_everything):
    times_one_in_each_thread()                                  # the pool's threads exist before the change
    ta.set_flush_denormal(True)
    seen = times_one_in_each_thread()
    assert len(seen) == 3 and set(seen.values()) == {0}
    ta.set_flush_denormal(False)
    seen = times_one_in_each_thread()
    assert len(seen) == 3 and set(seen.values()) == {denormals.SUBNORMAL_BITS}


@needs_support
@needs_threadpoolctl
def test_numba_kernels_flush_in_the_caller_and_in_tinyattn_threads(split_everything):
    cpu_kernels = pytest.importorskip("tinyattn.fast.cpu_kernels")
    x = denormals.subnormals(12)                                # 3 parts of 4: one per thread
    assert (bits(cpu_kernels.gelu_tanh(x)) != 0).all()          # GELU(x) is about x / 2: subnormal too
    ta.set_flush_denormal(True)
    assert (bits(cpu_kernels.gelu_tanh(x)) == 0).all()
    ta.set_flush_denormal(False)
    assert (bits(cpu_kernels.gelu_tanh(x)) != 0).all()


BLAS_PRODUCT = """
import numpy as np
import tinyattn as ta
from tinyattn.fast import denormals
a = np.ones((512, 512), np.float32)
a @ a                                     # OpenBLAS starts its threads now, before flushing is asked for
b = np.full((512, 512), 1e6, np.float32)  # 2**-129 * 1e6 * 512 is a normal float32: only DAZ gives 0
before = np.count_nonzero(denormals.subnormals((512, 512)) @ b)
assert ta.set_flush_denormal(True)
flushed = np.count_nonzero(denormals.subnormals((512, 512)) @ b)
assert ta.set_flush_denormal(False)
after = np.count_nonzero(denormals.subnormals((512, 512)) @ b)
print(before, flushed, after, len(denormals.restarted_blas))
"""


@needs_support
def test_a_blas_product_reads_subnormal_inputs_as_zero_in_blas_threads_started_before():
    """In a fresh process, so that OpenBLAS's threads started before the call (at their own thread count)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", BLAS_PRODUCT], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    before, flushed, after, restarted = map(int, done.stdout.split())
    assert before == after == 512 * 512
    assert flushed == 0
    if threads.blas_controllers() and threads.blas_controllers()[0].internal_api == "openblas":
        assert restarted >= 1


def test_where_the_register_is_unknown_it_changes_nothing_and_says_false(monkeypatch):
    was = denormals.flushes_here()
    monkeypatch.setattr(denormals, "_register", False)           # as on ARM or Windows
    assert ta.set_flush_denormal(not was) is False
    assert denormals.flushes_here() == was


@needs_support
def test_a_wrong_fenv_layout_is_caught_and_put_back(monkeypatch):
    """MXCSR looked for in the wrong word: the CPU does not flush, so the old state comes back."""
    right = denormals._mxcsr()
    monkeypatch.setattr(denormals, "_register", denormals._Mxcsr(right.lib, right.words, 0))
    flags = denormals.FTZ | denormals.DAZ
    before = right.read()[right.at] & flags
    assert ta.set_flush_denormal(True) is False
    assert not denormals.flushes_here() and right.read()[right.at] & flags == before


CHECK_TRAINING = ("from tinyattn.fast import denormals; before = denormals.flushes_here(); import train.command; "
                  "on_import = denormals.flushes_here(); train.command.setup_process(); "
                  "print(before, on_import, denormals.flushes_here())")


@needs_support
def test_the_training_program_flushes_and_import_tinyattn_does_not():
    done = subprocess.run([sys.executable, "-c", CHECK_TRAINING], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "True"]
