"""Starting a run of python -m train: the data, the model and its optimizer (new, fine-tuned from
another model, or as a checkpoint left them), and the learner's pieces for --use_exercises."""
import contextlib
import math
import os
import sys

import numpy as np

import tinyattn as ta
from tinyattn import distributed as dist
from tinyattn.models import GPT, GPTConfig

from . import checkpoint, finetune, lora, memory, parallel, stages
from .config import check_resume, schedule_ended


def setup(args, notes):
    """The data, the model and its optimizer, and the run's state: new, or as out_dir/ckpt.npz
    left them with --resume. -> (stage, model, optimizer, state, meta): the stage (train/stages.py)
    holds the data; meta is the checkpoint's (None for a new run). What the run should know goes
    into the list ``notes``."""
    ckpt_path = os.path.join(args.out_dir, "ckpt.npz")
    if os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
        raise ValueError(f"--out_dir {args.out_dir} is a file, not a folder")
    pretrained = finetune.load_pretrained(args, stages.chat_stage(args)) if args.init_from else None
    #            (refuses its own out_dir first)
    args.fine_tuned_from = args.init_from     # kept in the checkpoint: a resumed run has no --init_from
    writes = not args.resume and not args.eval_only           # a new run, into out_dir
    replaced = checkpoint.refuse_to_replace(args.out_dir, args.overwrite) if writes else None
    tokenizer = pretrained.tokenizer if pretrained else finetune.resumed_tokenizer(ckpt_path) if args.resume else None
    stage = stages.load(args, tokenizer)        # the stage and its data: the one place --stage is read
    dataset = stage.data
    if pretrained:
        notes.append(finetune.fit_args(args, pretrained, dataset))
    device_backend = ta.backend.get_backend(args.device)      # a clear error when CUDA is missing
    ta.manual_seed(args.seed)

    config = GPTConfig(block_size=args.block_size, vocab_size=dataset.tokenizer.vocab_size, n_layer=args.n_layer,
                       n_head=args.n_head, n_embd=args.n_embd, dropout=args.dropout, bias=args.bias,
                       init=args.init, head_dropout=args.head_dropout, pos=args.pos, rope_theta=args.rope_theta,
                       norm=args.norm, mlp=args.mlp, n_kv_head=args.n_kv_head, qk_norm=args.qk_norm,
                       tie_embeddings=args.tie_embeddings)
    state = dict(step=0, best_val_loss=math.inf, data_rng=np.random.default_rng(args.seed), log=[],
                 train_losses=[], saved_step=None, time_before=0.0)
    meta = None
    if args.resume:
        model_state, optim_state, meta = checkpoint.load(ckpt_path)
        check_resume(args, meta, dataset, notes)
        ran = meta.get("args") or {}
        args.fine_tuned_from = ran.get("fine_tuned_from") or ran.get("init_from")
        config = GPTConfig(**meta["config"])
    notes += stage.fit_length(finetune.max_length(args))      # conversations and pairs longer are cut
    if device_backend.on_host:                  # refused before it is allocated, in one line
        rows = args.batch_size * stage.rows_per_item()                 # rl: K answers a question
        memory.check_fits(config, rows // dist.world_size(), stage.tokens_per_row(config.block_size),
                          np.dtype(args.dtype).itemsize)
    model = pretrained.model if pretrained else GPT(config)
    if args.lora_rank:                          # only the adapters train: your LoRALinear (train/lora.py)
        trained = lora.adapt(model, lora.lora_linear(), args.lora_rank, args.lora_alpha)
        notes.append(f"--lora_rank {args.lora_rank}: {trained:,} adapter parameters train, the model's "
                     f"{model.num_parameters() - trained:,} are frozen")
    model = ta.compile(model.to(args.dtype).to(args.device), disable=not args.compile)   # nanoGPT's --compile
    optimizer = model.configure_optimizer(args.weight_decay, args.learning_rate, (args.beta1, args.beta2))
    if args.resume:
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optim_state)
        state.update(step=meta["step"], best_val_loss=meta["best_val_loss"], log=meta["log"], saved_step=meta["step"],
                     time_before=meta.get("elapsed") or (meta["log"][-1]["time"] if meta["log"] else 0.0),
                     train_losses=(meta.get("train_losses", []) + [None] * meta["step"])[:meta["step"]],
                     step_log=[row for row in meta.get("step_log") or [] if row["step"] < meta["step"]])
        state["data_rng"].bit_generator.state = meta["data_rng"]
        device_backend.set_rng_state(meta["device_rng"])
        if (meta.get("device_rng") is None or device_backend.get_rng_state() is None) and \
                (config.dropout or config.head_dropout):
            device_backend.seed(parallel.device_seed(args.seed, 0, state["step"]))     # not the first steps' masks again
            notes.append(f"the dropout generator's state was not saved ({args.device} cannot export it): the "
                         "resumed run draws its masks from a new stream, so it is not the uninterrupted run to the "
                         "bit (that needs --dropout 0 and --head_dropout 0 there)")
        threads_note = checkpoint.other_thread_count(meta, device_backend.on_host)
        if threads_note:
            notes.append(threads_note)
    stage.prepare(model, meta, pretrained, notes)            # (a reference model: --stage dpo, rl)
    if replaced and dist.rank() == 0:
        checkpoint.remove_run(args.out_dir)
        notes.append(replaced)
    if not args.eval_only:
        os.makedirs(args.out_dir, exist_ok=True)
    return stage, model, optimizer, state, meta


