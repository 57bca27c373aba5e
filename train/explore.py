"""python -m train.explore --out_dir DIR --text "...": explore a model's attention in the browser.

Runs the checkpoint's model on the text and writes one self-contained HTML
file (every script and style inline: no network, no server). Open it in any
browser to:
  - pick a layer and a head, or see every head of a layer at once;
  - hover over or click a token to see where it attends and what attends to it
    (shift- or ctrl-click selects several tokens: their weights are averaged);
  - aggregate over heads or layers: mean, max, or attention rollout
    (Abnar and Zuidema 2020: each layer's head-mean plus the residual, multiplied through);
  - save the current view as a PNG.
"""
import argparse
import base64
import html
import json
import os
import sys
from pathlib import Path

import numpy as np

import tinyattn as ta

from .config import OneLineParser
from .lesson import attention_modules, watching
from .data import encode_prompt
from .sample import load_model

TEMPLATE = Path(__file__).with_name("explore.html")


def build_parser():
    p = OneLineParser(prog="python -m train.explore", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out_dir", default="out-coref",
                   help="the folder that holds ckpt.npz (or a Hugging Face folder written by GPT.export_hf)")
    p.add_argument("--checkpoint", default="ckpt", choices=["ckpt", "best"])
    p.add_argument("--text", help="the text to look at (default: the lesson's sentence for a word model)")
    p.add_argument("--out", help="the HTML file to write (default: OUT_DIR/attention.html)")
    p.add_argument("--device", default="cpu")
    return p


def attention_weights(model, ids, device="cpu"):
    """(L, H, T, T) float32 attention weights of the model on one sequence of token ids."""
    with watching(model):
        model(ta.tensor([ids], device=device))
        return np.stack([attn.last_weights.numpy()[0] for attn in attention_modules(model)]).astype(np.float32)


def rollout(weights):
    """Attention rollout: (L, H, T, T) -> (T, T), how much each token draws on each input token.

    Each layer's attention is the mean over its heads plus the identity for the
    residual connection, rows renormalised; the layers are multiplied through.
    """
    T = weights.shape[-1]
    out = np.eye(T)
    for layer in weights.astype(np.float64):
        a = 0.5 * layer.mean(0) + 0.5 * np.eye(T)
        a /= a.sum(-1, keepdims=True)
        out = a @ out
    return out


def token_labels(tokenizer, ids):
    """What each token shows in the page: words as they are; characters and BPE tokens with
    space and newline made visible. BPE tokens that split a character's bytes between them
    each show the text of the whole run and their place in it: 日 (1/3), 日 (2/3), 日 (3/3)."""
    kind = getattr(tokenizer, "kind", "char")
    if kind == "word":
        return [tokenizer.words[i] for i in ids]
    shown = {" ": "\u2423", "\n": "\u21b5", "\t": "\u21e5"}
    texts = bpe_texts(tokenizer, ids) if kind == "bpe" else [(tokenizer.chars[i], "") for i in ids]
    return ["".join(shown.get(c, c) for c in t) + place for t, place in texts]


def bpe_texts(tokenizer, ids):
    """(text, place) of each token: its text and ''; but a run of tokens that only decodes
    whole (a character's bytes cut between tokens) gives each of them the run's text and
    its place in the run, ' (1/2)'."""
    texts, run = [], []
    for n, i in enumerate(ids):
        run.append(tokenizer.token_bytes(i))
        if n + 1 < len(ids) and ends_inside_a_character(b"".join(run)):
            continue                                               # the character goes on in the next token
        text = b"".join(run).decode("utf-8", errors="replace")
        texts += [(text, "")] if len(run) == 1 else [(text, f" ({k}/{len(run)})") for k in range(1, len(run) + 1)]
        run = []
    return texts


def ends_inside_a_character(data):
    """True when data's last UTF-8 character lacks bytes that may still follow."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.reason == "unexpected end of data"
    return False


def page(weights, tokens, title):
    """The HTML text: the template with the weights (lower triangles, float32, base64) filled in."""
    L, H, T, _ = weights.shape
    rows, cols = np.tril_indices(T)
    packed = np.ascontiguousarray(weights[:, :, rows, cols], dtype="<f4")     # (L, H, T(T+1)/2)
    data = dict(tokens=tokens, n_layer=L, n_head=H, T=T, title=title,
                weights=base64.b64encode(packed.tobytes()).decode("ascii"))
    payload = json.dumps(data).replace("</", "<\\/")                           # safe inside <script>
    return (TEMPLATE.read_text(encoding="utf-8")
            .replace("__TITLE__", html.escape(title))
            .replace("__DATA__", payload))


def default_text(tokenizer):
    if getattr(tokenizer, "kind", None) == "word" and "animal" in tokenizer.stoi:
        return "the animal didn't cross the street because it was too tired . it = animal"
    return None


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        model, tokenizer = load_model(args.out_dir, args.device, args.checkpoint)
        text = args.text if args.text is not None else default_text(tokenizer)
        if not text:
            raise ValueError("--text is needed (and must not be empty)")
        ids = encode_prompt(tokenizer, text)
        if not ids:
            raise ValueError("--text has no tokens")
        if len(ids) > model.config.block_size:
            raise ValueError(f"--text has {len(ids)} tokens, more than the model's block_size "
                             f"{model.config.block_size}")
        weights = attention_weights(model, ids, args.device)
        out = args.out or os.path.join(args.out_dir, "attention.html")
        title = f"attention of {os.path.basename(os.path.abspath(args.out_dir))}/{args.checkpoint}.npz"
        Path(out).write_text(page(weights, token_labels(tokenizer, ids), title), encoding="utf-8")
    except (ValueError, FileNotFoundError, KeyError, RuntimeError, OSError) as e:
        print(f"python -m train.explore: error: {e}", file=sys.stderr)
        return 1
    L, H, T, _ = weights.shape
    print(f"wrote {out}: {T} tokens, {L} layers x {H} heads; open it in a browser")
    return 0


if __name__ == "__main__":
    sys.exit(main())
