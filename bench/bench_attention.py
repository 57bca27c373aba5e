"""Benchmark: plain attention against flash attention, time and memory as N grows.

    python bench/bench_attention.py --sizes 128 256 512 1024 2048

Prints one JSON object per line:
    {"kind": "config", ...}                        the settings
    {"kind": "point", "impl": "naive", "n": 512, "ms_median": ..., "ms_runs": [...], "peak_mib": ...}
    {"kind": "fit", "impl": "naive", "time_exponent": ...}   slope of log(time) against log(N)

"naive" is F.scaled_dot_product_attention: it builds the (N, N) scores and
weights. "flash" is F.flash_attention: (block, block) tiles, never (N, N).
Time is the median of forward + backward over --repeats runs after --warmup
runs. Memory is the peak of Python's tracemalloc (host allocations made by
numpy) in a separate, untimed run; on a GPU it is not measured (null).

On a shared 2-core machine timings are noisy: compare shapes of curves, not
single numbers. Each size times both sides in a block, after a short settle,
and swaps which side goes first from one size to the next, since a BLAS call
leaves spinning threads that slow whatever runs right after it.
"""
import argparse
import json
import math
import statistics
import time
import tracemalloc

import numpy as np

import tinyattn as ta
import tinyattn.nn.functional as F
from tinyattn.backend import get_backend


def make_inputs(args, n, rng):
    """q, k, v (B, H, N, D) that require grad, and a cotangent for the output."""
    shape = (args.batch, args.heads, n, args.head_dim)
    q, k, v = (ta.tensor(rng.standard_normal(shape), dtype=args.dtype, device=args.device, requires_grad=True)
               for _ in range(3))
    u = ta.tensor(rng.standard_normal(shape), dtype=args.dtype, device=args.device)
    return q, k, v, u


def attention_fns(args):
    return {
        "naive": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=args.causal),
        "flash": lambda q, k, v: F.flash_attention(q, k, v, is_causal=args.causal, block_size=args.block_size),
    }


def step(fn, q, k, v, u):
    """One forward + backward; gradients are dropped so runs do not accumulate."""
    for t in (q, k, v):
        t.grad = None
    fn(q, k, v).backward(u)


def time_ms(fn, inputs, args):
    """Forward + backward times in ms: --warmup untimed runs, then --repeats timed ones."""
    backend = get_backend(args.device)
    for _ in range(args.warmup):
        step(fn, *inputs)
    backend.synchronize()
    time.sleep(args.settle)
    runs = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        step(fn, *inputs)
        backend.synchronize()
        runs.append((time.perf_counter() - start) * 1e3)
    return runs


def peak_mib(fn, inputs, args):
    """Peak host memory (MiB) traced during one forward + backward; None off the host."""
    if not get_backend(args.device).on_host:
        return None
    tracemalloc.start()
    try:
        step(fn, *inputs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / 2 ** 20


def loglog_slope(ns, ms):
    """Least-squares slope of log(ms) against log(n): 2 means time grows as n^2."""
    return statistics.linear_regression([math.log(n) for n in ns], [math.log(t) for t in ms]).slope


def emit(record):
    print(json.dumps(record), flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[128, 256, 512, 1024, 2048], help="sequence lengths N")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head_dim", type=int, default=64)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--block_size", type=int, default=64, help="flash attention's tile size")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--settle", type=float, default=0.2, help="seconds of rest before each timed block")
    p.add_argument("--impls", nargs="+", default=["naive", "flash"], choices=["naive", "flash"])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    emit({"kind": "config", **vars(args)})
    fns = attention_fns(args)
    rng = np.random.default_rng(args.seed)
    medians = {name: [] for name in args.impls}
    for index, n in enumerate(args.sizes):
        inputs = make_inputs(args, n, rng)
        order = args.impls if index % 2 == 0 else args.impls[::-1]    # swap who goes first
        for name in order:
            runs = time_ms(fns[name], inputs, args)
            medians[name].append(statistics.median(runs))
            emit({"kind": "point", "impl": name, "n": n, "ms_median": round(medians[name][-1], 3),
                  "ms_runs": [round(t, 3) for t in runs], "peak_mib": _round(peak_mib(fns[name], inputs, args))})
    if len(args.sizes) >= 2:
        for name in args.impls:
            emit({"kind": "fit", "impl": name, "sizes": args.sizes,
                  "time_exponent": round(loglog_slope(args.sizes, medians[name]), 3)})


def _round(x, digits=3):
    return None if x is None else round(x, digits)


if __name__ == "__main__":
    main()
