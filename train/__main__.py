"""python -m train: the command line; the loop, its flags and presets are in train/loop.py."""
import os
import sys

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE")


def share_the_cores(environ, cores):
    """Under mpiexec, N processes on one machine get cores / N BLAS threads each, unless the
    environment sets a number (as torchrun does): otherwise each would start one thread per
    core, and N x cores threads would fight over the cores. Runs before numpy is imported.
    -> the number of threads set, or None where nothing was set."""
    local = next((int(environ[v]) for v in LOCAL_SIZE_VARS if v in environ), 1)
    if local < 2 or any(v in environ for v in THREAD_VARS):
        return None
    threads = max(1, cores // local)
    environ.update({v: str(threads) for v in THREAD_VARS})
    return threads


if __name__ == "__main__":
    # the cores this process may use (containers, taskset), as tinyattn.fast.threads counts them; written
    # out here because it must run before numpy is imported, and importing tinyattn imports numpy
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:                                # not on Linux
        cores = os.cpu_count() or 1
    share_the_cores(os.environ, cores)
    from .command import main
    sys.exit(main())
