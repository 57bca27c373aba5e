"""Different heads learn different attention patterns.

Runs a trained model over held-out sentences of the "it" corpus (or windows
of its text), keeps every head's attention weights, and measures:

  how different the heads of a layer are: the mean Jensen-Shannon divergence
  (in bits, 0 = the same distribution, 1 = no overlap) and total variation
  (half the L1 distance, 0..1) between the attention rows of every pair of
  heads. Identical heads would score 0.
  what each head attends to on average: the previous token, the first token,
  itself, the nouns (the corpus's animal and place words), and the offset
  i - j of the key it weights most, against a head that spreads its weight
  evenly over the visible keys.

Position 0 is left out (it can only see itself), and so is padding.

    python -m train.experiments.heads [--out_dir out-coref] [--n_sentences 200] [--tiny]

It needs a trained model in --out_dir (default out-coref): `python -m train` makes the
lesson model there, `python -m train --data FILE --out_dir DIR` a text model for
--out_dir DIR. --tiny trains a small model in-process instead.
"""
from collections import Counter

import numpy as np

from . import _common

FEATURES = ("prev", "first", "self", "nouns")


def coref_batch(dataset, n, rng):
    """(ids (B, T) right-padded, lengths (B,), noun mask (B, T)) from held-out sentences.

    Padding at the end is harmless: with the causal mask no real position sees it.
    """
    examples = dataset.examples["test"]
    chosen = [examples[i] for i in rng.permutation(len(examples))[:n]]
    tok = dataset.tokenizer
    T = max(len(ex.words) for ex in chosen)
    pad = tok.stoi["<eos>"]
    ids = np.full((len(chosen), T), pad, dtype=np.int64)
    nouns = np.zeros((len(chosen), T), dtype=bool)
    for b, ex in enumerate(chosen):
        ids[b, :len(ex.words)] = tok.encode(ex.words)
        nouns[b, :len(ex.words)] = [w in (ex.animal, ex.place) for w in ex.words]
    return ids, np.array([len(ex.words) for ex in chosen]), nouns, chosen[0].words


def valid_queries(lengths, T):
    """(B, T) booleans: real query positions from 1 on."""
    pos = np.arange(T)
    return (pos[None, :] >= 1) & (pos[None, :] < lengths[:, None])


def js_bits(p, q):
    """Jensen-Shannon divergence in bits along the last axis."""
    m = 0.5 * (p + q)

    def kl(a, b):
        return np.where(a > 0, a * np.log2(np.where(a > 0, a, 1) / np.where(b > 0, b, 1)), 0.0).sum(-1)
    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def head_features(w, valid, nouns):
    """Mean attention of one head on prev/first/self/nouns. w (B, T, T), valid (B, T), nouns (B, T)."""
    T = w.shape[-1]
    i = np.arange(T)
    per_query = {
        "prev": np.concatenate([np.zeros((w.shape[0], 1)), w[:, i[1:], i[1:] - 1]], axis=1),   # (B, T)
        "first": w[:, :, 0],
        "self": w[:, i, i],
        "nouns": (w * nouns[:, None, :]).sum(-1),
    }
    return {k: float(v[valid].mean()) for k, v in per_query.items()}


def top_offset(w, valid):
    """The most common offset i - argmax_j w[i, j], and how often it is the top key."""
    i = np.arange(w.shape[-1])
    offsets = (i[None, :] - w.argmax(-1))[valid]                   # (n_valid,)
    offset, count = Counter(offsets.tolist()).most_common(1)[0]
    return int(offset), count / len(offsets)


def label(feats, baseline, offset):
    """A short name: the feature this head weights most above an even spread, if any stands out."""
    names = {"prev": "previous token", "first": "first token", "self": "itself", "nouns": "nouns"}
    ratios = {k: feats[k] / baseline[k] for k in FEATURES if feats.get(k) is not None and baseline.get(k)}
    best = max(ratios, key=ratios.get, default=None)
    if best is not None and ratios[best] >= 2.0 and feats[best] >= 0.2:
        return f"{names[best]} ({ratios[best]:.1f}x even)"
    return f"spread (top offset {offset})"


def analyse(maps, valid, nouns, has_nouns=True):
    """Per-layer head differences and per-head features, from (B, H, T, T) maps."""
    B, T = valid.shape
    uniform = np.broadcast_to(_common.uniform_causal(T), (B, T, T))
    baseline = head_features(uniform, valid, nouns)
    if not has_nouns:
        baseline["nouns"] = None
    layers = []
    for layer, w in enumerate(maps):
        H = w.shape[1]
        js, tv = [], []
        for h in range(H):
            for g in range(h + 1, H):
                js.append(js_bits(w[:, h], w[:, g])[valid].mean())
                tv.append((0.5 * np.abs(w[:, h] - w[:, g]).sum(-1))[valid].mean())
        heads = []
        for h in range(H):
            feats = head_features(w[:, h], valid, nouns)
            if not has_nouns:
                feats["nouns"] = None
            offset, share = top_offset(w[:, h], valid)
            heads.append(dict(head=h, **feats, top_offset=offset, top_offset_share=share,
                              js_to_uniform=float(js_bits(w[:, h], uniform)[valid].mean()),
                              label=label(feats, baseline, offset)))
        layers.append(dict(layer=layer, mean_pairwise_js=float(np.mean(js)) if js else 0.0,
                           min_pairwise_js=float(np.min(js)) if js else 0.0,
                           max_pairwise_js=float(np.max(js)) if js else 0.0,
                           mean_pairwise_tv=float(np.mean(tv)) if tv else 0.0, heads=heads))
    return layers, baseline


