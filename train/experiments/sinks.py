"""Attention sinks: trained heads pile weight on the first token and on delimiters.

A head's softmax must put its weight somewhere, even when nothing in the
context is useful. Trained models often park it on the first position of
the window or on frequent delimiter tokens (newline, full stop, space; in
the "it" corpus ".", "=" and "<eos>").

For windows of validation text this script measures, per layer and head,
the mean attention weight on the first token and the mean total weight on
delimiter tokens, over every query position i >= 1. The baseline is a head
that spreads its weight evenly over the i + 1 keys it can see: 1/(i + 1) on
the first token, (delimiters among them)/(i + 1) on the delimiters, averaged
over the same queries. A ratio above 1 means more weight than even.

    python -m train.experiments.sinks [--out_dir out-coref] [--n_windows 256] [--tiny]

It needs a trained model in --out_dir (default out-coref): `python -m train` makes the
lesson model there, `python -m train --data FILE --out_dir DIR` a text model for
--out_dir DIR. --tiny trains a small model in-process instead.
"""

import numpy as np

from . import _common
from ..data import CharTokenizer, WordTokenizer

DELIMITERS = {"char": ("\n", ".", ",", " "), "word": (".", ",", "=", "<eos>")}


def delimiter_ids(tokenizer):
    """{token text: id} for the delimiters this tokenizer has."""
    if isinstance(tokenizer, (CharTokenizer, WordTokenizer)):
        return {d: tokenizer.stoi[d] for d in DELIMITERS[tokenizer.kind] if d in tokenizer.stoi}
    return {}


def masses(w, is_delim):
    """Mean weight on the first token and on delimiters, over queries i >= 1.

    w (B, T, T) one head's weights, is_delim (B, T) booleans -> (first, delimiters).
    """
    first = w[:, 1:, 0].mean()
    delim = (w[:, 1:, :] * is_delim[:, None, :]).sum(-1).mean()
    return float(first), float(delim)


def analyse(maps, ids, delims):
    """Per layer and head: masses, the even-spread baselines and their ratios."""
    B, T = ids.shape
    even = np.broadcast_to(_common.uniform_causal(T), (B, T, T))
    is_delim = np.isin(ids, list(delims.values()))                      # (B, T)
    base_first, base_delim = masses(even, is_delim)
    by_token_base = {d: masses(even, ids == i)[1] for d, i in delims.items()}
    heads, by_token = [], {d: [] for d in delims}
    for layer, w in enumerate(maps):                                    # (B, H, T, T)
        for h in range(w.shape[1]):
            first, delim = masses(w[:, h], is_delim)
            heads.append(dict(layer=layer, head=h, first=first, delimiters=delim,
                              first_ratio=first / base_first,
                              delimiters_ratio=delim / base_delim if base_delim else None))
            for d, i in delims.items():
                by_token[d].append(masses(w[:, h], ids == i)[1])
    return dict(
        heads=heads, baseline_first=base_first, baseline_delimiters=base_delim,
        mean_first=float(np.mean([h["first"] for h in heads])),
        mean_delimiters=float(np.mean([h["delimiters"] for h in heads])),
        by_token={d: dict(mass=float(np.mean(v)), baseline=by_token_base[d],
                          ratio=float(np.mean(v)) / by_token_base[d] if by_token_base[d] else None)
                  for d, v in by_token.items()},
    )


def plot(r, n_layer, n_head, out_dir, name="sinks.png"):
    plt = _common.pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(4 + 1.2 * n_head * 2, 1.2 * n_layer + 2), squeeze=False)
    for ax, key, title in ((axes[0][0], "first_ratio", "first token"),
                           (axes[0][1], "delimiters_ratio", "delimiters")):
        grid = np.zeros((n_layer, n_head))
        for h in r["heads"]:
            grid[h["layer"], h["head"]] = h[key] or 0.0
        im = ax.imshow(np.log2(np.maximum(grid, 1e-3)), cmap="RdBu_r", vmin=-4, vmax=4)
        for (l, h), v in np.ndenumerate(grid):
            ax.text(h, l, f"{v:.1f}x", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(n_head), [f"H{h}" for h in range(n_head)])
        ax.set_yticks(range(n_layer), [f"L{l}" for l in range(n_layer)])
        ax.set_title(f"weight on the {title} / even spread")
        fig.colorbar(im, ax=ax, label="log2 ratio")
    fig.tight_layout()
    path = _common.save_figure(fig, out_dir, name)
    plt.close(fig)
    return path


