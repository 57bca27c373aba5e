"""python -m train.export_hf --out_dir DIR --to HF_DIR: a checkpoint as a Hugging Face GPT-2 folder.

HF_DIR gets config.json and model.safetensors (transformers' GPT2LMHeadModel loads
them) and, for a character or BPE model, tokenizer.json and tokenizer_config.json
(transformers' AutoTokenizer reads them and encodes any text to the ids tinyattn's
tokenizer gives, special tokens such as <|endoftext|> as one id each). A word model's
vocabulary is not exported: its words are in the checkpoint's metadata only.
"""
import sys

from .config import OneLineParser
from .sample import load_model


def build_parser():
    p = OneLineParser(prog="python -m train.export_hf", description=__doc__)
    p.add_argument("--out_dir", default="out", help="the folder that holds ckpt.npz")
    p.add_argument("--checkpoint", default="ckpt", choices=["ckpt", "best"],
                   help="ckpt: the latest state (default); best: the state with the best val loss")
    p.add_argument("--to", required=True, help="the folder to write (made if missing; its files are replaced)")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        model, tokenizer = load_model(args.out_dir, which=args.checkpoint)
        chars = tokenizer.chars if tokenizer.kind == "char" else None
        bpe = tokenizer if tokenizer.kind == "bpe" else None
        model.export_hf(args.to, chars=chars, tokenizer=bpe)
    except (ValueError, OSError, KeyError) as e:
        print(f"python -m train.export_hf: error: {e}", file=sys.stderr)
        return 1
    vocab = ("and its characters (tokenizer.json)" if chars else "and its BPE tokenizer (tokenizer.json)" if bpe
             else f"(its {tokenizer.kind} vocabulary is not exported)")
    print(f"wrote {args.to}: config.json, model.safetensors {vocab}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
