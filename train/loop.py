"""python -m train: train a GPT, with nanoGPT's flag names.

With no --data it trains on the lesson's generated "it" corpus (data/coref.py)
and reports how well the model, and its attention, resolve "it". With
--data FILE it trains a character-level model on any UTF-8 text file.

(This module is the reusable part: the flags and presets, ``train_step``,
``train(args)`` and ``main(argv)``. ``train/__main__.py`` only calls ``main``.)
"""
import argparse
import contextlib
import csv
import difflib
import io
import json
import math
import os
import sys
import time

import numpy as np
from tqdm import tqdm

import tinyattn as ta
from tinyattn import distributed as dist
from tinyattn.models import GPT, GPTConfig
from tinyattn.models.gpt import INITS
from tinyattn.optim import warmup_cosine, set_lr
from tinyattn.nn.utils import clip_grad_norm_
from tinyattn.fast import tune_host_allocator

from . import checkpoint, finetune, interrupts, memory, parallel
from .data import load_coref, load_data, tokenizer_from_json, tokenizer_to_json
from .plots import NOT_INSTALLED, pyplot

# Defaults per dataset, like nanoGPT's config files. Flags override them.
PRESETS = {
    # the lesson's corpus, one sentence per sequence (18 tokens at most). 4 heads of 16 channels:
    # with one head per layer the exact answer failed at some seeds. Head dropout (a head is dropped
    # for a whole sentence a quarter of the time) makes a head that handles one kind of noun only,
    # and leaves the other kind to another head, a bad bet: one head learns to choose for both.
    # PyTorch's default init (not GPT-2's) made that head appear at more seeds. Over seeds:
    # bench/BENCHMARKS.md, python -m train.experiments.seeds.
    "coref": dict(layout="sentence", n_layer=2, n_head=4, n_embd=64, block_size=20, batch_size=64, max_iters=1500,
                  learning_rate=3e-3, min_lr=3e-4, warmup_iters=100, lr_decay_iters=1500, eval_interval=200,
                  eval_iters=10, out_dir="out-coref", init="default", head_dropout=0.25),
    # nanoGPT's CPU "baby" Shakespeare config
    "text": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, max_iters=2000,
                 learning_rate=1e-3, min_lr=1e-4, warmup_iters=100, lr_decay_iters=2000, eval_interval=250,
                 eval_iters=20, out_dir="out"),
}
DEFAULT_SEED = 1337
PROFILE_STEPS = range(1, 6)   # --profile: step 0 warms up, these five are timed
COMMON = dict(dropout=0.0, head_dropout=0.0, init="gpt2", weight_decay=0.1, beta1=0.9, beta2=0.99, grad_clip=1.0,
              gradient_accumulation_steps=1, bias=True, log_interval=10, sample_tokens=200, shared_batches=False)


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line, without the usage block. Flags are never
    abbreviated (``--lr`` is not ``--lr_decay_iters``): an unknown flag is refused by name,
    with the closest real ones suggested."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n" if dist.rank() == 0 else None)

    def parse_args(self, args=None, namespace=None):
        args, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(unknown_argument_message(self, extras))
        return args


def at_least(lo, kind=int):
    """An argparse type: a number of ``kind`` that is at least ``lo``."""
    def parse(text):
        value = kind(text)
        if not value >= lo:                      # NaN fails too
            raise argparse.ArgumentTypeError(f"must be at least {lo}, got {text}")
        return value
    parse.__name__ = kind.__name__               # argparse's "invalid int value" message
    return parse


def yes_or_no(text):
    """An argparse type for on/off flags: true/false, yes/no, 1/0."""
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


ALIASES = {"--lr": "--learning_rate", "--epochs": "--max_iters", "--steps": "--max_iters", "--iters": "--max_iters",
           "--bs": "--batch_size", "--context": "--block_size", "--layers": "--n_layer", "--heads": "--n_head"}


def unknown_argument_message(parser, extras):
    """One line about the first argument argparse did not know, with a suggestion."""
    flags = [f for action in parser._actions for f in action.option_strings if f.startswith("--")]
    first = next((e for e in extras if e.startswith("-")), extras[0])
    if not first.startswith("-"):
        hint = f" (did you mean --data {first}?)" if os.path.isfile(first) else ""
        return f"unexpected argument {first!r}: every value follows its flag, as in --max_iters 100{hint}"
    name = first.split("=", 1)[0]
    full = "--" + name.lstrip("-")                           # -lr and --lr alike
    close = [ALIASES[full]] if full in ALIASES else [full] if full in flags else []
    close += [f for f in flags if f.startswith(full) and len(full) > 3 and f not in close]
    if not close:
        close = difflib.get_close_matches(full, flags, n=3, cutoff=0.6)
    hint = f" (did you mean {' or '.join(close[:3])}?)" if close else ""
    return f"unknown flag {name}{hint}; flags are never abbreviated"


