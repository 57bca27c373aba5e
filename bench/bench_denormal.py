"""Benchmark: a training step with subnormal weights, with subnormals flushed to zero and without.

    python3 bench/bench_denormal.py                          # baby: 4 layers, 128 channels, block 64, batch 12
    python3 bench/bench_denormal.py --fast on --steps 11     # the compiled model only, more steps
    python3 bench/bench_denormal.py --config tiny --steps 1 --repeats 1 --size 64     # a smoke test

A float32 below 2**-126 in size is subnormal, and an x86 CPU takes a slow path
for each operation that reads or makes one. Fine-tuning makes them (tiny
probabilities, weights and gradients). ``ta.set_flush_denormal(True)`` makes
every thread that computes read and write them as zero (tinyattn/fast/denormals.py);
``python -m train`` turns it on. Each case below runs with it off, then on:

    matmul   a (n, n) @ b (n, n) float32 with b normal, then b all subnormal (2**-129); BLAS at
             the thread count it has when the case runs (printed), the median of --repeats products
    step     train.loop.train_step of a GPT (forward, backward, clip_grad_norm_(1.0), AdamW,
             zero_grad) with its weights normal, then with half the entries of each weight matrix
             set to 2**-129; the weights are put back before each step (untimed), as one step of
             AdamW would make them normal again. The median of --steps steps, after one untimed
             step; the GPT compiled (ta.compile: the fast layer), not compiled (its formulas), or
             both (--fast on, off, both)

One JSON line for the CPU, then one per case and mode: normal_ms, subnormal_ms and
their ratio, subnormal_over_normal (about 1 where subnormals cost nothing extra).
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np

import tinyattn as ta
from tinyattn.fast import denormals, tune_host_allocator
from tinyattn.models import GPT, GPTConfig
from train.loop import train_step

# (bench_step.py is beside this file: python puts its folder on the path)
from bench_step import BETAS, CONFIGS, GRAD_CLIP, LR, WEIGHT_DECAY, cpu_info


def median_ms(fn, repeats, before=None):
    """The median time of ``repeats`` calls of ``fn``, in ms; ``before()`` runs untimed before each."""
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def blas_threads():
    """The thread count of each BLAS library numpy may call now (threadpoolctl), or None without it."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    return [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]


def row(case, normal_ms, subnormal_ms, **info):
    print(json.dumps({"case": case, **info, "normal_ms": round(normal_ms, 3), "subnormal_ms": round(subnormal_ms, 3),
                      "subnormal_over_normal": round(subnormal_ms / normal_ms, 2)}), flush=True)


def matmul_rows(n, repeats):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    tiny = denormals.subnormals((n, n))
    for flush in (False, True):
        ta.set_flush_denormal(flush)
        a @ b, a @ tiny                                                 # untimed: BLAS's threads start
        row("matmul", median_ms(lambda: a @ b, repeats), median_ms(lambda: a @ tiny, repeats),
            n=n, flush=flush, blas_threads=blas_threads())


class Step:
    """A GPT, its AdamW and a few random batches; its weights as made, and with subnormals seeded in."""

    def __init__(self, cfg, fast):
        ta.manual_seed(0)
        names = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "dropout")
        config = GPTConfig(**{k: cfg[k] for k in names})
        self.model = ta.compile(GPT(config), disable=not fast)      # not compiled: every op's formula
        self.optimizer = self.model.configure_optimizer(WEIGHT_DECAY, LR, BETAS)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        rng = np.random.default_rng(0)
        seq = rng.integers(0, cfg["vocab_size"], (8, cfg["batch_size"], cfg["block_size"] + 1))   # (K, B, T + 1)
        self.batches = [(ta.tensor(s[:, :-1]), ta.tensor(s[:, 1:])) for s in seq]
        self.normal = [p.data.copy() for p in self.params]
        # half the entries of each weight matrix set to 2**-129 (np.where copies bits: no arithmetic
        # that flushing could change)
        self.subnormal = [np.where(rng.random(w.shape) < 0.5, denormals.subnormals(w.shape), w) if w.ndim >= 2 else w
                          for w in self.normal]
        self.i = 0

    def put(self, weights):
        for p, w in zip(self.params, weights):
            np.copyto(p.data, w)

    def step(self):
        self.i += 1
        train_step(self.model, self.optimizer, [self.batches[self.i % len(self.batches)]], GRAD_CLIP)

    def time(self, weights, steps):
        """The median ms of ``steps`` steps, each from ``weights``, after one untimed step."""
        self.put(weights)
        self.step()
        return median_ms(self.step, steps, before=lambda: self.put(weights))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="baby", choices=sorted(CONFIGS), help="a model of bench/bench_step.py (baby)")
    p.add_argument("--steps", type=int, default=7, help="timed steps per case and mode (7)")
    p.add_argument("--repeats", type=int, default=20, help="timed products per matmul case and mode (20)")
    p.add_argument("--size", type=int, default=512, help="n of the (n, n) @ (n, n) product (512)")
    p.add_argument("--fast", default="both", choices=["on", "off", "both"],
                   help="time the step compiled (on: ta.compile, the fast layer), not compiled (off: every "
                        "op's teaching formula) or both")
    args = p.parse_args(argv)
    if min(args.steps, args.repeats, args.size) < 1:
        p.error("--steps, --repeats and --size must be at least 1")
    if not ta.set_flush_denormal(False):
        print("bench_denormal: ta.set_flush_denormal is not supported on this CPU and system "
              "(x86-64 Linux and macOS only)", file=sys.stderr)
        return 1
    cfg = dict(CONFIGS[args.config])
    print(json.dumps({"cpu": cpu_info(), "numpy": np.__version__, "host_allocator": tune_host_allocator(),
                      "config": {"name": args.config, **cfg}, "steps": args.steps, "repeats": args.repeats}),
          flush=True)
    matmul_rows(args.size, args.repeats)                    # first: before tinyattn's threads hold BLAS at one thread
    for fast in {"on": [True], "off": [False], "both": [True, False]}[args.fast]:
        step = Step(cfg, fast)
        for flush in (False, True):
            ta.set_flush_denormal(flush)
            time.sleep(0.2)                                 # BLAS's spinning threads settle
            row("step", step.time(step.normal, args.steps), step.time(step.subnormal, args.steps),
                fast=fast, flush=flush, blas_restarted=[path.rsplit("/", 1)[-1] for path in denormals.restarted_blas])
    ta.set_flush_denormal(False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