def plot(maps, words, layers, out_dir, name="heads.png"):
    """One panel per (layer, head): its attention on the first sentence."""
    plt = _common.pyplot()
    if plt is None:
        return None
    L, H = len(maps), maps[0].shape[1]
    n = len(words)
    fig, axes = plt.subplots(L, H, figsize=(2.8 * H + 1, 2.8 * L + 0.8), squeeze=False)
    for l in range(L):
        for h in range(H):
            ax = axes[l][h]
            ax.imshow(maps[l][0, h, :n, :n], cmap="viridis", vmin=0, vmax=1)
            info = layers[l]["heads"][h]
            ax.set_title(f"L{l} H{h}: {info['label']}", fontsize=8)
            if n <= 20:
                ax.set_xticks(range(n), words, rotation=90, fontsize=6)
                ax.set_yticks(range(n), words, fontsize=6)
            else:
                ax.set_xticks([])
                ax.set_yticks([])
    fig.suptitle("attention of each head (rows: queries, columns: keys)")
    fig.tight_layout()
    path = _common.save_figure(fig, out_dir, name)
    plt.close(fig)
    return path


def run(out_dir="out-coref", tiny=False, n_sentences=200, seed=0, steps=150, plot_png=True):
    """-> dict: per layer, the mean pairwise JS divergence between heads and each head's features."""
    model, tokenizer, dataset, source = _common.get_model(out_dir, tiny, seed=seed, steps=steps)
    rng = np.random.default_rng(seed)
    if dataset is not None and dataset.examples is not None:
        ids, lengths, nouns, words = coref_batch(dataset, n_sentences, rng)
        T = min(ids.shape[1], model.config.block_size)              # a model with a short context
        ids, nouns, lengths, words = ids[:, :T], nouns[:, :T], np.minimum(lengths, T), words[:T]
        inputs, has_nouns = "held-out 'it' sentences", True
    else:
        ids = _common.windows(model, dataset, n_sentences, rng)
        lengths = np.full(len(ids), ids.shape[1])
        nouns = np.zeros(ids.shape, dtype=bool)
        words = [tokenizer.decode([i]) for i in ids[0]] if tokenizer else [str(i) for i in ids[0]]
        inputs = "text windows" if dataset is not None else "random token windows"
        has_nouns = False
    maps = _common.attention_maps(model, ids)                       # L x (B, H, T, T)
    valid = valid_queries(lengths, ids.shape[1])
    layers, baseline = analyse(maps, valid, nouns, has_nouns)
    result = dict(source=source, inputs=inputs, n_sequences=len(ids), layers=layers,
                  uniform_baseline=baseline, identical_heads_js=0.0,
                  mean_pairwise_js=float(np.mean([l["mean_pairwise_js"] for l in layers])))
    result["plot"] = plot(maps, words, layers, out_dir, _common.plot_name("heads", tiny)) if plot_png else None
    return result


def table(r):
    b = r["uniform_baseline"]

    def cell(x):
        return f"{'n/a':>6}" if x is None else f"{x:6.3f}"
    lines = [f"{'head':>6} {'prev':>6} {'first':>6} {'self':>6} {'nouns':>6} {'top offset':>11}  label"]
    for layer in r["layers"]:
        lines.append(f"layer {layer['layer']}: mean pairwise JS {layer['mean_pairwise_js']:.3f} bits "
                     f"(min {layer['min_pairwise_js']:.3f}, max {layer['max_pairwise_js']:.3f}), "
                     f"total variation {layer['mean_pairwise_tv']:.3f}")
        for h in layer["heads"]:
            lines.append(f"{'L%dH%d' % (layer['layer'], h['head']):>6} {cell(h['prev'])} {cell(h['first'])} "
                         f"{cell(h['self'])} {cell(h['nouns'])} {h['top_offset']:>5} ({h['top_offset_share']:4.0%})"
                         f"  {h['label']}")
    lines.append(f"{'even':>6} {cell(b['prev'])} {cell(b['first'])} {cell(b['self'])} {cell(b['nouns'])}"
                 "                (a head spread evenly over the visible keys)")
    return "\n".join(lines)


def sentence(r):
    per_layer = ", ".join(f"{l['mean_pairwise_js']:.3f}" for l in r["layers"])
    standouts = [f"L{l['layer']}H{h['head']} {h['label']}" for l in r["layers"] for h in l["heads"]
                 if not h["label"].startswith("spread")]
    n_heads = sum(len(l["heads"]) for l in r["layers"])
    text = (f"Over {r['n_sequences']} {r['inputs']}, the heads of each layer differ by a mean pairwise "
            f"Jensen-Shannon divergence of {per_layer} bits (layer by layer; identical heads: 0, "
            f"disjoint ones: 1); {len(standouts)} of {n_heads} heads have a clear favourite")
    if standouts:
        text += " (" + "; ".join(standouts[:4]) + ("; ..." if len(standouts) > 4 else "") + ")"
    return text + f", in {r['source']}."


def main(argv=None):
    p = _common.parser("heads", __doc__, "out-coref", "the folder that holds ckpt.npz; heads.png goes there too")
    p.add_argument("--n_sentences", type=_common.at_least(1), default=200)
    p.add_argument("--steps", type=_common.at_least(0), default=150, help="training steps of the --tiny model")
    args = p.parse_args(argv)
    if args.tiny:
        args.n_sentences = min(args.n_sentences, 50)
    try:
        r = run(args.out_dir, args.tiny, args.n_sentences, args.seed, args.steps, not args.no_plot)
    except (FileNotFoundError, ValueError, KeyError) as e:
        return _common.error("heads", e)
    return _common.report(sentence(r), r, table(r))


if __name__ == "__main__":
    raise SystemExit(main())
