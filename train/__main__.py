"""python -m train: train a GPT, with nanoGPT's flag names.

With no --data it trains on the lesson's generated "it" corpus (data/coref.py)
and reports how well the model, and its attention, resolve "it". With
--data FILE it trains a character-level model on any UTF-8 text file.
"""
import argparse
import csv
import json
import math
import os
import sys
import time

import numpy as np
from tqdm import tqdm

import tinyattn as ta
from tinyattn.models import GPT, GPTConfig
from tinyattn.optim import warmup_cosine, set_lr
from tinyattn.nn.utils import clip_grad_norm_

from . import checkpoint
from .data import load_coref, load_text, tokenizer_to_json

# Defaults per dataset, like nanoGPT's config files. Flags override them.
PRESETS = {
    # the lesson's corpus, one sentence per sequence (18 tokens at most). 4 heads of 16 channels:
    # with one head per layer the exact answer failed at some seeds. Which head chooses the noun,
    # and how cleanly, still varies with the seed (train/BENCHMARKS.md has ten of them).
    "coref": dict(layout="sentence", n_layer=2, n_head=4, n_embd=64, block_size=20, batch_size=64, max_iters=1500,
                  learning_rate=3e-3, min_lr=3e-4, warmup_iters=100, lr_decay_iters=1500, eval_interval=200,
                  eval_iters=10, out_dir="out-coref"),
    # nanoGPT's CPU "baby" Shakespeare config
    "text": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, max_iters=2000,
                 learning_rate=1e-3, min_lr=1e-4, warmup_iters=100, lr_decay_iters=2000, eval_interval=250,
                 eval_iters=20, out_dir="out"),
}
COMMON = dict(dropout=0.0, weight_decay=0.1, beta1=0.9, beta2=0.99, grad_clip=1.0, gradient_accumulation_steps=1,
              bias=True, log_interval=10, sample_tokens=200)


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line, without the usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser():
    p = OneLineParser(prog="python -m train", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="a UTF-8 text file for character-level training (default: the lesson corpus)")
    p.add_argument("--out_dir", help="where ckpt.npz, log.csv, loss.png and summary.json go")
    p.add_argument("--resume", action="store_true", help="continue from out_dir/ckpt.npz")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--seed", type=int, default=1337)
    for name in ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "max_iters", "lr_decay_iters",
                 "warmup_iters", "eval_interval", "eval_iters", "gradient_accumulation_steps", "log_interval",
                 "sample_tokens"):
        p.add_argument(f"--{name}", type=int)
    for name in ("learning_rate", "min_lr", "weight_decay", "beta1", "beta2", "grad_clip", "dropout"):
        p.add_argument(f"--{name}", type=float)
    p.add_argument("--bias", type=lambda s: s.lower() in ("1", "true", "yes"), help="biases in Linear and LayerNorm")
    p.add_argument("--layout", choices=("sentence", "stream"),
                   help="the 'it' corpus only: one sentence per sequence from position 0 (default), "
                        "or random windows of the sentences run together")
    p.add_argument("--quiet", action="store_true", help="no progress bar or samples")
    return p


def parse_args(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    preset = {**COMMON, **PRESETS["text" if args.data else "coref"]}
    for key, value in preset.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    problems = []
    if args.data and args.layout:
        problems.append("--layout is for the 'it' corpus only, not with --data")
    if args.n_embd % args.n_head:
        problems.append(f"--n_embd {args.n_embd} must be divisible by --n_head {args.n_head}")
    for name in ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "eval_interval", "eval_iters",
                 "gradient_accumulation_steps"):
        if getattr(args, name) < 1:
            problems.append(f"--{name} must be at least 1")
    if args.max_iters < 0:
        problems.append("--max_iters must not be negative")
    if not 0.0 <= args.dropout < 1.0:
        problems.append("--dropout must be in [0, 1)")
    if problems:
        parser.error("; ".join(problems))
    return args


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


def train_step(model, optimizer, batches, grad_clip):
    """One optimizer step over the micro-batches [(x, y), ...]: their gradients add up.

    Each loss is scaled by 1/k, so the summed gradient is that of the mean loss
    and clipping sees the same norm as one big batch would. Returns the mean
    loss as a 0-d Tensor, still on the device.
    """
    total = None
    for x, y in batches:
        _, loss = model(x, y)
        scaled = loss * (1.0 / len(batches))
        scaled.backward()
        total = scaled.detach() if total is None else total + scaled.detach()
    if grad_clip > 0:
        clip_grad_norm_(model.parameters(), grad_clip)
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
                args=vars(args), data_rng=state["data_rng"].bit_generator.state,
                device_rng=ta.backend.get_backend(args.device).get_rng_state(),
                tokenizer=tokenizer_to_json(dataset.tokenizer), dataset=dataset.name, log=state["log"])
    checkpoint.save(path, model, optimizer, meta)


def write_plot(log_rows, out_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "loss.png skipped: matplotlib is not installed (pip install -e \".[viz]\")"
    fig, ax = plt.subplots(figsize=(6, 4))
    steps = [r["step"] for r in log_rows]
    ax.plot(steps, [r["train_loss"] for r in log_rows], label="train")
    ax.plot(steps, [r["val_loss"] for r in log_rows], label="val")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "loss.png"), dpi=100)
    plt.close(fig)
    return f"wrote {os.path.join(out_dir, 'loss.png')}"


