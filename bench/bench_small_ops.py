"""Benchmark: one small op without a graph, tinyattn alone: the engine's cost per op.

    python bench/bench_small_ops.py                       # the five ops of bench_ops.py, compiled
    python bench/bench_small_ops.py --formulas            # the same ops as written (not compiled)
    python bench/bench_small_ops.py --ops add matmul --repeats 100

The ops and shapes of bench_ops.py, on float32 inputs under ``ta.no_grad()``,
without PyTorch:

    add         (4, 4) + (4, 4)
    matmul      (4, 4) @ (4, 4)
    softmax     F.softmax of (4, 4) over the last dim
    layer_norm  F.layer_norm of (1, 128) with a weight and bias of 128
    linear      F.linear of (1, 128) with a (128, 128) weight and a bias

After --warmup calls of each, a round times --number calls of each op in
turn, so that a busy moment of the machine slows them all alike. The clock
is this process's CPU time (--clock cpu): on a shared machine, the time it
waits for a core is not counted (these ops run on one thread; --clock wall
for the wall clock). Prints one JSON line: the tinyattn it imported, then
the median microseconds per call of each op over --repeats rounds.

By default the rounds run inside one function given to ``ta.compile``, so each
op runs its fast version, as inside a compiled model (one compiled call for all
of them: a compiled call of its own would add its check to each op's time); a
checkout older than ``ta.compile`` runs its fast layer by default, which is the
same thing. ``--formulas`` times the ops as written, not compiled (what a user who
never compiles gets; an older checkout is told TINYATTN_FAST=0). It uses only the
API that older checkouts have too, so bench_ab.py runs it against both of them
(ops:small, ops:formulas).
"""
import argparse
import json
import os
import statistics
import sys
import time
import timeit

import numpy as np

if "--formulas" in sys.argv:                    # (an older checkout: its fast layer off, before it is imported)
    os.environ["TINYATTN_FAST"] = "0"
import tinyattn as ta  # noqa: E402
import tinyattn.nn.functional as F  # noqa: E402

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
OPS = {"add": "a + b", "matmul": "a @ b", "softmax": "F.softmax(a, -1)",
       "layer_norm": "F.layer_norm(x, (128,), ln_w, ln_b)", "linear": "F.linear(x, w, bias)"}


def inputs(rng):
    """The tensors the statements of OPS read."""
    def t(*shape):
        return ta.tensor(rng.standard_normal(shape).astype(np.float32))
    return dict(F=F, a=t(4, 4), b=t(4, 4), x=t(1, 128), w=t(128, 128), bias=t(128), ln_w=t(128), ln_b=t(128))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS), help="the ops to time (default: all)")
    p.add_argument("--repeats", type=int, default=50, help="rounds, each timing every op once (default 50)")
    p.add_argument("--number", type=int, default=1000, help="calls of one op in a round (default 1000)")
    p.add_argument("--warmup", type=int, default=1000, help="calls of each op before the rounds (default 1000)")
    p.add_argument("--clock", choices=list(CLOCKS), default="cpu",
                   help="cpu: this process's CPU time (default); wall: the wall clock")
    p.add_argument("--formulas", action="store_true", help="the ops as written, not compiled")
    args = p.parse_args(argv)
    names = inputs(np.random.default_rng(0))
    timers = {op: timeit.Timer(OPS[op], timer=CLOCKS[args.clock], globals=names) for op in args.ops}
    us = {op: [] for op in args.ops}

    def rounds():
        with ta.no_grad():
            for timer in timers.values():
                timer.timeit(args.warmup)
            for _ in range(args.repeats):
                for op, timer in timers.items():
                    us[op].append(timer.timeit(args.number) / args.number * 1e6)
    compiled = not args.formulas and hasattr(ta, "compile")
    (ta.compile(rounds) if compiled else rounds)()
    print(json.dumps({"tinyattn": ta.__file__, "compiled": compiled, "formulas": args.formulas, "clock": args.clock,
                      "repeats": args.repeats, "number": args.number,
                      "us_median": {op: round(statistics.median(t), 4) for op, t in us.items()}}))


if __name__ == "__main__":
    main()
