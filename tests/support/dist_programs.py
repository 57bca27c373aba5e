"""Programs that tests/training/test_distributed.py runs under ``mpiexec -n 2`` (not collected by pytest).

    python tests/support/dist_programs.py checks [DEVICE...]     # the collectives, checked on every rank, on the
                                                         # CPU and each DEVICE: strict, cuda (NCCL, a GPU
                                                         # per process), cuda-staged (CUDA through the host)
    python tests/support/dist_programs.py fail raise STEP ARGS   # rank 1 raises at STEP of python -m train ARGS
    python tests/support/dist_programs.py fail kill STEP ARGS    # rank 1 is killed (SIGKILL) at STEP
"""
import os
import signal
import sys

import numpy as np

import tinyattn as ta
import tinyattn.distributed as dist


def expect_equal(got, want, what):
    got = got.numpy() if isinstance(got, ta.Tensor) else got
    if not (np.shape(got) == np.shape(want) and np.array_equal(got, want)):
        raise AssertionError(f"rank {dist.rank()}: {what}: got {got!r}, expected {want!r}")


def checks(device):
    """Each rank knows what every rank holds (it is made from the rank), so each checks the result."""
    n, r = dist.world_size(), dist.rank()
    assert n == 2, f"run this with mpiexec -n 2, not {n}"
    per_rank = [np.arange(6, dtype=np.float32).reshape(2, 3) * (k + 1) - k for k in range(n)]   # (2, 3)
    for op, want in (("sum", sum(per_rank)), ("mean", sum(per_rank) / n),
                     ("max", np.maximum(*per_rank)), ("min", np.minimum(*per_rank))):
        t = ta.tensor(per_rank[r], device=device)
        assert dist.all_reduce(t, op) is t
        expect_equal(t, want.astype(np.float32), f"all_reduce {op} on {device}")
    for dtype in ("float64", "int64"):
        t = ta.tensor(per_rank[r], dtype=dtype, device=device)
        expect_equal(dist.all_reduce(t, "sum"), sum(per_rank).astype(dtype), f"all_reduce sum of {dtype}")
    t = ta.tensor(per_rank[r], device=device).T                      # not contiguous: (3, 2)
    expect_equal(dist.all_reduce(t, "sum"), sum(per_rank).T, f"all_reduce of a transposed tensor on {device}")
    for root in range(n):
        t = ta.tensor(per_rank[r], device=device)
        expect_equal(dist.broadcast(t, root), per_rank[root], f"broadcast from rank {root} on {device}")
    expect_equal(np.array(dist.all_gather_object(("rank", r))), np.array([("rank", k) for k in range(n)]),
                 "all_gather_object")
    gathered = dist.gather_object(r * 10)
    expect_equal(np.array(gathered if r == 0 else 0), np.array([0, 10] if r == 0 else 0), "gather_object")
    expect_equal(np.array(dist.broadcast_object({"from": r}, root=1)["from"]), np.array(1), "broadcast_object")

    # GradAverager: 4 parameters, buckets of at most 100 bytes -> [[a, b], [c], [d]]
    shapes = [(3, 4), (2,), (5, 5), (7,)]
    params = [ta.zeros(*s, device=device, requires_grad=True) for s in shapes]
    grads = [[np.random.default_rng((k, i)).standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)]
             for k in range(n)]                                          # grads[rank][param]
    for p, g in zip(params, grads[r]):
        p.grad = ta.tensor(g, device=device)
    params[1].grad = None if r == 0 else params[1].grad                  # no gradient on rank 0: counts as zero
    averager = dist.GradAverager(params, bucket_mb=100e-6)
    expect_equal(np.array([len(b) for b in averager.buckets]), np.array([2, 1, 1]), "bucket sizes")
    sent = averager.average()
    expect_equal(np.array(sent), np.array(4 * (12 + 2 + 25 + 7)), "bytes per step")
    for i, p in enumerate(params):
        want = (grads[1][i] if i == 1 else grads[0][i] + grads[1][i]) * np.float32(0.5)
        expect_equal(p.grad, want, f"averaged gradient of parameter {i} on {device}")
    for p, g in zip(params, grads[r]):                                   # the next step: the buckets are reused
        p.grad = ta.tensor(-3 * g, device=device)
    averager.average()
    for i, p in enumerate(params):
        want = (-3 * grads[0][i] + -3 * grads[1][i]) * np.float32(0.5)
        expect_equal(p.grad, want, f"second average of parameter {i} on {device}")
    dist.barrier()


def fail(how, step, argv):
    """python -m train ARGS, with rank 1 failing at ``step``."""
    from train import loop
    real_step = loop.train_step
    calls = [0]

    def failing_step(*args, **kwargs):
        if dist.rank() == 1 and calls[0] == step:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"a failure made on purpose at step {step}")
        calls[0] += 1
        return real_step(*args, **kwargs)

    loop.train_step = failing_step
    from train import command
    return command.main(argv)


if __name__ == "__main__":
    if sys.argv[1] == "checks":
        devices = ["cpu"] + sys.argv[2:]
        dist.init("cuda" if "cuda" in devices else "cpu")            # NCCL only for "cuda", not "cuda-staged"
        for device in devices:
            checks("cuda" if device == "cuda-staged" else device)
        print(f"rank {dist.rank()}: the checks passed on {', '.join(devices)}", flush=True)
    elif sys.argv[1] == "fail":
        dist.init()
        sys.exit(fail(sys.argv[2], int(sys.argv[3]), sys.argv[4:]))
