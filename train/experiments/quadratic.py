"""Attention costs O(N^2): time and memory of naive attention against sequence length.

Naive attention builds the whole (N, N) score matrix, and keeps the (N, N)
weights for the backward pass, so both its time and its memory grow like
N^2. This script times forward + backward of F.scaled_dot_product_attention(impl="naive")
on (B, H, N, D) float32 inputs for each N (the median over repeats, after
warm-up runs), measures the peak memory allocated during one forward +
backward with tracemalloc (numpy reports its arrays to it), and fits the
exponent p of cost ~ N^p on a log-log scale over the larger sizes. The
score computation alone (q k^T, forward only) is timed too: it is exactly
N^2 D multiply-adds, so its exponent shows the N^2 without the overheads.

F.flash_attention (blockwise attention with an online softmax) is measured
beside the naive one: it never holds an (N, N) array, so its memory grows
linearly, while its time stays quadratic.

Run as a script it uses one BLAS thread (set OPENBLAS_NUM_THREADS to
override): on a shared 2-core machine, a second BLAS thread that waits for a
busy core makes the timings of the large matmuls jump around.

    python -m train.experiments.quadratic [--sizes 64 128 ... 4096] [--repeats 5] [--out_dir DIR] [--tiny]
"""
import os

if __name__ == "__main__":                  # before numpy is imported, or it has no effect
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import statistics
import time
import tracemalloc

import numpy as np

import tinyattn as ta
import tinyattn.nn.functional as F

from . import _common

SIZES = (64, 128, 256, 512, 1024, 2048, 4096)


def methods(block_size=64):
    """name -> (attention function (q, k, v, is_causal), with backward?) for every method measured."""
    return {
        "naive": (lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c, impl="naive"), True),
        "flash": (lambda q, k, v, c: F.flash_attention(q, k, v, is_causal=c, block_size=block_size), True),
        "scores": (lambda q, k, v, c: q @ k.mT, False),          # (B, H, N, N), forward only
    }


def inputs(n, d, batch, heads, rng):
    """q, k, v (B, H, N, D) float32 leaves, and the output gradient."""
    make = lambda: ta.tensor(rng.standard_normal((batch, heads, n, d)).astype(np.float32),  # noqa: E731
                             requires_grad=True)
    q, k, v = make(), make(), make()
    return q, k, v, ta.tensor(rng.standard_normal((batch, heads, n, d)).astype(np.float32))


def step(fn, q, k, v, g, causal, backward):
    """One forward (+ backward); gradients land in q.grad, k.grad, v.grad."""
    for t in (q, k, v):
        t.grad = None
    if not backward:
        with ta.no_grad():
            fn(q, k, v, causal)
        return
    out = fn(q, k, v, causal)                                       # (B, H, N, D)
    out.backward(g)


def measure(fn, backward, n, d, batch, heads, causal, repeats, warmup, rng):
    """-> (median seconds, peak bytes) of forward (+ backward) at length n."""
    q, k, v, g = inputs(n, d, batch, heads, rng)
    for _ in range(warmup):
        step(fn, q, k, v, g, causal, backward)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step(fn, q, k, v, g, causal, backward)
        times.append(time.perf_counter() - t0)
    for t in (q, k, v):
        t.grad = None
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        step(fn, q, k, v, g, causal, backward)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    return statistics.median(times), peak


