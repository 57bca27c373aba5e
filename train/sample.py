"""python -m train.sample --out_dir DIR: generate text from a checkpoint."""
import argparse
import math
import sys

import tinyattn as ta
from tinyattn.models import GPT, GPTConfig

from . import checkpoint, finetune
from .config import OneLineParser, add_compile_flag, at_least
from .data import default_start, encode_prompt, tokenizer_from_json


def build_parser():
    p = OneLineParser(prog="python -m train.sample", description=__doc__)
    p.add_argument("--out_dir", default="out-coref",
                   help="the folder that holds ckpt.npz (or a Hugging Face folder written by GPT.export_hf)")
    p.add_argument("--checkpoint", default="ckpt", choices=["ckpt", "best"],
                   help="ckpt: the latest state (default); best: the state with the best val loss")
    p.add_argument("--start", default=None,
                   help="the prompt; a BPE model's special tokens (<|endoftext|>) in it are one token each "
                        "(default: a BPE model's <|endoftext|>, else the first token of the vocabulary)")
    p.add_argument("--num_samples", type=at_least(1), default=3)
    p.add_argument("--max_new_tokens", type=at_least(0), default=200)
    p.add_argument("--temperature", type=finite_at_least_0, default=0.8,
                   help="0: always the likeliest token; higher: more varied (default 0.8)")
    p.add_argument("--top_k", type=at_least(1), default=None)
    p.add_argument("--top_p", type=probability, default=None, help="in (0, 1]")
    p.add_argument("--stop", default=None,
                   help='end each sample at this text, kept in the output ("\\n" is a newline; "" turns it off; '
                        'default: <eos> for a word model that has it, else none)')
    p.add_argument("--seed", type=at_least(0), default=1337)
    p.add_argument("--device", default="cpu")
    add_compile_flag(p)
    return p


def finite_at_least_0(text):
    """An argparse type: a finite float >= 0 (NaN and infinity are refused)."""
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def probability(text):
    """An argparse type: a float in (0, 1]."""
    value = float(text)
    if not 0 < value <= 1:                       # NaN fails too
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


finite_at_least_0.__name__ = probability.__name__ = "float"     # argparse's "invalid float value"


def load_model(out_dir, device="cpu", which="ckpt"):
    """-> (model in eval mode, tokenizer) from out_dir/ckpt.npz (or best.npz), or from a Hugging
    Face folder with a character or BPE tokenizer (as GPT.export_hf writes it)."""
    if finetune.is_hf_folder(out_dir):
        return GPT.from_hf(out_dir).to(device).eval(), finetune.hf_tokenizer(out_dir)
    model_state, _, meta = checkpoint.load(f"{out_dir}/{which}.npz")
    model = GPT(GPTConfig(**meta["config"])).to((meta.get("args") or {}).get("dtype") or "float32")   # the run's
    model.load_state_dict(model_state)
    return model.to(device).eval(), tokenizer_from_json(meta["tokenizer"])


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        model, tokenizer = load_model(args.out_dir, args.device, args.checkpoint)
        model = ta.compile(model, disable=not args.compile)
        start = encode_prompt(tokenizer, args.start) if args.start else default_start(tokenizer)
        if not start:
            raise ValueError("--start is empty")
        stop = stop_text(args.stop, tokenizer)
        stop_ids = tokenizer.encode(stop) if stop else None     # a stop text outside the vocabulary: an error
    except (ValueError, FileNotFoundError, KeyError, RuntimeError) as e:
        print(f"python -m train.sample: error: {e}", file=sys.stderr)
        return 1
    ta.manual_seed(args.seed)
    for i in range(args.num_samples):
        idx = ta.tensor([start], device=args.device)
        out = model.generate(idx, args.max_new_tokens, temperature=args.temperature,
                             top_k=args.top_k, top_p=args.top_p, stop=stop_ids)
        print(cut_at_stop(tokenizer.decode(out[0].tolist()), len(tokenizer.decode(start)), stop))
        print("---------------")
    return 0


def stop_text(flag, tokenizer):
    """The stop text: the flag with \\n and \\t read as newline and tab; by default <eos> for a word model."""
    if flag is None:
        return "<eos>" if getattr(tokenizer, "kind", None) == "word" and "<eos>" in tokenizer.stoi else None
    return flag.replace("\\n", "\n").replace("\\t", "\t") or None


def cut_at_stop(text, prompt_chars, stop):
    """The text up to and including the first stop text after the prompt."""
    if not stop:
        return text
    at = text.find(stop, prompt_chars)
    return text if at < 0 else text[:at + len(stop)]


if __name__ == "__main__":
    sys.exit(main())
