"""GPT in and out of Hugging Face's GPT-2 format: a folder with config.json and model.safetensors.
(A GPT with the modern block's choices travels as Llama instead: llama.py.)

tinyattn's GPT is GPT-2's architecture, and its parameters already carry GPT-2's
names, so the translation is short:

    tinyattn                      transformers (GPT2LMHeadModel)
    wte.weight                    transformer.wte.weight
    h.0.attn.c_attn.weight        transformer.h.0.attn.c_attn.weight, transposed
    ...                           ...
    (lm_head.weight is wte)       (lm_head.weight is tied to wte: not stored)

GPT-2 writes its projections with a "Conv1D" layer that computes x @ W + b with
W (in, out); tinyattn's Linear computes x @ W.T + b with W (out, in), as PyTorch's
does. So every 2-d weight inside a block is transposed on the way, and nothing
else changes.

GPT-2 always has biases: a tinyattn model built with bias=False is written with
zero biases, which compute the same function.

A character vocabulary or a byte-level BPE tokenizer travels as tokenizer.json, in
the format of Hugging Face's `tokenizers` (for characters: every character is a token,
special tokens are added tokens, decoding joins them; see tinyattn/tokenizers/hf.py), which
``transformers.AutoTokenizer.from_pretrained(folder)`` reads. GPT-2's own BPE
tokenizer files in a folder are left alone: from_hf reads the weights only.
"""
import json
import os

from ..backend import get_backend
from ..safetensors import read_safetensors, save_safetensors
from ..tokenizers.hf import read_hf_tokenizer, write_json
from . import llama

np = get_backend("cpu").xp          # weights travel through host memory

PREFIX = "transformer."
GELUS = {"tanh": "gelu_new", "none": "gelu"}                # tinyattn's GELU -> GPT-2's activation_function
FROM_HF_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}   # the same two formulas
LAYER_NORM_EPS = 1e-5                                      # tinyattn's LayerNorm; GPT-2's default too
SKIPPED = (".attn.bias", ".attn.masked_bias")              # old GPT-2 files keep the causal mask as a buffer


def is_conv1d(name):
    """A 2-d weight inside a block: stored (in, out) by GPT-2, (out, in) here."""
    return name.startswith("h.") and name.endswith(".weight") and (".attn." in name or ".mlp." in name)


def gpt2_state(model):
    """-> (tensors, config): the model's weights under GPT-2's names, float32, and its config.json."""
    config = model.config
    tensors = {}
    for name, p in model.state_dict().items():
        a = p.numpy().astype(np.float32)
        tensors[PREFIX + name] = np.ascontiguousarray(a.T) if is_conv1d(name) else a
    if not config.bias:                                     # GPT-2 has biases: zeros compute the same
        for name, p in model.state_dict().items():
            if name.endswith(".weight") and not name.startswith(("wte", "wpe")):
                rows = p.shape[0]                           # Linear (out, in) or LayerNorm (C,)
                tensors[PREFIX + name[:-len("weight")] + "bias"] = np.zeros(rows, np.float32)
    hf_config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.block_size,
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": None,                                    # 4 * n_embd
        "activation_function": GELUS[config.gelu],
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "layer_norm_epsilon": LAYER_NORM_EPS,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "bos_token_id": None,                               # GPT-2's are 50256: not in a small vocabulary
        "eos_token_id": None,
        "torch_dtype": "float32",
    }
    return tensors, hf_config