def exercises_swapped_in(wanted):
    """--use_exercises: the learner's passing pieces replace the library's for this run."""
    if not wanted:
        return contextlib.nullcontext()
    try:
        from exercises.checking.swap import use_exercises
    except ImportError as e:
        raise OSError(f"--use_exercises needs the exercises/ folder: run from the repository root ({e})") from None
    return use_exercises()


def resuming(ckpt_path, state, max_iters, best_words=stages.LanguageModel.best_words):
    """'resuming out/ckpt.npz at step 300 of 5000, best val loss 1.9123' (the last eval's val
    loss when the checkpoint has no best, 'not evaluated yet' when it has no eval at all).
    ``best_words(best, log)``: how the stage says its best (--stage rl: its sampled accuracy)."""
    said = best_words(state["best_val_loss"], state["log"])
    return f"resuming {ckpt_path} at step {state['step']} of {max_iters}, {said}"


def announce(args, notes, state, meta, stage, model, ckpt_path, say):
    """What the run is about to do, before its first step: where a resumed run starts and the
    notes the set-up left (rank 0 prints them, even under --quiet), a resumed run with nothing to train or past its schedule's end, the data
    and the model, and under mpiexec who does what."""
    world, root = dist.world_size(), dist.rank() == 0
    def note(message):                          # stderr, and under --quiet too
        print(f"python -m train: {message}", file=sys.stderr, flush=True)
    if args.resume and root:
        said = resuming(ckpt_path, state, args.max_iters, stage.best_words)
        note(said.replace("resuming", "evaluating", 1) if args.eval_only else said)
    for message in notes if root else ():
        note(f"note: {message}")
    if args.resume and root and not args.eval_only:
        if state["step"] >= args.max_iters:
            note(f"note: {ckpt_path} is at step {state['step']}, not below --max_iters "
                 f"{args.max_iters}: nothing to train (raise --max_iters to continue)")
        elif schedule_ended(args, state["step"], meta):
            flat_from = max(state["step"], args.lr_decay_iters)
            note(f"note: the learning rate schedule ends at --lr_decay_iters {args.lr_decay_iters}: "
                 f"steps {flat_from} to {args.max_iters - 1} {'all ' if flat_from == state['step'] else ''}run "
                 f"at --min_lr {args.min_lr:g} (pass --lr_decay_iters {args.max_iters} for a schedule that ends "
                 "at --max_iters)")
    say(f"{stage.describe()}, vocab {model.config.vocab_size}; model {model.num_parameters() / 1e6:.2f}M parameters on {args.device}"
        f"{'' if args.dtype == 'float32' else ', in ' + args.dtype}, "
        + ("compiled (ta.compile; --compile False runs the formulas)" if args.compile else
           "not compiled (every op runs its teaching formula)"))
    pids = dist.gather_object(os.getpid())      # a process that dies is named by its pid (mpiexec says which)
    if world > 1 and root:
        threads = f" (OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']})" if "OMP_NUM_THREADS" in os.environ else ""
        print(f"python -m train: data parallel over {world} processes, {args.batch_size // world} of the "
              f"{args.batch_size} rows of each batch on each{threads}; "
              f"ranks {', '.join(f'{r}: pid {p}' for r, p in enumerate(pids))}", flush=True)
