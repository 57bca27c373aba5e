"""Benchmark: fine-tuning steps of a fine-tuned run, tinyattn against PyTorch, subnormals flushed or not.

    python3 bench/bench_finetune_steps.py --run out-sft --data conv                      # SFT steps
    python3 bench/bench_finetune_steps.py --run out-sft --stage dpo --data pairs        # DPO steps
    python3 bench/bench_finetune_steps.py --run out-sft --stage rl --data input.txt     # RL updates
    python3 bench/bench_finetune_steps.py --run out-sft --data conv --steps 5           # a smoke test

Late in fine-tuning a model is sure of its answers: most of its probabilities are tiny, and so
are many of its gradients. Where they fall below 2**-126 (float32) the CPU takes a slow path for
each operation that reads or makes them, unless subnormals are flushed to zero. This continues
a trained chat run (``--run``, a checkpoint of ``python -m train ... --data CONVERSATIONS``) in
tinyattn (``train_step``: forward, backward, clip, AdamW, compiled as ``python -m train`` runs it)
and in PyTorch (the same weights as a ``GPT2LMHeadModel`` through ``export_hf``, the same
batches, the same AdamW), each with flushing off (``ta.set_flush_denormal(False)``,
``torch.set_flush_denormal(False)``) and on:

    sft   batches of --data's conversations (a folder of python -m data.prepare), the masked loss
    dpo   batches of --data's pairs (a folder of python -m data.pairs), the DPO loss (beta 0.1)
          against a frozen copy of the run
    rl    the policy-gradient update on answers to counting questions (words from --data, a
          text), sampled once by tinyattn's model at temperature 1 and given to both sides:
          the update is timed, not the sampling

Prints one JSON line a side and mode: the median ms a step over ``--steps`` steps (after one
untimed step), and the ratio of the times with flushing off and on.
"""
import argparse
import json
import statistics
import tempfile
import time
from types import SimpleNamespace

import numpy as np

import tinyattn as ta
from train import dpo, rl
from train.data import load_data
from train.loop import lm_loss, train_step, to_device
from train.sample import load_model

from bench_step import cpu_info     # (beside this file: python puts its folder on the path)

LR, BETAS, WEIGHT_DECAY, GRAD_CLIP = 1e-4, (0.9, 0.99), 0.1, 1.0


def batches(stage, run, data, n, batch_size):
    """n batches of the stage, the same arrays for both sides."""
    model, tokenizer = load_model(run)
    rng, block = np.random.default_rng(0), model.config.block_size
    if stage == "sft":
        dataset = load_data(data)
    elif stage == "dpo":
        dataset = dpo.load_pairs(data, tokenizer)
    else:
        args = SimpleNamespace(rl_tasks="count", data=data, rl_eval_prompts=8, rl_samples=8, rl_temperature=1.0,
                               rl_max_tokens=32, rl_std=False, rl_kl=0.0, block_size=block, rl_reward=None,
                               rl_tasks_given=True)
        dataset = rl.RL(rl.load_questions(args, tokenizer), args)      # the stage, answering with the run's model
        dataset.prepare(model, None, None, [])
        batch_size //= args.rl_samples                        # questions: each gives rl_samples rows
    return [dataset.get_batch("train", batch_size, block, rng) for _ in range(n)]


def tinyattn_loss(stage, run):
    """The stage's loss_fn(model, batch), as python -m train runs it."""
    if stage == "dpo":
        reference = load_model(run)[0]
        for p in reference.parameters():
            p.requires_grad = False
        return dpo.DPOObjective(ta.compile(reference), 0.1)
    return rl.rl_loss if stage == "rl" else lm_loss


