"""What a training run writes beside its checkpoints: log.csv, loss.png, the profile and trace."""
import csv
import io
import json
import math
import os

from tqdm import tqdm

from . import checkpoint
from .config import PROFILE_STEPS
from .plots import NOT_INSTALLED, pyplot


def perplexity(loss):
    """exp(mean cross-entropy): the number of tokens the model hesitates between."""
    return math.exp(min(loss, 700.0))


def write_plot(log_rows, out_dir, train_losses=()):
    plt = pyplot()
    if plt is None:
        return f"loss.png skipped: {NOT_INSTALLED}"
    fig = loss_figure(plt, log_rows, train_losses)
    fig.savefig(os.path.join(out_dir, "loss.png"), dpi=100)
    plt.close(fig)
    return f"wrote {os.path.join(out_dir, 'loss.png')}"


def loss_figure(plt, log_rows, train_losses):
    """The loss of every training step (grey; None where unknown) and the eval points."""
    fig, ax = plt.subplots(figsize=(6, 4))
    if len(train_losses):
        losses = [math.nan if v is None else v for v in train_losses]        # None: a step from before --resume
        ax.plot(range(len(losses)), losses, color="0.7", lw=0.8, label="train (each step)")
    steps = [r["step"] for r in log_rows]
    if log_rows and "val_loss" not in log_rows[0]:       # --stage rl: the held-out accuracies, on a second axis
        acc = ax.twinx()
        for column in ("sampled_accuracy", "greedy_accuracy"):
            acc.plot(steps, [r[column] for r in log_rows], "o-", label=column.replace("_", " ") + " (held out)")
        acc.set_ylabel("accuracy")
        acc.legend(loc="lower right")
    else:
        ax.plot(steps, [r["train_loss"] for r in log_rows], "o-", label="train (eval)")
        ax.plot(steps, [r["val_loss"] for r in log_rows], "o-", label="val (eval)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def report_profile(profiler, out_dir):
    """--profile: the op table of the profiled steps (printed even with --quiet), and their Chrome trace."""
    trace = profiler.chrome_trace(os.path.join(out_dir, "trace.json"))
    tqdm.write(f"profile of steps {PROFILE_STEPS.start}-{PROFILE_STEPS.stop - 1}:\n{profiler.table()}\nwrote {trace}")


def write_log(log_rows, out_dir):
    f = io.StringIO()
    columns = ["step", "train_loss", "val_loss", "train_perplexity", "val_perplexity", "lr", "time", "val_bpb"]
    if log_rows and "val_loss" not in log_rows[0]:      # a stage measured by its answers (--stage rl)
        columns = list(dict.fromkeys(k for row in log_rows for k in row))
    else:                                               # and a stage's own numbers after them (--stage dpo)
        columns += [k for k in dict.fromkeys(k for row in log_rows for k in row) if k not in columns]
    writer = csv.DictWriter(f, fieldnames=columns)
    writer.writeheader()
    writer.writerows(log_rows)
    checkpoint.write_text(os.path.join(out_dir, "log.csv"), f.getvalue())


def write_results(out_dir, log_rows, train_losses, summary, say):
    """log.csv, loss.png and summary.json: what a run leaves beside its checkpoints."""
    write_log(log_rows, out_dir)
    say(write_plot(log_rows, out_dir, train_losses))
    checkpoint.write_text(os.path.join(out_dir, "summary.json"), json.dumps(summary, indent=2))
