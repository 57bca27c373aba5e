"""What a training run writes beside its checkpoints: log.csv, loss.png, the profile and trace."""
import csv
import io
import json
import math
import os

from tqdm import tqdm

from . import checkpoint
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
    for column, label in (("train_loss", "train (eval)"), ("val_loss", "val (eval)")):
        if log_rows and column in log_rows[0]:
            ax.plot(steps, [r[column] for r in log_rows], "o-", label=label)
    accuracies = [k for k in (log_rows[0] if log_rows else {}) if k.endswith("_accuracy")]
    if accuracies:                                       # (the held-out accuracies, on a second axis)
        acc = ax.twinx()
        for column in accuracies:
            acc.plot(steps, [r[column] for r in log_rows], "o-", label=column.replace("_", " ") + " (held out)")
        acc.set_ylabel("accuracy")
        acc.legend(loc="lower right")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def report_profile(profiler, out_dir):
    """--profile: the op table of the profiled steps (printed even with --quiet), and their Chrome trace."""
    from .config import PROFILE_STEPS          # (here: config.py reads the stages, which import this module)
    trace = profiler.chrome_trace(os.path.join(out_dir, "trace.json"))
    tqdm.write(f"profile of steps {PROFILE_STEPS.start}-{PROFILE_STEPS.stop - 1}:\n{profiler.table()}\nwrote {trace}")


def write_log(log_rows, out_dir, step_rows=None):
    """log.csv: a row for each evaluation; with ``step_rows`` (a stage's numbers of each training
    step, --stage rl's rewards) a row for each step too, the evaluation's columns filled at its steps."""
    f = io.StringIO()
    first = ["step", "train_loss", "val_loss", "train_perplexity", "val_perplexity", "lr", "time", "val_bpb"]
    found = list(dict.fromkeys(k for row in log_rows for k in row))         # the stage's columns, in their order
    columns = [k for k in first if k in found] + [k for k in found if k not in first]
    rows = log_rows
    if step_rows:
        merged = {row["step"]: dict(row) for row in step_rows}
        for row in log_rows:
            merged.setdefault(row["step"], {}).update(row)
        rows = [merged[step] for step in sorted(merged)]
        columns += [k for k in dict.fromkeys(k for row in step_rows for k in row) if k not in columns]
    writer = csv.DictWriter(f, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    checkpoint.write_text(os.path.join(out_dir, "log.csv"), f.getvalue())


def write_results(out_dir, log_rows, train_losses, summary, say, step_rows=None):
    """log.csv, loss.png and summary.json: what a run leaves beside its checkpoints."""
    write_log(log_rows, out_dir, step_rows)
    say(write_plot(log_rows, out_dir, train_losses))
    checkpoint.write_text(os.path.join(out_dir, "summary.json"), json.dumps(summary, indent=2))
