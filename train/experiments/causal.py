"""The causal mask: a position never sees the tokens after it.

Take a sequence, replace every token after position t by a different one,
and run the model on both. With the mask, the logits at positions 0..t must
be the same bit for bit (np.array_equal, not merely close): the masked
weights are exactly 0, so the changed tokens add exactly nothing. The logits
after t should change, which shows the perturbation was real.

This holds for any weights, so --tiny uses a small random GPT. The plot, causal.png in
--out_dir, shows the first layer's attention weights, averaged over its heads (the
upper triangle is exactly 0), and how far the logits moved at each position.

    python -m train.experiments.causal [--out_dir out-coref] [--t T] [--tiny] [--no_plot]

It needs a trained model in --out_dir (default out-coref): `python -m train` makes the
lesson model there, `python -m train --data FILE --out_dir DIR` a text model for
--out_dir DIR. --tiny trains a small model in-process instead.
"""

import numpy as np

import tinyattn as ta
from tinyattn.models import GPT, GPTConfig

from . import _common
from ..data import WordTokenizer


def example_ids(tokenizer, block_size, rng):
    """A sequence to test on: the lesson's sentence for the word model, else random ids."""
    if isinstance(tokenizer, WordTokenizer):
        try:
            ids = tokenizer.encode("the animal didn't cross the street because it was too tired . it = animal <eos>")
            if len(ids) <= block_size:
                return np.array(ids)
        except ValueError:
            pass
    return rng.integers(0, tokenizer.vocab_size if tokenizer else 64, size=block_size)


def perturb_after(ids, t, vocab_size, rng):
    """A copy of ids whose tokens after position t are all different ones."""
    out = ids.copy()
    n = len(ids) - t - 1
    out[t + 1:] = (ids[t + 1:] + rng.integers(1, vocab_size, size=n)) % vocab_size
    return out


@ta.no_grad()
def logits_of(model, ids):
    logits, _ = model(ta.tensor(ids[None, :]))                     # (1, T, V)
    return logits.numpy()[0]                                        # (T, V)


def plot(weights, diff, t, words, out_dir, name="causal.png"):
    """Left: attention weights (T, T), rows the queries; right: max |logit change| per position."""
    plt = _common.pyplot()
    if plt is None:
        return None
    T = len(diff)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.6), gridspec_kw={"width_ratios": [1, 1.3]})
    im = left.imshow(weights, cmap="viridis", vmin=0)
    left.set_title("layer 0's weights, mean over its heads\n(rows: queries, columns: keys)", fontsize=9)
    fig.colorbar(im, ax=left, fraction=0.046)
    right.bar(range(T), diff, color=["tab:blue" if i <= t else "tab:orange" for i in range(T)])
    for i in range(t + 1):
        right.text(i, 0, "0", ha="center", va="bottom", fontsize=8)
    right.axvline(t + 0.5, color="gray", ls=":", lw=1)
    right.set_title(f"max |change of the logits| per position,\ntokens after position {t} changed", fontsize=9)
    right.set_xlabel("position")
    for ax in (left, right):
        ax.set_xticks(range(T), words, rotation=90, fontsize=7)
    left.set_yticks(range(T), words, fontsize=7)
    fig.tight_layout()
    path = _common.save_figure(fig, out_dir, name)
    plt.close(fig)
    return path


def run(out_dir="out-coref", tiny=False, t=None, seed=0, plot_png=False, plot_name="causal.png"):
    """-> dict: how many positions <= t kept bit-identical logits, how many after t changed
    (and with plot_png, causal.png in out_dir)."""
    rng = np.random.default_rng(seed)
    if tiny:
        ta.manual_seed(seed)
        model = GPT(GPTConfig(block_size=16, vocab_size=50, n_layer=2, n_head=2, n_embd=16)).eval()
        tokenizer, source = None, "a tiny random GPT"
        ids = rng.integers(0, 50, size=16)
    else:
        model, tokenizer, _, source = _common.load_checkpoint(out_dir)
        ids = example_ids(tokenizer, model.config.block_size, rng)
    T, V = len(ids), model.config.vocab_size
    t = T // 2 if t is None else t
    if not 0 <= t < T - 1:
        raise ValueError(f"--t must be in [0, {T - 2}] for a sequence of {T} tokens")
    changed_ids = perturb_after(ids, t, V, rng)

    a, b = logits_of(model, ids), logits_of(model, changed_ids)    # (T, V) each
    same = [bool(np.array_equal(a[i], b[i])) for i in range(T)]
    diff = np.abs(a - b).max(-1)                                    # (T,)
    result = dict(
        source=source, n_positions=T, t=t,
        equal_positions=sum(same[:t + 1]),                           # of t + 1
        changed_positions=sum(not s for s in same[t + 1:]),          # of T - t - 1
        past_identical=all(same[:t + 1]),
        future_changed=not any(same[t + 1:]),
        max_abs_diff_past=float(diff[:t + 1].max()),
        max_abs_diff_future=float(diff[t + 1:].max()),
        equal_per_position=same,
        max_abs_diff_per_position=diff.tolist(),
    )
    words = [str(i) for i in ids]
    if tokenizer is not None and isinstance(tokenizer, WordTokenizer):
        result["text"] = tokenizer.decode(ids)
        result["perturbed_text"] = tokenizer.decode(changed_ids)
        words = [tokenizer.decode([i]) for i in ids]
    if plot_png:
        weights = _common.attention_maps(model, ids[None, :])[0][0].mean(0)    # (T, T): layer 0, heads averaged
        result["plot"] = plot(weights, diff, t, words, out_dir, plot_name)
    return result


def sentence(r):
    return (f"Changing the {r['n_positions'] - r['t'] - 1} tokens after position {r['t']} left the logits at "
            f"{r['equal_positions']} of {r['t'] + 1} earlier positions bit-identical "
            f"(largest difference {r['max_abs_diff_past']:.1g}) and changed them at {r['changed_positions']} of "
            f"{r['n_positions'] - r['t'] - 1} later positions (largest difference {r['max_abs_diff_future']:.3g}), "
            f"in {r['source']}.")


def main(argv=None):
    p = _common.parser("causal", __doc__, "out-coref", "the folder that holds ckpt.npz")
    p.add_argument("--t", type=_common.at_least(0), default=None, help="the last position kept (default: the middle)")
    args = p.parse_args(argv)
    try:
        r = run(args.out_dir, args.tiny, args.t, args.seed, not args.no_plot, _common.plot_name("causal", args.tiny))
    except (FileNotFoundError, ValueError, KeyError) as e:
        return _common.error("causal", e)
    if "text" in r:
        print(f"original:  {r['text']}\nperturbed: {r['perturbed_text']}")
    return _common.report(sentence(r), r)


if __name__ == "__main__":
    raise SystemExit(main())
