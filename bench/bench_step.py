"""Benchmark: one GPT training step, tinyattn (CuPy) against PyTorch eager, side by side.

    python3 bench/bench_step.py --out bench.json                  # nanoGPT's GPU Shakespeare config on "cuda"
    python3 bench/bench_step.py --device cpu --config baby        # nanoGPT's CPU "baby" config on the CPU
    python3 bench/bench_step.py --device cpu --config mid         # the GPU config's model, batch 4, on the CPU
    python3 bench/bench_step.py --device cpu --config default     # the model that python -m train trains
    python3 bench/bench_step.py --device cpu --config lesson      # the lesson's first default model
    python3 bench/bench_step.py --device cpu --config tiny        # a smoke test
    python3 bench/bench_step.py --device cpu --config baby --block modern   # every modern choice, both sides

The config is nanoGPT's shakespeare_char: 6 layers, 6 heads, 384 channels,
block 256, batch 64, dropout 0.2, vocabulary 65. One step is forward,
backward, clip_grad_norm_(1.0), AdamW, zero_grad, on the same batch for every side:

    tinyattn           train.loop.train_step on ta.compile(GPT(...)), the compiled model's optimizer
                       (AdamW's flat step): the fast layer (tinyattn/fast) and its fused kernels
                       (CuPy's on "cuda"; on "cpu" numba's, with the fast extra)
    tinyattn_unfused   the same GPT not compiled: every op runs its teaching formula (what the
                       fast layer saves; skip it with --no_unfused)
    tinyattn_1thread   with --one_thread: ta.set_num_threads(1), so BLAS splits the products with its
                       own threads and every other pass runs on one core (what tinyattn's threads buy)
    torch              the same architecture in plain PyTorch (below): eager, no torch.compile

Everything is float32 with plain float32 matmuls (no TF32, no autocast).
Timing: --warmup steps per side, then --blocks blocks of --steps steps per
side, the order of the sides rotating from block to block; the device is
synchronised before and after each block, and a block's time over its steps
is one sample. Reported: the median ms/step, tokens/s, the ratio to torch,
and the memory each framework's pool holds. Results go to --out as JSON.
Without torch (as on the CPU test machine) only the tinyattn sides run, and
the JSON says so.
"""
import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

import numpy as np

import tinyattn as ta
from tinyattn.fast import tune_host_allocator
from tinyattn.backend import get_backend
from tinyattn.models import GPT, GPTConfig
from train.loop import train_step

SHAKESPEARE_GPU = dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64, dropout=0.2, vocab_size=65)
BABY_CPU = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, dropout=0.0, vocab_size=65)
MID_CPU = dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=4, dropout=0.0, vocab_size=65)
LESSON = dict(n_layer=2, n_head=1, n_embd=48, block_size=32, batch_size=64, dropout=0.0, vocab_size=55)   # the first default
DEFAULT = dict(n_layer=2, n_head=4, n_embd=64, block_size=20, batch_size=64, dropout=0.0, vocab_size=56)   # python -m train
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=4, dropout=0.2, vocab_size=65)
CONFIGS = {"gpu": SHAKESPEARE_GPU, "baby": BABY_CPU, "mid": MID_CPU, "lesson": LESSON, "default": DEFAULT, "tiny": TINY}
N_BATCHES = 256     # distinct random batches: see batches()
LR, BETAS, WEIGHT_DECAY, GRAD_CLIP = 1e-3, (0.9, 0.99), 0.1, 1.0


# ---------------------------------------------------------------- the PyTorch model
MODERN = dict(pos="rope", norm="rmsnorm", mlp="swiglu", qk_norm=True, bias=False, tie_embeddings=False)
# --block modern: every choice of the modern block at once, with n_kv_head = n_head / 2 (GQA)


