"""A BPE tokenizer in and out of Hugging Face's tokenizer.json (the `tokenizers` library's format).

Hugging Face's byte-level BPE (GPT-2's tokenizer.json) stores each token as a string,
not as bytes: every byte is drawn as one printable character (byte_chars), so that
b" the" is written "Ġthe". The rest maps one to one:

    tinyattn BPE                      tokenizer.json
    pattern (the split regex)         pre_tokenizer: Split on the regex, then ByteLevel
    ranks {token bytes: id}           model.vocab {token string: id}
    (pairs that join into a token)    model.merges, in the order of the tokens they make
    special_tokens {name: id}         added_tokens, "special": true

tinyattn merges by rank, as tiktoken does: any adjacent pair whose bytes form a token
may join, the lowest-ranked token first. `tokenizers` joins only the pairs its merges
list, in list order. So every way of cutting a token into two tokens is listed, at the
token's place in the order; and ignore_merges (a piece that is a whole token stays one)
matches tinyattn's shortcut for such pieces.

A character vocabulary travels in the same file (char_to_hf_json), and a chat model's
template, end token and generation config next to it (write_chat_config).
"""
import json
import os

from .bpe import BPE


def byte_chars():
    """[the character that stands for byte b, for b in 0..255] (GPT-2's table).

    Printable Latin-1 bytes stand for themselves; the others (control bytes, space,
    and a few more) take the characters from U+0100 on, in byte order.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    out, extra = [], 0
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def to_hf_json(tok):
    """A BPE tokenizer as a dict in tokenizer.json's layout (json.dump writes the file)."""
    chars = byte_chars()

    def name(token_bytes):
        return "".join(chars[b] for b in token_bytes)

    merges = []
    for token, rank in sorted(tok.ranks.items(), key=lambda kv: kv[1]):
        for cut in range(1, len(token)):                   # every split into two tokens, at this rank
            if token[:cut] in tok.ranks and token[cut:] in tok.ranks:
                merges.append([name(token[:cut]), name(token[cut:])])
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for s, i in sorted(tok.special_tokens.items(), key=lambda kv: kv[1])]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": tok.pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": {name(t): i for t, i in sorted(tok.ranks.items(), key=lambda kv: kv[1])},
                  "merges": merges},
    }


def from_hf_json(d):
    """to_hf_json's dict -> the BPE tokenizer, or None when d is some other tokenizer
    (not byte-level BPE split by one regex). A damaged vocabulary is a ValueError."""
    model, pre = d.get("model"), d.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not isinstance(model, dict) or model.get("type") != "BPE" or not steps or len(steps) != 2 \
            or steps[0].get("type") != "Split" or steps[1].get("type") != "ByteLevel":
        return None
    pattern = (steps[0].get("pattern") or {}).get("Regex")
    byte_of = {c: b for b, c in enumerate(byte_chars())}
    try:
        ranks = {bytes(byte_of[c] for c in s): i for s, i in model["vocab"].items()}
    except (KeyError, TypeError) as e:
        raise ValueError(f"a byte-level BPE vocabulary holds a character that stands for no byte ({e})") from None
    specials = {t["content"]: t["id"] for t in d.get("added_tokens", []) if t.get("special")}
    return BPE(ranks, pattern, specials)


# --- a character vocabulary --------------------------------------------------------------

CHAR_SPLIT = "[\\s\\S]"                                     # a regex for "any one character", newlines too


def char_to_hf_json(tok):
    """A CharTokenizer as a dict in tokenizer.json's layout: its special tokens (a chat's
    <|user|>, say) are added tokens, matched in the text before anything else; the rest of the
    text is split into single characters, each looked up (WordLevel), and decoding joins them
    back (Fuse). So transformers encodes a text to the ids tinyattn gives it, with the special
    tokens allowed: one id each.

    WordLevel needs an unknown token for a character it has not seen. The model has no row
    for one, so an unseen character reads as the space (or, without one, the first character)."""
    chars = tok.chars
    ordinary = [c for c in chars if c not in tok.special_tokens]
    unknown = " " if " " in chars else (ordinary or chars)[0]
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for s, i in sorted(tok.special_tokens.items(), key=lambda kv: kv[1])]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": CHAR_SPLIT}, "behavior": "Isolated",
                              "invert": False},
            "post_processor": None,
            "decoder": {"type": "Fuse"},
            "model": {"type": "WordLevel", "vocab": {c: i for i, c in enumerate(chars)}, "unk_token": unknown}}