def build_parser():
    p = OneLineParser(prog="python -m train", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="a UTF-8 text file for character-level training, or a folder of token files "
                                   "from python -m data.prepare (default: the lesson corpus)")
    p.add_argument("--out_dir", help="where ckpt.npz, log.csv, loss.png and summary.json go")
    p.add_argument("--resume", action="store_true", help="continue from out_dir/ckpt.npz")
    p.add_argument("--init_from", metavar="PATH",
                   help="fine-tune: start a new run from a trained model (a checkpoint, or a Hugging Face GPT-2 "
                        "folder written by GPT.export_hf), with its vocabulary and a fresh optimizer")
    p.add_argument("--overwrite", action="store_true",
                   help="start a new run in an --out_dir that holds one (its checkpoints and logs are deleted first)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, or strict (the test stand-in for a GPU)")
    p.add_argument("--seed", type=int, help="the random streams: init, batches, dropout, evaluation (default 1337; "
                                            "--resume: the run's own)")
    for name in ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "max_iters", "lr_decay_iters",
                 "warmup_iters", "eval_interval", "eval_iters", "gradient_accumulation_steps", "log_interval",
                 "sample_tokens"):
        p.add_argument(f"--{name}", type=int)
    for name in ("learning_rate", "min_lr", "weight_decay", "beta1", "beta2", "grad_clip", "dropout", "head_dropout"):
        p.add_argument(f"--{name}", type=float)
    p.add_argument("--bias", type=yes_or_no, help="biases in Linear and LayerNorm (true or false)")
    p.add_argument("--init", choices=INITS, help="weight init: gpt2 (nanoGPT's N(0, 0.02)) or default (each "
                                                 "layer's own, as in PyTorch: Embedding N(0, 1), Linear uniform)")
    p.add_argument("--layout", choices=("sentence", "stream"),
                   help="the 'it' corpus only: one sentence per sequence from position 0 (default), "
                        "or random windows of the sentences run together")
    p.add_argument("--shared_batches", action="store_true", default=None,
                   help="under mpiexec: every process draws the whole batch from --seed's stream and trains on "
                        "its slice, so N processes see exactly the batches of one (a check; see train/parallel.py)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or samples")
    p.add_argument("--use_exercises", action="store_true",
                   help="run with every passing piece of exercises/ (EXERCISES.md, part two) swapped into the library")
    p.add_argument("--detect_anomaly", action="store_true",
                   help="stop at the first op whose output or gradient holds NaN or Inf, and name it")
    p.add_argument("--profile", action="store_true",
                   help=f"time every op over steps {PROFILE_STEPS.start}-{PROFILE_STEPS.stop - 1}, print the "
                        "table and write out_dir/trace.json (for chrome://tracing or Perfetto)")
    return p


def parse_args(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    args._given = sorted(k for k, v in vars(args).items() if v is not None and k not in ("device", "seed"))
    if args.resume and args.init_from:
        parser.error("--resume continues a run, --init_from starts a new one from a model: give one of them")
    preset = {**COMMON, **PRESETS["text" if args.data else "coref"], "seed": DEFAULT_SEED}
    if args.resume:                              # --resume continues the run with its own settings
        ran = resumed_settings(args.out_dir or preset["out_dir"])
        preset.update(ran)
        args._given = sorted(set(args._given) | set(ran))      # kept as they are, like flags given again
    for key, value in preset.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    problems, args._notes = validate_args(args)
    if problems:
        parser.error("; ".join(problems))
    return args


AT_LEAST_1 = ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "eval_interval", "eval_iters",
              "gradient_accumulation_steps", "log_interval")
AT_LEAST_0 = ("max_iters", "warmup_iters", "lr_decay_iters", "sample_tokens", "seed")


def refit(args, name, value, limit):
    """Set a preset value that does not fit; -> the note that says so."""
    note = f"--{name} set to {value} to fit {limit} (the preset's was {getattr(args, name)})"
    setattr(args, name, value)
    return note