def make_torch_gpt(torch, cfg):
    """nanoGPT's architecture in plain torch, with tinyattn's parameter names (so weights copy over);
    with cfg's modern choices (--block modern) those of tinyattn's GPTConfig, written as Llama's are."""
    nn, F = torch.nn, torch.nn.functional
    C, H = cfg["n_embd"], cfg["n_head"]
    Hkv, D, bias = cfg.get("n_kv_head", H), C // H, cfg.get("bias", True)
    modern = cfg.get("pos") == "rope"
    hidden = 8 * C // 3 if modern else 4 * C

    def norm(n):
        return nn.RMSNorm(n, eps=1e-5) if modern else nn.LayerNorm(n)

    def rotate(x):                                                 # (B, H, T, D): RoPE, pairs (i, i + D/2)
        T = x.shape[2]
        theta = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64, device=x.device) / D)
        angles = torch.arange(T, dtype=torch.float64, device=x.device)[:, None] * theta   # (T, D/2)
        cos, sin = (torch.cat([f(angles)] * 2, -1).to(x.dtype) for f in (torch.cos, torch.sin))
        return x * cos + torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1) * sin

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(C, C + 2 * Hkv * D, bias=bias)  # q, k, v in one matmul
            self.c_proj = nn.Linear(C, C, bias=bias)
            if cfg.get("qk_norm"):
                self.q_norm, self.k_norm = nn.RMSNorm(D, eps=1e-5), nn.RMSNorm(D, eps=1e-5)
            self.resid_dropout = nn.Dropout(cfg["dropout"])

        def forward(self, x):                                      # (B, T, C)
            B, T, _ = x.shape
            q, k, v = self.c_attn(x).view(B, T, H + 2 * Hkv, D).transpose(1, 2).split([H, Hkv, Hkv], dim=1)
            if cfg.get("qk_norm"):
                q, k = self.q_norm(q), self.k_norm(k)
            if modern:
                q, k = rotate(q), rotate(k)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hkv != H,
                                               dropout_p=cfg["dropout"] if self.training else 0.0)
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            return self.resid_dropout(self.c_proj(y))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            if modern:
                self.c_gate = nn.Linear(C, hidden, bias=bias)
            else:
                self.gelu = nn.GELU(approximate="tanh")
            self.c_fc = nn.Linear(C, hidden, bias=bias)
            self.c_proj = nn.Linear(hidden, C, bias=bias)
            self.dropout = nn.Dropout(cfg["dropout"])

        def forward(self, x):
            h = F.silu(self.c_gate(x)) * self.c_fc(x) if modern else self.gelu(self.c_fc(x))
            return self.dropout(self.c_proj(h))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn = norm(C), Attention()
            self.ln_2, self.mlp = norm(C), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class TorchGPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(cfg["vocab_size"], C)
            if not modern:
                self.wpe = nn.Embedding(cfg["block_size"], C)
            self.drop = nn.Dropout(cfg["dropout"])
            self.h = nn.ModuleList([Block() for _ in range(cfg["n_layer"])])
            self.ln_f = norm(C)
            self.lm_head = nn.Linear(C, cfg["vocab_size"], bias=False)
            if cfg.get("tie_embeddings", True):
                self.lm_head.weight = self.wte.weight              # tied, as in tinyattn's GPT

        def forward(self, idx, targets):                           # (B, T) ints
            B, T = idx.shape
            x = self.wte(idx)
            if not modern:
                x = x + self.wpe(torch.arange(T, device=idx.device))
            x = self.drop(x)
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))                    # (B, T, V)
            return logits, F.cross_entropy(logits.view(B * T, -1), targets.view(B * T), ignore_index=-1)

    return TorchGPT()


# ---------------------------------------------------------------- the sides
class TinyattnSide:
    def __init__(self, cfg, device, x, y, compiled=True, threads=None):
        self.backend = get_backend(device)
        self.threads = ta.get_num_threads() if threads is None else threads
        ta.manual_seed(0)
        config = GPTConfig(**{k: cfg[k] for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "dropout",
                                                  *MODERN, "n_kv_head") if k in cfg})
        model = GPT(config).to(device)
        self.model = ta.compile(model) if compiled else model       # not compiled: op by op, the formulas
        self.optimizer = self.model.configure_optimizer(WEIGHT_DECAY, LR, BETAS)
        self.batches = [(ta.tensor(xb, device=device), ta.tensor(yb, device=device)) for xb, yb in zip(x, y)]
        self.batch, self.i = self.batches[:1], 0

    def step(self):
        ta.set_num_threads(self.threads)
        self.i += 1
        return train_step(self.model, self.optimizer, [self.batches[self.i % len(self.batches)]], GRAD_CLIP)

    def sync(self):
        self.backend.synchronize()

    def memory(self):
        if not hasattr(self.backend.xp, "get_default_memory_pool"):     # only CuPy keeps a pool
            return None
        pool = self.backend.xp.get_default_memory_pool()
        return {"pool_used_bytes": int(pool.used_bytes()), "pool_total_bytes": int(pool.total_bytes()),
                "note": "CuPy's default memory pool: used = live arrays now; total = held by the pool "
                        "(it keeps freed blocks, so about the peak)"}


