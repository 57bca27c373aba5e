"""Helpers shared by the experiments: command line, models, attention maps, output."""
import argparse
import json
import os
import sys

import numpy as np

import tinyattn as ta
from tinyattn.models import GPT, GPTConfig

from .. import checkpoint, plots
from ..config import PRESETS, OneLineParser, at_least
from ..data import load_coref, load_text

TINY_CONFIG = dict(n_layer=2, n_head=4, n_embd=32, block_size=32)


def parser(prog, doc, default_out_dir, out_dir_help):
    """argparse with the two flags every experiment takes."""
    p = OneLineParser(prog=f"python -m train.experiments.{prog}", description=doc,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out_dir", default=default_out_dir, help=out_dir_help)
    p.add_argument("--tiny", action="store_true", help="a small, fast run (what the tests use)")
    p.add_argument("--seed", type=at_least(0), default=0)
    p.add_argument("--no_plot", action="store_true", help="skip the PNG")
    return p


def pyplot():
    """matplotlib.pyplot with a file-only backend, or None (and a one-line notice)."""
    plt = plots.pyplot()
    if plt is None:
        print(f"{plots.NOT_INSTALLED}: skipping the plot")
    return plt


def jsonable(x):
    """numpy scalars and arrays -> plain Python, recursively."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x


def report(sentence, result, table=None):
    """Print the table (if any), where the plot went, the finding as a sentence, then the result
    as one JSON line. Returns 0, the exit code."""
    if table:
        print(table)
    if result.get("plot"):
        print(f"wrote {result['plot']}")
    print(sentence)
    print(json.dumps(jsonable(result)))
    return 0


def error(prog, exc):
    """A one-line error on stderr; returns 1, the exit code."""
    print(f"python -m train.experiments.{prog}: error: {exc}", file=sys.stderr)
    return 1


# ---------------------------------------------------------------- models
HOW_TO_TRAIN = ("make the lesson model with `python -m train` (it writes out-coref/ckpt.npz, a few minutes "
                "on a CPU), or a text model with `python -m train --data FILE --out_dir DIR` and pass --out_dir DIR; "
                "or pass --tiny for a small model trained here in seconds")


def read_meta(out_dir):
    """The JSON metadata of out_dir/ckpt.npz (config, dataset name, training args)."""
    path = os.path.join(out_dir, "ckpt.npz")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}: {HOW_TO_TRAIN}")
    return checkpoint.read_meta(path)


def warn_if_barely_trained(meta, out_dir):
    """A checkpoint with fewer than half the steps of its preset shows little: say so, on stderr."""
    step = meta.get("step")
    kind = "coref" if meta.get("dataset") == "coref" else "text"
    full = PRESETS[kind]["max_iters"]
    if step is not None and step < full // 2:
        again = "python -m train" + ("" if kind == "coref" else f" --data {(meta.get('args') or {}).get('data', 'FILE')}")
        print(f"warning: the model in {out_dir} is barely trained ({step} steps; a full run is {full}): "
              f"its attention may show little. Train it further with `{again} --out_dir {out_dir} --resume "
              f"--max_iters {full}`", file=sys.stderr)


def load_checkpoint(out_dir, device="cpu"):
    """-> (model, tokenizer, dataset or None, a description) from out_dir/ckpt.npz."""
    from ..sample import load_model
    meta = read_meta(out_dir)
    warn_if_barely_trained(meta, out_dir)
    model, tokenizer = load_model(out_dir, device)
    dataset = None
    if meta.get("dataset") == "coref":
        dataset = load_coref(seed=0)
    else:
        path = (meta.get("args") or {}).get("data")
        if path and os.path.exists(path):
            dataset = load_text(path)
            if dataset.tokenizer.to_dict() != tokenizer.to_dict():
                dataset = None                     # the file changed since training
    return model, tokenizer, dataset, f"the checkpoint in {out_dir} ({meta.get('dataset', '?')})"


def tiny_model(steps=60, seed=0, batch_size=16, learning_rate=3e-3, **config):
    """A small GPT trained for a few steps on the "it" corpus, in-process.

    -> (model in eval mode, tokenizer, dataset, description).
    """
    dataset = load_coref(seed=0)
    ta.manual_seed(seed)
    cfg = GPTConfig(vocab_size=dataset.tokenizer.vocab_size, **{**TINY_CONFIG, **config})
    model = GPT(cfg)
    compiled = ta.compile(model)                       # trained on the fast layer; returned as the model itself
    optimizer = compiled.configure_optimizer(0.0, learning_rate, (0.9, 0.99))
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        x, y = dataset.get_batch("train", batch_size, cfg.block_size, rng)      # (B, T) each
        _, loss = compiled(ta.tensor(x), ta.tensor(y))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval(), dataset.tokenizer, dataset, f"a tiny GPT trained {steps} steps on the 'it' corpus"


def get_model(out_dir, tiny, seed=0, steps=60, device="cpu"):
    """The checkpoint in out_dir, or with tiny=True a tiny model trained in-process."""
    if tiny:
        return tiny_model(steps=steps, seed=seed)
    return load_checkpoint(out_dir, device)


def windows(model, dataset, n, rng, length=None):
    """n windows of token ids, (n, T) int64: from the validation split, or random ids."""
    T = min(length or model.config.block_size, model.config.block_size)
    if dataset is not None and len(dataset.val) > T + 1:
        x, _ = dataset.get_batch("val", n, T, rng)
        return x
    return rng.integers(0, model.config.vocab_size, size=(n, T))


@ta.no_grad()
def attention_maps(model, idx, device="cpu"):
    """One (B, H, T, T) numpy array of attention weights per layer, for ids idx (B, T)."""
    for block in model.h:
        block.attn.keep_weights = True
    try:
        model(ta.tensor(np.asarray(idx), device=device))
        return [block.attn.last_weights.numpy() for block in model.h]
    finally:
        for block in model.h:
            block.attn.keep_weights = False
            block.attn.last_weights = None


def uniform_causal(T):
    """(T, T): the weights of a head that spreads evenly over every visible key."""
    mask = np.tril(np.ones((T, T)))
    return mask / mask.sum(-1, keepdims=True)


def plot_name(experiment, tiny):
    """scaling.png, or scaling-tiny.png for a --tiny run (so it never replaces a real plot)."""
    return f"{experiment}-tiny.png" if tiny else f"{experiment}.png"


def save_figure(fig, out_dir, name):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=110)
    return path