def char_from_hf_json(d, where="tokenizer.json"):
    """char_to_hf_json's dict -> the CharTokenizer, or None when d is some other tokenizer.
    A vocabulary that is not single characters and added tokens, numbered 0 to n - 1, is a
    ValueError."""
    from .char import CharTokenizer
    model = d.get("model") if isinstance(d, dict) else None
    split = (d.get("pre_tokenizer") or {}).get("pattern", {}).get("Regex") if isinstance(d, dict) else None
    if not isinstance(model, dict) or model.get("type") != "WordLevel" or split != CHAR_SPLIT:
        return None
    vocab = model.get("vocab") or {}
    chars = sorted(vocab, key=vocab.get)
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise ValueError(f"{where}: a character vocabulary needs ids numbered 0 to {len(vocab) - 1}")
    added = {t.get("content"): t.get("id") for t in d.get("added_tokens") or [] if isinstance(t, dict)}
    wrong = [s for s, i in added.items() if vocab.get(s) != i]
    if wrong:
        raise ValueError(f"{where}: the added token {wrong[0]!r} has id {added[wrong[0]]}, not its vocabulary id "
                         f"{vocab.get(wrong[0])}")
    longer = [c for c in chars if len(c) != 1 and c not in added]
    if longer:
        raise ValueError(f"{where}: {longer[0]!r} is longer than one character but not an added token "
                         "(an export from an older tinyattn: export the checkpoint again)")
    return CharTokenizer(chars, special_tokens=sorted(added, key=added.get))


def read_hf_tokenizer(folder):
    """The tinyattn tokenizer in ``folder``/tokenizer.json (a CharTokenizer or a byte-level BPE,
    as GPT.export_hf writes them), or None when there is no such file or it holds some other
    tokenizer. A damaged file is a ValueError naming it."""
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(d, dict):
        return None
    return char_from_hf_json(d, path) or from_hf_json(d)


# --- a chat model: its template, its end token, its generation config ----------------------

def _quoted(text):
    """text as a Jinja string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def chat_template(roles, end):
    """A Jinja chat template (transformers' ``apply_chat_template``) that renders a conversation
    as tinyattn's chat format does: each message its role's token, its text and ``end``,

        <|system|>Be brief.<|end|><|user|>spell cat<|end|><|assistant|>c a t<|end|>

    and with ``add_generation_prompt`` the assistant's token after the last message.
    ``roles``: {"user": token, "assistant": token} and, where the tokenizer has one, "system".
    Like data/chat.py it refuses (raise_exception) a system message that is not first, a
    system message where there is no system token, and messages that do not alternate
    user, assistant, ... from the user."""
    user, assistant = _quoted(roles["user"]), _quoted(roles["assistant"])
    end = _quoted(end)
    if roles.get("system"):
        system = ("{%- if not loop.first -%}{{ raise_exception('a system message must be the first message') }}"
                  "{%- endif -%}"
                  f"{{{{- {_quoted(roles['system'])} + message['content'] + {end} -}}}}")
    else:
        system = "{{ raise_exception('this model has no system token: it was fine-tuned without system messages') }}"
    return (
        "{%- set offset = 1 if messages and messages[0]['role'] == 'system' else 0 -%}"
        "{%- for message in messages -%}"
        "{%- if message['role'] == 'system' -%}" + system +
        "{%- else -%}"
        "{%- set want = 'user' if (loop.index0 - offset) % 2 == 0 else 'assistant' -%}"
        "{%- if message['role'] != want -%}{{ raise_exception('message ' ~ loop.index0 ~ ' is from the ' ~ "
        "message['role'] ~ '; messages alternate user, assistant, ... from the user') }}{%- endif -%}"
        f"{{{{- ({user} if message['role'] == 'user' else {assistant}) + message['content'] + {end} -}}}}"
        "{%- endif -%}"
        "{%- endfor -%}"
        f"{{%- if add_generation_prompt -%}}{{{{- {assistant} -}}}}{{%- endif -%}}"
    )


def write_chat_config(folder, special_tokens, roles, end, max_length=None):
    """Make the Hugging Face folder ``folder`` a chat model's: its tokenizer_config.json gets
    ``chat_template`` (chat_template(roles, end)) and ``eos_token`` ``end``, and
    generation_config.json makes ``generate`` stop at ``end`` (eos_token_id; also the pad id,
    so batches of prompts need no other).

    ``special_tokens``: {token: id} of the folder's tokenizer, which must hold ``end`` and every
    role's token. tokenizer_config.json is read if it is there (other exporters' settings stay)."""
    missing = [t for t in [*roles.values(), end] if t not in special_tokens]
    if missing:
        raise ValueError(f"write_chat_config: the tokenizer has no special token {missing[0]!r}")
    path = os.path.join(folder, "tokenizer_config.json")
    config = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    config.update(chat_template=chat_template(roles, end), eos_token=end)
    write_json(path, config)
    generation = {"eos_token_id": special_tokens[end], "pad_token_id": special_tokens[end]}
    if max_length is not None:
        generation["max_length"] = max_length           # prompt and answer: the model's block_size
    write_json(os.path.join(folder, "generation_config.json"), generation)


def write_json(path, obj):
    """``obj`` as JSON at ``path``: a temporary file, then a rename, so never half a file."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
