"""The lesson's report: does the model know what "it" means, and does its attention show it?

After training on the "it" corpus (data/coref.py) we ask three questions:

  1. Accuracy: at the "=" token, is the logit of the right noun higher than
     the logit of the other noun? (Chance is 0.5.)
  2. Attention: find the head whose attention from "=" lands on the right
     noun more often than on the other noun (chosen on the training
     sentences), then check that head on the held-out sentences.
  3. Pictures: for the lesson's two sentences ("... too tired . it =" and
     "... too wide . it ="), where does every head look from "=" and from "it"?

    from train import lesson
    summary = lesson.report(model, dataset, out_dir, device, print)
"""
import os
from contextlib import contextmanager

import numpy as np

import tinyattn as ta
from data import coref
from .plots import NOT_INSTALLED, pyplot

SHADES = " ░▒▓█"      # terminal shading, from no attention to all of it
CHUNK = 512           # sentences per forward pass


# ---------------------------------------------------------------------------
# running the model
def prefix(example):
    """The words up to and including "=": what the model sees before it answers."""
    return example.words[:example.answer_index]


def other_noun(example):
    """The noun that "it" does not mean."""
    return example.place if example.referent == example.animal else example.animal


# The positions that have seen the adjective, so a head there could choose the noun: a causal
# model can decide at any of them, not only at "=".
QUERIES = ("adjective", ".", "it", "=")


def query_positions(example):
    """Positions of the adjective, the "." and "it" after it, and "=" (one per QUERIES)."""
    adjective = example.words.index(example.adjective)
    return [adjective, *range(example.answer_index - 3, example.answer_index)]


def noun_positions(example):
    """(position of the right noun, position of the other noun) in the sentence."""
    return example.words.index(example.referent), example.words.index(other_noun(example))


def attention_modules(model):
    """The attention layer of every block, first layer first."""
    return [block.attn for block in model.h]


def run_examples(model, examples, tokenizer, device):
    """Run the model on every example's prefix, in batches of equal length.

    Returns (logits, weights):
      logits  (N, V): the logits at the "=" position, one row per example
      weights a list with one entry per example: (L, H, T, T) attention weights,
              T the length of that example's prefix
    The model must be in eval mode with keep_weights set (see watching()).
    """
    by_length = {}
    for i, ex in enumerate(examples):
        by_length.setdefault(len(prefix(ex)), []).append(i)
    logits = [None] * len(examples)
    weights = [None] * len(examples)
    for indices in by_length.values():
        for start in range(0, len(indices), CHUNK):
            chunk = indices[start:start + CHUNK]
            ids = np.array([tokenizer.encode(prefix(examples[i])) for i in chunk], dtype=np.int64)   # (B, T)
            out, _ = model(ta.tensor(ids, device=device))                                             # (B, T, V)
            last = out[:, -1, :].numpy()                                                              # (B, V)
            w = np.stack([attn.last_weights.numpy() for attn in attention_modules(model)], axis=1)  # (B, L, H, T, T)
            for row, i in enumerate(chunk):
                logits[i] = last[row]
                weights[i] = w[row]
    return np.stack(logits) if logits else np.zeros((0, tokenizer.vocab_size)), weights


@contextmanager
def watching(model):
    """with watching(model): eval mode, no gradients, attention weights kept; all restored afterwards."""
    was_training = model.training
    kept = [attn.keep_weights for attn in attention_modules(model)]
    model.eval()
    for attn in attention_modules(model):
        attn.keep_weights = True
    try:
        with ta.no_grad():
            yield model
    finally:
        for attn, keep in zip(attention_modules(model), kept):
            attn.keep_weights = keep
            if not keep:
                attn.last_weights = None      # do not hold on to the last batch's weights
        model.train(was_training)


# ---------------------------------------------------------------------------
# the numbers
def referent_accuracy(model, examples, tokenizer, device):
    """Fraction of examples where, at "=", the right noun's logit beats the other noun's. Chance: 0.5."""
    return measure(model, examples, tokenizer, device)["accuracy"]


