"""Benchmark: data-parallel training steps over 1 and 2 processes (MPI), and the all-reduce alone.

    pip install -e ".[dist]"
    python bench/bench_dist.py                          # the mid config, 1 and 2 processes; JSON lines
    python bench/bench_dist.py --config tiny --steps 3  # a smoke test, in seconds
    python bench/bench_dist.py --out dist.jsonl         # also into a file

Each run is one process, or ``mpiexec -n N`` of this script (started for you). A step is
what ``python -m train`` does: forward and backward on this process's batch_size / N rows,
the gradient average (``tinyattn.distributed.GradAverager``: buckets of 25 MB, one
all-reduce each), clipping, AdamW. The batch is the config's global batch of random tokens.
Reported per run, rank 0's medians over --steps steps (after --warmup):

    ms_per_step, tokens_per_s        global tokens (batch x block) per second
    compute_ms                       forward + backward, this process's rows
    wait_ms                          at a barrier before the average: how long the faster
                                     process waits for the slower one
    allreduce_ms                     the average itself (pack the buckets, MPI all-reduce,
                                     unpack), after the barrier
    bytes_reduced_per_step           the gradients' bytes, reduced once per step

The BLAS threads of each process are given by --threads ("1,2": every run once with one
thread per process and once with as many as the machine has cores over the processes; a
process started with more threads than its share of cores fights the others for them).
Last, with 2 processes, the all-reduce of one buffer as large as the gradients, with nothing
else running ("allreduce_alone"), gives the transport's bandwidth: algbw = bytes / time and
busbw = algbw x 2(N - 1)/N, the bytes each process moves in a ring all-reduce (as NCCL's
tests report it).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

import tinyattn as ta
import tinyattn.distributed as dist
from tinyattn.models import GPT, GPTConfig
from train.loop import train_step

# from bench/bench_step.py: "mid" is the GPU config's model (10.7M parameters) at batch 4
CONFIGS = {
    "mid": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=4, vocab_size=65),
    "baby": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, vocab_size=65),
    "tiny": dict(n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=4, vocab_size=65),
}
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def median_ms(values):
    return round(1e3 * statistics.median(values), 2)


def worker(args):
    """One process of a run (rank 0 prints the result as one JSON line)."""
    dist.init(args.device)
    world, rank = dist.world_size(), dist.rank()
    cfg = dict(CONFIGS[args.config])
    batch, block = cfg.pop("batch_size"), cfg["block_size"]
    if batch % world:
        raise SystemExit(f"bench_dist: the {args.config} config's batch {batch} does not split over {world} processes")
    backend = ta.backend.get_backend(args.device)
    ta.manual_seed(0)
    model = ta.compile(GPT(GPTConfig(dropout=0.0, **cfg)).to(args.device))     # as python -m train runs it
    optimizer = model.configure_optimizer(0.1, 1e-3, (0.9, 0.99))
    dist.broadcast_parameters(model.parameters())
    averager = dist.GradAverager(model.parameters())
    rng = np.random.default_rng(rank)
    times = {"step": [], "compute": [], "wait": [], "allreduce": []}
    marks = {}

    def timed_average():                       # called by train_step between backward and clipping
        backend.synchronize()
        marks["backward_done"] = time.perf_counter()
        dist.barrier()
        marks["all_here"] = time.perf_counter()
        averager.average()
        backend.synchronize()
        marks["averaged"] = time.perf_counter()

    for i in range(args.warmup + args.steps):
        x = rng.integers(0, cfg["vocab_size"], size=(batch // world, block + 1))           # (b, T + 1)
        batches = [(ta.tensor(x[:, :-1], device=args.device), ta.tensor(x[:, 1:], device=args.device))]
        dist.barrier()
        t0 = time.perf_counter()
        train_step(model, optimizer, batches, 1.0, timed_average)
        backend.synchronize()
        t1 = time.perf_counter()
        if i >= args.warmup:
            times["step"].append(t1 - t0)
            times["compute"].append(marks["backward_done"] - t0)
            times["wait"].append(marks["all_here"] - marks["backward_done"])
            times["allreduce"].append(marks["averaged"] - marks["all_here"])
    result = dict(bench="dist_step", config=args.config, device=args.device, processes=world,
                  threads_per_process=os.environ.get("OMP_NUM_THREADS", "default"),
                  global_batch=batch, block_size=block, parameters=model.num_parameters(),
                  steps=args.steps, ms_per_step=median_ms(times["step"]),
                  tokens_per_s=round(batch * block / statistics.median(times["step"]), 1),
                  compute_ms=median_ms(times["compute"]), wait_ms=median_ms(times["wait"]),
                  allreduce_ms=median_ms(times["allreduce"]),
                  bytes_reduced_per_step=averager.bytes_per_step if world > 1 else 0,
                  buckets=len(averager.buckets))
    if world > 1:
        per_rank = dist.gather_object(times["allreduce"])            # every rank takes part; rank 0 gets the list
        if rank == 0:
            result["allreduce_ms_per_rank"] = [median_ms(t) for t in per_rank]
        alone = allreduce_alone(averager.bytes_per_step, args.device, args.steps)
    if rank == 0:
        print(json.dumps(result), flush=True)
        if world > 1:
            print(json.dumps(alone), flush=True)


def allreduce_alone(nbytes, device, repeats):
    """The mean all-reduce of one float32 buffer of ``nbytes``, with nothing else running."""
    world = dist.world_size()
    t = ta.zeros(nbytes // 4, device=device)
    backend = t.backend
    spans = []
    for i in range(repeats + 1):
        dist.barrier()
        backend.synchronize()
        t0 = time.perf_counter()
        dist.all_reduce(t, "mean")
        backend.synchronize()
        if i:                                  # the first one warms up
            spans.append(time.perf_counter() - t0)
    seconds = statistics.median(spans)
    algbw = nbytes / seconds / 1e9
    return dict(bench="allreduce_alone", device=device, processes=world, bytes=nbytes, ms=round(1e3 * seconds, 2),
                algbw_GBps=round(algbw, 2), busbw_GBps=round(algbw * 2 * (world - 1) / world, 2))


def run(procs, threads, args):
    """One run of ``procs`` processes, each with ``threads`` BLAS threads ("default": unset)."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    if threads != "default":
        env.update({var: threads for var in THREAD_VARS})
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--config", args.config, "--device", args.device,
           "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if procs > 1:
        cmd = [args.mpiexec, "-n", str(procs)] + cmd
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench_dist: {' '.join(cmd)} failed:\n{done.stdout}{done.stderr}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="mid", choices=sorted(CONFIGS))
    p.add_argument("--device", default="cpu", help="cpu, or cuda (one GPU per process, NCCL)")
    p.add_argument("--procs", default="1,2", help="numbers of processes to run, comma-separated")
    p.add_argument("--threads", default="1,default",
                   help="BLAS threads per process for each run: numbers or 'default' (unset), comma-separated")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--mpiexec", default=None, help="the mpiexec to start runs with (default: beside python, or on PATH)")
    p.add_argument("--out", help="also append the JSON lines to this file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.mpiexec is None:
        import shutil
        args.mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    if args.mpiexec is None and any(int(n) > 1 for n in args.procs.split(",")):
        raise SystemExit('bench_dist: no mpiexec found: pip install -e ".[dist]"')
    machine = dict(bench="machine", python=platform.python_version(), numpy=np.__version__, cpus=os.cpu_count(),
                   processor=platform.processor() or platform.machine())
    lines = [machine]
    print(json.dumps(machine), flush=True)
    for threads in args.threads.split(","):
        for procs in (int(n) for n in args.procs.split(",")):
            for result in run(procs, threads, args):
                print(json.dumps(result), flush=True)
                lines.append(result)
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)


if __name__ == "__main__":
    main()
