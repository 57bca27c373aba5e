"""Tests for tinyattn.tokenizers.BPE: training, encoding by rank, special tokens, files.

The merges are checked against tiktoken's educational trainer and the encoding against
tiktoken's encoder (both skip without tiktoken), and the fast training loop against a
plain recount of every pair at every merge. The texts are generated here.
"""
import base64
import collections
import importlib.util
import itertools
import random

import pytest

regex = pytest.importorskip("regex")   # the split pattern needs it (pip install regex)

from hypothesis import given, settings, strategies as st

from tinyattn.tokenizers import BPE, ENDOFTEXT, GPT2_PATTERN
from tinyattn.tokenizers import bpe as bpe_module

SYLLABLES = ["th", "e", "an", "re", "on", "at", "en", "nd", "ti", "es", "or", "te", "of", "ed",
             "is", "it", "al", "ar", "st", "to", "nt", "ng", "se", "ha", "as", "ou", "io", "le"]


def generated_text(n_chars, seed=0):
    """Deterministic text of varied words: capitals, apostrophes, numbers, punctuation,
    blank lines, runs of spaces, and a few words in other scripts."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    cum_weights = list(itertools.accumulate(1 / (i + 1) for i in range(len(words))))   # Zipf-like
    others = ["naïve", "café", "Straße", "жизнь", "東京", "😀", "ça"]
    out, size = [], 0
    while size < n_chars:
        r = rng.random()
        if r < 0.02:
            w = rng.choice(others)
        elif r < 0.04:
            w = str(rng.randint(0, 2000))
        else:
            w = rng.choices(words, cum_weights=cum_weights)[0]
            if rng.random() < 0.1:
                w = w.capitalize()
            if rng.random() < 0.05:
                w += rng.choice(["'s", "'ll", "'d", "'t"])
        sep = rng.choices([" ", ", ", ". ", "\n", "\n\n", "   ", "! ", "? ", ": "],
                          [60, 8, 8, 6, 2, 1, 1, 1, 1])[0]
        out.append(w + sep)
        size += len(w) + len(sep)
    return "".join(out)[:n_chars]


@pytest.fixture(scope="module")
def text():
    return generated_text(60_000)


@pytest.fixture(scope="module")
def tok(text):
    return BPE.train(text, 400)


# ---- training ---------------------------------------------------------------

def recount_merges(text, vocab_size, pattern=GPT2_PATTERN):
    """The slow reference: recount every pair of every piece at every merge; the most
    frequent wins, ties to the pair seen first (a dict keeps the order of insertion)."""
    words = [list(p.encode("utf-8")) for p in regex.findall(pattern, text)]
    vocab = {i: bytes([i]) for i in range(256)}
    merges = []
    while len(vocab) < vocab_size:
        counts = {}
        for ids in words:
            for pair in zip(ids, ids[1:]):
                counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            break
        pair = max(counts, key=counts.get)       # the first of the most frequent
        token = vocab[pair[0]] + vocab[pair[1]]
        new_id = next((i for i, t in vocab.items() if t == token), len(vocab))
        vocab[new_id] = token
        merges.append((pair[0], pair[1], new_id))
        words = [bpe_module.merge(ids, pair, new_id) for ids in words]
    return merges


def pieces_of(text):
    return collections.Counter(p.encode("utf-8") for p in regex.findall(GPT2_PATTERN, text))


def test_merge():
    assert bpe_module.merge([5, 6, 5, 6, 7], (5, 6), 300) == [300, 300, 7]
    assert bpe_module.merge([1, 1, 1], (1, 1), 300) == [300, 1]
    assert bpe_module.merge([1, 1, 1, 1], (1, 1), 300) == [300, 300]
    assert bpe_module.merge([], (1, 1), 300) == []


def test_incremental_training_equals_recount(text):
    merges, _ = bpe_module.train_merges(pieces_of(text[:8000]), 340)
    assert merges == recount_merges(text[:8000], 340)


# small alphabets make many ties and long runs ("aaaa"), where the bookkeeping is hardest
@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="ab c\nd'é", max_size=300), st.integers(256, 300))
def test_incremental_training_equals_recount_on_small_texts(s, vocab_size):
    merges, vocab = bpe_module.train_merges(pieces_of(s), vocab_size)
    assert merges == recount_merges(s, vocab_size)
    assert len(set(vocab)) == len(vocab)            # one id per token's bytes


def test_merges_equal_tiktoken_educational(text):
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken._educational import bpe_train
    head = text[:25_000]
    for vocab_size in (300, 512):
        theirs = bpe_train(head, vocab_size, GPT2_PATTERN, visualise=None)
        ours = BPE.train(head, vocab_size, special_tokens=[])
        assert list(ours.ranks.items()) == list(theirs.items()), vocab_size   # merge for merge
        # and with those ranks, the rest of the text encodes as tiktoken's encoder does
        enc = tiktoken.Encoding("t", pat_str=GPT2_PATTERN, mergeable_ranks=ours.ranks, special_tokens={})
        assert ours.encode(text[25_000:]) == enc.encode_ordinary(text[25_000:])


def test_train_sizes_and_special_ids(text):
    tok = BPE.train(text, 300, special_tokens=[ENDOFTEXT, "<|pad|>"])
    assert len(tok.ranks) == 300 and sorted(tok.ranks.values()) == list(range(300))
    assert tok.special_tokens == {ENDOFTEXT: 300, "<|pad|>": 301}
    assert tok.n_vocab == tok.vocab_size == 302
    assert BPE.train("ab ab", 1000, special_tokens=[]).n_vocab == 258   # ab, " ab"; then no pair is left
    assert BPE.train(text, 256).n_vocab == 257


def test_train_never_merges_into_special_tokens():
    s = "".join(f"hello {i}{ENDOFTEXT}" for i in range(200))
    tok = BPE.train(s, 300)
    assert not any(b"<|" in t or b"|>" in t for t in tok.ranks)   # as text, "<|" would merge
    assert tok.encode(s, allowed_special="all").count(tok.special_tokens[ENDOFTEXT]) == 200


def test_train_bad_input():
    with pytest.raises(ValueError, match="at least 256"):
        BPE.train("abc", 255)
    with pytest.raises(ValueError, match="distinct"):
        BPE.train("abc", 300, special_tokens=["<a>", "<a>"])
    with pytest.raises(ValueError, match="bad split pattern"):
        BPE.train("abc", 300, pattern="(")


# ---- encoding and decoding --------------------------------------------------

ROUND_TRIPS = {
    "empty": "",
    "whitespace runs": " \t\n  \n\n\n      x    \r\n\t\t  " + " " * 500 + "\n" * 300,
    "emoji": "😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵🇫🇷 ✨",
    "combining marks": "e\u0301 a\u0308\u0304 Z\u0351\u0352\u0357\u0350 \u0915\u094d\u0937 \u05e9\u05c1\u05b8",
    "cjk": "東京は日本の首都です。我爱自然语言处理。한국어 텍스트",
    "mixed scripts": "Hello, Здравствуй, مرحبا, שלום, नमस्ते 123 ½ ² x²+y² it's 'quoted' ",
    "control and odd": "\x00\x01\x7f \ufeff\ufffd \U0010ffff \u2028 \u00a0",
}


@pytest.mark.parametrize("name", list(ROUND_TRIPS))
@pytest.mark.parametrize("fast", [True, False])
def test_round_trip(tok, name, fast, monkeypatch):
    if not fast:
        monkeypatch.setenv(bpe_module.CPU_KERNELS_ENV, "0")
    t = BPE(tok.ranks, tok.pattern, tok.special_tokens)
    s = ROUND_TRIPS[name]
    ids = t.encode(s)
    assert t.decode(ids) == s
    assert t.decode_bytes(ids) == s.encode("utf-8")
    assert all(0 <= i < t.n_vocab for i in ids)


def test_round_trip_1mb(tok):
    s = generated_text(1_000_000, seed=1) + "".join(ROUND_TRIPS.values())
    ids = tok.encode(s)
    assert len(ids) < len(s.encode("utf-8"))
    assert tok.decode(ids) == s


def test_any_ids_decode(tok):
    rng = random.Random(0)
    for _ in range(200):
        ids = [rng.randrange(tok.n_vocab) for _ in range(rng.randint(0, 50))]
        b = tok.decode_bytes(ids)
        assert b == b"".join(tok.token_bytes(i) for i in ids)
        assert tok.decode(ids) == b.decode("utf-8", errors="replace")
    assert tok.decode([0xE6, 0x9D]) == "\ufffd"             # half a character
    for bad in ([tok.n_vocab], [-1], [3, 10**9]):
        with pytest.raises(ValueError, match="not in this tokenizer"):
            tok.decode(bad)


@pytest.mark.parametrize("fast", [True, False])
def test_encoding_equals_tiktoken(tok, text, fast, monkeypatch):
    tiktoken = pytest.importorskip("tiktoken")
    if not fast:
        monkeypatch.setenv(bpe_module.CPU_KERNELS_ENV, "0")
    ours = BPE(tok.ranks, tok.pattern, tok.special_tokens)
    enc = tiktoken.Encoding("t", pat_str=GPT2_PATTERN, mergeable_ranks=tok.ranks,
                            special_tokens=tok.special_tokens)
    for s in [generated_text(50_000, seed=2), *ROUND_TRIPS.values(), "aaaaaaaaaaaaaaaaaaaaaaaa"]:
        assert ours.encode(s) == enc.encode(s)
    s = f"one{ENDOFTEXT}two"
    assert ours.encode(s, allowed_special="all") == enc.encode(s, allowed_special="all")
    assert ours.encode_ordinary(s) == enc.encode_ordinary(s)


def test_encode_piece_by_rank():
    # ranks: "ab" before "bc": "abc" becomes ab + c, though "bc" is a token too
    ranks = {bytes([b]): b for b in range(256)}
    ranks.update({b"ab": 256, b"bc": 257, b"abc": 258, b"bcd": 259})
    assert bpe_module.encode_piece(b"abc", ranks) == [258]
    assert bpe_module.encode_piece(b"abcd", ranks) == [258, ord("d")]   # ab, abc, then no abcd
    assert bpe_module.encode_piece(b"bcd", ranks) == [259]
    assert bpe_module.encode_piece(b"", ranks) == []


def test_fast_encoding_equals_plain(tok):
    pytest.importorskip("numba")
    from tinyattn.tokenizers.fast import PairTable
    table = PairTable(tok.ranks)
    rng = random.Random(3)
    pieces = [bytes(rng.randrange(256) for _ in range(rng.randint(0, 12))) for _ in range(2000)]
    pieces += [p.encode("utf-8") for p in regex.findall(GPT2_PATTERN, generated_text(20_000, seed=4))]
    assert table.encode_pieces(pieces) == [bpe_module.encode_piece(p, tok.ranks) for p in pieces]


def test_encode_bad_input(tok):
    with pytest.raises(TypeError, match="str"):
        tok.encode(b"bytes")
    with pytest.raises(ValueError, match="not special tokens"):
        tok.encode("x", allowed_special={"<|nope|>"})


# ---- special tokens ---------------------------------------------------------

def test_special_tokens(text):
    tok = BPE.train(text[:20_000], 300, special_tokens=[ENDOFTEXT, "<|end|>", "<|end|>x"])
    s = f"a{ENDOFTEXT}b<|end|>xc<|end|>"
    with pytest.raises(ValueError, match="special token"):
        tok.encode(s)                                        # refused unless allowed
    with pytest.raises(ValueError, match="<\\|end\\|>"):
        tok.encode(s, allowed_special={ENDOFTEXT, "<|end|>x"})
    ids = tok.encode(s, allowed_special="all")
    sp = tok.special_tokens
    assert [i for i in ids if i >= 300] == [sp[ENDOFTEXT], sp["<|end|>x"], sp["<|end|>"]]  # longest first
    assert tok.decode(ids) == s
    plain = tok.encode_ordinary(s)                           # the same text, as ordinary text
    assert all(i < 300 for i in plain) and tok.decode(plain) == s
    assert tok.encode("no special here") == tok.encode_ordinary("no special here")


# ---- files --------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["merges", "tiktoken"])
def test_save_load(tok, text, tmp_path, fmt):
    path = tmp_path / f"tok.{fmt}"
    tok.save(path, format=fmt)
    back = BPE.load(path)
    assert back.ranks == tok.ranks and back.pattern == tok.pattern
    assert back.special_tokens == tok.special_tokens        # tiktoken's: <|endoftext|> after the ranks
    s = text[:5000] + ROUND_TRIPS["emoji"]
    assert back.encode(s) == tok.encode(s)
    assert [p for p in tmp_path.iterdir()] == [path]         # no temporary file left behind


def test_merges_file_layout(tmp_path):
    tok = BPE.train("aaab aaab aaab", 258, special_tokens=["<s>"])
    tok.save(tmp_path / "t.bpe")
    assert (tmp_path / "t.bpe").read_text().splitlines() == [
        "tinyattn bpe v1", "pattern " + __import__("json").dumps(GPT2_PATTERN), 'special 258 "<s>"',
        "merges 2", "97 97", "256 97"]          # the merges as learned


def test_from_tiktoken_file(tmp_path):
    # a rank file whose bytes are not in byte order, as GPT-2's is not
    order = list(range(256))
    random.Random(5).shuffle(order)
    ranks = {bytes([b]): i for i, b in enumerate(order)}
    ranks[b"he"] = 256
    ranks[b"hel"] = 257
    lines = [f"{base64.b64encode(t).decode()} {i}" for t, i in ranks.items()]
    (tmp_path / "r.tiktoken").write_text("\n".join(lines) + "\n")
    tok = BPE.from_tiktoken(tmp_path / "r.tiktoken", special_tokens={"<|x|>": 300})
    assert tok.encode("hello") == [257, ranks[b"l"], ranks[b"o"]]
    assert tok.decode(tok.encode("hello")) == "hello"
    with pytest.raises(ValueError, match="format='tiktoken'"):
        tok.save(tmp_path / "r.bpe")                         # bytes are not ids 0..255
    tok.save(tmp_path / "again.tiktoken", format="tiktoken")
    assert BPE.from_tiktoken(tmp_path / "again.tiktoken").ranks == ranks


def test_bad_files(tmp_path):
    (tmp_path / "bad.tiktoken").write_text("not base64 at all\n")
    with pytest.raises(ValueError, match="bad.tiktoken:1"):
        BPE.load(tmp_path / "bad.tiktoken")
    (tmp_path / "short.tiktoken").write_text("YQ== 0\n")
    with pytest.raises(ValueError, match="single bytes"):
        BPE.load(tmp_path / "short.tiktoken")
    (tmp_path / "cut.bpe").write_text("tinyattn bpe v1\npattern \"x\"\nmerges 3\n97 97\n")
    with pytest.raises(ValueError, match="not a tinyattn BPE file"):
        BPE.load(tmp_path / "cut.bpe")
    with pytest.raises(ValueError, match="no such file"):
        BPE.load(tmp_path / "missing.bpe")


def test_dict_round_trip(tok):
    back = BPE.from_dict(tok.to_dict())
    assert back.ranks == tok.ranks and back.special_tokens == tok.special_tokens
    with pytest.raises(ValueError, match="not a BPE tokenizer"):
        BPE.from_dict({"kind": "bpe"})


def test_long_pieces_encode_as_short_ones_do(tok):
    # a long piece takes the heap path (encode_long_piece and its compiled twin): same ids
    rng = random.Random(6)
    for n in (bpe_module.LONG_PIECE + 1, 1000, 3000):
        for alphabet in ("etaoinshr", "ab", " ", "th e"):
            piece = "".join(rng.choice(alphabet) for _ in range(n)).encode()
            want = bpe_module.encode_piece(piece, tok.ranks)
            assert bpe_module.encode_long_piece(piece, tok.ranks) == want
            if importlib.util.find_spec("numba"):
                from tinyattn.tokenizers.fast import PairTable
                assert PairTable(tok.ranks).encode_pieces([piece]) == [want]


@pytest.mark.parametrize("fast", [True, False])
def test_a_pattern_that_skips_text(tok, fast, monkeypatch):
    # pieces that do not cover the text (here the spaces are dropped) take the per-piece path
    if not fast:
        monkeypatch.setenv(bpe_module.CPU_KERNELS_ENV, "0")
    t = BPE(tok.ranks, r"[a-zé]+")
    ids = t.encode("the cat  é sat!")
    assert ids == [i for w in ("the", "cat", "é", "sat") for i in bpe_module.encode_piece(w.encode(), tok.ranks)]
    assert t.decode(ids) == "thecatésat"