def attention_to_nouns(model, examples, tokenizer, device):
    """Attention from "=" onto the right noun and onto the other noun.

    Returns an array (N, L, H, 2): [..., 0] is the weight on the right noun,
    [..., 1] the weight on the other noun, for every layer L and head H.
    """
    return measure(model, examples, tokenizer, device)["attention"]


def measure(model, examples, tokenizer, device):
    """Everything from one pass over the examples, as a dict:

      accuracy   the right noun's logit beats the other noun's (referent_accuracy)
      exact      the model's top word is the right noun (a harder test: it must copy the noun)
      attention  (N, L, H, 2) weights from "=" on the right and the other noun (attention_to_nouns)
      by_query   {query: (N, L, H, 2)}: the same from each position after the adjective (QUERIES)
    """
    cfg = model.config
    if not examples:
        empty = np.zeros((0, cfg.n_layer, cfg.n_head, 2))
        return dict(accuracy=float("nan"), exact=float("nan"), attention=empty, by_query={q: empty for q in QUERIES})
    with watching(model):
        logits, weights = run_examples(model, examples, tokenizer, device)     # (N, V), N x (L, H, T, T)
    rows = np.arange(len(examples))
    right = np.array([tokenizer.stoi[ex.referent] for ex in examples])        # (N,) token ids
    wrong = np.array([tokenizer.stoi[other_noun(ex)] for ex in examples])
    accuracy = float(np.mean(logits[rows, right] > logits[rows, wrong]))
    exact = float(np.mean(logits.argmax(axis=1) == right))

    by_query = {name: np.zeros((len(examples), cfg.n_layer, cfg.n_head, 2)) for name in QUERIES}
    for i, ex in enumerate(examples):
        right_pos, wrong_pos = noun_positions(ex)
        for name, q in zip(QUERIES, query_positions(ex)):
            w = weights[i][:, :, q, :]                  # (L, H, T): the row of this query
            by_query[name][i, :, :, 0] = w[:, :, right_pos]
            by_query[name][i, :, :, 1] = w[:, :, wrong_pos]
    return dict(accuracy=accuracy, exact=exact, attention=by_query["="], by_query=by_query)


def correct_by_head(attention):
    """(N, L, H, 2) -> (L, H): how often each head puts more weight on the right noun."""
    return (attention[..., 0] > attention[..., 1]).mean(axis=0)


def pick_referent_head(train_attention):
    """The (layer, head) that most often looks more at the right noun than the other.

    train_attention: attention_to_nouns(...) on the TRAINING examples, (N, L, H, 2).
    Returns (layer, head, fraction of training examples it gets right).
    """
    scores = correct_by_head(train_attention)           # (L, H)
    layer, head = np.unravel_index(np.argmax(scores), scores.shape)
    return int(layer), int(head), float(scores[layer, head])


def pick_referent_pair(train_attention):
    """The two heads of one layer whose summed weights from "=" favour the right noun most often.

    A model may split the choice between two heads, each right in only part of the
    sentences. train_attention: (N, L, H, 2) on the TRAINING examples.
    Returns (layer, [head, head], fraction of training examples), or None with one head per layer.
    """
    n_layer, n_head = train_attention.shape[1:3]
    best = None
    for layer in range(n_layer):
        for a in range(n_head):
            for b in range(a + 1, n_head):
                pair = train_attention[:, layer, [a, b]].sum(axis=1)              # (N, 2)
                score = float((pair[:, 0] > pair[:, 1]).mean())
                if best is None or score > best[2]:
                    best = (layer, [a, b], score)
    return best


def pair_correct(attention, layer, heads):
    """Held-out fraction where the heads' summed weight on the right noun beats the other noun's."""
    pair = attention[:, layer, heads].sum(axis=1)                                   # (N, 2)
    return float((pair[:, 0] > pair[:, 1]).mean())


