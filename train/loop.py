"""python -m train: train a GPT, with nanoGPT's flag names.

With no --data it trains on the lesson's generated "it" corpus (data/coref.py)
and reports how well the model, and its attention, resolve "it". With
--data FILE it trains a character-level model on any UTF-8 text file.

This module is the run: ``train_step`` and the loop (``train(args)``), the same
for every stage. Around it: stages.py (the stage: its batches, its loss, its
evaluation and what it prints; DPO's in dpo.py, RL's in rl.py), config.py (the
flags, presets and their checks), start.py (the stage and its data, the
model and its optimizer, new or from a checkpoint), report.py (log.csv,
loss.png, the profile), checkpoint.py, and command.py (``main``, which
``python -m train`` runs: errors become one line and an exit status).
"""
import contextlib
import math
import os
import sys
import time

import numpy as np
from tqdm import tqdm

import tinyattn as ta
from tinyattn import distributed as dist
from tinyattn.optim import warmup_cosine, set_lr
from tinyattn.nn.utils import clip_grad_norm_

from . import checkpoint, interrupts, parallel
from .config import PROFILE_STEPS
from .report import report_profile, write_log, write_results
from .start import announce, setup


def train(args, notes=()):
    """The training run -> its summary dict. ``notes``: what parse_args adapted, printed with the
    set-up's own. Ctrl-C, SIGTERM or SIGHUP stop it after a step: it saves, then raises StoppedBySignal.
    Under mpiexec every process runs it (train/parallel.py says who does what)."""
    notes = list(notes)
    with parallel.together():                   # under mpiexec: an error in any process stops them all
        stage, model, optimizer, state, meta = setup(args, notes)     # the stage: train/stages.py
    device = ta.backend.get_backend(args.device)
    parallel.split_streams(args, state, device, meta)
    dist.broadcast_parameters(model.parameters())          # every process starts from rank 0's weights
    average_grads = dist.GradAverager(model.parameters()).average if dist.world_size() > 1 else None
    run = Run(args, stage, model, optimizer, state, device)
    announce(args, notes, state, meta, stage, model, run.ckpt_path, run.say)
    if args.eval_only:
        return run.evaluate_only()
    profiler = ta.profile() if args.profile and run.root else None
    parallel.leave_signals_to_root()

    with interrupts.Stop(run.note) as stop:     # a signal: finish the step, stop, save (train/interrupts.py)
        with tqdm(total=args.max_iters, initial=state["step"], desc="train", dynamic_ncols=True,
                  disable=args.quiet or not run.root) as bar:
            while state["step"] < args.max_iters:
                step = state["step"]
                if step % args.eval_interval == 0 and step != run.last_eval_step:
                    run.evaluate(step)          # log.csv; ckpt.npz and best.npz when val improved
                if stop.requested:
                    break
                lr = warmup_cosine(step, args.learning_rate, args.min_lr, args.warmup_iters, args.lr_decay_iters)
                set_lr(optimizer, lr)
                t0 = time.time()
                with stop.step(state, device, optimizer):     # a second Ctrl-C: back to a step boundary
                    batches, numbers = [], []
                    for _ in range(args.gradient_accumulation_steps):
                        batches.append(to_device(parallel.local_batch(stage, args, state["data_rng"]), args.device))
                        numbers.append(stage.step_metrics())       # (--stage rl: the answers' rewards)
                    with profiler if profiler and step in PROFILE_STEPS else contextlib.nullcontext():
                        loss = train_step(model, optimizer, batches, args.grad_clip, average_grads, stage.loss)
                    with interrupts.uninterrupted():
                        run.pending.append(loss)         # read every log_interval steps: reading waits
                        run.pending_numbers.append(numbers)      # for the device (and the numbers with them)
                        state["step"] = step + 1
                run.time_step(time.time() - t0)
                bar.update(1)
                if step % args.log_interval == 0:
                    loss_value = run.read_losses()
                    bar.set_postfix(**stage.progress(loss_value), lr=f"{lr:.2e}")
                if run.save_due():                       # --save_interval_s
                    run.save_latest()
        if profiler:
            report_profile(profiler, args.out_dir)
        if not stop.requested:
            return run.finish()                  # the final evaluation, ckpt.npz, log, plot and summary
    run.stopped(stop)                            # saves all the steps made, then raises StoppedBySignal