def run(out_dir="out-coref", tiny=False, n_windows=256, seed=0, steps=100, plot_png=True):
    """-> dict: per (layer, head) the weight on the first token and on delimiters, and the baselines."""
    model, tokenizer, dataset, source = _common.get_model(out_dir, tiny, seed=seed, steps=steps)
    rng = np.random.default_rng(seed)
    ids = _common.windows(model, dataset, n_windows, rng)              # (B, T)
    delims = delimiter_ids(tokenizer)
    maps = _common.attention_maps(model, ids)                          # L x (B, H, T, T)
    r = analyse(maps, ids, delims)
    strongest = max(r["heads"], key=lambda h: h["first_ratio"])
    r.update(source=source, n_windows=len(ids), window=ids.shape[1], delimiters=list(delims),
             inputs="validation windows" if dataset is not None else "random token windows",
             first_ratio=r["mean_first"] / r["baseline_first"],
             delimiters_ratio=r["mean_delimiters"] / r["baseline_delimiters"] if r["baseline_delimiters"] else None,
             strongest_first=strongest)
    r["plot"] = (plot(r, model.config.n_layer, model.config.n_head, out_dir, _common.plot_name("sinks", tiny))
                 if plot_png else None)
    return r


def table(r):
    lines = [f"{'head':>6} {'first':>7} {'ratio':>7} {'delims':>7} {'ratio':>7}"]
    for h in r["heads"]:
        dr = "n/a" if h["delimiters_ratio"] is None else f"{h['delimiters_ratio']:.2f}"
        lines.append(f"{'L%dH%d' % (h['layer'], h['head']):>6} {h['first']:7.3f} {h['first_ratio']:7.2f} "
                     f"{h['delimiters']:7.3f} {dr:>7}")
    lines.append(f"{'even':>6} {r['baseline_first']:7.3f} {1:7.2f} {r['baseline_delimiters']:7.3f} {1:7.2f}")
    for d, v in r["by_token"].items():
        ratio = "n/a" if v["ratio"] is None else f"{v['ratio']:.2f}x"
        lines.append(f"  {d!r}: mean weight {v['mass']:.3f} against {v['baseline']:.3f} even ({ratio})")
    return "\n".join(lines)


def sentence(r):
    s = r["strongest_first"]
    delims = ", ".join(repr(d) for d in r["delimiters"]) or "none in this vocabulary"
    dr = "n/a" if r["delimiters_ratio"] is None else f"{r['delimiters_ratio']:.1f}x"
    return (f"Averaged over all heads and {r['n_windows']} {r['inputs']} of {r['window']} tokens, the first token "
            f"gets {r['mean_first']:.3f} of the attention ({r['first_ratio']:.1f}x the {r['baseline_first']:.3f} "
            f"of an even spread) and the delimiters ({delims}) get {r['mean_delimiters']:.3f} ({dr} the "
            f"{r['baseline_delimiters']:.3f} baseline); the strongest first-token head is "
            f"L{s['layer']}H{s['head']} with {s['first']:.3f} ({s['first_ratio']:.1f}x), in {r['source']}.")


def main(argv=None):
    p = _common.parser("sinks", __doc__, "out-coref", "the folder that holds ckpt.npz; sinks.png goes there too")
    p.add_argument("--n_windows", type=_common.at_least(1), default=256)
    p.add_argument("--steps", type=_common.at_least(0), default=100, help="training steps of the --tiny model")
    args = p.parse_args(argv)
    if args.tiny:
        args.n_windows = min(args.n_windows, 64)
    try:
        r = run(args.out_dir, args.tiny, args.n_windows, args.seed, args.steps, not args.no_plot)
    except (FileNotFoundError, ValueError, KeyError) as e:
        return _common.error("sinks", e)
    return _common.report(sentence(r), r, table(r))


if __name__ == "__main__":
    raise SystemExit(main())
