"""Benchmark: attention paths side by side in one process: where auto should switch, and how the
tiled path compares with PyTorch's SDPA.

    python bench/bench_dispatch.py                       # naive against tiled, B, H, T of docs/benchmarks.md
    python bench/bench_dispatch.py --shapes 1,8,512 4,6,256 --repeats 30
    python bench/bench_dispatch.py --paths tiled torch --shapes 1,8,4096 --repeats 5   # needs PyTorch

Causal forward + backward, D = 64, float32, the paths alternating call by call
in one process, so that a machine whose speed drifts from minute to minute
moves them all alike (bench_attention.py runs each path in its own process,
which its memory measure needs, but then drift lands between the paths):

    naive   F.scaled_dot_product_attention(..., impl="naive")
    tiled   F.scaled_dot_product_attention(..., impl="tiled")
    torch   torch.nn.functional.scaled_dot_product_attention (PyTorch installed in this Python)

tinyattn's paths run compiled: each forward is a function wrapped by ta.compile, so its
ops are the fast layer's, and so is the backward of the ops it made (out.backward()
runs outside the call). Not compiled, the same call runs the teaching formulas.

Prints one JSON line per shape: the median ms of each path, tiled / naive where
both ran, and each tinyattn path over torch where torch ran, with the largest
relative difference (max |a - b| / max |b|) of the output and of dq, dk, dv
from PyTorch's. Where tiled / naive is above 1, auto should stay naive
(TILED_MIN_SCORES in tinyattn/nn/attention.py). fast_ops says whether the fast ops ran (false
where the library's teaching code was edited: they step aside, saying so on stderr).
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np

import tinyattn as ta
import tinyattn.nn.functional as F
from tinyattn.fast import checked
from tinyattn.nn import attention

SHAPES = ["1,8,256", "1,8,384", "1,8,512", "1,8,768", "1,8,1024", "4,6,256"]
PATHS = ["naive", "tiled"]


class Tinyattn:
    def __init__(self, impl, arrays):
        self.impl = impl

        @ta.compile
        def forward(q, k, v):                            # the ops made here are the fast layer's
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, impl=impl)
        self.forward = forward
        self.q, self.k, self.v = (ta.tensor(a, requires_grad=True) for a in arrays[:3])
        self.u = ta.tensor(arrays[3])

    def call(self):
        """ms for one causal forward + backward; the output and gradients stay in self.result."""
        for t in (self.q, self.k, self.v):
            t.grad = None
        start = time.perf_counter()
        out = self.forward(self.q, self.k, self.v)
        out.backward(self.u)                             # (the fast ops' backward, outside the call)
        ms = (time.perf_counter() - start) * 1000
        self.result = [t.numpy() for t in (out, self.q.grad, self.k.grad, self.v.grad)]
        return ms


class Torch:
    def __init__(self, torch, arrays):
        self.torch = torch
        self.q, self.k, self.v = (torch.from_numpy(a).requires_grad_() for a in arrays[:3])
        self.u = torch.from_numpy(arrays[3])

    def call(self):
        for t in (self.q, self.k, self.v):
            t.grad = None
        start = time.perf_counter()
        out = self.torch.nn.functional.scaled_dot_product_attention(self.q, self.k, self.v, is_causal=True)
        out.backward(self.u)
        ms = (time.perf_counter() - start) * 1000
        self.result = [t.detach().numpy() for t in (out, self.q.grad, self.k.grad, self.v.grad)]
        return ms


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def measure(B, H, T, paths, repeats, rng, torch=None, settle=0.0):
    arrays = [rng.standard_normal((B, H, T, 64)).astype(np.float32) for _ in range(4)]   # q, k, v, dout
    sides = {p: Torch(torch, arrays) if p == "torch" else Tinyattn(p, arrays) for p in paths}
    times = {p: [] for p in paths}
    for side in sides.values():                          # warm up: first calls load kernels, fill caches
        side.call()
    row = dict(B=B, H=H, T=T, repeats=repeats)
    if "torch" in sides:                                 # the same numbers as PyTorch
        ref = sides["torch"].result
        for p in paths:
            if p != "torch":
                row[f"{p}_rel_err_vs_torch"] = {name: round(rel_err(a, b), 9) for name, a, b
                                                in zip(("out", "dq", "dk", "dv"), sides[p].result, ref)}
    for _ in range(repeats):
        for p, side in sides.items():
            time.sleep(settle)                           # the last path's idle BLAS or OpenMP threads stop spinning
            times[p].append(side.call())
    median = {p: statistics.median(t) for p, t in times.items()}
    row.update({f"{p}_ms": round(m, 2) for p, m in median.items()})
    if "naive" in median and "tiled" in median:
        row["tiled_over_naive"] = round(median["tiled"] / median["naive"], 3)
    if "torch" in median:
        row.update({f"{p}_over_torch": round(median[p] / median["torch"], 3) for p in paths if p != "torch"})
    row.update(threshold_scores=attention.TILED_MIN_SCORES, auto=attention.attention_impl(ta.tensor(arrays[0]), ta.tensor(arrays[1])))
    if any(p != "torch" for p in paths):
        row["fast_ops"] = "the fast ops" in checked.allowed()
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=SHAPES, help="B,H,T triples (default: %(default)s)")
    p.add_argument("--paths", nargs="+", default=PATHS, choices=["naive", "tiled", "torch"],
                   help="the paths that alternate (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=20, help="calls per path and shape (default 20)")
    p.add_argument("--settle", type=float, default=0.3,
                   help="seconds of rest before each timed call (default 0.3): after a call, BLAS's and "
                        "PyTorch's worker threads keep spinning for a while and slow whatever runs next")
    args = p.parse_args(argv)
    torch = None
    if "torch" in args.paths:
        try:
            import torch
        except ImportError:
            sys.exit("bench_dispatch: --paths torch needs PyTorch in this Python (pip install torch)")
    paths = list(dict.fromkeys(args.paths))              # each once, in the order given
    rng = np.random.default_rng(0)
    for shape in args.shapes:
        B, H, T = (int(x) for x in shape.split(","))
        print(json.dumps(measure(B, H, T, paths, args.repeats, rng, torch, args.settle)), flush=True)


if __name__ == "__main__":
    main()
