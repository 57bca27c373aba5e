"""Tokenizers: text to token ids and back.

    from tinyattn.tokenizers import BPE
    tok = BPE.train(text, vocab_size=4096)      # byte-level BPE, GPT-2's split pattern
    ids = tok.encode("Hello world")
    tok.decode(ids)                             # 'Hello world'
"""
from .bpe import BPE, GPT2_PATTERN, ENDOFTEXT
from .char import CharTokenizer

__all__ = ["BPE", "CharTokenizer", "GPT2_PATTERN", "ENDOFTEXT"]