class Run:
    """What the loop keeps and reports: the step losses, the evaluations, the checkpoints,
    log.csv, loss.png and summary.json. Under mpiexec every process calls these methods at the
    same points (some hold a collective); rank 0 alone evaluates, prints and writes."""

    def __init__(self, args, stage, model, optimizer, state, device):
        self.args, self.stage, self.model, self.optimizer, self.state = args, stage, model, optimizer, state
        self.device = device
        self.root = dist.rank() == 0
        self.ckpt_path = os.path.join(args.out_dir, "ckpt.npz")
        self.pending = []                        # the step losses still on the device
        self.pending_numbers = []                # and the stage's numbers of each step's batches
        self.quiet_steps_said = False            # "no signal for N steps" said for the current stretch
        self.train_time, self.steps_timed = 0.0, 0
        self.started = self.saved_at = time.time()

    def say(self, message):
        """A line of progress (stdout), on rank 0 and without --quiet."""
        if self.root and not self.args.quiet:
            tqdm.write(message)

    def note(self, message):
        """A note (stderr), on rank 0, even with --quiet."""
        if self.root:
            tqdm.write(f"python -m train: {message}", file=sys.stderr)

    def clock(self):
        """The run's seconds, over every --resume."""
        return self.state["time_before"] + time.time() - self.started

    def time_step(self, seconds):
        self.train_time += seconds
        self.steps_timed += 1

    @property
    def last_eval_step(self):
        return self.state["log"][-1]["step"] if self.state["log"] else None

    # ------------------------------------------------------------------ the losses
    def read_losses(self):
        """Move the step losses still on the device into state["train_losses"] (one device read, a
        mean over the processes), and stop at the first non-finite one. -> the newest loss, or None."""
        if not self.pending:
            return None
        values = dist.all_reduce(ta.stack(self.pending), "mean").numpy().astype(float).tolist()
        self.pending.clear()
        losses = self.state["train_losses"]
        start = len(losses)
        losses.extend(values)
        self.read_numbers(start)
        for i, v in enumerate(values):
            if not math.isfinite(v):
                del losses[start + i + 1:]
                raise Diverged(f"the training loss is {v} at step {start + i}; stopped: {last_saved(self.state)}")
        return values[-1]

    def read_numbers(self, first_step):
        """The stage's numbers of the steps from ``first_step`` on (their mean over the micro-batches
        and the processes) into state["step_log"], the step rows of log.csv; and one line, under
        --quiet too, when a stage says that its steps have had nothing to learn from for a while."""
        pending, self.pending_numbers = self.pending_numbers, []
        names = list(dict.fromkeys(k for numbers in pending for batch in numbers for k in batch))
        if not names:
            return
        table = np.array([[np.mean([batch[k] for batch in numbers]) for k in names] for numbers in pending])
        table = dist.all_reduce(ta.tensor(table, dtype="float64", device=self.args.device), "mean").numpy()
        rows = self.state.setdefault("step_log", [])
        for i, values in enumerate(table.tolist()):
            rows.append(dict(step=first_step + i, **{k: round(v, 6) for k, v in zip(names, values)}))
        problem = self.stage.stalled(rows)
        if problem and not self.quiet_steps_said:
            self.note(f"note: {problem}")
        self.quiet_steps_said = bool(problem)

    def evaluate(self, step):
        """The losses at ``step`` into log.csv; ckpt.npz and best.npz when the val loss improved
        (ckpt.npz at every evaluation with --always_save_checkpoint). -> the losses."""
        self.read_losses()
        parallel.gather_streams(self.state, self.device)
        return parallel.on_root(self._evaluate, step)

    def _evaluate(self, step, save=True):
        """The stage's evaluation at ``step``: a row of log.csv, the line, a sample, best.npz.
        -> its metrics (a dict). save=False (--eval_only): the metrics alone."""
        args, state, stage = self.args, self.state, self.stage
        metrics = stage.evaluate(self.model)
        problem = stage.diverged(metrics)
        if problem:
            raise Diverged(f"{problem} at step {step}; stopped: {last_saved(state)}")
        if not save:
            return metrics
        self.say(f"step {step}: {stage.eval_line(metrics)}")
        self.log_row(dict(step=step, **metrics, lr=warmup_cosine(step, args.learning_rate, args.min_lr,
                                                                 args.warmup_iters, args.lr_decay_iters),
                          time=round(self.clock(), 3)))
        start = stage.sample_ids() if args.sample_tokens and not args.quiet else None
        if start is not None:
            self.say("  sample: " + repr(sample_text(self.model, stage.data.tokenizer, start, args,
                                                     args.sample_tokens)[:300]))
        self.keep_best(step, stage.score(metrics))
        return metrics

    def log_row(self, row):
        if self.last_eval_step != row["step"]:
            self.state["log"].append(row)
            write_log(self.state["log"], self.args.out_dir, self.state.get("step_log"))   # up to date, whatever
                                                                                           # stops the run

    def keep_best(self, step, val):
        """ckpt.npz and best.npz when ``val`` (the val loss, or a stage's error) improved."""
        args, state = self.args, self.state
        improved = val < state["best_val_loss"]
        with interrupts.uninterrupted():              # best_val_loss and best.npz change together
            if improved:
                state["best_val_loss"] = val
            if step > 0 and (improved or args.always_save_checkpoint):
                self.save(self.ckpt_path)              # the latest state, for --resume
            if step > 0 and improved:
                self.save(os.path.join(args.out_dir, "best.npz"))

    def evaluate_only(self):
        """--eval_only: the evaluation of the model the run starts from, printed as each evaluation
        prints it ("eval at step 0: ..."); nothing is written."""
        metrics = parallel.on_root(self._evaluate, self.state["step"], False)
        if self.root:
            print(f"eval at step {self.state['step']}: {self.stage.eval_line(metrics)}", flush=True)
        return dict(eval_only=True, step=self.state["step"], **metrics)

    # ------------------------------------------------------------------ saving
    def save(self, path):
        with interrupts.uninterrupted():
            self.state["elapsed"] = self.clock()
            checkpoint.save_run(path, self.model, self.optimizer, self.state, self.args, self.stage.data)
            self.state["saved_step"] = self.state["step"]
            self.saved_at = time.time()

    def save_due(self):
        """--save_interval_s: has it been that long since ckpt.npz was written? (rank 0's clock decides)"""
        if not self.args.save_interval_s:
            return False
        return parallel.on_root(lambda: time.time() - self.saved_at >= self.args.save_interval_s)

    def save_latest(self):
        """ckpt.npz, as the run stands between two steps."""
        self.read_losses()
        parallel.gather_streams(self.state, self.device)
        parallel.on_root(self.save, self.ckpt_path)

    def run_facts(self):
        """What every summary.json says of the run: the data, its speed and wall time, the model."""
        args = self.args
        tokens_per_step = args.batch_size * args.block_size * args.gradient_accumulation_steps
        return dict(dataset=self.stage.data.name, wall_s=round(time.time() - self.started, 2),
                    tokens_per_s=round(tokens_per_step * self.steps_timed / self.train_time, 1)
                    if self.train_time else None,
                    parameters=self.model.num_parameters(), device=args.device, config=self.model.config.to_dict())

    def finish(self):
        """After the last step: the final evaluation, ckpt.npz, and log.csv, loss.png, summary.json."""
        self.read_losses()
        parallel.gather_streams(self.state, self.device)
        return parallel.on_root(self._finish)        # every process gets the summary

    def _finish(self):
        state, stage = self.state, self.stage
        final = self._evaluate(state["step"])
        if state["saved_step"] != state["step"]:       # (the evaluation may have saved it)
            self.save(self.ckpt_path)
        summary = dict(stage.summary(final, state["best_val_loss"]), iters=state["step"], **self.run_facts())
        if dist.world_size() > 1:
            summary["processes"] = dist.world_size()
        summary.update(stage.report(self.model, self.say))       # (the lesson's report on attention)
        summary["wall_s"] = round(time.time() - self.started, 2)
        write_results(self.args.out_dir, state["log"], state["train_losses"], summary, self.say,
                      state.get("step_log"))
        print(stage.done_line(summary), flush=True)     # the last line, also under --quiet
        return summary

    def stopped(self, stop):
        """After a signal: ckpt.npz, and log.csv, loss.png and summary.json as far as the run went,
        then StoppedBySignal (the exit status is 128 + the signal's number). Under mpiexec rank 0 alone
        is here (the others ignore the signals): it saves and ends the other processes."""
        state, step = self.state, self.state["step"]
        if stop.cut:
            kept = "no checkpoint was written" if state["saved_step"] is None else \
                f"{self.ckpt_path} keeps step {state['saved_step']}"
            raise Interrupted(f"interrupted inside the optimizer's update (the weights are half updated): "
                              f"not saved; {kept}")
        with interrupts.uninterrupted():         # from here on a Ctrl-C waits for the files to be written
            if dist.world_size() > 1:            # no collective: the unread losses stay unknown (None) in
                self.pending.clear()             # the checkpoint, and the other ranks' streams have moved
                self.pending_numbers.clear()
                state["rank_rngs"] = None        # on since the last evaluation
            else:
                self.read_losses()
            self.save(self.ckpt_path)
            last = state["log"][-1] if state["log"] else {}
            best = state["best_val_loss"] if math.isfinite(state["best_val_loss"]) else None
            summary = dict(interrupted=True, signal=stop.name, iters=step, best_val_loss=best and round(best, 6),
                           last_eval_step=last.get("step"), val_loss=last.get("val_loss"),
                           train_loss=last.get("train_loss"), **self.run_facts())
            write_results(self.args.out_dir, state["log"], state["train_losses"], summary, self.say,
                          state.get("step_log"))
        message = f"stopped by {stop.name} at step {step}: saved {self.ckpt_path} (continue with --resume)"
        if dist.world_size() > 1:
            dist.abort(f"python -m train: {message}; ending the other processes", stop.exit_code)
        raise StoppedBySignal(message, stop.exit_code)


