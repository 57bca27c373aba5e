"""Side by side on nanoGPT's CPU "baby" config: train tinyattn and PyTorch from the same
initial weights, on the same batches, with the same optimizer and schedule, and compare
their val losses and speed. (Needs torch; install torch==2.13.0 for a CPU build.)

    python bench/bench_baby.py --data data/shakespeare_char/input.txt --out baby.json

Each side trains in its own block of time (not interleaved), one after the other.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import tinyattn as ta
from tinyattn.models import GPT, GPTConfig
from tinyattn.optim import warmup_cosine, set_lr
from train.data import load_text
from train.loop import train_step

from bench_step import make_torch_gpt, torch_adamw      # the sibling script (run as python bench/...)

BABY = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, vocab_size=None, dropout=0.0)
HYPER = dict(max_iters=2000, lr=1e-3, min_lr=1e-4, warmup=100, decay=2000, wd=0.1, betas=(0.9, 0.99),
             clip=1.0, eval_interval=250, eval_iters=20, seed=1337)


def evaluate(loss_fn, dataset, cfg):
    rng = np.random.default_rng(HYPER["seed"] + 1)          # the same batches at every evaluation
    return {split: float(np.mean([loss_fn(*dataset.get_batch(split, cfg["batch_size"], cfg["block_size"], rng))
                                  for _ in range(HYPER["eval_iters"])])) for split in ("train", "val")}


def run_tinyattn(model, dataset, cfg):
    opt = model.configure_optimizer(HYPER["wd"], HYPER["lr"], HYPER["betas"])
    rng = np.random.default_rng(HYPER["seed"])

    @ta.no_grad()
    def loss_fn(x, y):
        model.eval()
        value = model(ta.tensor(x), ta.tensor(y))[1].item()
        model.train()
        return value
    return train_loop(lambda step, x, y: train_step(model, opt, [(ta.tensor(x), ta.tensor(y))], HYPER["clip"]),
                      lambda lr: set_lr(opt, lr), loss_fn, dataset, cfg, rng)


def run_torch(torch, model, dataset, cfg):
    opt = torch_adamw(torch, model, HYPER["lr"], HYPER["betas"], HYPER["wd"])
    rng = np.random.default_rng(HYPER["seed"])

    def step_fn(step, x, y):
        _, loss = model(torch.from_numpy(x), torch.from_numpy(y))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), HYPER["clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def set_lr_torch(lr):
        for g in opt.param_groups:
            g["lr"] = lr

    @torch.no_grad()
    def loss_fn(x, y):
        model.eval()
        value = model(torch.from_numpy(x), torch.from_numpy(y))[1].item()
        model.train()
        return value
    return train_loop(step_fn, set_lr_torch, loss_fn, dataset, cfg, rng)


def train_loop(step_fn, set_lr_fn, loss_fn, dataset, cfg, rng):
    log, train_s = [], 0.0
    for step in range(HYPER["max_iters"] + 1):
        if step % HYPER["eval_interval"] == 0 or step == HYPER["max_iters"]:
            log.append(dict(step=step, **evaluate(loss_fn, dataset, cfg)))
        if step == HYPER["max_iters"]:
            break
        set_lr_fn(warmup_cosine(step, HYPER["lr"], HYPER["min_lr"], HYPER["warmup"], HYPER["decay"]))
        x, y = dataset.get_batch("train", cfg["batch_size"], cfg["block_size"], rng)
        t0 = time.perf_counter()
        step_fn(step, x, y)
        train_s += time.perf_counter() - t0
    return dict(log=log, best_val_loss=min(r["val"] for r in log), final_val_loss=log[-1]["val"],
                train_s=round(train_s, 2), ms_per_step=round(1000 * train_s / HYPER["max_iters"], 2),
                tokens_per_s=round(HYPER["max_iters"] * cfg["batch_size"] * cfg["block_size"] / train_s, 1))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="tiny Shakespeare (or any text file)")
    p.add_argument("--max_iters", type=int, default=HYPER["max_iters"])
    p.add_argument("--out", help="write the results here as JSON")
    args = p.parse_args(argv)
    HYPER["max_iters"] = HYPER["decay"] = args.max_iters
    import torch
    torch.manual_seed(HYPER["seed"])
    dataset = load_text(args.data)
    cfg = dict(BABY, vocab_size=dataset.tokenizer.vocab_size)
    ta.manual_seed(HYPER["seed"])
    model = ta.compile(GPT(GPTConfig(**{k: cfg[k] for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size",
                                                         "dropout")})))     # as python -m train runs it
    torch_model = make_torch_gpt(torch, cfg)
    with torch.no_grad():                                      # the same starting weights
        named = dict(torch_model.named_parameters())
        for name, p_ta in model.named_parameters():
            named[name].copy_(torch.from_numpy(p_ta.numpy()))
    results = {"config": cfg, "hyper": {k: v for k, v in HYPER.items()}, "torch_version": torch.__version__,
               "torch_threads": torch.get_num_threads()}
    results["tinyattn"] = run_tinyattn(model, dataset, cfg)
    results["torch"] = run_torch(torch, torch_model, dataset, cfg)
    results["speed_ratio_torch_over_tinyattn"] = round(results["tinyattn"]["ms_per_step"] / results["torch"]["ms_per_step"], 3)
    text = json.dumps(results, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    for side in ("tinyattn", "torch"):
        r = results[side]
        print(json.dumps({"side": side, "best_val_loss": round(r["best_val_loss"], 4),
                          "final_val_loss": round(r["final_val_loss"], 4), "ms_per_step": r["ms_per_step"],
                          "tokens_per_s": r["tokens_per_s"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
