"""python -m train.export_hf --out_dir DIR --to HF_DIR: a checkpoint as a Hugging Face GPT-2 folder
(or, for a model whose choices are Llama's: rotary, RMSNorm, SwiGLU, a LlamaForCausalLM folder).

HF_DIR gets config.json and model.safetensors (transformers' GPT2LMHeadModel, or
LlamaForCausalLM, loads them) and, for a character or BPE model, tokenizer.json and tokenizer_config.json
(transformers' AutoTokenizer reads them and encodes any text to the ids tinyattn's
tokenizer gives, special tokens such as <|endoftext|> or <|user|> as one id each). A word
model's vocabulary is not exported: its words are in the checkpoint's metadata only.

A chat model (one fine-tuned on conversations: its tokenizer has <|user|>, <|assistant|> and
<|end|>) is written as transformers expects a chat model: tokenizer_config.json holds a
chat_template that renders a conversation as python -m train.chat does, and names <|end|> its
eos_token; generation_config.json makes generate() stop there:

    tok = AutoTokenizer.from_pretrained(HF_DIR)
    model = AutoModelForCausalLM.from_pretrained(HF_DIR)
    ids = tok.apply_chat_template([{"role": "user", "content": "spell cat"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=32)          # greedy, up to <|end|>
"""
import sys

from data import chat
from tinyattn.tokenizers.hf import write_chat_config

from .config import OneLineParser
from .sample import load_model


def chat_roles(tokenizer):
    """{role: token} of the chat format (data/chat.py's ROLES) that the tokenizer has (the system's
    only where it has <|system|>), or None for a model that is not a chat model (no <|user|>,
    <|assistant|> and <|end|>)."""
    special = getattr(tokenizer, "special_tokens", {})
    if any(t not in special for t in chat.CHAT_TOKENS):
        return None
    return {role: token for role, token in chat.ROLES.items() if token in special}


def export(model, tokenizer, folder):
    """Write ``folder`` (export_hf's files, and a chat model's template and generation config).
    -> what was written, in a few words."""
    exported = tokenizer.kind in ("char", "bpe")
    model.export_hf(folder, tokenizer=tokenizer if exported else None)
    if not exported:
        return f"config.json, model.safetensors (its {tokenizer.kind} vocabulary is not exported)"
    roles = chat_roles(tokenizer)
    if roles is None:
        return f"config.json, model.safetensors and its {'characters' if tokenizer.kind == 'char' else 'BPE tokenizer'} " \
               "(tokenizer.json)"
    write_chat_config(folder, tokenizer.special_tokens, roles, chat.END, max_length=model.config.block_size)
    return ("config.json, model.safetensors, tokenizer.json, tokenizer_config.json (a chat template"
            f"{' with system messages' if 'system' in roles else ''}, eos_token {chat.END}) and generation_config.json")


def build_parser():
    p = OneLineParser(prog="python -m train.export_hf", description=__doc__.split("\n\n")[0])
    p.add_argument("--out_dir", default="out", help="the folder that holds ckpt.npz")
    p.add_argument("--checkpoint", default="ckpt", choices=["ckpt", "best"],
                   help="ckpt: the latest state (default); best: the state with the best val loss")
    p.add_argument("--to", required=True, help="the folder to write (made if missing; its files are replaced)")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        model, tokenizer = load_model(args.out_dir, which=args.checkpoint)
        written = export(model, tokenizer, args.to)
    except (ValueError, OSError, KeyError) as e:
        print(f"python -m train.export_hf: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.to}: {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