def fit_exponent(sizes, values):
    """p in value ~ c N^p, fitted on the larger half of the sizes (at least two points)."""
    pairs = [(n, v) for n, v in zip(sizes, values) if v and v > 0]
    pairs = pairs[-max(2, (len(pairs) + 1) // 2):]
    if len(pairs) < 2:
        return None
    x = np.log([n for n, _ in pairs])
    y = np.log([v for _, v in pairs])
    return float(np.polyfit(x, y, 1)[0])


def plot(result, out_dir, name="quadratic.png"):
    plt = _common.pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    sizes = result["sizes"]
    slope = lambda p: "n/a" if p is None else f"{p:.2f}"             # noqa: E731
    for method, m in result["methods"].items():
        ok = [i for i, t in enumerate(m["time_s"]) if t is not None]
        n = [sizes[i] for i in ok]
        what = f"{method} ({'forward + backward' if m['backward'] else 'forward only'})"
        axes[0].plot(n, [m["time_s"][i] * 1e3 for i in ok], "o-", label=f"{what}: slope {slope(m['time_exponent'])}")
        axes[1].plot(n, [m["peak_bytes"][i] / 2**20 for i in ok], "o-",
                     label=f"{what}: slope {slope(m['memory_exponent'])}")
    n = np.array(sizes, dtype=float)
    for ax, key, unit in ((axes[0], "time_s", 1e3), (axes[1], "peak_bytes", 1 / 2**20)):
        ref = result["methods"]["naive"][key][-1] * unit
        ax.plot(n, ref * (n / n[-1]) ** 2, ":", color="gray", label="N^2")
        ax.plot(n, ref * (n / n[-1]), "--", color="lightgray", label="N")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("time (ms, median)")
    axes[1].set_ylabel("peak memory (MiB, tracemalloc)")
    fig.suptitle(f"attention on (B={result['batch']}, H={result['heads']}, N, D={result['d']}) float32"
                 + (", causal" if result["causal"] else ""))
    fig.tight_layout()
    path = _common.save_figure(fig, out_dir, name)
    plt.close(fig)
    return path


def run(sizes=SIZES, d=64, batch=1, heads=1, causal=False, repeats=5, warmup=1, block_size=64,
        seed=0, out_dir="out-experiments", plot_png=True, plot_name="quadratic.png"):
    """-> dict: per method, median time and peak memory per size and the fitted exponents."""
    rng = np.random.default_rng(seed)
    result = dict(sizes=list(sizes), d=d, batch=batch, heads=heads, causal=causal, repeats=repeats,
                  blas_threads=os.environ.get("OPENBLAS_NUM_THREADS", "default"), methods={})
    for name, (fn, backward) in methods(block_size).items():
        times, peaks, error = [], [], None
        for n in sizes:
            try:
                t, peak = measure(fn, backward, n, d, batch, heads, causal, repeats, warmup, rng)
            except Exception as e:        # a method under construction must not stop the experiment
                error = f"{type(e).__name__}: {e}"
                t, peak = None, None
            times.append(t)
            peaks.append(peak)
        result["methods"][name] = dict(time_s=times, peak_bytes=peaks, error=error, backward=backward,
                                       time_exponent=fit_exponent(sizes, times),
                                       memory_exponent=fit_exponent(sizes, peaks))
    result["plot"] = plot(result, out_dir, plot_name) if plot_png else None
    return result


def table(r):
    lines = [f"{'N':>6} " + " ".join(f"{name + ' ms':>12} {name + ' MiB':>12}" for name in r["methods"])]
    for i, n in enumerate(r["sizes"]):
        cells = []
        for m in r["methods"].values():
            t, b = m["time_s"][i], m["peak_bytes"][i]
            cells.append(f"{t * 1e3:12.2f} {b / 2**20:12.2f}" if t is not None else f"{'failed':>12} {'':>12}")
        lines.append(f"{n:>6} " + " ".join(cells))
    for name, m in r["methods"].items():
        if m["error"]:
            lines.append(f"{name}: {m['error']}")
    return "\n".join(lines)


def sentence(r):
    def fmt(x):
        return "n/a" if x is None else f"{x:.2f}"
    naive, flash = r["methods"]["naive"], r["methods"]["flash"]
    text = (f"From N = {r['sizes'][0]} to {r['sizes'][-1]}, naive attention's forward + backward time grows "
            f"like N^{fmt(naive['time_exponent'])} and its peak memory like N^{fmt(naive['memory_exponent'])}"
            f"; flash attention's time like N^{fmt(flash['time_exponent'])} and its memory like "
            f"N^{fmt(flash['memory_exponent'])}")
    scores = r["methods"]["scores"]
    return text + (f"; the score matrix q k^T alone takes time like N^{fmt(scores['time_exponent'])} "
                   "(exponents fitted on the larger sizes).")


def main(argv=None):
    p = _common.parser("quadratic", __doc__, "out-experiments", "where quadratic.png goes")
    p.add_argument("--sizes", type=_common.at_least(1), nargs="+", default=list(SIZES), help="sequence lengths N")
    p.add_argument("--d", type=_common.at_least(1), default=64, help="head size D")
    p.add_argument("--batch", type=_common.at_least(1), default=1)
    p.add_argument("--heads", type=_common.at_least(1), default=1)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--repeats", type=_common.at_least(1), default=5)
    p.add_argument("--warmup", type=_common.at_least(0), default=1)
    p.add_argument("--block_size", type=_common.at_least(1), default=64, help="flash attention's block size")
    args = p.parse_args(argv)
    if args.tiny:
        args.sizes, args.repeats, args.warmup = [32, 64, 128], 1, 0
    r = run(tuple(args.sizes), args.d, args.batch, args.heads, args.causal, args.repeats, args.warmup,
            args.block_size, args.seed, args.out_dir, not args.no_plot, _common.plot_name("quadratic", args.tiny))
    return _common.report(sentence(r), r, table(r))


if __name__ == "__main__":
    raise SystemExit(main())
