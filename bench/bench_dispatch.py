"""Benchmark: where scaled_dot_product_attention should switch from the naive path to the tiled one.

    python bench/bench_dispatch.py                       # B, H, T of the table in BENCHMARKS.md
    python bench/bench_dispatch.py --shapes 1,8,512 4,6,256 --repeats 30

Causal forward + backward of F.scaled_dot_product_attention(impl="naive") and
(impl="tiled"), D = 64, float32, the two paths alternating in one process (a
machine whose speed drifts from minute to minute moves both alike). Prints one
JSON line per shape: the median ms of each path and tiled / naive. Where the
ratio is above 1, auto should stay naive (TILED_MIN_SCORES in
tinyattn/nn/functional.py).
"""
import argparse
import json
import statistics
import time

import numpy as np

import tinyattn as ta
import tinyattn.nn.functional as F

SHAPES = ["1,8,256", "1,8,384", "1,8,512", "1,8,768", "1,8,1024", "4,6,256"]


def one_call(q, k, v, u, impl):
    """ms for one causal forward + backward on the given path."""
    for t in (q, k, v):
        t.grad = None
    start = time.perf_counter()
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, impl=impl)
    out.backward(u)
    return (time.perf_counter() - start) * 1000


def measure(B, H, T, repeats, rng):
    q, k, v = (ta.tensor(rng.standard_normal((B, H, T, 64)).astype(np.float32), requires_grad=True)
               for _ in range(3))
    u = ta.tensor(rng.standard_normal((B, H, T, 64)).astype(np.float32))
    times = {"naive": [], "tiled": []}
    for impl in times:                                   # warm up: first calls load kernels, fill caches
        one_call(q, k, v, u, impl)
    for _ in range(repeats):
        for impl in times:
            times[impl].append(one_call(q, k, v, u, impl))
    naive, tiled = statistics.median(times["naive"]), statistics.median(times["tiled"])
    return dict(B=B, H=H, T=T, repeats=repeats, naive_ms=round(naive, 2), tiled_ms=round(tiled, 2),
                tiled_over_naive=round(tiled / naive, 3), threshold_scores=F.TILED_MIN_SCORES,
                auto=F.attention_impl(q, k))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=SHAPES, help="B,H,T triples (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=20, help="calls per path and shape (default 20)")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    for shape in args.shapes:
        B, H, T = (int(x) for x in shape.split(","))
        print(json.dumps(measure(B, H, T, args.repeats, rng)), flush=True)


if __name__ == "__main__":
    main()