def write_log(log_rows, out_dir):
    with open(os.path.join(out_dir, "log.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["step", "train_loss", "val_loss", "lr", "time"])
        writer.writeheader()
        writer.writerows(log_rows)


# ---------------------------------------------------------------------------
def train(args):
    """The training run; returns the summary dict."""
    ckpt_path = os.path.join(args.out_dir, "ckpt.npz")
    dataset = load_text(args.data) if args.data else load_coref(seed=0, layout=args.layout)
    device_backend = ta.backend.get_backend(args.device)      # a clear error when CUDA is missing
    ta.manual_seed(args.seed)

    config = GPTConfig(block_size=args.block_size, vocab_size=dataset.tokenizer.vocab_size, n_layer=args.n_layer,
                       n_head=args.n_head, n_embd=args.n_embd, dropout=args.dropout, bias=args.bias)
    state = dict(step=0, best_val_loss=math.inf, data_rng=np.random.default_rng(args.seed), log=[])
    if args.resume:
        model_state, optim_state, meta = checkpoint.load(ckpt_path)
        config = GPTConfig(**meta["config"])
    model = GPT(config).to(args.device)
    optimizer = model.configure_optimizer(args.weight_decay, args.learning_rate, (args.beta1, args.beta2))
    if args.resume:
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optim_state)
        state.update(step=meta["step"], best_val_loss=meta["best_val_loss"], log=meta["log"])
        state["data_rng"].bit_generator.state = meta["data_rng"]
        device_backend.set_rng_state(meta["device_rng"])
    os.makedirs(args.out_dir, exist_ok=True)
    say = (lambda msg: None) if args.quiet else tqdm.write
    say(f"{dataset.name}: {len(dataset.train):,} train / {len(dataset.val):,} val tokens, vocab {config.vocab_size}; "
        f"model {model.num_parameters() / 1e6:.2f}M parameters on {args.device}")

    tokens_per_step = args.batch_size * args.block_size * args.gradient_accumulation_steps
    train_time, steps_timed, interrupted = 0.0, 0, False
    start_wall = time.time()
    bar = tqdm(total=args.max_iters, initial=state["step"], disable=args.quiet, dynamic_ncols=True, desc="train")

    def evaluate(step):
        losses = estimate_loss(model, dataset, args)
        row = dict(step=step, train_loss=round(losses["train"], 6), val_loss=round(losses["val"], 6),
                   lr=warmup_cosine(step, args.learning_rate, args.min_lr, args.warmup_iters, args.lr_decay_iters),
                   time=round(time.time() - start_wall, 3))
        if not state["log"] or state["log"][-1]["step"] != step:
            state["log"].append(row)
        say(f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if args.sample_tokens and not args.quiet:
            say("  sample: " + repr(sample_text(model, dataset, args, args.sample_tokens)[:300]))
        if losses["val"] < state["best_val_loss"]:
            state["best_val_loss"] = losses["val"]
            if step > 0:                             # ckpt.npz: the latest state, for --resume
                save_checkpoint(ckpt_path, model, optimizer, state, args, dataset)
                save_checkpoint(os.path.join(args.out_dir, "best.npz"), model, optimizer, state, args, dataset)
        return losses

    try:
        while state["step"] < args.max_iters:
            step = state["step"]
            if step % args.eval_interval == 0 and (not state["log"] or state["log"][-1]["step"] != step):
                evaluate(step)
            lr = warmup_cosine(step, args.learning_rate, args.min_lr, args.warmup_iters, args.lr_decay_iters)
            set_lr(optimizer, lr)
            t0 = time.time()
            batches = [to_device(dataset.get_batch("train", args.batch_size, args.block_size, state["data_rng"]),
                                 args.device) for _ in range(args.gradient_accumulation_steps)]
            loss = train_step(model, optimizer, batches, args.grad_clip)
            state["step"] = step + 1
            if step % args.log_interval == 0:          # reading the loss waits for the device: not every step
                bar.set_postfix(loss=f"{loss.item():.4f}", lr=f"{lr:.2e}")
            train_time += time.time() - t0
            steps_timed += 1
            bar.update(1)
    except KeyboardInterrupt:
        interrupted = True
        say(f"interrupted at step {state['step']}: saving {ckpt_path}")
    bar.close()
    if interrupted:
        save_checkpoint(ckpt_path, model, optimizer, state, args, dataset)
        return None
    final = evaluate(state["step"])
    save_checkpoint(ckpt_path, model, optimizer, state, args, dataset)

    summary = dict(best_val_loss=round(state["best_val_loss"], 6), val_loss=round(final["val"], 6),
                   train_loss=round(final["train"], 6), iters=state["step"], dataset=dataset.name,
                   tokens_per_s=round(tokens_per_step * steps_timed / train_time, 1) if train_time else None,
                   wall_s=round(time.time() - start_wall, 2), parameters=model.num_parameters(),
                   device=args.device, config=config.to_dict())
    if dataset.name == "coref":
        from . import lesson
        summary.update(lesson.report(model, dataset, args.out_dir, args.device, say))
        summary["wall_s"] = round(time.time() - start_wall, 2)
    write_log(state["log"], args.out_dir)
    say(write_plot(state["log"], args.out_dir))
    with open(os.path.join(args.out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def main(argv=None):
    args = parse_args(argv)
    try:
        summary = train(args)
    except (ValueError, OSError, KeyError, RuntimeError) as e:
        print(f"python -m train: error: {e}", file=sys.stderr)
        return 1
    if summary is None:
        return 130
    extra = ""
    if "heldout_accuracy" in summary:
        extra = (f", held-out referent accuracy {summary['heldout_accuracy']:.3f}, "
                 f"attention on the referent {summary['heldout_attention_correct']:.3f}")
    print(f"done: {summary['iters']} iters, best val loss {summary['best_val_loss']:.4f}, "
          f"val loss {summary['val_loss']:.4f}{extra}, {summary['tokens_per_s']} tokens/s, "
          f"{summary['wall_s']:.0f} s; wrote {os.path.join(args.out_dir, 'summary.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