def choice_by_query(train_by_query, test_by_query):
    """For each query position: the head chosen on training and its held-out fraction.

    A model may choose the noun before "=", e.g. with a layer-0 head at the adjective,
    and then only copy the choice to "=": this shows where the choice is made.
    Returns {query: {"head": [layer, head], "heldout": fraction}}.
    """
    out = {}
    for q in QUERIES:
        layer, head, _ = pick_referent_head(train_by_query[q])
        out[q] = dict(head=[layer, head], heldout=round(float(correct_by_head(test_by_query[q])[layer, head]), 4))
    return out


# ---------------------------------------------------------------------------
# the pictures
def lesson_rows(model, example, tokenizer, device):
    """Attention from "=" and from "it" over the sentence, for every head.

    Returns (rows (L, H, 2, T), words (T,), labels, logits (V,)).
    """
    with watching(model):
        logits, weights = run_examples(model, [example], tokenizer, device)
    w = weights[0]                                      # (L, H, T, T)
    queries = [len(prefix(example)) - 1, example.it_index]
    rows = w[:, :, queries, :]                          # (L, H, 2, T)
    return rows, prefix(example), ['"=" looks at', '"it" looks at'], logits[0]


def plot_attention(rows, words, labels, path, title, say=print, highlight=None):
    """Draw a grid of small heatmaps, one per layer (rows) and head (columns).

    rows: (L, H, Q, T) attention weights: Q query rows (named by labels) over
    the T words. highlight: an optional (layer, head) to mark. Writes a PNG at
    path. Without matplotlib the same is drawn in the terminal with shaded
    blocks, and the PNG is skipped. Returns the name of the file written, or None.
    """
    rows = np.asarray(rows)
    plt = pyplot()
    if plt is None:
        say(f"{os.path.basename(path)} skipped: {NOT_INSTALLED}; here it is as text")
        print_attention(rows, words, labels, title, say, highlight)
        return None
    n_layer, n_head = rows.shape[:2]
    fig, axes = plt.subplots(n_layer, n_head, figsize=(2.6 * n_head + 1, 1.6 * n_layer + 1.2),
                             squeeze=False, sharex=True, sharey=True)
    for layer in range(n_layer):
        for head in range(n_head):
            ax = axes[layer][head]
            image = ax.imshow(rows[layer, head], cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
            marked = highlight is not None and tuple(highlight) == (layer, head)
            ax.set_title(f"layer {layer} head {head}" + (" (referent head)" if marked else ""), fontsize=8,
                         color="crimson" if marked else "black", fontweight="bold" if marked else "normal")
            ax.set_yticks(range(len(labels)))
            ax.set_yticklabels(labels, fontsize=7)
            ax.set_xticks(range(len(words)))
            ax.set_xticklabels(words, rotation=90, fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return os.path.basename(path)


def print_attention(rows, words, labels, title, say=print, highlight=None):
    """The heatmaps as text: one line per layer, head and query, a shaded block under each word."""
    widths = [max(len(w), 2) for w in words]
    name_width = max(len(l) for l in labels) + 11
    say(title)
    say(" " * name_width + " ".join(w.ljust(n) for w, n in zip(words, widths)))
    for layer in range(rows.shape[0]):
        for head in range(rows.shape[1]):
            for q, label in enumerate(labels):
                w = rows[layer, head, q]                               # (T,)
                cells = [SHADES[min(int(x * len(SHADES)), len(SHADES) - 1)] * n for x, n in zip(w, widths)]
                top = int(np.argmax(w))
                mark = "*" if highlight is not None and tuple(highlight) == (layer, head) else " "
                name = f"{mark}L{layer} H{head} {label}"
                say(name.ljust(name_width) + " ".join(cells) + f"  most: {words[top]} {w[top]:.0%}")
    if highlight is not None:
        say("* the referent head")


# ---------------------------------------------------------------------------
def report(model, dataset, out_dir, device, say=print):
    """Accuracy, the referent head and the heatmaps; returns a dict for summary.json."""
    tok = dataset.tokenizer
    train_examples, test_examples = dataset.examples["train"], dataset.examples["test"]
    longest = max(len(prefix(ex)) for ex in train_examples + test_examples + coref.LESSON_SENTENCES)
    if longest > model.config.block_size:
        say(f"lesson report skipped: block_size {model.config.block_size} is shorter than "
            f"a sentence ({longest} tokens)")
        return {}

    train, test = measure(model, train_examples, tok, device), measure(model, test_examples, tok, device)
    train_acc, test_acc = train["accuracy"], test["accuracy"]
    layer, head, train_frac = pick_referent_head(train["attention"])
    by_head = correct_by_head(test["attention"])       # (L, H): held-out fraction right, per head
    heldout_attn = float(by_head[layer, head])
    weight_right, weight_wrong = test["attention"][:, layer, head].mean(axis=0)   # how much, not only which

    say(f"what does 'it' mean? right noun beats the other noun (chance 0.5): "
        f"train {train_acc:.3f}, held-out {test_acc:.3f}")
    say(f"the top word is exactly the right noun (it must copy it from the sentence): "
        f"train {train['exact']:.3f}, held-out {test['exact']:.3f}")
    say(f"referent head: layer {layer} head {head} looks more at the right noun than the other from '=' "
        f"in {train_frac:.1%} of training and {heldout_attn:.1%} of held-out sentences "
        f"(mean weight {weight_right:.2f} on the right noun, {weight_wrong:.2f} on the other)")
    choice = choice_by_query(train["by_query"], test["by_query"])
    pair = pick_referent_pair(train["attention"])
    if pair is not None:
        pair_layer, pair_heads, pair_train = pair
        pair_heldout = pair_correct(test["attention"], pair_layer, pair_heads)
        say(f"the best two heads of one layer together (their weights added): layer {pair_layer} heads "
            f"{pair_heads[0]} and {pair_heads[1]}, right in {pair_train:.1%} of training and "
            f"{pair_heldout:.1%} of held-out sentences")
    say("the best head from each position after the adjective (chosen on training, scored held out): "
        + ", ".join(f"from {q!r} L{c['head'][0]}H{c['head'][1]} {c['heldout']:.1%}" for q, c in choice.items()))

    plots = []
    os.makedirs(out_dir, exist_ok=True)
    for ex in coref.LESSON_SENTENCES:
        rows, words, labels, logits = lesson_rows(model, ex, tok, device)
        right, wrong = noun_positions(ex)
        on_nouns = {ex.words[right]: rows[layer, head, 0, right], ex.words[wrong]: rows[layer, head, 0, wrong]}
        looked_at = max(on_nouns, key=on_nouns.get)
        answer = tok.words[int(np.argmax(logits))]
        say(f'"{" ".join(words)}"  model answers: {answer} '
            f'({"right" if answer == ex.referent else "wrong, expected " + ex.referent}); '
            f"head L{layer}H{head} from '=' looks at: "
            + ", ".join(f"{w} {p:.0%}" for w, p in on_nouns.items()) + f" -> {looked_at}")
        path = os.path.join(out_dir, f"attention_{ex.adjective}.png")
        title = f'"{" ".join(words)}"  (answer: {ex.referent})'
        written = plot_attention(rows, words, labels, path, title, say, highlight=(layer, head))
        if written:
            say(f"wrote {path}")
            plots.append(written)

    say('(the "it" rows: a causal model reads left to right, so at "it" the adjective is not there yet; '
        'only at "=" can it decide)')
    extra = {} if pair is None else dict(referent_pair=[pair_layer, pair_heads],
                                         heldout_pair_attention_correct=round(pair_heldout, 4))
    return dict(heldout_accuracy=round(test_acc, 4), train_accuracy=round(train_acc, 4), **extra,
                heldout_exact=round(test["exact"], 4),
                heldout_attention_correct=round(heldout_attn, 4), referent_head=[layer, head],
                heldout_weight_right=round(float(weight_right), 4), heldout_weight_wrong=round(float(weight_wrong), 4),
                referent_head_train_fraction=round(train_frac, 4),
                heldout_attention_by_head=np.round(by_head, 4).tolist(), choice_by_query=choice,
                attention_plots=plots)