def export_hf(model, folder, chars=None, tokenizer=None):
    """Write ``folder``/config.json and ``folder``/model.safetensors for
    ``transformers.GPT2LMHeadModel.from_pretrained(folder)`` (a model with the modern block's
    choices: for ``LlamaForCausalLM``, see llama.py); with ``tokenizer`` (a tinyattn
    CharTokenizer or BPE) or ``chars`` (the token of each id: characters, and special tokens
    such as <|user|>, which are longer) also tokenizer.json and tokenizer_config.json."""
    config = model.config
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"export_hf: {folder} is a file; give a folder to write config.json and model.safetensors into")
    if chars is not None and tokenizer is not None:
        raise ValueError("export_hf: give chars or tokenizer, not both")
    if chars is not None:
        from ..tokenizers import CharTokenizer
        tokenizer = CharTokenizer(chars, special_tokens=[c for c in chars if len(c) != 1])
    if tokenizer is not None and tokenizer.kind == "char" and tokenizer.vocab_size != config.vocab_size:
        raise ValueError(f"export_hf: {tokenizer.vocab_size} characters for a vocabulary of {config.vocab_size} tokens")
    if tokenizer is not None and tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"export_hf: the tokenizer has {tokenizer.vocab_size} ids, more than the model's "
                         f"{config.vocab_size}")
    if llama.is_gpt2(config):
        tensors, hf_config = gpt2_state(model)
    else:                                                   # the modern block travels as Llama (llama.py)
        tensors, hf_config = llama.to_llama(model)
    os.makedirs(folder, exist_ok=True)
    save_safetensors(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    write_json(os.path.join(folder, "config.json"), hf_config)
    if tokenizer is not None:
        from ..tokenizers import ENDOFTEXT
        from ..tokenizers.hf import char_to_hf_json, to_hf_json
        tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast",
                            "clean_up_tokenization_spaces": False,   # else decode() moves spaces around punctuation
                            "model_max_length": config.block_size}
        as_json = char_to_hf_json if tokenizer.kind == "char" else to_hf_json
        write_json(os.path.join(folder, "tokenizer.json"), as_json(tokenizer))
        if ENDOFTEXT in tokenizer.special_tokens:                   # GPT-2's name for it: the tokenizer's eos
            tokenizer_config["eos_token"] = ENDOFTEXT
        write_json(os.path.join(folder, "tokenizer_config.json"), tokenizer_config)


def read_chars(folder):
    """The character vocabulary that export_hf wrote into ``folder`` (a list: token id ->
    character, or special token), or None when the folder holds some other tokenizer, or none.
    read_tokenizer gives the tokenizer itself."""
    tok = read_hf_tokenizer(folder)
    return tok.chars if tok is not None and tok.kind == "char" else None


def read_tokenizer(folder):
    """The tokenizer (a CharTokenizer or a byte-level BPE) that export_hf wrote into ``folder``,
    or None when the folder holds some other tokenizer, or none."""
    return read_hf_tokenizer(folder)


