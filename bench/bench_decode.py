"""Benchmark: greedy decoding with a KV cache, tinyattn against PyTorch eager, side by side.

    python bench/bench_decode.py                               # baby and default models, batch 1 and 8
    python bench/bench_decode.py --configs baby --batches 1 --rounds 20

Both sides hold the same weights (tinyattn's GPT, copied into the PyTorch
GPT of bench_step.py) and decode greedily (temperature 0) from the same
prompt of --prompt tokens up to the model's block size, so every new token
runs one position through the cache:

    tinyattn   ta.compile(GPT).generate(idx, n, temperature=0), under ta.no_grad():
               compiled, so it decodes on arrays (not compiled, every op runs its formula)
    torch      the same loop in PyTorch: keys and values written into
               preallocated (B, H, block, D) buffers, SDPA over the filled part,
               argmax of the last position's logits, under torch.inference_mode()

A round runs one generate call of each side, alternating which goes first.
Prints one JSON line per (config, batch): the median ms per token of each
side (prompt included, spread over the new tokens), tokens/s (batch x new
tokens / time), tinyattn's speed over PyTorch's (above 1: faster), and the
share of generated tokens on which the two sides agree (float32 rounding can
flip a near-tie of random weights; 1.0 is usual). Also the CPU it ran on.
Needs PyTorch in this Python (CPU build: pip install torch==2.13.0
--index-url https://download.pytorch.org/whl/cpu).
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np

import tinyattn as ta
from tinyattn.fast import tune_host_allocator
from tinyattn.models import GPT, GPTConfig

from bench_step import CONFIGS, cpu_info, import_torch, make_torch_gpt  # (beside this file: python puts its folder on the path)


def make_models(torch, cfg):
    """(tinyattn GPT compiled, PyTorch GPT) with the same weights, in eval mode."""
    ta.manual_seed(0)
    config = GPTConfig(**{k: cfg[k] for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")}, dropout=0.0)
    ours = GPT(config)
    theirs = make_torch_gpt(torch, dict(cfg, dropout=0.0))
    named = dict(ours.named_parameters())
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            p.copy_(torch.from_numpy(named[name].numpy()))
    ours.eval()
    theirs.eval()
    return ta.compile(ours), theirs


def torch_generate(torch, model, cfg, idx, new_tokens):
    """Greedy decoding with a KV cache in preallocated buffers: idx (B, T) -> (B, T + new_tokens)."""
    F = torch.nn.functional
    B, T = idx.shape
    C, H = cfg["n_embd"], cfg["n_head"]
    D = C // H
    caches = [(torch.empty(B, H, cfg["block_size"], D), torch.empty(B, H, cfg["block_size"], D)) for _ in model.h]
    out, x_ids, start = [idx], idx, 0
    for _ in range(new_tokens):
        t = x_ids.shape[1]
        x = model.wte(x_ids) + model.wpe(torch.arange(start, start + t))           # (B, t, C)
        for block, (k_cache, v_cache) in zip(model.h, caches):
            q, k, v = block.attn.c_attn(block.ln_1(x)).split(C, dim=2)
            q, k, v = (a.view(B, t, H, D).transpose(1, 2) for a in (q, k, v))    # (B, H, t, D)
            k_cache[:, :, start:start + t] = k
            v_cache[:, :, start:start + t] = v
            y = F.scaled_dot_product_attention(q, k_cache[:, :, :start + t], v_cache[:, :, :start + t],
                                               is_causal=t > 1)                   # the prompt: causal
            x = x + block.attn.c_proj(y.transpose(1, 2).reshape(B, t, C))
            x = x + block.mlp(block.ln_2(x))
        logits = model.lm_head(model.ln_f(x[:, -1:]))                              # (B, 1, V)
        x_ids = logits.argmax(-1)                                                  # (B, 1)
        out.append(x_ids)
        start += t
    return torch.cat(out, dim=1)


def measure(torch, name, cfg, batch, prompt, rounds):
    ours, theirs = make_models(torch, cfg)
    new_tokens = cfg["block_size"] - prompt
    ids = np.random.default_rng(0).integers(0, cfg["vocab_size"], (batch, prompt))
    idx_ours, idx_theirs = ta.tensor(ids), torch.from_numpy(ids)

    def run_ours():
        with ta.no_grad():
            return ours.generate(idx_ours, new_tokens, temperature=0).numpy()

    def run_theirs():
        with torch.inference_mode():
            return torch_generate(torch, theirs, cfg, idx_theirs, new_tokens).numpy()

    sides = {"tinyattn": run_ours, "torch": run_theirs}
    results = {side: fn() for side, fn in sides.items()}               # warm up, and the tokens to compare
    agree = float(np.mean(results["tinyattn"][:, prompt:] == results["torch"][:, prompt:]))
    times = {side: [] for side in sides}
    for r in range(rounds):
        for side in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            start = time.perf_counter()
            sides[side]()
            times[side].append((time.perf_counter() - start) * 1000 / new_tokens)
    ms = {side: statistics.median(t) for side, t in times.items()}
    return {"config": name, "batch": batch, "prompt": prompt, "new_tokens": new_tokens, "rounds": rounds,
            "tinyattn_ms_per_token": round(ms["tinyattn"], 4), "torch_ms_per_token": round(ms["torch"], 4),
            "tinyattn_tokens_per_s": round(batch * 1000 / ms["tinyattn"], 1),
            "torch_tokens_per_s": round(batch * 1000 / ms["torch"], 1),
            "speed_vs_torch": round(ms["torch"] / ms["tinyattn"], 3), "tokens_agree": agree}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", default=["baby", "default"], choices=sorted(CONFIGS),
                   help="models of bench_step.py (default: baby default)")
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8], help="batch sizes (default: 1 8)")
    p.add_argument("--prompt", type=int, default=4, help="prompt tokens; decoding runs up to the block size (default 4)")
    p.add_argument("--rounds", type=int, default=15, help="generate calls per side (default 15)")
    args = p.parse_args(argv)
    torch = import_torch("bench_decode")
    tune_host_allocator()                                              # as the training program does
    print(json.dumps({"cpu": cpu_info(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                      "tinyattn_threads": ta.get_num_threads()}), flush=True)
    for name in args.configs:
        cfg = CONFIGS[name]
        if not 0 < args.prompt < cfg["block_size"]:
            sys.exit(f"bench_decode: --prompt must be between 1 and {cfg['block_size'] - 1} for {name}")
        for batch in args.batches:
            print(json.dumps(measure(torch, name, cfg, batch, args.prompt, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
