"""Benchmark: attention's time and memory as the sequence grows, naive against tiled against PyTorch.

    python bench/bench_attention.py --sizes 1024 4096 16384 --plot attention_cost.png
    python bench/bench_attention.py --torch_python PATH/TO/venv/bin/python ...   # PyTorch from another venv
    python bench/bench_attention.py --sizes 4096 --impls tiled torch --side_by_side  # time ratio, one process

Causal forward + backward on (B, H, T, D) inputs (default B=1, H=8, D=64,
float32). Each implementation at each T runs in its own fresh process, so
that one's memory and spinning BLAS threads cannot touch another's:

    naive   F.scaled_dot_product_attention(..., impl="naive"): builds the (T, T) scores and weights
    tiled   F.scaled_dot_product_attention(..., impl="tiled"): 256 x 256 tiles, never (T, T)
    auto    F.scaled_dot_product_attention(...) with default arguments: it picks one of the two
    torch   torch.nn.functional.scaled_dot_product_attention, when PyTorch is installed
            (in this Python, or in the one given by --torch_python)

tinyattn's three run compiled: the forward is a function wrapped by ta.compile, so
its ops are the fast layer's (compiled kernels, threads), and so is the backward of
the ops it made, though out.backward() runs outside the call. Not compiled, the same
call runs the teaching formulas (the fast layer runs only where ta.compile asks for
it). Each record's fast_ops says whether the fast ops did run (false where the
library's teaching code was edited: they step aside, saying so on stderr).

Prints one JSON object per line:
    {"kind": "config", ...}
    {"kind": "point", "impl": "tiled", "n": 4096, "ms_median": ..., "ms_runs": [...],
     "cpu_ms_median": ..., "peak_growth_mib": ..., ...}
    {"kind": "skip", "impl": "naive", "n": 16384, "reason": ...}
    {"kind": "check", "n": 1024, "rel_err": {"out": ..., "dq": ...}}   tinyattn against PyTorch

ms: wall time of one forward + backward, the median of --repeats runs after
--warmup runs (cpu_ms: the process's CPU time, which moves less when other
programs share the machine). peak_growth_mib: the process's peak resident
memory during the first forward + backward at N, minus what it held just before
(inputs made, libraries imported), the same measure for both frameworks. Before
it, each process makes one call at a small N (--warm_n, or N if smaller), so
that what a library sets up once (numba loading tinyattn's compiled kernels,
about 100 MiB; PyTorch's own first-call work) is not counted as growth with N;
that call's growth is reported as first_call_growth_mib. returned_mib: what
any implementation must hand back, the output and the three gradients (a floor
for peak_growth_mib).

--side_by_side times instead, for each N, each tinyattn implementation against
PyTorch in one process (PyTorch's Python, which then needs tinyattn's own
packages too: numba and threadpoolctl), a run of each side in turn, --repeats
times, the side that goes first alternating, so that a machine whose speed
drifts moves both alike (no memory measure there). One line per implementation and N:
    {"kind": "side_by_side", "impl": "tiled", "n": 4096, "ms_median": ..., "torch_ms_median": ...,
     "time_over_torch": ..., "ms_runs": [...], "torch_ms_runs": [...], "fast_ops": true, "cpu_kernels": true, ...,
     "rel_err_vs_torch": {"out": ..., "dq": ..., "dk": ..., "dv": ...}}
time_over_torch is tinyattn's median time over PyTorch's (1.0: as fast; 1.25: a quarter longer);
fast_ops, cpu_kernels and threadpoolctl say whether tinyattn ran its fast ops, with its compiled
kernels and with BLAS held at one thread (without any of them it is slower).
"""
import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

IMPLS = ("naive", "tiled", "auto", "torch")