def torch_loss(stage, hf, reference):
    """The stage's loss in PyTorch: the same formulas."""
    import torch
    F = torch.nn.functional

    def token_logprobs(model, x, y):                         # (B, T): log p(y), 0 where y is -1
        logp = F.log_softmax(model(x).logits, -1)
        got = logp.gather(-1, y.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        return got * (y >= 0)

    def loss(batch):
        batch = [torch.from_numpy(np.asarray(a)) for a in batch]
        if stage == "sft":
            x, y = batch
            return F.cross_entropy(hf(x).logits.flatten(0, 1), y.flatten(), ignore_index=-1)
        if stage == "dpo":
            xc, yc, xr, yr = batch
            with torch.no_grad():
                ref_c, ref_r = token_logprobs(reference, xc, yc).sum(-1), token_logprobs(reference, xr, yr).sum(-1)
            pol_c, pol_r = token_logprobs(hf, xc, yc).sum(-1), token_logprobs(hf, xr, yr).sum(-1)
            return -F.logsigmoid(0.1 * ((pol_c - ref_c) - (pol_r - ref_r))).mean()
        x, y, advantages, _ = batch
        mask = (y >= 0).float()
        return -(token_logprobs(hf, x, y) * advantages.view(-1, 1) * mask).sum() / mask.sum()
    return loss


def tinyattn_steps(stage, run, data, steps):
    model, _ = load_model(run)
    model = ta.compile(model.train())
    optimizer = model.configure_optimizer(WEIGHT_DECAY, LR, BETAS)
    loss_fn = tinyattn_loss(stage, run)
    times = []
    for batch in data[:steps + 1]:
        start = time.perf_counter()
        train_step(model, optimizer, [to_device(batch, "cpu")], GRAD_CLIP, None, loss_fn).item()
        times.append(time.perf_counter() - start)
    return times[1:]


def torch_steps(stage, run, data, steps):
    import torch
    from transformers import GPT2LMHeadModel
    model, _ = load_model(run)
    with tempfile.TemporaryDirectory() as folder:
        model.export_hf(folder)
        hf = GPT2LMHeadModel.from_pretrained(folder).train()
        reference = GPT2LMHeadModel.from_pretrained(folder).eval().requires_grad_(False)
    loss_fn = torch_loss(stage, hf, reference)
    decay = [p for p in hf.parameters() if p.dim() >= 2]
    rest = [p for p in hf.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                   {"params": rest, "weight_decay": 0.0}], lr=LR, betas=BETAS)
    times = []
    for batch in data[:steps + 1]:
        start = time.perf_counter()
        loss = loss_fn(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), GRAD_CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - start)
    return times[1:]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="a chat fine-tuned run's out_dir (its ckpt.npz)")
    p.add_argument("--stage", choices=["sft", "dpo", "rl"], default="sft")
    p.add_argument("--data", required=True, help="sft: the conversation folder it was fine-tuned on; dpo: a "
                                                 "folder of python -m data.pairs; rl: the text of the words")
    p.add_argument("--steps", type=int, default=40, help="timed steps a side and mode (default 40)")
    p.add_argument("--repeats", type=int, default=1, help="how many times each side and mode runs (default 1)")
    p.add_argument("--batch_size", type=int, default=32, help="rows a step (rl: 8 answers to each question)")
    p.add_argument("--sides", nargs="+", default=["tinyattn", "torch"], choices=["tinyattn", "torch"])
    args = p.parse_args(argv)
    data = batches(args.stage, args.run, args.data, args.steps + 1, args.batch_size)
    print(json.dumps({"cpu": cpu_info(), "run": args.run, "stage": args.stage, "steps": args.steps,
                      "batch_size": args.batch_size}))
    for side in args.sides:
        medians = {}
        for flush in (False, True):
            if side == "torch":
                import torch
                torch.set_flush_denormal(flush)
            ta.set_flush_denormal(flush)
            run = tinyattn_steps if side == "tinyattn" else torch_steps
            times = [t for _ in range(args.repeats) for t in run(args.stage, args.run, data, args.steps)]
            medians[flush] = 1e3 * statistics.median(times)
            print(json.dumps({"side": side, "flush": flush, "ms_per_step_median": round(medians[flush], 3)}),
                  flush=True)
        print(json.dumps({"side": side, "not_flushed_over_flushed": round(medians[False] / medians[True], 3)}))
    ta.set_flush_denormal(False)


if __name__ == "__main__":
    main()