def validate_args(args):
    """Range-check every numeric flag and fit the schedule to --max_iters.

    -> (problems, notes): problems stop the run (one line, all of them); notes say what was
    adapted. A preset value that does not fit is adapted; a flag the user gave is kept.
    """
    problems, notes = [], []
    given = set(args._given)
    if args.resume and args.overwrite:
        problems.append("--resume continues the run in --out_dir, --overwrite replaces it: give one of them")
    if args.data and args.layout:
        problems.append("--layout is for the 'it' corpus only, not with --data")
    for name in AT_LEAST_1:
        if getattr(args, name) < 1:
            problems.append(f"--{name} must be at least 1, got {getattr(args, name)}")
    for name in AT_LEAST_0:
        if getattr(args, name) < 0:
            problems.append(f"--{name} must not be negative, got {getattr(args, name)}")
    if args.n_embd >= 1 and args.n_head >= 1 and args.n_embd % args.n_head:
        problems.append(f"--n_embd {args.n_embd} must be divisible by --n_head {args.n_head}")
    world = dist.world_size()
    if args.batch_size >= 1 and args.batch_size % world:
        problems.append(f"--batch_size {args.batch_size} is the global batch and must split evenly over the "
                        f"{world} processes: use a multiple of {world}")
    for name, lo, lo_ok, hi, hi_ok in (("learning_rate", 0, False, math.inf, False), ("min_lr", 0, True, math.inf, False),
                                       ("weight_decay", 0, True, math.inf, False), ("grad_clip", 0, True, math.inf, False),
                                       ("beta1", 0, True, 1, False), ("beta2", 0, True, 1, False),
                                       ("dropout", 0, True, 1, False), ("head_dropout", 0, True, 1, False)):
        value = getattr(args, name)
        if not (math.isfinite(value) and (value >= lo if lo_ok else value > lo) and (value <= hi if hi_ok else value < hi)):
            span = f"in {'[' if lo_ok else '('}{lo}, {hi}{']' if hi_ok else ')'}" if hi != math.inf else \
                f"{'>= ' if lo_ok else '> '}{lo} and finite"
            problems.append(f"--{name} must be {span.replace('inf', 'infinity')}, got {value}")
    if problems:
        return problems, notes
    if args.min_lr > args.learning_rate:
        if "min_lr" in given:
            problems.append(f"--min_lr {args.min_lr} must not exceed --learning_rate {args.learning_rate}")
        else:
            args.min_lr = args.learning_rate / 10
            notes.append(f"--min_lr set to {args.min_lr:g} (a tenth of --learning_rate; the preset's was higher)")
    if args.max_iters > 0:
        if args.lr_decay_iters > args.max_iters:
            if "lr_decay_iters" in given:
                notes.append(f"--lr_decay_iters {args.lr_decay_iters} is past --max_iters {args.max_iters}: "
                             "the learning rate will not reach --min_lr in this run")
            else:
                notes.append(refit(args, "lr_decay_iters", args.max_iters, "--max_iters"))
        if args.warmup_iters >= args.max_iters:
            if "warmup_iters" in given:
                notes.append(f"--warmup_iters {args.warmup_iters} is not below --max_iters {args.max_iters}: "
                             "the whole run is warmup")
            else:
                notes.append(refit(args, "warmup_iters", args.max_iters // 10, "--max_iters"))
    if args.warmup_iters > args.lr_decay_iters and "warmup_iters" not in given:
        notes.append(refit(args, "warmup_iters", args.lr_decay_iters // 10, "--lr_decay_iters"))
    if args.warmup_iters > args.lr_decay_iters:
        problems.append(f"--warmup_iters {args.warmup_iters} must not exceed --lr_decay_iters {args.lr_decay_iters}")
    return problems, notes


# ---------------------------------------------------------------------------
def perplexity(loss):
    """exp(mean cross-entropy): the number of tokens the model hesitates between."""
    return math.exp(min(loss, 700.0))


def to_device(batch, device):
    x, y = batch
    return ta.tensor(x, device=device), ta.tensor(y, device=device)


@ta.no_grad()
def estimate_loss(model, dataset, args):
    """Mean loss over eval_iters batches of each split; the same batches every time."""
    model.eval()
    rng = np.random.default_rng(args.seed + 1)
    out = {}
    for split in ("train", "val"):
        losses = []
        for _ in range(args.eval_iters):
            x, y = to_device(dataset.get_batch(split, args.batch_size, args.block_size, rng), args.device)
            losses.append(model(x, y)[1])
        out[split] = (sum(losses[1:], losses[0]) * (1.0 / len(losses))).item()   # one read of the device
    model.train()
    return out


def train_step(model, optimizer, batches, grad_clip, average_grads=None):
    """One optimizer step over the micro-batches [(x, y), ...]: their gradients add up.

    Each loss is scaled by 1/k, so the summed gradient is that of the mean loss
    and clipping sees the same norm as one big batch would. Over several processes,
    ``average_grads()`` (a GradAverager's) then makes every process's gradient the mean
    over all of them. Returns this process's mean loss as a 0-d Tensor, still on the device.
    """
    total = None
    for x, y in batches:
        _, loss = model(x, y)
        scaled = loss * (1.0 / len(batches))
        scaled.backward()
        total = scaled.detach() if total is None else total + scaled.detach()
    if average_grads is not None:
        average_grads()
    if grad_clip > 0:
        clip_grad_norm_(model.parameters(), grad_clip)
    with interrupts.optimizer_update():      # Ctrl-C never cuts the update in two (train/interrupts.py)
        optimizer.step()
    optimizer.zero_grad()
    return total


def sample_text(model, dataset, args, n_tokens):
    """A short sample for the log, from its own generator (training randomness is untouched)."""
    host = ta.backend.get_backend("cpu")
    saved = host.get_rng_state()
    host.seed(args.seed + 2)
    try:
        prompt = dataset.sample_prompt()
        idx = ta.tensor([dataset.tokenizer.encode(prompt)], device=args.device)
        out = model.generate(idx, n_tokens, temperature=0.8, top_k=20)
        return dataset.tokenizer.decode(out[0].tolist())
    finally:
        host.set_rng_state(saved)


def save_checkpoint(path, model, optimizer, state, args, dataset):
    meta = dict(config=model.config.to_dict(), step=state["step"], best_val_loss=state["best_val_loss"],
                args={k: v for k, v in vars(args).items() if not k.startswith("_")}, data_rng=state["data_rng"].bit_generator.state,
                device_rng=ta.backend.get_backend(args.device).get_rng_state(),
                tokenizer=tokenizer_to_json(dataset.tokenizer), dataset=dataset.name, log=state["log"],
                train_losses=state["train_losses"], elapsed=state.get("elapsed"), data_source=dataset.source)
    if dist.world_size() > 1:                    # every rank's streams, for --resume (train/parallel.py)
        meta.update(world_size=dist.world_size(), rank_rngs=state.get("rank_rngs"))
    checkpoint.save(path, model, optimizer, meta)


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
    writer = csv.DictWriter(f, fieldnames=["step", "train_loss", "val_loss", "train_perplexity",
                                           "val_perplexity", "lr", "time", "val_bpb"])
    writer.writeheader()
    writer.writerows(log_rows)
    checkpoint.write_text(os.path.join(out_dir, "log.csv"), f.getvalue())


class Diverged(RuntimeError):
    """A non-finite loss: the run stops, and no checkpoint is written from here on."""


class Interrupted(RuntimeError):
    """A Ctrl-C that left no state to save (the optimizer's update was cut in two)."""


def check_resume(args, meta, dataset):
    """--resume continues the checkpoint's run: the same data, vocabulary and model.

    Raises a ValueError naming every conflict. Model flags that were not given take the
    checkpoint's values, so the summary describes the model that is trained."""
    where = os.path.join(args.out_dir, "ckpt.npz")
    trained_on = (meta.get("args") or {}).get("data")
    if meta.get("dataset") == "coref" and args.data:
        raise ValueError(f"--resume: {where} was trained on the lesson corpus, not on --data {args.data}: "
                         "drop --data, or use another --out_dir")
    if meta.get("dataset") != "coref" and not args.data:
        raise ValueError(f"--resume: {where} was trained on a text file ({trained_on or meta.get('dataset')}): "
                         f"pass --data {trained_on or 'FILE'} to resume it")
    if tokenizer_to_json(dataset.tokenizer) != meta["tokenizer"]:
        n_theirs = tokenizer_from_json(meta["tokenizer"]).vocab_size
        raise ValueError(f"--resume: the vocabulary of {args.data or dataset.name} ({dataset.tokenizer.vocab_size} "
                         f"tokens) differs from the one {where} was trained with ({n_theirs} tokens)")
    same_data(args, meta, dataset, where)
    ran_seed = (meta.get("args") or {}).get("seed")
    if ran_seed is not None and args.seed != ran_seed:       # it draws the evaluation's batches: they would change
        raise ValueError(f"--resume: --seed {args.seed} (the run in {where} has --seed {ran_seed}): a resumed run "
                         f"continues its own random streams; drop --seed, or use another --out_dir for a new run")
    config, given = meta["config"], set(args._given)
    config = {k: config.get(k, getattr(GPTConfig, k)) for k in MODEL_FLAGS}    # older ones lack init, head_dropout
    conflicts = [f"--{k} {getattr(args, k)} (the checkpoint has {config[k]})" for k in MODEL_FLAGS
                 if k in given and getattr(args, k) != config[k]]
    if conflicts:
        raise ValueError(f"--resume: {', '.join(conflicts)}: the model in {where} is fixed; drop "
                         f"{'these flags' if len(conflicts) > 1 else 'the flag'}, or use another --out_dir for a new model")
    for k in MODEL_FLAGS:
        setattr(args, k, config[k])


def same_data(args, meta, dataset, where):
    """--resume: the text (or corpus) is the one the checkpoint was trained on, byte for byte
    (its size and SHA-256). A checkpoint from before they were kept: a note, and it goes on."""
    theirs, ours = meta.get("data_source"), dataset.source
    what = args.data or "the lesson corpus"
    if theirs is None:
        args._notes = [*getattr(args, "_notes", ()), f"{where} does not say which data it was trained on (an older "
                       f"checkpoint): {what} is taken as that data, unchecked beyond its vocabulary"]
    elif theirs != ours:
        def described(source):
            return f"{source['bytes']:,} bytes, sha256 {source['sha256'][:12]}"
        trained_on = (meta.get("args") or {}).get("data") or "the lesson corpus"
        raise ValueError(f"--resume: {what} ({described(ours)}) is not the data {where} was trained on "
                         f"({trained_on}: {described(theirs)}): pass that, or use another --out_dir for a new run")


RESUMED_FLAGS = ("seed", "layout", "max_iters", "batch_size", "learning_rate", "min_lr", "warmup_iters", "lr_decay_iters", "weight_decay",
                 "beta1", "beta2", "grad_clip", "gradient_accumulation_steps", "eval_interval", "eval_iters",
                 "log_interval", "sample_tokens", "shared_batches")


def resumed_settings(out_dir):
    """The training flags of the run in out_dir/ckpt.npz, the defaults of its --resume ({} when
    there is no readable checkpoint: train() then says what is wrong)."""
    try:
        ran = checkpoint.read_meta(os.path.join(out_dir, "ckpt.npz")).get("args") or {}
    except (ValueError, OSError):
        return {}
    return {k: ran[k] for k in RESUMED_FLAGS if ran.get(k) is not None}


MODEL_FLAGS = ("n_layer", "n_head", "n_embd", "block_size", "dropout", "bias", "init", "head_dropout")


def read_losses(pending, state):
    """Move the step losses still on the device into state["train_losses"] (one device read),
    and stop at the first non-finite one. -> the newest loss, or None."""
    if not pending:
        return None
    values = dist.all_reduce(ta.stack(pending), "mean").numpy().astype(float).tolist()   # the global batch's
    pending.clear()
    start = len(state["train_losses"])
    state["train_losses"].extend(values)
    for i, v in enumerate(values):
        if not math.isfinite(v):
            del state["train_losses"][start + i + 1:]
            raise Diverged(f"the training loss is {v} at step {start + i}; stopped: {last_saved(state)}")
    return values[-1]


def last_saved(state):
    """Where the last finite state is: a checkpoint is only ever written from one."""
    saved = state.get("saved_step")
    keep = f"ckpt.npz (step {saved}) and best.npz keep their last finite state" if saved is not None else \
        "no checkpoint was written"
    return f"{keep} (try a lower --learning_rate, or --grad_clip)"


def schedule_ended(args, step, meta):
    """--resume: do new steps run past the schedule's end, at --min_lr, as the run did not? All of
    them (the schedule ended before the step resumed from), or those after a schedule that was
    fitted to the first run's --max_iters (a preset's, adapted) when --max_iters grew."""
    if args.min_lr == args.learning_rate or args.lr_decay_iters >= args.max_iters:
        return False
    return step >= args.lr_decay_iters or args.lr_decay_iters == (meta.get("args") or {}).get("max_iters")


def exercises_swapped_in(wanted):
    """--use_exercises: the learner's passing pieces replace the library's for this run."""
    if not wanted:
        return contextlib.nullcontext()
    try:
        from exercises.swap import use_exercises
    except ImportError as e:
        raise OSError(f"--use_exercises needs the exercises/ folder: run from the repository root ({e})") from None
    return use_exercises()


# ---------------------------------------------------------------------------
def setup(args):
    """The data, the model and its optimizer, and the run's state: new, or as out_dir/ckpt.npz
    left them with --resume. -> (dataset, model, optimizer, state, meta); meta is the
    checkpoint's (None for a new run)."""
    ckpt_path = os.path.join(args.out_dir, "ckpt.npz")
    if os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
        raise ValueError(f"--out_dir {args.out_dir} is a file, not a folder")
    pretrained = finetune.load_pretrained(args) if args.init_from else None   # (refuses its own out_dir first)
    replaced = None if args.resume else checkpoint.refuse_to_replace(args.out_dir, args.overwrite)
    tokenizer = pretrained.tokenizer if pretrained else finetune.resumed_tokenizer(ckpt_path) if args.resume else None
    dataset = load_data(args.data, tokenizer) if args.data else load_coref(seed=0, layout=args.layout)
    if pretrained:
        args._notes = [*getattr(args, "_notes", []), finetune.fit_args(args, pretrained, dataset)]
    device_backend = ta.backend.get_backend(args.device)      # a clear error when CUDA is missing
    ta.manual_seed(args.seed)

    config = GPTConfig(block_size=args.block_size, vocab_size=dataset.tokenizer.vocab_size, n_layer=args.n_layer,
                       n_head=args.n_head, n_embd=args.n_embd, dropout=args.dropout, bias=args.bias,
                       init=args.init, head_dropout=args.head_dropout)
    state = dict(step=0, best_val_loss=math.inf, data_rng=np.random.default_rng(args.seed), log=[],
                 train_losses=[], saved_step=None, time_before=0.0)
    meta = None
    if args.resume:
        model_state, optim_state, meta = checkpoint.load(ckpt_path)
        check_resume(args, meta, dataset)
        config = GPTConfig(**meta["config"])
    if device_backend.on_host:                  # refused before it is allocated, in one line
        tokens_per_row = dataset.rows["train"].shape[1] - 1 if dataset.rows is not None else config.block_size
        memory.check_fits(config, args.batch_size // dist.world_size(), tokens_per_row)
    model = (pretrained.model if pretrained else GPT(config)).to(args.device)
    optimizer = model.configure_optimizer(args.weight_decay, args.learning_rate, (args.beta1, args.beta2))
    if args.resume:
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optim_state)
        state.update(step=meta["step"], best_val_loss=meta["best_val_loss"], log=meta["log"], saved_step=meta["step"],
                     time_before=meta.get("elapsed") or (meta["log"][-1]["time"] if meta["log"] else 0.0),
                     train_losses=(meta.get("train_losses", []) + [None] * meta["step"])[:meta["step"]])
        state["data_rng"].bit_generator.state = meta["data_rng"]
        device_backend.set_rng_state(meta["device_rng"])
        if (meta.get("device_rng") is None or device_backend.get_rng_state() is None) and \
                (config.dropout or config.head_dropout):
            device_backend.seed(parallel.device_seed(args.seed, 0, state["step"]))     # not the first steps' masks again
            args._notes = [*getattr(args, "_notes", ()), f"the dropout generator's state was not saved ({args.device} "
                           "cannot export it): the resumed run draws its masks from a new stream, so it is not the "
                           "uninterrupted run to the bit (that needs --dropout 0 and --head_dropout 0 there)"]
    if replaced and dist.rank() == 0:
        checkpoint.remove_run(args.out_dir)
        args._notes = [*getattr(args, "_notes", ()), replaced]
    os.makedirs(args.out_dir, exist_ok=True)
    return dataset, model, optimizer, state, meta


def train(args):
    """The training run; returns the summary dict (None after Ctrl-C). Under mpiexec every
    process runs it (train/parallel.py says who does what)."""
    with interrupts.Interrupts(tqdm.write if dist.rank() == 0 else (lambda msg: None)):
        return _train(args)


def _train(args):
    with parallel.together():                   # under mpiexec: an error in any process stops them all
        dataset, model, optimizer, state, meta = setup(args)
    ckpt_path = os.path.join(args.out_dir, "ckpt.npz")
    device_backend = ta.backend.get_backend(args.device)
    config = model.config
    world, root = dist.world_size(), dist.rank() == 0
    parallel.split_streams(args, state, device_backend, meta)
    dist.broadcast_parameters(model.parameters())          # every process starts from rank 0's weights
    averager = dist.GradAverager(model.parameters()) if world > 1 else None
    say = (lambda msg: None) if args.quiet or not root else tqdm.write
    for note in getattr(args, "_notes", ()) if root else ():
        print(f"python -m train: note: {note}")
    if args.resume and state["step"] >= args.max_iters and root:
        print(f"python -m train: note: {ckpt_path} is at step {state['step']}, not below --max_iters "
              f"{args.max_iters}: nothing to train (raise --max_iters to continue)")
    elif args.resume and root and schedule_ended(args, state["step"], meta):
        flat_from = max(state["step"], args.lr_decay_iters)
        print(f"python -m train: note: the learning rate schedule ends at --lr_decay_iters {args.lr_decay_iters}: "
              f"steps {flat_from} to {args.max_iters - 1} {'all ' if flat_from == state['step'] else ''}run at "
              f"--min_lr {args.min_lr:g} (pass --lr_decay_iters {args.max_iters} for a schedule that ends at --max_iters)")
    say(f"{dataset.name}: {len(dataset.train):,} train / {len(dataset.val):,} val tokens, vocab {config.vocab_size}; "
        f"model {model.num_parameters() / 1e6:.2f}M parameters on {args.device}")
    pids = dist.gather_object(os.getpid())      # a process that dies is named by its pid (mpiexec says which)
    if world > 1 and root:
        threads = f" (OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']})" if "OMP_NUM_THREADS" in os.environ else ""
        print(f"python -m train: data parallel over {world} processes, {args.batch_size // world} of the "
              f"{args.batch_size} rows of each batch on each{threads}; "
              f"ranks {', '.join(f'{r}: pid {p}' for r, p in enumerate(pids))}", flush=True)

    tokens_per_step = args.batch_size * args.block_size * args.gradient_accumulation_steps
    train_time, steps_timed, interrupted = 0.0, 0, False
    start_wall = time.time()
    clock = lambda: state["time_before"] + time.time() - start_wall      # noqa: E731  (continues over --resume)
    bar = tqdm(total=args.max_iters, initial=state["step"], disable=args.quiet or not root, dynamic_ncols=True,
               desc="train")

    def evaluate(step):
        losses = estimate_loss(model, dataset, args)
        row = dict(step=step, train_loss=round(losses["train"], 6), val_loss=round(losses["val"], 6),
                   train_perplexity=round(perplexity(losses["train"]), 4),
                   val_perplexity=round(perplexity(losses["val"]), 4),
                   lr=warmup_cosine(step, args.learning_rate, args.min_lr, args.warmup_iters, args.lr_decay_iters),
                   time=round(clock(), 3))
        bpb = dataset.bits_per_byte(losses["val"])      # val bits per byte: comparable across tokenizers
        if bpb is not None:
            row["val_bpb"] = round(bpb, 6)
        if not all(math.isfinite(v) for v in losses.values()):
            raise Diverged(f"the eval loss is train {losses['train']}, val {losses['val']} at step {step}; "
                           f"stopped: {last_saved(state)}")
        if not state["log"] or state["log"][-1]["step"] != step:
            state["log"].append(row)
            write_log(state["log"], args.out_dir)      # up to date, whatever stops the run
        say(f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f} "
            f"(perplexity {perplexity(losses['val']):.2f}" + ("" if bpb is None else f", {bpb:.4f} bits per byte") + ")")
        if args.sample_tokens and not args.quiet:
            say("  sample: " + repr(sample_text(model, dataset, args, args.sample_tokens)[:300]))
        if losses["val"] < state["best_val_loss"]:
            with interrupts.uninterrupted():         # best_val_loss and best.npz change together
                state["best_val_loss"] = losses["val"]
                if step > 0:                         # ckpt.npz: the latest state, for --resume
                    save(ckpt_path)
                    save(os.path.join(args.out_dir, "best.npz"))
        return losses

    def stopped():
        """After Ctrl-C: ckpt.npz, and log.csv, loss.png and summary.json as far as the run went."""
        save(ckpt_path)
        last = state["log"][-1] if state["log"] else {}
        best = state["best_val_loss"] if math.isfinite(state["best_val_loss"]) else None
        summary = dict(interrupted=True, iters=state["step"], best_val_loss=best and round(best, 6),
                       last_eval_step=last.get("step"), val_loss=last.get("val_loss"),
                       train_loss=last.get("train_loss"), dataset=dataset.name,
                       tokens_per_s=round(tokens_per_step * steps_timed / train_time, 1) if train_time else None,
                       wall_s=round(time.time() - start_wall, 2), parameters=model.num_parameters(),
                       device=args.device, config=config.to_dict())
        write_log(state["log"], args.out_dir)
        say(write_plot(state["log"], args.out_dir, state["train_losses"]))
        checkpoint.write_text(os.path.join(args.out_dir, "summary.json"), json.dumps(summary, indent=2))

    def save(path):
        with interrupts.uninterrupted():
            state["elapsed"] = clock()
            save_checkpoint(path, model, optimizer, state, args, dataset)
            state["saved_step"] = state["step"]

    pending = []                                     # this step's losses, still on the device
    profiler = ta.profile() if args.profile and root else None
    parallel.leave_interrupts_to_root()
    guard = interrupts.active().arm()                # Ctrl-C from here on: stop between two steps
    started = None                                   # the state at the start of the step under way
    try:
        while state["step"] < args.max_iters:
            step = state["step"]
            if step % args.eval_interval == 0 and (not state["log"] or state["log"][-1]["step"] != step):
                read_losses(pending, state)
                parallel.gather_streams(state, device_backend)
                parallel.on_root(evaluate, step)
            if guard.requested:                          # Ctrl-C: stop here, between two steps
                raise KeyboardInterrupt
            lr = warmup_cosine(step, args.learning_rate, args.min_lr, args.warmup_iters, args.lr_decay_iters)
            set_lr(optimizer, lr)
            t0 = time.time()
            started = interrupts.StepStart(state, device_backend, guard)
            batches = [to_device(parallel.local_batch(dataset, args, state["data_rng"]), args.device)
                       for _ in range(args.gradient_accumulation_steps)]
            with profiler if profiler and step in PROFILE_STEPS else contextlib.nullcontext():
                pending.append(train_step(model, optimizer, batches, args.grad_clip,
                                          None if averager is None else averager.average))
            with interrupts.uninterrupted():
                state["step"] = step + 1
                started = None
                if step % args.log_interval == 0:      # reading the losses waits for the device: not every step
                    loss_value = read_losses(pending, state)
                    bar.set_postfix(loss=f"{loss_value:.4f}", ppl=f"{perplexity(loss_value):.2f}", lr=f"{lr:.2e}")
            train_time += time.time() - t0
            steps_timed += 1
            bar.update(1)
    except KeyboardInterrupt:
        interrupted = True
        cut = started and started.undo(state, device_backend, guard, optimizer)   # back to the step's start
        if cut:
            bar.close()
            kept = "no checkpoint was written" if state["saved_step"] is None else \
                f"{ckpt_path} keeps step {state['saved_step']}"
            raise Interrupted(f"interrupted {cut}: not saved; {kept}") from None
        say(f"interrupted at step {state['step']}: saving {ckpt_path}")
    finally:
        bar.close()
    with interrupts.uninterrupted():                 # from here Ctrl-C waits for the results to be written
        if interrupted and world > 1:                # rank 0 alone is here: no collective, and the
            pending.clear()                          # unread losses stay unknown (None) in the checkpoint
            state["rank_rngs"] = None                # the other ranks' streams have moved on since
            stopped()
            dist.abort(f"python -m train: interrupted at step {state['step']}: saved {ckpt_path}; "
                       f"ending the other processes", 130)
        read_losses(pending, state)
        if profiler:
            report_profile(profiler, args.out_dir)
        if interrupted:
            stopped()
            return None
        parallel.gather_streams(state, device_backend)

    def finish():
        final = evaluate(state["step"])
        save(ckpt_path)

        summary = dict(best_val_loss=round(state["best_val_loss"], 6), val_loss=round(final["val"], 6),
                       best_val_perplexity=round(perplexity(state["best_val_loss"]), 4),
                       val_perplexity=round(perplexity(final["val"]), 4),
                       train_loss=round(final["train"], 6), iters=state["step"], dataset=dataset.name,
                       tokens_per_s=round(tokens_per_step * steps_timed / train_time, 1) if train_time else None,
                       wall_s=round(time.time() - start_wall, 2), parameters=model.num_parameters(),
                       device=args.device, config=config.to_dict())
        if dataset.text_bytes:
            summary.update(best_val_bpb=round(dataset.bits_per_byte(state["best_val_loss"]), 6),
                           val_bpb=round(dataset.bits_per_byte(final["val"]), 6))
        if world > 1:
            summary["processes"] = world
        if dataset.name == "coref":
            from . import lesson
            summary.update(lesson.report(model, dataset, args.out_dir, args.device, say))
            summary["wall_s"] = round(time.time() - start_wall, 2)
        write_log(state["log"], args.out_dir)
        say(write_plot(state["log"], args.out_dir, state["train_losses"]))
        checkpoint.write_text(os.path.join(args.out_dir, "summary.json"), json.dumps(summary, indent=2))
        return summary

    try:
        return parallel.on_root(finish)          # rank 0 evaluates and writes; every process gets the summary
    except KeyboardInterrupt:                    # a second Ctrl-C in the final evaluation: all steps are done
        say(f"interrupted at step {state['step']}: saving {ckpt_path}")
        with interrupts.uninterrupted():
            stopped()
        return None


def setup_process():
    """What the training program sets for its whole process: glibc's allocator thresholds (steady
    step times; tinyattn.fast.tune_host_allocator)."""
    tune_host_allocator()


def main(argv=None):
    setup_process()
    try:
        dist.init()                              # under mpiexec: join the other processes
    except RuntimeError as e:
        if dist.launched()[1] == 0:
            print(f"python -m train: error: {e}", file=sys.stderr)
        return 1
    return parallel.run_or_abort(lambda: run(argv))


def run(argv=None):
    """The command, in one process (of one or of many: then rank 0 alone prints)."""
    args = parse_args(argv)
    try:
        dist.init(args.device)                   # --device cuda over several processes: a GPU each, and NCCL
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"), \
                exercises_swapped_in(args.use_exercises), \
                ta.detect_anomaly() if args.detect_anomaly else contextlib.nullcontext():
            # a blow-up is reported once, below
            summary = train(args)
    except KeyboardInterrupt:                    # before the training loop began: nothing to save
        if dist.rank() == 0:
            print("python -m train: interrupted before training began: nothing was saved", file=sys.stderr)
        return 130
    except Interrupted as e:
        print(f"python -m train: {e}", file=sys.stderr)
        return 130
    except (parallel.Stopped, Diverged) as e:   # every process stopped here together
        if dist.rank() == 0:
            print(f"python -m train: error: {e}", file=sys.stderr)
        return 1
    except (ValueError, OSError, KeyError, RuntimeError) as e:
        if dist.world_size() > 1:
            raise                                # this process's alone: run_or_abort ends the job
        print(f"python -m train: error: {e}", file=sys.stderr)
        return 1
    except MemoryError as e:                     # numpy's "Unable to allocate ...", CuPy's out of memory
        if dist.world_size() > 1:
            raise
        print(f"python -m train: error: out of memory: {str(e).splitlines()[0] if str(e) else 'MemoryError'} "
              f"(lower --batch_size or --block_size, or the model's --n_embd or --n_layer)", file=sys.stderr)
        return 1
    if summary is None:
        return 130
    if dist.rank() != 0:
        return 0
    extra = ""
    if "heldout_accuracy" in summary:
        extra = (f", held-out referent accuracy {summary['heldout_accuracy']:.3f}, "
                 f"attention on the referent {summary['heldout_attention_correct']:.3f}")
    print(f"done: {summary['iters']} iters, best val loss {summary['best_val_loss']:.4f} "
          f"(perplexity {summary['best_val_perplexity']:.2f}), "
          f"val loss {summary['val_loss']:.4f}{extra}, "
          f"{'' if 'val_bpb' not in summary else str(round(summary['val_bpb'], 4)) + ' val bits per byte, '}"
          f"{'no steps timed' if summary['tokens_per_s'] is None else str(summary['tokens_per_s']) + ' tokens/s'}, "
          f"{summary['wall_s']:.0f} s; wrote {os.path.join(args.out_dir, 'summary.json')}")
    return 0