def rss_mib():
    """Resident memory of this process now (MiB), from /proc; None where there is none."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except OSError:
        return None


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024      # KiB on Linux


def inputs(args, n):
    """Host q, k, v and the output cotangent u, (B, H, n, D) float arrays from a fixed seed."""
    import numpy as np
    rng = np.random.default_rng(args.seed)
    shape = (args.batch, args.heads, n, args.head_dim)
    return [rng.standard_normal(shape).astype(args.dtype) for _ in range(4)]


def tinyattn_step(args, impl):
    """A function (q, k, v, u) -> [out, dq, dk, dv] as arrays, and the tensors it uses; its
    forward compiled (ta.compile: the fast ops, whose backward runs fast too)."""
    import tinyattn as ta
    import tinyattn.nn.functional as F
    kwargs = {} if impl == "auto" else {"impl": impl}

    @ta.compile
    def forward(q, k, v):                                     # the ops made here are the fast layer's
        return F.scaled_dot_product_attention(q, k, v, is_causal=args.causal, **kwargs)

    def make(arrays):
        q, k, v = (ta.tensor(a, dtype=args.dtype, requires_grad=True) for a in arrays[:3])
        return q, k, v, ta.tensor(arrays[3], dtype=args.dtype)

    def step(q, k, v, u):
        for t in (q, k, v):
            t.grad = None
        out = forward(q, k, v)
        out.backward(u)                                       # (the fast ops' backward, outside the call)
        return [out.data] + [t.grad.data for t in (q, k, v)]
    return make, step


def torch_step(args):
    import torch

    def make(arrays):
        q, k, v = (torch.from_numpy(a).requires_grad_() for a in arrays[:3])
        return q, k, v, torch.from_numpy(arrays[3])

    def step(q, k, v, u):
        for t in (q, k, v):
            t.grad = None
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
        out.backward(u)
        return [out.detach().numpy()] + [t.grad.numpy() for t in (q, k, v)]
    return make, step


def without_threadpoolctl():
    """Run tinyattn as if threadpoolctl were not installed (--no_threadpoolctl)."""
    from tinyattn.fast import threads
    threads._blas = ()                                        # no BLAS controllers: nothing held, heads in order


def how_tinyattn_ran():
    """What decides tinyattn's speed here: the fast ops (compiled, and the library's code), its
    compiled kernels (numba), threadpoolctl, its threads."""
    import tinyattn as ta
    from tinyattn.backend import get_backend
    from tinyattn.fast import checked, threads
    return {"fast_ops": "the fast ops" in checked.allowed(), "cpu_kernels": bool(get_backend("cpu").kernels),
            "threadpoolctl": bool(threads.blas_controllers()), "tinyattn_threads": ta.get_num_threads()}


def worker(args):
    """Measure one implementation at one size, in this process; print one JSON line."""
    impl, n = args.worker, args.n
    if args.no_threadpoolctl and impl != "torch":
        without_threadpoolctl()
    make, step = torch_step(args) if impl == "torch" else tinyattn_step(args, impl)
    warm_n = min(n, args.warm_n)                              # a first, small call: the library's one-time cost
    before = rss_mib()
    step(*make(inputs(args, warm_n)))
    first_call_growth = peak_rss_mib() - before
    arrays = inputs(args, n)
    tensors = make(arrays)
    before = rss_mib()
    step(*tensors)                                            # the first run at n: memory
    growth = peak_rss_mib() - before
    for _ in range(args.warmup - 1):
        step(*tensors)
    time.sleep(args.settle)
    wall, cpu = [], []
    for _ in range(args.repeats):
        w, c = time.perf_counter(), time.process_time()
        step(*tensors)
        wall.append((time.perf_counter() - w) * 1e3)
        cpu.append((time.process_time() - c) * 1e3)
    record = {"kind": "point", "impl": impl, "n": n, "ms_median": round(statistics.median(wall), 2),
              "ms_runs": [round(t, 2) for t in wall], "cpu_ms_median": round(statistics.median(cpu), 2),
              "peak_growth_mib": round(growth, 1), "warm_n": warm_n,
              "returned_mib": round(sum(a.nbytes for a in arrays) / 2 ** 20, 1),   # out (as u), dq, dk, dv
              "first_call_growth_mib": round(first_call_growth, 1)}
    if impl == "torch":
        import torch
        record["torch"] = torch.__version__
        record["threads"] = torch.get_num_threads()
        if n <= args.check_max_n:                               # tinyattn's default call on the same inputs
            theirs = step(*tensors)
            mine = tinyattn_step(args, "auto")[1](*tinyattn_step(args, "auto")[0](arrays))
            record["rel_err_vs_tinyattn"] = rel_errs(mine, theirs)
    else:
        record.update(how_tinyattn_ran())
    print(json.dumps(record), flush=True)


def side_by_side(args):
    """Time each tinyattn implementation against PyTorch at one size in this process, a run of
    each side in turn (who goes first alternates); print one JSON line per implementation."""
    import torch
    n, impls = args.n, [i for i in args.impls if i != "torch"]
    if args.no_threadpoolctl:
        without_threadpoolctl()
    arrays = inputs(args, n)
    sides = {impl: tinyattn_step(args, impl) for impl in impls}
    sides["torch"] = torch_step(args)
    tensors = {impl: make(arrays) for impl, (make, _) in sides.items()}
    outputs = {impl: step(*tensors[impl]) for impl, (_, step) in sides.items()}   # (also a first, untimed run)
    wall = {impl: [] for impl in sides}
    order = list(sides)
    untimed = max(args.warmup, 1) - 1                         # (the run above was the first)
    for round_ in range(untimed + args.repeats):
        for impl in order if round_ % 2 == 0 else order[::-1]:
            time.sleep(args.settle)                           # the other side's idle threads stop spinning
            start = time.perf_counter()
            sides[impl][1](*tensors[impl])
            if round_ >= untimed:
                wall[impl].append((time.perf_counter() - start) * 1e3)
    theirs = statistics.median(wall["torch"])
    for impl in impls:
        mine = statistics.median(wall[impl])
        record = {"kind": "side_by_side", "impl": impl, "n": n, "ms_median": round(mine, 2),
                  "torch_ms_median": round(theirs, 2), "time_over_torch": round(mine / theirs, 3),
                  "ms_runs": [round(t, 2) for t in wall[impl]], "torch_ms_runs": [round(t, 2) for t in wall["torch"]],
                  "torch": torch.__version__, "torch_threads": torch.get_num_threads(), **how_tinyattn_ran()}
        if n <= args.check_max_n:
            record["rel_err_vs_torch"] = rel_errs(outputs[impl], outputs["torch"])
        print(json.dumps(record), flush=True)


def rel_errs(mine, theirs):
    """{"out": ..., "dq": ..., "dk": ..., "dv": ...}: rel_err of each of a step's four results."""
    return {name: rel_err(a, b) for name, a, b in zip(("out", "dq", "dk", "dv"), mine, theirs)}


