"""python -m train: train a GPT, with nanoGPT's flag names.

With no --data it trains on the lesson's generated "it" corpus (data/coref.py)
and reports how well the model, and its attention, resolve "it". With
--data FILE it trains a character-level model on any UTF-8 text file.

This module is the run: ``setup`` (the data, the model, its optimizer, or a
checkpoint's), ``train_step``, the loop (``train(args)``) and ``main(argv)``.
The flags, presets and their checks are in config.py; what a run writes
beside its checkpoints (log.csv, loss.png, the profile) in report.py;
``train/__main__.py`` only calls ``main``.
"""
import contextlib
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
from tinyattn.optim import warmup_cosine, set_lr
from tinyattn.nn.utils import clip_grad_norm_
from tinyattn.fast import tune_host_allocator

from . import checkpoint, finetune, interrupts, memory, parallel
from .config import PRESETS, PROFILE_STEPS, build_parser, check_resume, parse_args, schedule_ended  # noqa: F401
from .data import load_coref, load_data, tokenizer_to_json
from .report import loss_figure, perplexity, report_profile, write_log, write_plot  # noqa: F401



# ---------------------------------------------------------------------------
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


class Diverged(RuntimeError):
    """A non-finite loss: the run stops, and no checkpoint is written from here on."""


class Interrupted(RuntimeError):
    """A Ctrl-C that left no state to save (the optimizer's update was cut in two)."""


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


def exercises_swapped_in(wanted):
    """--use_exercises: the learner's passing pieces replace the library's for this run."""
    if not wanted:
        return contextlib.nullcontext()
    try:
        from exercises.checking.swap import use_exercises
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
