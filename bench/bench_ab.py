"""Benchmark: tinyattn's own time, two checkouts against each other, in alternating fresh processes.

    git worktree add ../before HEAD~5                  # the code to compare with
    python bench/bench_ab.py ../before . --pairs 10    # step: baby, default, mid; decoding: baby, default

For each workload, each pair runs the "before" checkout and the "after" one,
each in a fresh process (its own imports, numba's cache, BLAS threads), the
order swapped from pair to pair, and nothing else in between:

    step:CONFIG     bench/bench_step.py --device cpu --config CONFIG --sides tinyattn --no_unfused:
                    the median ms of a training step (forward, backward, clip, AdamW)
    decode:CONFIG   bench/bench_decode.py --configs CONFIG --batches 1 8: the median ms per
                    generated token, batch 1 and batch 8 (needs PyTorch: its side runs too)

Each run uses the benchmark script of its own checkout. Prints one JSON line
per workload: the medians of each side, the median of the after/before ratios
of the pairs (above 1: after is slower) with their spread, and every pair;
then the CPU. Run it with nothing else running: these machines are noisy.
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


def run(checkout, workload):
    """The ms this workload takes in one fresh process of ``checkout``: {label: ms}."""
    kind, config = workload.split(":")
    root = Path(checkout).resolve()
    env = {**os.environ, "PYTHONPATH": str(root)}
    if kind == "step":
        command = [sys.executable, str(root / "bench" / "bench_step.py"), "--device", "cpu", "--config", config,
                   "--sides", "tinyattn", "--no_unfused", *STEP_FLAGS.get(config, [])]
    else:
        command = [sys.executable, str(root / "bench" / "bench_decode.py"), "--configs", config,
                   "--batches", "1", "8", "--rounds", "10"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=root, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"bench_ab: {workload} in {root} failed: {done.stderr.strip().splitlines()[-1:]}")
    if kind == "step":
        report = json.loads(done.stdout[done.stdout.index("{"):])
        return {workload: report["results"]["tinyattn"]["ms_per_step_median"]}
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {f"{workload} B{r['batch']}": r["tinyattn_ms_per_token"] for r in lines if "batch" in r}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", help="a checkout of the code to compare with")
    p.add_argument("after", help="a checkout of the code to measure")
    p.add_argument("--pairs", type=int, default=10, help="fresh-process pairs per workload (default 10)")
    p.add_argument("--workloads", nargs="+", default=WORKLOADS, help=f"default: {' '.join(WORKLOADS)}")
    args = p.parse_args(argv)
    for workload in args.workloads:
        pairs = {}
        for i in range(args.pairs):
            order = [("before", args.before), ("after", args.after)]
            if i % 2:
                order.reverse()
            times = {side: run(checkout, workload) for side, checkout in order}
            for label in times["before"]:
                pairs.setdefault(label, []).append((times["before"][label], times["after"][label]))
        for label, got in pairs.items():
            ratios = sorted(after / before for before, after in got)
            print(json.dumps({"workload": label, "pairs": len(got),
                              "before_ms_median": round(statistics.median(b for b, _ in got), 4),
                              "after_ms_median": round(statistics.median(a for _, a in got), 4),
                              "after_over_before_median": round(statistics.median(ratios), 4),
                              "ratio_spread": [round(ratios[0], 4), round(ratios[-1], 4)],
                              "ms_pairs": [[round(b, 4), round(a, 4)] for b, a in got]}), flush=True)
    print(json.dumps({"cpu": cpu_info()}))


if __name__ == "__main__":
    main()