def torch_adamw(torch, model, lr, betas, weight_decay, fused=False):
    """torch's AdamW grouped as tinyattn's GPT.configure_optimizer does: decay matrices only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=betas, fused=fused)


class TorchSide:
    def __init__(self, torch, cfg, device, x, y):
        self.torch, self.cuda = torch, device.startswith("cuda")
        torch.manual_seed(0)
        self.model = make_torch_gpt(torch, cfg).to(device)
        self.optimizer = torch_adamw(torch, self.model, LR, BETAS, WEIGHT_DECAY, fused=self.cuda)
        self.x, self.y = (torch.from_numpy(a).to(device) for a in (x, y))     # (K, B, T) each
        self.i = 0

    def step(self):
        self.i += 1
        k = self.i % len(self.x)
        _, loss = self.model(self.x[k], self.y[k])
        loss.backward()
        self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def memory(self):
        if not self.cuda:
            return None
        cuda = self.torch.cuda
        return {"max_allocated_bytes": int(cuda.max_memory_allocated()), "reserved_bytes": int(cuda.memory_reserved()),
                "note": "PyTorch's caching allocator: peak of live tensors, and held in all"}


def same_architecture_check(torch, tiny_side, torch_side, x, y):
    """Copy tinyattn's weights into the torch model; eval-mode losses on one batch must agree."""
    named = dict(tiny_side.model.named_parameters())
    with torch.no_grad():
        for name, p in torch_side.model.named_parameters():
            p.copy_(torch.from_numpy(named[name].numpy()))
    tiny_side.model.eval()
    torch_side.model.eval()
    with ta.no_grad():
        _, loss_ta = tiny_side.model(*tiny_side.batch[0])
    with torch.no_grad():
        _, loss_torch = torch_side.model(torch_side.x[0], torch_side.y[0])
    tiny_side.model.train()
    torch_side.model.train()
    a, b = loss_ta.item(), loss_torch.item()
    return {"loss_tinyattn": a, "loss_torch": b, "rel_diff": abs(a - b) / abs(b),
            "parameters_tinyattn": sum(p.numel() for p in tiny_side.model.parameters()),
            "parameters_torch": sum(p.numel() for p in torch_side.model.parameters())}


# ---------------------------------------------------------------- timing
def time_block(side, steps, settle_s=0.5):
    """ms per step over one block of steps, with the device synchronised at both ends.

    One untimed step and a short pause come first: on a CPU the other framework's idle
    worker threads keep spinning for a while after its last call and slow this one.
    """
    side.step()
    side.sync()
    time.sleep(settle_s)
    t0 = time.perf_counter()
    for _ in range(steps):
        side.step()
    side.sync()
    return (time.perf_counter() - t0) * 1000.0 / steps


