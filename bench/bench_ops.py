"""Benchmark: one small op without a graph, tinyattn against PyTorch, side by side in one process.

    python bench/bench_ops.py                          # the five ops of docs/benchmarks.md
    python bench/bench_ops.py --ops add matmul --rounds 30

What a step of a small model, or one decoded token, pays per op: the engine's
and Python's cost around a tiny array operation. Each op runs under
``no_grad`` (``torch.no_grad``) on float32 inputs:

    add         (4, 4) + (4, 4)
    matmul      (4, 4) @ (4, 4)
    softmax     softmax of (4, 4) over the last dim
    layer_norm  F.layer_norm of (1, 128) with a weight and bias of 128
    linear      F.linear of (1, 128) with a (128, 128) weight and a bias

Three sides: tinyattn compiled (``tinyattn``: the timing loop of ``--calls``
calls is one function wrapped by ta.compile, so each op runs its fast version
and the check each compiled call makes first is paid once per loop, not once
per op), tinyattn not compiled (``formula``: the teaching formulas, what a program
that never calls ta.compile runs), and PyTorch. A round times ``--calls``
calls of each side in turn (the sides alternate, so that a machine whose speed
drifts moves them alike). Prints one JSON line per op (after one naming the
CPU, and whether the fast ops ran: false where the library's teaching code
was edited): the median microseconds per call of each side over the rounds,
and each tinyattn side's time over PyTorch's (1.0: as fast; 2.0: twice as
long). Ops the fast layer has no version of (add) run the same code on both
tinyattn sides.
Needs PyTorch in this Python (a CPU build: pip install torch==2.13.0 --index-url
https://download.pytorch.org/whl/cpu).
"""
import argparse
import json
import statistics
import time

import numpy as np

import tinyattn as ta
import tinyattn.nn.functional as F
from tinyattn.fast import checked
from bench_step import cpu_info, import_torch  # (beside this file: python puts its folder on the path)

OPS = ["add", "matmul", "softmax", "layer_norm", "linear"]


def cases(torch, rng):
    """{op: (tinyattn call, PyTorch call)}, each a function of no arguments on ready inputs."""
    def pair(*shapes):
        arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        return [ta.tensor(a) for a in arrays], [torch.from_numpy(a) for a in arrays]

    (a, b), (ta_, tb) = pair((4, 4), (4, 4))
    (x, w, bias, ln_w, ln_b), (tx, tw, tbias, tln_w, tln_b) = pair((1, 128), (128, 128), (128,), (128,), (128,))
    tf = torch.nn.functional
    return {
        "add": (lambda: a + b, lambda: ta_ + tb),
        "matmul": (lambda: a @ b, lambda: ta_ @ tb),
        "softmax": (lambda: a.softmax(-1), lambda: ta_.softmax(-1)),
        "layer_norm": (lambda: F.layer_norm(x, (128,), ln_w, ln_b), lambda: tf.layer_norm(tx, (128,), tln_w, tln_b)),
        "linear": (lambda: F.linear(x, w, bias), lambda: tf.linear(tx, tw, tbias)),
    }


def per_call_us(fn, calls):
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def measure(name, ours, theirs, rounds, calls):
    sides = {"tinyattn": (ta.compile(per_call_us), ours),    # the whole loop compiled: the fast ops
             "formula": (per_call_us, ours),                 # not compiled: the teaching formulas
             "torch": (per_call_us, theirs)}
    times = {side: [] for side in sides}
    for timer, fn in sides.values():                         # warm up: first calls load kernels, fill caches
        timer(fn, calls)
    for _ in range(rounds):
        for side, (timer, fn) in sides.items():
            times[side].append(timer(fn, calls))
    med = {side: statistics.median(t) for side, t in times.items()}
    return dict(op=name, rounds=rounds, calls=calls, tinyattn_us=round(med["tinyattn"], 3),
                formula_us=round(med["formula"], 3), torch_us=round(med["torch"], 3),
                tinyattn_over_torch=round(med["tinyattn"] / med["torch"], 3),
                formula_over_torch=round(med["formula"] / med["torch"], 3))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", nargs="+", default=OPS, choices=OPS, help="the ops to time (default: all)")
    p.add_argument("--rounds", type=int, default=20, help="rounds per op, alternating the sides (default 20)")
    p.add_argument("--calls", type=int, default=2000, help="calls per side in a round (default 2000)")
    args = p.parse_args(argv)
    torch = import_torch("bench_ops")
    torch.set_num_threads(1)                                 # a tiny op runs on one thread on both sides
    print(json.dumps({"cpu": cpu_info(), "torch": torch.__version__, "fast_ops": "the fast ops" in checked.allowed()}),
          flush=True)
    table = cases(torch, np.random.default_rng(0))
    with ta.no_grad(), torch.no_grad():
        for name in args.ops:
            print(json.dumps(measure(name, *table[name], args.rounds, args.calls)), flush=True)


if __name__ == "__main__":
    main()
