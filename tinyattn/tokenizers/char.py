"""One token per character: nanoGPT's shakespeare_char tokenizer, with special tokens.

    tok = CharTokenizer.from_text(text)          # the sorted set of the text's characters
    tok.encode("to be"), tok.decode([...])

Special tokens (a chat's <|user|>, say) are strings that take one id each. A tokenizer
grows without moving an id (``extended``): new characters and special tokens take the ids
after the last one, so a trained model keeps its embedding rows and gets new ones.
"""


class CharTokenizer:
    """``chars``: the token of each id, in order (a character, or a special token's text);
    ``special_tokens``: those of them that are special tokens."""
    kind = "char"

    def __init__(self, chars, special_tokens=()):
        self.chars = list(chars)
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        if len(self.stoi) != len(self.chars):
            raise ValueError("CharTokenizer: a token appears twice in chars")
        self.special_tokens = {s: self.stoi[s] for s in special_tokens if s in self.stoi}
        missing = [s for s in special_tokens if s not in self.stoi]
        if missing:
            raise ValueError(f"CharTokenizer: special tokens {missing} have no id in chars")
        longer = [c for c in self.chars if len(c) != 1 and c not in self.special_tokens]
        if longer:
            raise ValueError(f"CharTokenizer: {longer[:3]} are longer than one character but not special tokens")

    @classmethod
    def from_text(cls, text):
        return cls(sorted(set(text)))

    @property
    def vocab_size(self):
        return len(self.chars)

    def encode(self, text, allowed_special=()):
        """str -> list of ids. A special token's text is read as one token where it is allowed
        (``allowed_special``: names, or "all"), else as its characters."""
        allowed = set(self.special_tokens) if allowed_special == "all" else set(allowed_special)
        unknown = allowed - set(self.special_tokens)
        if unknown:
            raise ValueError(f"allowed_special names {sorted(unknown)}, which are not special tokens of this "
                             f"tokenizer ({sorted(self.special_tokens)})")
        allowed = sorted(allowed, key=len, reverse=True)       # the longest first, where one begins another
        ids, i = [], 0
        while i < len(text):
            special = next((s for s in allowed if text.startswith(s, i)), None)
            if special is not None:
                ids.append(self.stoi[special])
                i += len(special)
                continue
            if text[i] not in self.stoi:
                raise ValueError(f"character {text[i]!r} is not in the vocabulary")
            ids.append(self.stoi[text[i]])
            i += 1
        return ids

    def decode(self, ids):
        """ids -> str (a special token as its text)."""
        return "".join(self.chars[int(i)] for i in ids)

    def extended(self, chars=(), special_tokens=()):
        """This tokenizer with more characters and special tokens, each after the last id (those
        it has already are skipped): every id it had keeps its token."""
        new = [c for c in dict.fromkeys([*sorted(set(chars)), *special_tokens]) if c not in self.stoi]
        return CharTokenizer(self.chars + new, [*self.special_tokens, *special_tokens])

    def to_dict(self):
        d = {"kind": self.kind, "chars": self.chars}
        if self.special_tokens:                     # (a plain vocabulary writes what it always did)
            d["special_tokens"] = list(self.special_tokens)
        return d

    @classmethod
    def from_dict(cls, d):
        return cls(d["chars"], d.get("special_tokens", ()))
