"""Make the site's pictures again, from the project's own code and runs (from the repository root):

    python docs/tools/make_pictures.py                  every picture
    python docs/tools/make_pictures.py graphs cost      some of them

    graphs    docs/graph_neuron.png, graph_head.png, graph_gpt.png: ta.viz.graph of the examples
              below (seconds)
    heads     docs/attention_wide.png: the lesson's heatmaps, drawn by `python -m train` (the
              default job, seed 1337) in a temporary folder (a minute or two)
    scaling   docs/scaling.png: `python -m train.experiments.scaling` (seconds)
    causal    docs/causal.png: `python -m train.experiments.causal --out_dir out-coref` on that
              default model
    specialise, sinks
              docs/heads_baby.png, docs/sinks_baby.png: `python -m train.experiments.heads --out_dir out`
              and `python -m train.experiments.sinks --out_dir out` on the baby Shakespeare model,
              `python -m train --data data/shakespeare_char/input.txt` trained in a temporary folder
              (a few minutes; the text is --shakespeare FILE, else the repository's
              data/shakespeare_char/input.txt, else downloaded by `python data/shakespeare_char.py`)
    cost      docs/attention_cost.png: `python bench/bench_attention.py --sizes 256 1024 4096 16384
              --repeats 5 --plot docs/attention_cost.png --plot_cpu_time` (minutes; with PyTorch
              installed its SDPA is drawn too; the numbers are the machine's)
    explore   docs/explore.png: `python -m train.explore` on that default model and the lesson's
              sentence, opened in the system's Chromium with Playwright, layer 1's head 0 (the
              referent head) shown from "=", and a screenshot taken

Each page's caption names the command of its picture. The pictures need the viz extra
(matplotlib); explore needs playwright and Chromium (as the explorer's browser test does).
"""
import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile

import tinyattn as ta
import tinyattn.nn.functional as F
from tinyattn.models import GPT, GPTConfig

DOCS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(DOCS)
SENTENCE = "the animal didn't cross the street because it was too tired . it = animal"


def neuron():
    """tanh(x . w + b): one neuron with two inputs."""
    x = ta.tensor([1.0, -2.0], requires_grad=True)
    w = ta.tensor([0.5, 0.3], requires_grad=True)
    b = ta.tensor(0.1, requires_grad=True)
    y = ((x * w).sum() + b).tanh()
    return y, dict(x=x, w=w, b=b)


def attention_head(T=4, C=8, D=4):
    """One causal attention head on T tokens of C channels, written out op by op."""
    ta.manual_seed(0)
    x = ta.randn(T, C)                                          # (T, C): the tokens, no gradient
    w_q, w_k, w_v = (ta.randn(C, D, requires_grad=True) for _ in range(3))
    q, k, v = x @ w_q, x @ w_k, x @ w_v                         # (T, D) each
    scores = (q @ k.T) * (1.0 / math.sqrt(D))                   # (T, T)
    future = ta.tensor([[j > i for j in range(T)] for i in range(T)])
    weights = F.softmax(scores.masked_fill(future, float("-inf")), dim=-1)   # (T, T), rows sum to 1
    return weights @ v, dict(x=x, w_q=w_q, w_k=w_k, w_v=w_v, future=future)    # (T, D)


def gpt_loss():
    ta.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=10))
    idx = ta.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    return model(idx, idx)[1]


def graphs(folder):
    y, params = neuron()
    ta.viz.graph(y, os.path.join(folder, "graph_neuron.png"), params=params)
    out, params = attention_head()
    ta.viz.graph(out, os.path.join(folder, "graph_head.png"), params=params)
    ta.viz.graph(gpt_loss(), os.path.join(folder, "graph_gpt.png"), depth=1)
    return ["graph_neuron.png", "graph_head.png", "graph_gpt.png"]


def run(*command, cwd=ROOT):
    print("+", " ".join(command), flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, *command], cwd=cwd, env=env, check=True)


_default_run = {}


def default_run():
    """`python -m train` (the lesson's default job, seed 1337) in a temporary folder, once a process:
    -> that folder, which holds out-coref/."""
    if not _default_run:
        _default_run["folder"] = tempfile.mkdtemp()
        run("-m", "train", "--quiet", cwd=_default_run["folder"])
    return _default_run["folder"]


