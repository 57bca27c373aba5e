"""The lesson's "it" result over many seeds: a robust result, or one lucky run?

Trains the default job (`python -m train`: the "it" corpus, the lesson's
report) once per seed, a few at a time: one process per core, each with one
BLAS thread. For every seed it reports what the lesson measures on the
held-out sentences:

  accuracy   the right noun's logit beats the other noun's at "=" (chance 0.5)
  exact      the top word at "=" is the right noun
  attention  the referent head (chosen on the training sentences) looks more at
             the right noun than at the other one from "="
  head       which (layer, head) was chosen, and its mean weight on the right
             noun and on the other one (a head that truly chooses puts most of
             its weight on the right noun, not just a little more than on the other)
  two heads  the best two heads of one layer with their weights added (a model
             may split the choice between two heads)

and ends with the minimum and the median of each over the seeds, as JSON
lines, and a chart (seeds.png; a text table without matplotlib). Flags it
does not know go to `python -m train`, e.g. `-- --n_head 1` to try a design.

    python -m train.experiments.seeds [--seeds 10] [--first 1] [--jobs 2] [--out_dir out-seeds] [-- TRAIN FLAGS]
"""
import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from . import _common

REPO_ROOT = Path(__file__).resolve().parents[2]
METRICS = ("heldout_accuracy", "heldout_exact", "heldout_attention_correct")
SHORT = {"heldout_accuracy": "accuracy", "heldout_exact": "exact", "heldout_attention_correct": "attention"}
# --tiny: a model small enough to train in a couple of seconds (what the tests use)
TINY_FLAGS = ["--n_layer", "2", "--n_head", "1", "--n_embd", "16", "--batch_size", "16", "--max_iters", "30",
              "--lr_decay_iters", "30", "--warmup_iters", "5", "--eval_interval", "1000", "--eval_iters", "1"]
OWN_FLAGS = ("--seed", "--out_dir", "--data", "--resume", "--overwrite")     # set here, or not for this experiment


def train_command(seed, out_dir, train_flags=()):
    """The `python -m train` command line for one seed (a seed's folder is this experiment's own:
    running it again replaces the seed's run)."""
    return [sys.executable, "-m", "train", "--quiet", "--seed", str(seed), "--out_dir", out_dir,
            "--sample_tokens", "0", "--overwrite", *train_flags]


def one_thread_env():
    """The environment for a worker: one BLAS thread, so N workers share N cores without fighting."""
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"
    return env


def run_seed(seed, out_dir, train_flags=(), threads_env=None):
    """Train one seed in its own process; -> a dict of the lesson's numbers for it."""
    seed_dir = os.path.join(out_dir, f"seed{seed}")
    start = time.time()
    done = subprocess.run(train_command(seed, seed_dir, train_flags), cwd=REPO_ROOT, env=threads_env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"seed {seed}: python -m train failed: {last}")
    with open(os.path.join(seed_dir, "summary.json")) as f:
        summary = json.load(f)
    if "heldout_accuracy" not in summary:
        raise RuntimeError(f"seed {seed}: the lesson report was skipped (is block_size long enough?)")
    row = dict(seed=seed, **{k: summary[k] for k in METRICS}, referent_head=summary["referent_head"],
               weight_right=summary["heldout_weight_right"], weight_wrong=summary["heldout_weight_wrong"],
               referent_head_train_fraction=summary["referent_head_train_fraction"],
               val_loss=summary["val_loss"], wall_s=round(time.time() - start, 1))
    for key in ("referent_pair", "heldout_pair_attention_correct", "choice_by_query"):
        if key in summary:
            row[key] = summary[key]
    return row


def summarise(rows):
    """min and median of each metric over the seeds, and how many seeds reach 0.9 and 0.95."""
    out = {}
    for k in METRICS:
        values = np.array([r[k] for r in rows])
        out[SHORT[k]] = dict(min=float(values.min()), median=float(np.median(values)),
                             at_least_0_9=int((values >= 0.9).sum()), at_least_0_95=int((values >= 0.95).sum()))
    return out


def run(seeds, out_dir="out-seeds", jobs=None, train_flags=(), plot_png=True, say=print):
    """Train every seed, `jobs` at a time; -> dict(seeds=[row, ...] in seed order, summary, plot)."""
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(seeds)))
    env = one_thread_env() if jobs > 1 else None
    os.makedirs(out_dir, exist_ok=True)
    rows = {}
    with ThreadPoolExecutor(jobs) as pool:       # threads that each wait on one training process
        futures = {pool.submit(run_seed, s, out_dir, train_flags, env): s for s in seeds}
        for future in futures:
            row = future.result()
            rows[row["seed"]] = row
            say(json.dumps(row))
    rows = [rows[s] for s in seeds]
    result = dict(seeds=rows, summary=summarise(rows), jobs=jobs, train_flags=list(train_flags),
                  command=" ".join(["python -m train", *train_flags, "--seed S"]))
    result["plot"] = plot(rows, out_dir) if plot_png else None
    return result


