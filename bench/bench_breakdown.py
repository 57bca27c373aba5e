"""Benchmark: where a compiled GPT training step's time goes on the CPU, tinyattn against PyTorch eager.

    python3 bench/bench_breakdown.py                                  # the mid config, both sides
    python3 bench/bench_breakdown.py --config baby --sides tinyattn   # one side
    TINYATTN_BLOCK_SCHEDULE=whole python3 bench/bench_breakdown.py    # the fused block's other schedules

The step is bench_step.py's (the same model, batches and AdamW; forward,
backward, clip_grad_norm_(1.0), AdamW, zero_grad), compiled on tinyattn's
side, eager on PyTorch's with torch.set_num_threads set to tinyattn's thread
count. Each side runs in a fresh process of its own (PyTorch's threads slow
numpy down once PyTorch has run). A side first times --steps steps as they
are, then the same number with its timers on; the categories come from the
second run, in ms per step:

    products       the blocks' four linear layers (BLAS)
    elementwise    the blocks' layer norms, GELU, biases and residual adds
    attention      the blocks' causal attention: scores, softmax, weighted sum
                   (their own small products included) and their backward
    waiting        tinyattn: the calling thread waiting for the pool's parts
                   inside the blocks; torch waits inside its ops
    block, other   tinyattn: the rest of the block kernels' time (arrays made,
                   Python between the stages)
    optimizer      clip_grad_norm_, AdamW's step, zero_grad
    outside        the embeddings, the final layer norm, the lm head and the
                   loss; on tinyattn's side also the autograd engine and
                   Python, which torch's side counts apart (engine, Python)

tinyattn's numbers are its calling thread's (they add up to the step), from
light timers in the fused block and the thread pool (tinyattn/fast: off
unless this program sets them); the pool's threads' time is reported apart,
per thread: its work by category and its time idle on the pool's queue (in
the block's whole schedule, BLAS's own threads share each product with the
calling thread, unseen by these timers, while the pool's threads idle).
Torch's are its profiler's (torch.profiler) self CPU time per op, grouped by
name (mm, addmm, bmm: products, except the lm head's, which has the
vocabulary's size in its shapes; scaled_dot_product_attention and softmax:
attention; embedding, cross_entropy and log_softmax: outside; ops under
clip, AdamW and zero_grad: optimizer; every other op: elementwise), with the
time outside any op as engine, Python. Profiling costs both sides time: both
step times are given, with and without it. Prints a table, then one JSON line.
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

import tinyattn as ta
from bench_step import CONFIGS, GRAD_CLIP, TinyattnSide, TorchSide, batches, cpu_info, import_torch
from tinyattn.fast import threads, tune_host_allocator

CATEGORIES = ["products", "elementwise", "attention", "waiting", "block, other", "optimizer", "outside",
              "engine, Python"]
POOL = ["products", "elementwise", "attention", "other work", "idle"]


def wall_ms(step, steps):
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) * 1e3 / steps


def timed(fn, add):
    """fn, with the seconds each call takes handed to add(seconds)."""
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            add(time.perf_counter() - start)
    return wrapper


# ---------------------------------------------------------------- tinyattn
def tinyattn_breakdown(cfg, steps, warmup, n_threads):
    import train.loop
    try:
        from tinyattn.fast.cpu_block import schedule
    except ImportError:                            # no numba: no fused block
        schedule = None

    x, y = batches(cfg)
    side = TinyattnSide(cfg, "cpu", x, y, compiled=True, threads=n_threads)
    for _ in range(warmup):
        side.step()
    time.sleep(0.3)
    plain = wall_ms(side.step, steps)

    me = threading.current_thread().name
    clock = threads.Timers()
    kernels = side.backend.kernels
    saved = {name: kernels[name] for name in ("block", "block_backward")}
    saved_clip, optimizer = train.loop.clip_grad_norm_, side.optimizer
    own = {m: vars(optimizer)[m] for m in ("step", "zero_grad") if m in vars(optimizer)}   # (else the class's)

    def block_timed(fn):                          # a block kernel's wall time, and the waits inside it
        def wrapper(*args):
            waited = clock.seconds.get((me, "waiting"), 0.0)
            start = time.perf_counter()
            out = fn(*args)
            clock.add("block", time.perf_counter() - start)
            clock.add("block waiting", clock.seconds.get((me, "waiting"), 0.0) - waited)
            return out
        return wrapper

    add_optimizer = lambda s: clock.add("optimizer", s)                     # noqa: E731
    try:
        for name, fn in saved.items():
            kernels[name] = block_timed(fn)
        train.loop.clip_grad_norm_ = timed(saved_clip, add_optimizer)
        optimizer.step, optimizer.zero_grad = (timed(getattr(optimizer, m), add_optimizer)
                                               for m in ("step", "zero_grad"))
        time.sleep(0.3)
        threads.timers = clock
        profiled = wall_ms(side.step, steps)
    finally:
        threads.timers = None
        kernels.update(saved)
        train.loop.clip_grad_norm_ = saved_clip
        for m in ("step", "zero_grad"):                                    # the methods as they were
            if m in own:
                setattr(optimizer, m, own[m])
            else:
                vars(optimizer).pop(m, None)

    mine = {c: s * 1e3 / steps for (who, c), s in clock.seconds.items() if who == me}
    laps = {c: mine.get(c, 0.0) for c in ("products", "elementwise", "attention")}
    block, optimizer_ms = mine.get("block", 0.0), mine.get("optimizer", 0.0)
    categories = {**laps, "waiting": mine.get("block waiting", 0.0),
                  "block, other": block - sum(laps.values()) - mine.get("block waiting", 0.0),
                  "optimizer": optimizer_ms, "outside": profiled - block - optimizer_ms, "engine, Python": None}
    pool_names = sorted({who for who, _ in clock.seconds} - {me})
    pool = {}
    for c in POOL:                                                           # per pool thread, on average
        def per_thread(who):
            got = {k: s * 1e3 / steps for (w, k), s in clock.seconds.items() if w == who}
            if c == "other work":
                return got.get("work", 0.0) - sum(got.get(k, 0.0) for k in ("products", "elementwise", "attention"))
            return got.get(c, 0.0)
        pool[c] = sum(per_thread(who) for who in pool_names) / len(pool_names) if pool_names else None
    B, T, C = cfg["batch_size"], cfg["block_size"], cfg["n_embd"]
    return {"ms_per_step": plain, "ms_per_step_profiled": profiled, "categories": categories,
            "pool_threads": len(pool_names), "pool_ms_per_thread": pool,
            "threads": n_threads, "block_schedule": schedule and schedule((B, T, C), n_threads),
            "blocks_fused": block > 0}


# ---------------------------------------------------------------- torch
def torch_category(event, vocab_size):
    """The category of one profiled op, by its name (and the lm head's product by its shapes)."""
    name = event.name.removeprefix("aten::")
    parent = event
    while parent is not None:
        if parent.name == "optimizer":
            return "optimizer"
        parent = parent.cpu_parent
    if not event.name.startswith("aten::"):
        return "engine, Python"                   # the engine's and the profiler's own frames
    if name in ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot"):
        shapes = [d for s in (event.input_shapes or []) if isinstance(s, (list, tuple)) for d in s]
        return "outside" if vocab_size in shapes else "products"
    if "log_softmax" in name or "embedding" in name or "cross_entropy" in name or "nll_loss" in name:
        return "outside"
    if "scaled_dot_product" in name or "attention" in name or "softmax" in name:
        return "attention"
    return "elementwise"


def torch_breakdown(cfg, steps, warmup, n_threads):
    torch = import_torch("bench_breakdown")
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(n_threads)
    x, y = batches(cfg)
    side = TorchSide(torch, cfg, "cpu", x, y)
    model, optimizer = side.model, side.optimizer

    def step():
        side.i += 1
        k = side.i % len(side.x)
        _, loss = model(side.x[k], side.y[k])
        loss.backward()
        with record_function("optimizer"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    time.sleep(0.3)
    plain = wall_ms(step, steps)
    time.sleep(0.3)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        profiled = wall_ms(step, steps)
    categories = dict.fromkeys(CATEGORIES, 0.0)
    for event in prof.events():
        categories[torch_category(event, cfg["vocab_size"])] += event.self_cpu_time_total / 1e3 / steps
    categories["engine, Python"] += profiled - sum(categories.values())   # the time outside every op
    categories["waiting"] = categories["block, other"] = None
    return {"ms_per_step": plain, "ms_per_step_profiled": profiled, "categories": categories,
            "threads": torch.get_num_threads(), "torch": torch.__version__}


# ---------------------------------------------------------------- the report
def table(report):
    sides = list(report["sides"])
    cell = lambda v: "-" if v is None else f"{v:.1f}"                       # noqa: E731
    lines = [f"{'ms per step':<44}" + "".join(f"{s:>12}" for s in sides)]
    rows = [(c, [report["sides"][s]["categories"].get(c) for s in sides]) for c in CATEGORIES]
    rows += [("step, profiled", [report["sides"][s]["ms_per_step_profiled"] for s in sides]),
             ("step, not profiled", [report["sides"][s]["ms_per_step"] for s in sides])]
    pool = report["sides"].get("tinyattn", {}).get("pool_ms_per_thread")
    rows += [(f"pool thread: {c}", [(pool or {}).get(c) if s == "tinyattn" else None for s in sides]) for c in POOL]
    for label, values in rows:
        lines.append(f"{label:<44}" + "".join(f"{cell(v):>12}" for v in values))
    if "tinyattn" in report["sides"] and not report["sides"]["tinyattn"]["blocks_fused"]:
        lines.append("note: tinyattn's blocks ran op by op here (dropout, or a batch that does not share "
                     "evenly over the threads), so their time is in outside")
    return "\n".join(lines)


def run_side(side, args):
    n_threads = args.threads or ta.get_num_threads()
    cfg = dict(CONFIGS[args.config])
    if side == "tinyattn":
        return tinyattn_breakdown(cfg, args.steps, args.warmup, n_threads)
    return torch_breakdown(cfg, args.steps, args.warmup, n_threads)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="mid", choices=sorted(CONFIGS), help="bench_step.py's config (default mid)")
    p.add_argument("--steps", type=int, default=10, help="steps timed, then as many profiled (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--sides", nargs="+", default=["tinyattn", "torch"], choices=["tinyattn", "torch"],
                   help="which frameworks, each in a fresh process when more than one (default both)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for both sides (default: tinyattn's, TINYATTN_NUM_THREADS or the cores)")
    p.add_argument("--out", help="write the JSON report here too")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or (args.threads is not None and args.threads < 1):
        p.error("--steps and --threads must be at least 1, --warmup at least 0")
    tune_host_allocator()                          # as the training program does
    sides = list(dict.fromkeys(args.sides))
    report = {"config": CONFIGS[args.config], "config_name": args.config, "steps": args.steps, "sides": {}}
    for side in sides:
        if len(sides) == 1:
            report["sides"][side] = run_side(side, args)
            continue
        n_threads = args.threads or ta.get_num_threads()
        command = [sys.executable, os.path.abspath(__file__), "--config", args.config, "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--sides", side, "--threads", str(n_threads)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"bench_breakdown: the {side} side failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}",
                  file=sys.stderr)
            return 1
        report["sides"][side] = json.loads(done.stdout.strip().splitlines()[-1])["sides"][side]
    report["cpu"] = cpu_info()
    print(table(report))
    line = json.dumps(report)
    print(line)
    if args.out:
        with open(args.out, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
