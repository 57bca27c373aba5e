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
"""
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