# ---------------------------------------------------------------------------
# what the loop calls: the step, the evaluation, the sample, reading the losses
def lm_loss(model, batch):
    """The language model's loss on a batch (x, y) (train/stages.py's LanguageModel.loss)."""
    x, y = batch
    return model(x, y)[1]


def train_step(model, optimizer, batches, grad_clip, average_grads=None, loss_fn=lm_loss):
    """One optimizer step over the micro-batches [(x, y), ...]: their gradients add up.

    Each loss is scaled by 1/k, so the summed gradient is that of the mean loss
    and clipping sees the same norm as one big batch would. Over several processes,
    ``average_grads()`` (a GradAverager's) then makes every process's gradient the mean
    over all of them. ``loss_fn(model, batch)``: the objective (the language model's by
    default). Returns this process's mean loss as a 0-d Tensor, still on the device.
    """
    total = None
    for batch in batches:
        loss = loss_fn(model, batch)
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


@ta.no_grad()
def estimate_loss(model, dataset, args, loss_fn=lm_loss):
    """Mean loss over eval_iters batches of each split; the same batches every time."""
    model.eval()
    rng = np.random.default_rng(args.seed + 1)
    out = {}
    try:
        for split in ("train", "val"):
            losses = []
            for _ in range(args.eval_iters):
                batch = to_device(dataset.get_batch(split, args.batch_size, args.block_size, rng), args.device)
                losses.append(loss_fn(model, batch))
            out[split] = (sum(losses[1:], losses[0]) * (1.0 / len(losses))).item()   # one read of the device
    finally:
        model.train()
    return out