def config_from_hf(hf, where):
    """GPT-2's config.json (a dict) -> the keyword arguments of a GPTConfig, or a ValueError
    naming the first field that tinyattn's GPT cannot represent."""
    def refuse(field, why):
        raise ValueError(f"{where}: cannot load: {field} is {hf.get(field)!r}; {why}")

    if not isinstance(hf, dict):
        raise ValueError(f"{where}: config.json holds a JSON {type(hf).__name__}, not an object")
    if hf.get("model_type", "gpt2") != "gpt2":
        refuse("model_type", "only GPT-2's architecture (model_type 'gpt2') and Llama's ('llama') are supported")
    for field in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
        if not isinstance(hf.get(field), int) or hf[field] < 1:
            refuse(field, "it must be a positive integer")
    n_embd = hf["n_embd"]
    if hf.get("n_inner") not in (None, 4 * n_embd):
        refuse("n_inner", f"tinyattn's MLP is 4 * n_embd = {4 * n_embd} wide")
    if hf.get("activation_function", "gelu_new") not in FROM_HF_GELU:
        refuse("activation_function", f"tinyattn's GPT has {', '.join(FROM_HF_GELU)}")
    eps = hf.get("layer_norm_epsilon", LAYER_NORM_EPS)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or abs(eps - LAYER_NORM_EPS) > 1e-12:
        refuse("layer_norm_epsilon", f"tinyattn's LayerNorm uses {LAYER_NORM_EPS}")
    if not hf.get("tie_word_embeddings", True):
        refuse("tie_word_embeddings", "tinyattn's GPT ties its output head to the token embedding")
    if not hf.get("scale_attn_weights", True):
        refuse("scale_attn_weights", "tinyattn's attention always scales by 1/sqrt(head size)")
    if hf.get("scale_attn_by_inverse_layer_idx", False):
        refuse("scale_attn_by_inverse_layer_idx", "tinyattn's attention scales every layer alike")
    if hf.get("add_cross_attention", False):
        refuse("add_cross_attention", "tinyattn's GPT is a decoder only")
    if hf.get("reorder_and_upcast_attn", False):
        refuse("reorder_and_upcast_attn", "tinyattn computes attention in the model's own dtype")
    if n_embd % hf["n_head"]:
        refuse("n_head", f"n_embd {n_embd} must be divisible by it")
    drops = {hf.get(f, 0.1) for f in ("resid_pdrop", "embd_pdrop", "attn_pdrop")}
    for f in ("resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if isinstance(hf.get(f, 0.1), bool) or not isinstance(hf.get(f, 0.1), (int, float)) or not 0 <= hf.get(f, 0.1) < 1:
            refuse(f, "a dropout probability is a number in [0, 1)")
    if len(drops) > 1:
        refuse("attn_pdrop", "tinyattn's GPT has one dropout for embeddings, attention and residuals "
                             "(resid_pdrop, embd_pdrop and attn_pdrop must be equal)")
    return dict(block_size=hf["n_positions"], vocab_size=hf["vocab_size"], n_layer=hf["n_layer"],
                n_head=hf["n_head"], n_embd=n_embd, dropout=float(drops.pop()), bias=True,
                gelu=FROM_HF_GELU[hf.get("activation_function", "gelu_new")])


def from_hf(cls, folder, **overrides):
    """A GPT (class ``cls``) with the weights of a GPT-2 folder: config.json and
    model.safetensors (or the shards that model.safetensors.index.json lists).
    ``overrides``: settings that leave the weights alone (dropout, head_dropout)."""
    config_path = os.path.join(folder, "config.json")
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"{folder}: no config.json (is it a Hugging Face model folder?)")
    try:
        with open(config_path, encoding="utf-8") as f:
            hf = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{config_path}: not valid JSON ({e})") from None
    from .gpt import GPTConfig
    wrong = sorted(set(overrides) - {"dropout", "head_dropout"})
    if wrong:
        raise TypeError(f"from_hf: {', '.join(wrong)} cannot be changed: the weights fix it")
    arrays = {}
    for path in _weight_files(folder):
        arrays.update(read_safetensors(path)[0])
    is_llama = isinstance(hf, dict) and hf.get("model_type") == "llama"
    if is_llama:                                                      # the modern block (llama.py)
        config = GPTConfig(**{**llama.config_from_llama(hf, folder), **overrides})
        state = llama.from_llama_state(arrays, config, folder)
    else:
        config = GPTConfig(**{**config_from_hf(hf, folder), **overrides})
        state = gpt2_names(arrays, folder)
    model = cls(config)
    own = model.state_dict()
    missing = [n for n in own if n not in state]
    unexpected = [n for n in state if n not in own]
    if missing or unexpected:
        raise ValueError(f"{folder}: not {'Llama' if is_llama else 'GPT-2'}'s weights: missing {_few(missing)}, "
                         f"unexpected {_few(unexpected)}")
    for name, a in state.items():
        a = a.T if is_conv1d(name) and not is_llama else a
        if a.shape != own[name].shape:
            raise ValueError(f"{folder}: {name} is {a.shape}, but config.json makes it {own[name].shape}")
        state[name] = np.ascontiguousarray(a, dtype=np.float32)       # row-major, as a new Linear's weight
    model.load_state_dict(state)
    return model


def gpt2_names(arrays, folder):
    """GPT-2's tensors (name -> array) under tinyattn's names (the head, tied, left out)."""
    state = {}
    for name, a in arrays.items():
        state[name[len(PREFIX):] if name.startswith(PREFIX) else name] = a
    for name in [n for n in state if n.endswith(SKIPPED)]:
        del state[name]
    head = state.pop("lm_head.weight", None)
    if head is not None and not np.array_equal(head, state.get("wte.weight")):
        raise ValueError(f"{folder}: cannot load: lm_head.weight differs from wte.weight (an untied head); "
                         "tinyattn's GPT ties them")
    return state


def _weight_files(folder):
    single = os.path.join(folder, "model.safetensors")
    index = single + ".index.json"
    if os.path.isfile(single):
        return [single]
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(folder, s) for s in shards]
    hint = " (only pytorch_model.bin, which needs PyTorch to read: load it in transformers and " \
           "save_pretrained it again, which writes safetensors)" if os.path.isfile(
               os.path.join(folder, "pytorch_model.bin")) else ""
    raise FileNotFoundError(f"{folder}: no model.safetensors{hint}")


def _few(names, n=3):
    return "none" if not names else ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")
