"""python -m train: train a GPT, with nanoGPT's flag names.

With no --data it trains on the lesson's generated "it" corpus (data/coref.py)
and reports how well the model, and its attention, resolve "it". With
--data FILE it trains a character-level model on any UTF-8 text file.

This module is the run: ``train_step`` and the loop (``train(args)``). Around
it: config.py (the flags, presets and their checks), start.py (the data, the
model and its optimizer, new or from a checkpoint), report.py (log.csv,
loss.png, the profile), checkpoint.py, and command.py (``main``, which
``python -m train`` runs: errors become one line and an exit status).
"""
import contextlib
import math
import os
import time

import numpy as np
from tqdm import tqdm

import tinyattn as ta
from tinyattn import distributed as dist
from tinyattn.optim import warmup_cosine, set_lr
from tinyattn.nn.utils import clip_grad_norm_

from . import checkpoint, interrupts, parallel
from .config import PROFILE_STEPS
from .report import perplexity, report_profile, write_log, write_results
from .start import announce, setup


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
    announce(args, state, meta, dataset, model, ckpt_path, say)
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
                       train_loss=last.get("train_loss"), **run_facts())
        write_results(args.out_dir, state["log"], state["train_losses"], summary, say)

    def run_facts():
        """What every summary.json says of the run: the data, its speed and wall time, the model."""
        return dict(dataset=dataset.name, wall_s=round(time.time() - start_wall, 2),
                    tokens_per_s=round(tokens_per_step * steps_timed / train_time, 1) if train_time else None,
                    parameters=model.num_parameters(), device=args.device, config=config.to_dict())

    def save(path):
        with interrupts.uninterrupted():
            state["elapsed"] = clock()
            checkpoint.save_run(path, model, optimizer, state, args, dataset)
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
                       train_loss=round(final["train"], 6), iters=state["step"], **run_facts())
        if dataset.text_bytes:
            summary.update(best_val_bpb=round(dataset.bits_per_byte(state["best_val_loss"]), 6),
                           val_bpb=round(dataset.bits_per_byte(final["val"]), 6))
        if world > 1:
            summary["processes"] = world
        if dataset.name == "coref":
            from . import lesson
            summary.update(lesson.report(model, dataset, args.out_dir, args.device, say))
            summary["wall_s"] = round(time.time() - start_wall, 2)
        write_results(args.out_dir, state["log"], state["train_losses"], summary, say)
        return summary

    try:
        return parallel.on_root(finish)          # rank 0 evaluates and writes; every process gets the summary
    except KeyboardInterrupt:                    # a second Ctrl-C in the final evaluation: all steps are done
        say(f"interrupted at step {state['step']}: saving {ckpt_path}")
        with interrupts.uninterrupted():
            stopped()
        return None


# ---------------------------------------------------------------------------
# what the loop calls: the step, the evaluation, the sample, reading the losses
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


def to_device(batch, device):
    x, y = batch
    return ta.tensor(x, device=device), ta.tensor(y, device=device)


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


class Diverged(RuntimeError):
    """A non-finite loss: the run stops, and no checkpoint is written from here on."""


class Interrupted(RuntimeError):
    """A Ctrl-C that left no state to save (the optimizer's update was cut in two)."""