def rel_err(a, b):
    """max |a - b| / max |b|."""
    import numpy as np
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def has_torch(python):
    return subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0


def run_point(args, python, impl, n, extra=()):
    """One worker process: its JSON records (one per line), or [a skip record saying why it gave none]."""
    cmd = this_script(python) + ["--worker", impl, "--n", str(n)] + shared_flags(args) + list(extra)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return [{"kind": "skip", "impl": impl, "n": n, "reason": f"over {args.timeout} s"}]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return [{"kind": "skip", "impl": impl, "n": n, "reason": f"exit {done.returncode}: {last}"}]
    return [json.loads(line) for line in lines]


def naive_skip(args, impl, n):
    """The skip record of the naive path above --naive_max_n (its (N, N) scores), else None."""
    if impl == "naive" and n > args.naive_max_n:
        return {"kind": "skip", "impl": impl, "n": n, "reason": f"N > --naive_max_n {args.naive_max_n}"}
    return None


def this_script(python):
    """The command that runs this file again: as a module (python -m ...) or as a script."""
    if __spec__ is not None and __spec__.name:
        return [python, "-m", __spec__.name]
    return [python, os.path.abspath(__file__)]


def shared_flags(args):
    return ["--batch", str(args.batch), "--heads", str(args.heads), "--head_dim", str(args.head_dim),
            "--dtype", args.dtype, "--repeats", str(args.repeats), "--warmup", str(args.warmup),
            "--settle", str(args.settle), "--warm_n", str(args.warm_n), "--seed", str(args.seed), "--check_max_n", str(args.check_max_n)] + \
        ([] if args.causal else ["--no_causal"]) + (["--no_threadpoolctl"] if args.no_threadpoolctl else [])


