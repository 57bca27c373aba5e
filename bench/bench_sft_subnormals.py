"""Benchmark: SFT steps of a fine-tuned model, tinyattn against PyTorch, subnormals flushed or not.

    python3 bench/bench_sft_subnormals.py --run out-sft --data conv     # a run of README's pipeline
    python3 bench/bench_sft_subnormals.py --run out-sft --data conv --steps 5 --repeats 1   # a smoke test

Late in fine-tuning a model is sure of its answers: most of its probabilities are tiny, and so
are many of its gradients. Where they fall below 2**-126 (float32) the CPU takes a slow path for
each operation that reads or makes them, unless subnormals are flushed to zero. This continues
the SFT of a trained run (``--run``, a checkpoint of ``python -m train ... --data CONVERSATIONS``)
on its own conversations (``--data``, the folder it trained on), in tinyattn (``train_step``:
forward, backward, clip, AdamW, fused as ``python -m train`` runs it) and in PyTorch (the same
weights as a ``GPT2LMHeadModel`` through ``export_hf``, the same batches, the same AdamW), each
with flushing off (``ta.set_flush_denormal(False)``, ``torch.set_flush_denormal(False)``) and on.
Prints one JSON line a side and mode: the median ms a step over ``--steps`` steps (after one
untimed step), and the ratio of the slowest to the fastest mode.
"""
import argparse
import json
import statistics
import tempfile
import time

import numpy as np

import tinyattn as ta
from train.data import load_data
from train.loop import train_step, to_device
from train.sample import load_model

from bench_step import cpu_info     # (beside this file: python puts its folder on the path)

LR, BETAS, WEIGHT_DECAY, GRAD_CLIP = 1e-4, (0.9, 0.99), 0.1, 1.0


def batches(dataset, n, batch_size, block_size, seed=0):
    """n batches (x, y) of the conversation folder's train rows, the same for both sides."""
    rng = np.random.default_rng(seed)
    return [dataset.get_batch("train", batch_size, block_size, rng) for _ in range(n)]


def tinyattn_steps(run, data, steps):
    model, _ = load_model(run)
    model = ta.nn.fuse(model.train())
    optimizer = model.configure_optimizer(WEIGHT_DECAY, LR, BETAS)
    times = []
    for x, y in data[:steps + 1]:
        start = time.perf_counter()
        train_step(model, optimizer, [to_device((x, y), "cpu")], GRAD_CLIP).item()
        times.append(time.perf_counter() - start)
    return times[1:]


def torch_steps(run, data, steps):
    import torch
    from transformers import GPT2LMHeadModel
    model, _ = load_model(run)
    with tempfile.TemporaryDirectory() as folder:
        model.export_hf(folder)
        hf = GPT2LMHeadModel.from_pretrained(folder).train()
    decay = [p for p in hf.parameters() if p.dim() >= 2]
    rest = [p for p in hf.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                   {"params": rest, "weight_decay": 0.0}], lr=LR, betas=BETAS)
    times = []
    for x, y in data[:steps + 1]:
        start = time.perf_counter()
        logits = hf(torch.from_numpy(x)).logits                                  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.from_numpy(y).flatten(),
                                                 ignore_index=-1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), GRAD_CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - start)
    return times[1:]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="a fine-tuned run's out_dir (its ckpt.npz)")
    p.add_argument("--data", required=True, help="the conversation folder it was fine-tuned on")
    p.add_argument("--steps", type=int, default=40, help="timed steps a side and mode (default 40)")
    p.add_argument("--repeats", type=int, default=1, help="how many times each side and mode runs (default 1)")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--sides", nargs="+", default=["tinyattn", "torch"], choices=["tinyattn", "torch"])
    args = p.parse_args(argv)
    dataset = load_data(args.data)
    model, _ = load_model(args.run)
    data = batches(dataset, args.steps + 1, args.batch_size, model.config.block_size)
    print(json.dumps({"cpu": cpu_info(), "run": args.run, "steps": args.steps, "batch_size": args.batch_size}))
    for side in args.sides:
        medians = {}
        for flush in (False, True):
            if side == "torch":
                import torch
                torch.set_flush_denormal(flush)
            ta.set_flush_denormal(flush)
            run = tinyattn_steps if side == "tinyattn" else torch_steps
            times = [t for _ in range(args.repeats) for t in run(args.run, data, args.steps)]
            medians[flush] = 1e3 * statistics.median(times)
            print(json.dumps({"side": side, "flush": flush, "ms_per_step_median": round(medians[flush], 3)}),
                  flush=True)
        print(json.dumps({"side": side, "not_flushed_over_flushed": round(medians[False] / medians[True], 3)}))
    ta.set_flush_denormal(False)


if __name__ == "__main__":
    main()