def step_breakdown(side, steps):
    """Where one tinyattn step's time goes: ms per step in each op (forward, backward), from
    ta.profile over ``steps`` steps, and the rest (engine, clipping, AdamW, zero_grad)."""
    side.step()
    side.sync()
    time.sleep(0.5)
    with ta.profile() as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            side.step()
        side.sync()
        wall = time.perf_counter() - t0
    ops = {name: {"forward_ms": round(1e3 * r["forward_s"] / steps, 2), "backward_ms": round(1e3 * r["backward_s"] / steps, 2),
                  "calls": r["calls"] // steps} for name, r in prof.key_averages().items()}
    in_ops = sum(r["forward_ms"] + r["backward_ms"] for r in ops.values())
    return {"steps": steps, "ms_per_step_profiled": round(1e3 * wall / steps, 2), "ops_ms": round(in_ops, 2),
            "outside_ops_ms": round(1e3 * wall / steps - in_ops, 2), "ops": ops,
            "note": "an op's backward includes the ops its formula runs; outside ops: the engine's walk, "
                    "clip_grad_norm_, AdamW, zero_grad, Python; the profiler's own cost is in every number"}


def block_schedule(cfg, device):
    """The fused CPU block's schedule for this config (tinyattn/fast/cpu_block.py), or None (on a GPU,
    or without numba)."""
    try:
        from tinyattn.fast.cpu_block import schedule
    except ImportError:
        return None
    shape = (cfg["batch_size"], cfg["block_size"], cfg["n_embd"])
    return schedule(shape, ta.get_num_threads()) if device == "cpu" else None


def import_torch(program):
    """PyTorch, or exit with one line saying how to install it (a CPU build)."""
    try:
        import torch
    except ImportError:
        sys.exit(f"{program}: needs PyTorch in this Python (pip install torch==2.13.0 "
                 "--index-url https://download.pytorch.org/whl/cpu)")
    return torch


SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile",
              "asimd", "sve")


def cpu_info():
    """The CPU a result ran on: its model, the vector instruction sets it has (of SIMD_FLAGS),
    the cores this process may use, and the BLAS numpy calls."""
    info = {"machine": platform.machine(), "model": platform.processor() or None, "simd": None,
            "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:                                                  # not Linux: what platform knows
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Model", "CPU part") and info["model"] in (None, platform.machine()):
            info["model"] = value.strip()
        elif key in ("flags", "Features") and info["simd"] is None:
            have = set(value.split())
            info["simd"] = [f for f in SIMD_FLAGS if f in have]
    try:
        from threadpoolctl import threadpool_info
        info["blas"] = [f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')})"
                        for i in threadpool_info() if i.get("user_api") == "blas"]
    except ImportError:
        info["blas"] = "unknown (no threadpoolctl)"
    return info


def versions(torch):
    v = {"python": platform.python_version(), "numpy": np.__version__, "tinyattn": ta.__version__}
    try:
        import cupy
        v["cupy"] = cupy.__version__
        rt = cupy.cuda.runtime
        v["cuda_runtime"] = rt.runtimeGetVersion()
        v["cuda_driver"] = rt.driverGetVersion()
        name = rt.getDeviceProperties(0)["name"]
        v["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
    except Exception as e:  # no CuPy or no GPU: say why
        v["cupy"] = f"unavailable ({type(e).__name__})"
    if torch is not None:
        v["torch"] = torch.__version__
        v["torch_cuda"] = torch.version.cuda
        v["torch_tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    v["CUPY_TF32"] = os.environ.get("CUPY_TF32", "unset (TF32 off)")
    return v


def batches(cfg):
    """A pool of N_BATCHES distinct random batches, (K, B, T) inputs and targets (int64), the same for
    every side and every run: no batch comes twice while timing (one batch over and over would let
    the model overfit it, which is not what a training step sees)."""
    seq = np.random.default_rng(0).integers(0, cfg["vocab_size"], (N_BATCHES, cfg["batch_size"], cfg["block_size"] + 1))
    return np.ascontiguousarray(seq[..., :-1]), np.ascontiguousarray(seq[..., 1:])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--config", default="gpu", choices=sorted(CONFIGS),
                   help="gpu: nanoGPT's GPU Shakespeare config; baby: its CPU config; mid: the GPU config's "
                        "model at batch 4; lesson: the model of python -m train; tiny: a smoke test")
    p.add_argument("--block", default="gpt2", choices=["gpt2", "modern"],
                   help="gpt2: GPT-2's block (the default); modern: rotary positions, RMSNorm, SwiGLU, QK-norm, "
                        "n_kv_head = n_head / 2, no biases, untied embeddings, on both sides")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per side first")
    p.add_argument("--blocks", type=int, default=6, help="timed blocks per side")
    p.add_argument("--steps", type=int, default=10, help="steps per block")
    p.add_argument("--budget_s", type=float, default=90.0, help="no new block starts after this many seconds")
    p.add_argument("--no_unfused", action="store_true", help="skip the tinyattn side not compiled (its formulas)")
    p.add_argument("--one_thread", action="store_true",
                   help="also time tinyattn with ta.set_num_threads(1): numpy's BLAS threads instead of "
                        "tinyattn's own (what tinyattn's threads buy)")
    p.add_argument("--sides", default="all", choices=["all", "tinyattn", "torch"],
                   help="all: every side in this process; tinyattn or torch: one side alone, without importing "
                        "the other framework (on a CPU, torch's threads slow numpy down once torch has run)")
    p.add_argument("--profile_steps", type=int, default=0,
                   help="after the timing, profile this many tinyattn steps (ta.profile): where a step's time goes")
    p.add_argument("--out", help="write the results here as JSON (they are printed too)")
    args = p.parse_args(argv)
    start = time.perf_counter()
    allocator_note = tune_host_allocator()         # as the training program does

    cfg = dict(CONFIGS[args.config])
    if args.block == "modern":
        cfg.update(MODERN, n_kv_head=max(1, cfg["n_head"] // 2))
    x, y = batches(cfg)                            # (K, B, T) each, int64
    torch, torch_note = None, None
    try:
        if args.sides == "tinyattn":
            raise ImportError
        import torch
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            torch, torch_note = None, "torch is installed but sees no CUDA device"
    except ImportError:
        torch_note = ("--sides tinyattn: torch was not imported" if args.sides == "tinyattn"
                      else "torch is not installed: only the tinyattn side ran")
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = False             # plain float32, as CuPy's default
        torch.backends.cudnn.allow_tf32 = False

    sides = {"tinyattn": TinyattnSide(cfg, args.device, x, y, compiled=True)} if args.sides != "torch" else {}
    if not args.no_unfused and args.sides != "torch":
        sides["tinyattn_unfused"] = TinyattnSide(cfg, args.device, x, y, compiled=False)
    if args.one_thread and args.sides != "torch":
        sides["tinyattn_1thread"] = TinyattnSide(cfg, args.device, x, y, compiled=True, threads=1)
    if torch is not None:
        sides["torch"] = TorchSide(torch, cfg, args.device, x, y)

    if not sides:
        print(f"bench_step: error: --sides torch needs torch ({torch_note})", file=sys.stderr)
        return 1
    check = (same_architecture_check(torch, sides["tinyattn"], sides["torch"], x, y)
             if "torch" in sides and "tinyattn" in sides else None)
    for side in sides.values():
        for _ in range(args.warmup):
            side.step()
        side.sync()
    names = list(sides)
    samples = {name: [] for name in names}
    for block in range(args.blocks):
        if block and time.perf_counter() - start > args.budget_s:
            break
        order = names[block % len(names):] + names[:block % len(names)]   # rotate who goes first
        for name in order:
            time.sleep(0.1)                                        # let BLAS threads settle (CPU)
            samples[name].append(time_block(sides[name], args.steps))
    breakdown = (step_breakdown(sides["tinyattn"], args.profile_steps)
                 if args.profile_steps and "tinyattn" in sides else None)
    loss = sides[names[0]].step()
    final_loss = loss.item()                                       # one read, after the timing

    tokens = cfg["batch_size"] * cfg["block_size"]
    results = {}
    for name in names:
        ms = statistics.median(samples[name])
        results[name] = {"ms_per_step_median": round(ms, 3), "tokens_per_s": round(tokens / ms * 1000.0, 1),
                         "ms_per_step_blocks": [round(s, 3) for s in samples[name]],
                         "memory": sides[name].memory()}
    if "torch" in results:
        for name in names:
            if name != "torch":
                results[name]["ratio_to_torch"] = round(
                    results[name]["ms_per_step_median"] / results["torch"]["ms_per_step_median"], 3)
    report = {"config": cfg, "device": args.device, "tokens_per_step": tokens, "dtype": "float32",
              "step": "forward, backward, clip_grad_norm_(1.0), AdamW (wd 0.1, betas 0.9/0.99), zero_grad",
              "timing": {"warmup": args.warmup, "blocks": len(samples[names[0]]), "steps_per_block": args.steps,
                         "method": "device synchronised around each block; median over blocks; side order rotates"},
              "results": results, "same_architecture_check": check, "step_breakdown": breakdown,
              "torch": "ran" if "torch" in sides else torch_note, "host_allocator": allocator_note,
              "cpu_block_schedule": block_schedule(cfg, args.device),
              "tinyattn_loss_after": final_loss if math.isfinite(final_loss) else str(final_loss),
              "versions": versions(torch), "cpu": cpu_info(), "wall_s": round(time.perf_counter() - start, 2)}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