def plot(rows, out_dir, name="seeds.png"):
    plt = _common.pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(max(4.0, 0.5 * len(rows) + 2), 3.2))
    x = np.arange(len(rows))
    for offset, k, marker in ((-0.2, "heldout_accuracy", "o"), (0.0, "heldout_exact", "s"),
                              (0.2, "heldout_attention_correct", "^")):
        ax.scatter(x + offset, [r[k] for r in rows], marker=marker, label=SHORT[k])
    ax.axhline(0.5, color="gray", lw=0.8, ls="--", label="chance")
    ax.set_xticks(x, [str(r["seed"]) for r in rows])
    ax.set_xlabel("seed")
    ax.set_ylim(0.0, 1.05)
    ax.set_title('the "it" lesson on held-out sentences, by seed', fontsize=10)
    ax.legend(fontsize=7, loc="lower left", ncol=4)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = _common.save_figure(fig, out_dir, name)
    plt.close(fig)
    return path


def table(r):
    lines = [f"{'seed':>6} {'accuracy':>9} {'exact':>7} {'attention':>10} {'head':>6} {'weight':>11} "
             f"{'two heads':>10} {'wall s':>7}"]
    for row in r["seeds"]:
        layer, head = row["referent_head"]
        weights = f"{row['weight_right']:.2f}/{row['weight_wrong']:.2f}"
        pair = row.get("heldout_pair_attention_correct")
        lines.append(f"{row['seed']:>6} {row['heldout_accuracy']:9.3f} {row['heldout_exact']:7.3f} "
                     f"{row['heldout_attention_correct']:10.3f} {f'L{layer}H{head}':>6} {weights:>11} "
                     f"{'-' if pair is None else f'{pair:.3f}':>10} {row['wall_s']:7.1f}")
    for stat in ("min", "median"):
        s = r["summary"]
        lines.append(f"{stat:>6} {s['accuracy'][stat]:9.3f} {s['exact'][stat]:7.3f} {s['attention'][stat]:10.3f}")
    return "\n".join(lines)


def sentence(r):
    s, n = r["summary"], len(r["seeds"])
    return (f"Over {n} seeds of `{r['command']}`: held-out accuracy min {s['accuracy']['min']:.3f} "
            f"(median {s['accuracy']['median']:.3f}), exact answer min {s['exact']['min']:.3f} "
            f"(median {s['exact']['median']:.3f}); the referent head is right from '=' in at least 90% of "
            f"held-out sentences in {s['attention']['at_least_0_9']} of {n} seeds "
            f"(min {s['attention']['min']:.3f}, median {s['attention']['median']:.3f}).")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m train.experiments.seeds", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=10, help="how many seeds (default 10)")
    p.add_argument("--first", type=int, default=1, help="the first seed (default 1): seeds first .. first+N-1")
    p.add_argument("--jobs", type=int, default=None, help="training processes at a time (default: one per core)")
    p.add_argument("--out_dir", default="out-seeds", help="one folder per seed, and seeds.png")
    p.add_argument("--tiny", action="store_true", help="a tiny model, a few seconds a seed (what the tests use)")
    p.add_argument("--no_plot", action="store_true", help="skip the PNG")
    args, train_flags = p.parse_known_args(argv)
    train_flags = [f for f in train_flags if f != "--"]
    given = [f for f in train_flags if f.split("=")[0] in OWN_FLAGS]
    if given:
        return _common.error("seeds", f"{given[0]} is not a flag of this experiment (it sets the seed and "
                                      "the folders itself, and trains the 'it' corpus)")
    if args.seeds < 1 or (args.jobs is not None and args.jobs < 1):
        return _common.error("seeds", "--seeds and --jobs must be at least 1")
    if args.tiny:
        train_flags = TINY_FLAGS + train_flags
    from ..config import parse_args
    try:
        parse_args(train_flags)                       # a bad flag fails here, once, not in every worker
    except SystemExit:
        return 2
    seeds = list(range(args.first, args.first + args.seeds))
    try:
        r = run(seeds, args.out_dir, args.jobs, train_flags, not args.no_plot)
    except (RuntimeError, OSError, ValueError) as e:
        return _common.error("seeds", e)
    return _common.report(sentence(r), r, table(r))


if __name__ == "__main__":
    raise SystemExit(main())