def heads(folder):
    shutil.copy(os.path.join(default_run(), "out-coref", "attention_wide.png"), os.path.join(folder, "attention_wide.png"))
    return ["attention_wide.png"]


def scaling(folder):
    here = tempfile.mkdtemp()
    run("-m", "train.experiments.scaling", "--out_dir", here)
    shutil.copy(os.path.join(here, "scaling.png"), os.path.join(folder, "scaling.png"))
    return ["scaling.png"]


def causal(folder):
    here = default_run()
    run("-m", "train.experiments.causal", "--out_dir", "out-coref", cwd=here)
    shutil.copy(os.path.join(here, "out-coref", "causal.png"), os.path.join(folder, "causal.png"))
    return ["causal.png"]


_baby_run = {}


def baby_run(text=None):
    """`python -m train --data data/shakespeare_char/input.txt` (nanoGPT's baby config on tiny
    Shakespeare) in a temporary folder, once a process: -> that folder, which holds out/."""
    if not _baby_run:
        here = _baby_run["folder"] = tempfile.mkdtemp()
        data = os.path.join(here, "data", "shakespeare_char", "input.txt")
        mine = os.path.join(ROOT, "data", "shakespeare_char", "input.txt")   # what `python data/shakespeare_char.py` made
        text = text or (mine if os.path.exists(mine) else None)
        run("data/shakespeare_char.py", "--out", data, *(["--from", text] if text else []))
        run("-m", "train", "--data", os.path.join("data", "shakespeare_char", "input.txt"), "--quiet", cwd=here)
    return _baby_run["folder"]


def specialise(folder, text=None):
    here = baby_run(text)
    run("-m", "train.experiments.heads", "--out_dir", "out", cwd=here)
    shutil.copy(os.path.join(here, "out", "heads.png"), os.path.join(folder, "heads_baby.png"))
    return ["heads_baby.png"]


def sinks(folder, text=None):
    here = baby_run(text)
    run("-m", "train.experiments.sinks", "--out_dir", "out", cwd=here)
    shutil.copy(os.path.join(here, "out", "sinks.png"), os.path.join(folder, "sinks_baby.png"))
    return ["sinks_baby.png"]


def cost(folder):
    run("bench/bench_attention.py", "--sizes", "256", "1024", "4096", "16384", "--repeats", "5",
        "--plot", os.path.join(os.path.abspath(folder), "attention_cost.png"), "--plot_cpu_time")
    return ["attention_cost.png"]


def explore(folder):
    from playwright.sync_api import sync_playwright
    chromium = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    if chromium is None:
        raise SystemExit("make_pictures: explore needs Chromium (apt-get install chromium)")
    here = default_run()
    run("-m", "train.explore", "--out_dir", "out-coref", "--text", SENTENCE, cwd=here)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 900, "height": 560})
        page.goto("file://" + os.path.join(here, "out-coref", "attention.html"))
        page.select_option("#layer", "1")                      # the referent head: layer 1, head 0
        page.select_option("#head", "0")
        page.click(f"#tok-{SENTENCE.split().index('=')}")       # where "=" attends
        page.screenshot(path=os.path.join(folder, "explore.png"))
        browser.close()
    return ["explore.png"]


PICTURES = {"graphs": graphs, "heads": heads, "scaling": scaling, "causal": causal, "specialise": specialise,
            "sinks": sinks, "cost": cost, "explore": explore}
NEEDS_TEXT = ("specialise", "sinks")


def build_parser():
    p = argparse.ArgumentParser(prog="python docs/tools/make_pictures.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pictures", nargs="*", metavar="PICTURE",
                   help=f"which pictures (default: all): {', '.join(PICTURES)}")
    p.add_argument("--folder", default=DOCS, help="where they go (default: docs/)")
    p.add_argument("--shakespeare", metavar="FILE",
                   help="a local copy of tiny Shakespeare for the baby model (default: downloaded)")
    return p


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    unknown = [name for name in args.pictures if name not in PICTURES]
    if unknown:
        parser.error(f"no picture named {', '.join(unknown)}; the pictures are {', '.join(PICTURES)}")
    for name in args.pictures or PICTURES:
        extra = {"text": args.shakespeare} if name in NEEDS_TEXT else {}
        written = PICTURES[name](args.folder, **extra)
        print(f"wrote {', '.join(os.path.join(args.folder, w) for w in written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
