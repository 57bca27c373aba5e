"""Training over several processes: what each process of ``mpiexec -n N python -m train`` does.

Every process holds the whole model. --batch_size stays the global batch: each process
trains on batch_size / N rows, tinyattn.distributed averages the gradients, and every
copy of the model takes the same step. Rank 0 alone evaluates, samples, logs and writes
checkpoints (in the format of a one-process run); the others only train. With one process
each function here does what python -m train always did.

Random streams. Rank 0 draws its batches from the seed's own stream, so one process draws
exactly the batches it always did; rank r > 0 from a child of the seed,
``SeedSequence(seed, spawn_key=(r, step))``, where step is where that stream began (0 for
a new run). Dropout's generator is split the same way. A checkpoint keeps rank 0's states
where a one-process run keeps its own ("data_rng", "device_rng") and, from a run over N > 1
processes, every rank's states, gathered whenever rank 0 evaluates ("rank_rngs"). So
--resume over the same N continues every stream exactly, as if the run had never stopped;
over another N, rank 0 continues its stream and ranks r > 0 begin new ones at the step
resumed from. (A checkpoint written on Ctrl-C keeps no states for ranks r > 0: those
gathered at the last evaluation would replay batches already trained on.)

--shared_batches: every rank draws the whole global batch from the seed's stream and keeps
its own slice, so N processes see exactly the batches of a one-process run. That is for
checking that N processes train as one (tests/training/test_distributed.py does); it costs N times
the batch drawing.
"""
import contextlib
import signal

import numpy as np

from tinyattn import distributed as dist

CAUGHT = (ValueError, OSError, KeyError, RuntimeError)      # the errors python -m train reports in one line


class Stopped(Exception):
    """An error that every process raised together: rank 0 reports it once, and all exit."""


# ---------------------------------------------------------------------------
# random streams and batches
# ---------------------------------------------------------------------------
def data_rng(seed, rank, step=0):
    """The batch stream of ``rank``: the seed's own for rank 0, a child of it for the others."""
    if rank == 0:
        return np.random.default_rng(seed)
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(rank, step)))


def device_seed(seed, rank, step=0):
    """A seed for the dropout generator of rank r > 0 (rank 0 keeps the one --seed set)."""
    return int(np.random.SeedSequence(seed, spawn_key=(rank, step, 1)).generate_state(1)[0])


def local_batch(dataset, args, rng):
    """This process's rows of one global batch: (x, y), each (batch_size / N, T) (a stage's batch
    may hold more arrays, and more rows an item: --stage rl's are K answers to each question)."""
    world, rank = dist.world_size(), dist.rank()
    if world > 1 and args.shared_batches:
        batch = dataset.get_batch("train", args.batch_size, args.block_size, rng)   # everyone's rows
        b = len(batch[0]) // world
        return tuple(a[rank * b:(rank + 1) * b] for a in batch)
    return dataset.get_batch("train", args.batch_size // world, args.block_size, rng)


def split_streams(args, state, device_backend, meta=None):
    """Give this process its streams: on a new run (``meta`` None) ranks r > 0 take their own;
    on --resume each rank takes back what the checkpoint ``meta`` kept for it (see the top)."""
    rank, world = dist.rank(), dist.world_size()
    if meta is not None and (rank == 0 or args.shared_batches):
        state["data_rng"].bit_generator.state = meta["data_rng"]
    if meta is not None and rank == 0:
        device_backend.set_rng_state(meta["device_rng"])
    if rank == 0:
        return
    kept = (meta or {}).get("rank_rngs")
    if kept and meta.get("world_size") == world:
        if not args.shared_batches:
            state["data_rng"].bit_generator.state = kept[rank]["data_rng"]
        device_backend.set_rng_state(kept[rank]["device_rng"])
        return
    if not args.shared_batches:
        state["data_rng"] = data_rng(args.seed, rank, state["step"])
    device_backend.seed(device_seed(args.seed, rank, state["step"]))


def gather_streams(state, device_backend):
    """Every rank's stream states, into rank 0's ``state["rank_rngs"]`` (all ranks call it)."""
    if dist.world_size() == 1:
        return
    mine = dict(data_rng=state["data_rng"].bit_generator.state, device_rng=device_backend.get_rng_state())
    state["rank_rngs"] = dist.gather_object(mine)


# ---------------------------------------------------------------------------
# stopping together
# ---------------------------------------------------------------------------
@contextlib.contextmanager
def together():
    """A block that every process runs, with no collective inside: an error in any process
    stops all of them at its end, as Stopped with the error's message (naming the rank when
    the processes did not all fail alike). With one process errors pass as they are."""
    if dist.world_size() == 1:
        yield
        return
    error = None
    try:
        yield
    except CAUGHT as e:
        error = str(e)
    errors = dist.all_gather_object(error)
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if failed:
        rank, message = failed[0]
        raise Stopped(message if len(failed) == len(errors) and len(set(errors)) == 1 else f"rank {rank}: {message}")


def on_root(fn, *args):
    """``fn(*args)`` on rank 0 alone; every process returns its result, or raises Stopped
    with its error."""
    if dist.world_size() == 1:
        return fn(*args)
    result = error = None
    if dist.rank() == 0:
        try:
            result = fn(*args)
        except CAUGHT as e:
            error = str(e)
    result, error = dist.broadcast_object((result, error))
    if error is not None:
        raise Stopped(error)
    return result


def leave_signals_to_root():
    """Under mpiexec Ctrl-C reaches every process, and mpiexec passes SIGTERM and SIGHUP on to
    every process. Only rank 0 acts on them: it saves a checkpoint and ends the job (a rank that
    left in the middle of a step would leave the others waiting in a collective)."""
    if dist.world_size() > 1 and dist.rank() != 0:
        for name in ("SIGINT", "SIGTERM", "SIGHUP"):
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_IGN)


def run_or_abort(fn):
    """``fn()``; under mpiexec a failure of this process alone prints "rank K failed: ..."
    and ends the whole job, so that no process waits for it forever."""
    if dist.world_size() == 1:
        return fn()
    try:
        return fn()
    except (Stopped, SystemExit):
        raise
    except BaseException as e:
        code = 130 if isinstance(e, KeyboardInterrupt) else 1
        dist.abort(f"python -m train: rank {dist.rank()} failed: {type(e).__name__}: {e}", code)
