"""python -m train as a command: one process (or each of many, under mpiexec) parses the flags,
runs the training and turns what can go wrong into one line and an exit status."""
import contextlib
import sys

import numpy as np

import tinyattn as ta
from tinyattn import distributed as dist
from tinyattn.fast import tune_host_allocator

from . import interrupts, parallel
from .config import parse_args
from .loop import Diverged, Interrupted, StoppedBySignal, train
from .start import exercises_swapped_in


def setup_process():
    """What the training program sets for its whole process: glibc's allocator thresholds (steady
    step times; tinyattn.fast.tune_host_allocator), and subnormal floats flushed to zero on the CPU
    (ta.set_flush_denormal: fine-tuning makes tiny values, and each costs a slow path; where it is
    not supported, nothing changes)."""
    tune_host_allocator()
    ta.set_flush_denormal(True)


def main(argv=None):
    setup_process()
    try:
        dist.init()                              # under mpiexec: join the other processes
    except RuntimeError as e:
        if dist.launched()[1] == 0:
            print(f"python -m train: error: {e}", file=sys.stderr)
        return 1
    with interrupts.keep_writing():              # a closed pipe or terminal never stops a save
        return parallel.run_or_abort(lambda: run(argv))


def run(argv=None):
    """The command, in one process (of one or of many: then rank 0 alone prints)."""
    args, notes = parse_args(argv)
    try:
        dist.init(args.device)                   # --device cuda over several processes: a GPU each, and NCCL
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"), \
                exercises_swapped_in(args.use_exercises), \
                ta.detect_anomaly() if args.detect_anomaly else contextlib.nullcontext():
            # a blow-up is reported once, below
            train(args, notes)
    except KeyboardInterrupt:                    # before the training loop began: nothing to save
        if dist.rank() == 0:
            print("python -m train: interrupted before training began: nothing was saved", file=sys.stderr)
        return 130
    except Interrupted as e:
        print(f"python -m train: {e}", file=sys.stderr)
        return 130
    except StoppedBySignal as e:                 # a signal: the run saved, then stopped
        print(f"python -m train: {e}", file=sys.stderr)
        return e.code
    except (parallel.Stopped, Diverged) as e:   # every process stopped here together
        if dist.rank() == 0:
            print(f"python -m train: error: {e}", file=sys.stderr)
        return 1
    except (ValueError, OSError, KeyError, RuntimeError) as e:
        if dist.world_size() > 1:
            raise                                # this process's alone: run_or_abort ends the job
        print(f"python -m train: error: {e}", file=sys.stderr)
        return 1
    except MemoryError as e:                     # numpy's "Unable to allocate ...", CuPy's out of memory
        if dist.world_size() > 1:
            raise
        print(f"python -m train: error: out of memory: {str(e).splitlines()[0] if str(e) else 'MemoryError'} "
              f"(lower --batch_size or --block_size, or the model's --n_embd or --n_layer)", file=sys.stderr)
        return 1
    return 0                                     # (the run printed its last line: its stage's)
