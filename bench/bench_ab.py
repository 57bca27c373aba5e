"""Benchmark: tinyattn's own time, two checkouts against each other, in alternating fresh processes.

    git worktree add ../before HEAD~5                  # the code to compare with
    python bench/bench_ab.py ../before . --pairs 10    # step: baby, default, mid; decoding: baby, default
    python bench/bench_ab.py ../before . --workloads ops:small ops:formulas   # one small op

For each workload, each pair runs the "before" checkout and the "after" one,
each in a fresh process (its own imports, numba's cache, BLAS threads), the
order swapped from pair to pair, and nothing else in between:

    step:CONFIG     bench/bench_step.py --device cpu --config CONFIG --sides tinyattn --no_unfused:
                    the median ms of a training step (forward, backward, clip, AdamW)
    decode:CONFIG   bench/bench_decode.py --configs CONFIG --batches 1 8: the median ms per
                    generated token, batch 1 and batch 8 (needs PyTorch: its side runs too)
    ops:small       bench/bench_small_ops.py: the median us of one no-grad op on small
                    tensors (add, matmul, softmax, layer_norm, linear; one label each),
                    compiled (an older checkout: its fast layer, on by default then)
    ops:formulas    the same, the ops as written (not compiled; an older checkout: its
                    fast layer off): the engine's cost per op (ops:tiny: a few calls, for a test)

Each run uses the benchmark script of its own checkout, but for ops:small:
both sides run the bench_small_ops.py beside this file (an older checkout
may not have it), each importing its own checkout's tinyattn, which the run
checks. --before_env and --after_env set variables for one side only (the
numba's kernels off on one side: --after_env TINYATTN_CPU_KERNELS=0). Prints one JSON
line per workload (per op for ops:small): the medians of each side, the
median of the after/before ratios of the pairs (above 1: after is slower)
with their spread, and every pair, in ms (us for ops:small); then the CPU.
Run it with nothing else running: these machines are noisy.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench_step import cpu_info  # (beside this file: python puts its folder on the path)

WORKLOADS = ["step:baby", "step:default", "step:mid", "decode:baby", "decode:default"]
STEP_FLAGS = {"mid": ["--blocks", "4", "--steps", "3", "--warmup", "2"]}
OPS_FLAGS = {"small": [], "formulas": ["--formulas"],
             "tiny": ["--repeats", "2", "--number", "10", "--warmup", "10"]}   # (tiny: a test's)
UNITS = {"step": "ms", "decode": "ms", "ops": "us"}
SMALL_OPS = Path(__file__).resolve().with_name("bench_small_ops.py")


def run(checkout, workload, extra_env=None):
    """The time this workload takes in one fresh process of ``checkout``: {label: ms, or us for ops}."""
    kind, config = workload.split(":")
    root = Path(checkout).resolve()
    env = {**os.environ, **(extra_env or {}), "PYTHONPATH": str(root)}
    if kind == "step":
        command = [sys.executable, str(root / "bench" / "bench_step.py"), "--device", "cpu", "--config", config,
                   "--sides", "tinyattn", "--no_unfused", *STEP_FLAGS.get(config, [])]
    elif kind == "ops":
        command = [sys.executable, str(SMALL_OPS), *OPS_FLAGS[config]]
    else:
        command = [sys.executable, str(root / "bench" / "bench_decode.py"), "--configs", config,
                   "--batches", "1", "8", "--rounds", "10"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=root, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"bench_ab: {workload} in {root} failed: {done.stderr.strip().splitlines()[-1:]}")
    if kind == "step":
        report = json.loads(done.stdout[done.stdout.index("{"):])
        return {workload: report["results"]["tinyattn"]["ms_per_step_median"]}
    if kind == "ops":
        report = json.loads(done.stdout.splitlines()[-1])
        if not Path(report["tinyattn"]).resolve().is_relative_to(root):      # (an installed copy came first)
            raise SystemExit(f"bench_ab: {workload} for {root} imported {report['tinyattn']}")
        return {f"{workload} {op}": us for op, us in report["us_median"].items()}
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {f"{workload} B{r['batch']}": r["tinyattn_ms_per_token"] for r in lines if "batch" in r}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", help="a checkout of the code to compare with")
    p.add_argument("after", help="a checkout of the code to measure")
    p.add_argument("--pairs", type=int, default=10, help="fresh-process pairs per workload (default 10)")
    p.add_argument("--workloads", nargs="+", default=WORKLOADS, help=f"default: {' '.join(WORKLOADS)} "
                   f"(and ops:{', ops:'.join(OPS_FLAGS)})")
    p.add_argument("--before_env", nargs="+", default=[], metavar="NAME=VALUE",
                   help="environment variables for the before side only")
    p.add_argument("--after_env", nargs="+", default=[], metavar="NAME=VALUE",
                   help="environment variables for the after side only (e.g. TINYATTN_CPU_KERNELS=0)")
    args = p.parse_args(argv)
    env = {"before": environment(p, args.before_env), "after": environment(p, args.after_env)}
    for workload in args.workloads:
        unit = UNITS[workload.split(":")[0]]
        pairs = {}
        for i in range(args.pairs):
            order = [("before", args.before), ("after", args.after)]
            if i % 2:
                order.reverse()
            times = {side: run(checkout, workload, env[side]) for side, checkout in order}
            for label in times["before"]:
                pairs.setdefault(label, []).append((times["before"][label], times["after"][label]))
        for label, got in pairs.items():
            ratios = sorted(after / before for before, after in got)
            print(json.dumps({"workload": label, "pairs": len(got),
                              f"before_{unit}_median": round(statistics.median(b for b, _ in got), 4),
                              f"after_{unit}_median": round(statistics.median(a for _, a in got), 4),
                              "after_over_before_median": round(statistics.median(ratios), 4),
                              "ratio_spread": [round(ratios[0], 4), round(ratios[-1], 4)],
                              f"{unit}_pairs": [[round(b, 4), round(a, 4)] for b, a in got]}), flush=True)
    print(json.dumps({"cpu": cpu_info()}))


def environment(parser, assignments):
    """--before_env/--after_env's NAME=VALUE words as a dict."""
    env = {}
    for word in assignments:
        name, sep, value = word.partition("=")
        if not sep or not name:
            parser.error(f"expected NAME=VALUE, got {word!r}")
        env[name] = value
    return env


if __name__ == "__main__":
    main()