def to_device(batch, device):
    """A batch of arrays (x, y, ...) as tensors on the device."""
    return tuple(ta.tensor(a, device=device) for a in batch)


def sample_text(model, tokenizer, start, args, n_tokens):
    """A short sample for the log from the ids ``start``, from its own generator (training randomness
    is untouched)."""
    host = ta.backend.get_backend("cpu")
    saved = host.get_rng_state()
    host.seed(args.seed + 2)
    try:
        idx = ta.tensor([start], device=args.device)
        out = model.generate(idx, n_tokens, temperature=0.8, top_k=20)
        return tokenizer.decode(out[0].tolist())
    finally:
        host.set_rng_state(saved)


def last_saved(state):
    """Where the last finite state is: a checkpoint is only ever written from one."""
    saved = state.get("saved_step")
    keep = f"ckpt.npz (step {saved}) and best.npz keep their last finite state" if saved is not None else \
        "no checkpoint was written"
    return f"{keep} (try a lower --learning_rate, or --grad_clip)"


class Diverged(RuntimeError):
    """A non-finite loss: the run stops, and no checkpoint is written from here on."""


class Interrupted(RuntimeError):
    """A Ctrl-C that left no state to save (the optimizer's update was cut in two)."""


class StoppedBySignal(Exception):
    """A signal stopped the run after it saved: ``code`` is the exit status (128 + the signal)."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code