def plot(points, path, args):
    """Time and memory against N, log-log, one line per implementation, with an N^2 guide."""
    time_key = "cpu_ms_median" if args.plot_cpu_time else "ms_median"
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for impl in IMPLS:
        mine = sorted((p["n"], p[time_key], p["peak_growth_mib"]) for p in points if p["impl"] == impl)
        if not mine:
            continue
        ns, ms, mib = zip(*mine)
        label = {"torch": "PyTorch SDPA", "auto": "tinyattn default (auto)"}.get(impl, f"tinyattn {impl}")
        style = "s--" if impl == "auto" else "o-"                    # auto lies on naive or tiled
        ax_t.plot(ns, ms, style, label=label)
        ax_m.plot(ns, [max(m, 0.1) for m in mib], style, label=label)
    ns = sorted({p["n"] for p in points})
    if len(ns) >= 2:
        for ax, key in ((ax_t, time_key), (ax_m, "peak_growth_mib")):
            naive = {p["n"]: p[key] for p in points if p["impl"] == "naive"}
            if naive:
                n0 = min(naive)
                ax.plot(ns, [naive[n0] * (n / n0) ** 2 for n in ns], ":", color="grey", label="grows as N²")
    timed = "CPU time" if args.plot_cpu_time else "time"
    for ax, what in ((ax_t, f"{timed} of forward + backward (ms)"), (ax_m, "peak memory growth (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=8)
    fig.suptitle(f"{'causal ' if args.causal else ''}attention, B={args.batch}, H={args.heads}, "
                 f"D={args.head_dim}, {args.dtype}, CPU", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096, 16384], help="sequence lengths N")
    p.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head_dim", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--no_causal", dest="causal", action="store_false", help="full attention instead of causal")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first (the first one measures memory)")
    p.add_argument("--warm_n", type=int, default=256,
                   help="size of the one small call made before measuring memory (see peak_growth_mib)")
    p.add_argument("--settle", type=float, default=0.2,
                   help="seconds of rest before the timed runs (with --side_by_side: before each run)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torch_python", default=None,
                   help="a Python that has torch (default: this one, if it has torch)")
    p.add_argument("--naive_max_n", type=int, default=4096,
                   help="skip the naive path above this N (its (N, N) arrays would not fit)")
    p.add_argument("--check_max_n", type=int, default=4096,
                   help="the PyTorch worker compares tinyattn's numbers with its own up to this N")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per worker process")
    p.add_argument("--plot", default=None, help="write the time and memory chart to this PNG")
    p.add_argument("--plot_cpu_time", action="store_true",
                   help="plot the process's CPU time, not wall time (steadier on a shared machine)")
    p.add_argument("--replot", metavar="JSONL", default=None,
                   help="only draw --plot from the JSON lines of an earlier run")
    p.add_argument("--no_threadpoolctl", action="store_true",
                   help="run tinyattn as if threadpoolctl were not installed (heads in order, BLAS untouched)")
    p.add_argument("--side_by_side", action="store_true",
                   help="time each tinyattn implementation against PyTorch in one process, alternating runs")
    p.add_argument("--worker", choices=IMPLS + ("side_by_side",), help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return side_by_side(args) if args.worker == "side_by_side" else worker(args)
    if args.replot:
        if not args.plot:
            p.error("--replot needs --plot PATH")
        with open(args.replot) as f:
            records = [json.loads(line) for line in f if line.startswith("{")]
        return plot([r for r in records if r.get("kind") == "point"], args.plot, args)

    torch_python = args.torch_python or sys.executable
    if args.torch_python and not shutil.which(args.torch_python) and not os.path.exists(args.torch_python):
        p.error(f"--torch_python {args.torch_python}: no such program")
    impls = [i for i in args.impls if i != "torch" or has_torch(torch_python)]
    if args.side_by_side:
        if "torch" not in args.impls or len(set(args.impls)) < 2:
            print("bench_attention: --side_by_side needs torch and at least one tinyattn implementation in "
                  "--impls", file=sys.stderr)
            return 2
        if "torch" not in impls:
            print(f"bench_attention: --side_by_side needs PyTorch in {torch_python} (pip install torch==2.13.0 "
                  "--index-url https://download.pytorch.org/whl/cpu)", file=sys.stderr)
            return 1
    emit({"kind": "config", **{k: v for k, v in vars(args).items() if k not in ("worker", "n")},
          "impls": impls, "python": sys.version.split()[0], "cpus": os.cpu_count()})
    if args.side_by_side:                                      # (tinyattn runs in torch's Python too)
        for n in args.sizes:
            mine = []
            for impl in impls:
                skip = naive_skip(args, impl, n)
                if skip:
                    emit(skip)
                else:
                    mine.append(impl)
            if len(mine) > 1:
                for record in run_point(args, torch_python, "side_by_side", n, ["--impls"] + mine):
                    emit(record)
        return
    points = []
    for n in args.sizes:
        for impl in impls:
            skip = naive_skip(args, impl, n)
            if skip:
                emit(skip)
                continue
            record = run_point(args, torch_python if impl == "torch" else sys.executable, impl, n)[-1]
            emit(record)
            if record["kind"] == "point":
                points.append(record)
                if "rel_err_vs_tinyattn" in record:
                    emit({"kind": "check", "n": n, "rel_err": record["rel_err_vs_tinyattn"]})
    for impl in impls:
        mine = sorted((r["n"], r["ms_median"]) for r in points if r["impl"] == impl)
        if len(mine) >= 2:
            (n0, t0), (n1, t1) = mine[0], mine[-1]
            emit({"kind": "fit", "impl": impl, "time_exponent": round(math.log(t1 / t0) / math.log(n1 / n0), 3)})
    if args.plot and points:
        plot(points, args.plot, args)
        emit({"kind": "plot", "path": args.plot})


def emit(record):
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    sys.exit(main())
