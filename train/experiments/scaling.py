"""Why attention divides its scores by sqrt(d_k).

With q and k of d_k standard-normal entries, q . k has variance d_k. Without
the 1/sqrt(d_k) the scores grow with the head size, the softmax saturates
(one weight near 1, the rest near 0) and almost no gradient flows back
through it. This script measures, for random q and k and a random upstream
gradient u, on L = <u, softmax(s q k^T)>:

  entropy of each softmax row (nats; at most log(n_keys), a uniform row)
  the largest weight of each row, and the share of rows where it passes 0.99
  |dL/dscores| per row (mean and median) and |dL/dq| per row

with s = 1/sqrt(d_k) and with s = 1, at one d_k and over a sweep of d_k.
A saturated row passes almost no gradient; at moderate d_k only some rows
are saturated, so the median row shows the effect before the mean does.
(dL/dq also carries the factor s itself, so without the scale it can even be
larger on average: a few unsaturated rows with 8x steeper scores.)

    python -m train.experiments.scaling [--d_k 64] [--n_queries 1000] [--n_keys 32] [--out_dir DIR] [--tiny]
"""
import math

import numpy as np

import tinyattn as ta
import tinyattn.nn.functional as F

from . import _common

SWEEP = (4, 8, 16, 32, 64, 128, 256, 512, 1024)


def softmax_stats(q, k, u, scale):
    """Statistics of softmax(scale q k^T). q (N, D), k (M, D), u (N, M), numpy float64."""
    qt = ta.tensor(q, dtype="float64", requires_grad=True)
    kt = ta.tensor(k, dtype="float64")
    scores = (qt @ kt.mT) * scale                                    # (N, M)
    scores.retain_grad()
    weights = F.softmax(scores, dim=-1)                              # (N, M)
    (weights * ta.tensor(u, dtype="float64")).sum().backward()       # L = <u, softmax>
    w = weights.numpy()
    entropy = -(w * np.log(np.maximum(w, 1e-300))).sum(-1)            # (N,)
    grad_rows = np.linalg.norm(scores.grad.numpy(), axis=-1)          # (N,)
    return dict(
        score_std=float(scores.numpy().std()),
        entropy=float(entropy.mean()),
        max_weight=float(w.max(-1).mean()),
        saturated=float((w.max(-1) > 0.99).mean()),
        grad_scores=float(grad_rows.mean()),
        grad_scores_median=float(np.median(grad_rows)),
        grad_q=float(np.linalg.norm(qt.grad.numpy(), axis=-1).mean()),
    )


def compare(d_k, n_queries, n_keys, rng):
    """Scaled and unscaled statistics on the same random q, k, u."""
    q = rng.standard_normal((n_queries, d_k))
    k = rng.standard_normal((n_keys, d_k))
    u = rng.standard_normal((n_queries, n_keys))
    return {"scaled": softmax_stats(q, k, u, 1.0 / math.sqrt(d_k)),
            "unscaled": softmax_stats(q, k, u, 1.0)}


def ratio(a, b):
    return a / max(b, 1e-300)


def plot(sweep, n_keys, out_dir, name="scaling.png"):
    plt = _common.pyplot()
    if plt is None:
        return None
    dims = [row["d_k"] for row in sweep]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = [("entropy", "softmax entropy (nats)"), ("max_weight", "largest weight"),
              ("grad_scores_median", "median |dL/dscores| per row")]
    for ax, (key, label) in zip(axes, panels):
        for which, style in (("scaled", "o-"), ("unscaled", "s--")):
            ax.plot(dims, [row[which][key] for row in sweep], style, label=which)
        ax.set_xscale("log", base=2)
        ax.set_title(label)
        ax.set_xlabel("d_k")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].axhline(math.log(n_keys), color="gray", lw=0.8, ls=":", label=f"uniform (log {n_keys})")
    axes[2].set_yscale("log")
    axes[0].legend()
    fig.suptitle(f"softmax(q k^T * s) over {n_keys} keys: s = 1/sqrt(d_k) against s = 1")
    fig.tight_layout()
    path = _common.save_figure(fig, out_dir, name)
    plt.close(fig)
    return path


def run(d_k=64, n_queries=1000, n_keys=32, sweep=SWEEP, seed=0, out_dir="out-experiments", plot_png=True,
        plot_name="scaling.png"):
    """-> dict: the comparison at d_k, the sweep, and the ratios the sentence quotes."""
    rng = np.random.default_rng(seed)
    at = compare(d_k, n_queries, n_keys, rng)
    rows = [dict(d_k=d, **compare(d, n_queries, n_keys, rng)) for d in sweep]
    s, u = at["scaled"], at["unscaled"]
    result = dict(
        d_k=d_k, n_queries=n_queries, n_keys=n_keys, max_entropy=math.log(n_keys),
        scaled=s, unscaled=u,
        grad_scores_ratio=ratio(s["grad_scores"], u["grad_scores"]),      # how many times smaller unscaled
        grad_scores_median_ratio=ratio(s["grad_scores_median"], u["grad_scores_median"]),
        grad_q_ratio=ratio(s["grad_q"], u["grad_q"]),
        sweep=rows,
        largest_d_k=rows[-1]["d_k"] if rows else None,
        largest_d_k_median_ratio=ratio(rows[-1]["scaled"]["grad_scores_median"],
                                       rows[-1]["unscaled"]["grad_scores_median"]) if rows else None,
    )
    result["plot"] = plot(rows, n_keys, out_dir, plot_name) if plot_png else None
    return result


def sentence(r):
    s, u = r["scaled"], r["unscaled"]
    text = (f"At d_k = {r['d_k']} over {r['n_keys']} keys, without 1/sqrt(d_k) the mean max weight is "
            f"{u['max_weight']:.2f} (with it: {s['max_weight']:.2f}), the entropy is {u['entropy']:.2f} nats "
            f"(with it: {s['entropy']:.2f}; uniform: {r['max_entropy']:.2f}), {100 * u['saturated']:.0f}% of rows "
            f"put more than 0.99 on one key (with it: {100 * s['saturated']:.0f}%), and the gradient through the "
            f"softmax is {r['grad_scores_ratio']:.1f}x smaller on average, "
            f"{r['grad_scores_median_ratio']:.1f}x for the median row")
    if r["largest_d_k"] and r["largest_d_k"] != r["d_k"]:
        text += f" ({r['largest_d_k_median_ratio']:.3g}x at d_k = {r['largest_d_k']})"
    return text + "."


def main(argv=None):
    p = _common.parser("scaling", __doc__, "out-experiments", "where scaling.png goes")
    p.add_argument("--d_k", type=_common.at_least(1), default=64)
    p.add_argument("--n_queries", type=_common.at_least(1), default=1000)
    p.add_argument("--n_keys", type=_common.at_least(1), default=32)
    p.add_argument("--sweep", type=_common.at_least(1), nargs="+", default=list(SWEEP), help="the d_k values of the sweep")
    args = p.parse_args(argv)
    if args.tiny:
        args.n_queries, args.sweep = min(args.n_queries, 200), [4, 16, 64, 256]
    r = run(args.d_k, args.n_queries, args.n_keys, tuple(args.sweep), args.seed, args.out_dir, not args.no_plot,
            _common.plot_name("scaling", args.tiny))
    return _common.report(sentence(r), r)


if __name__ == "__main__":
    raise SystemExit(main())
