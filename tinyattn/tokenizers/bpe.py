"""Byte-level BPE (byte pair encoding), the tokenizer of GPT-2 and its successors.

Training, in three steps you can read below:
  1. split the text into pieces with a regex (words, numbers, runs of punctuation or
     spaces); pieces never merge with each other. Each piece starts as its UTF-8 bytes,
     token ids 0..255, so any text can be encoded;
  2. count the adjacent pairs of tokens inside the pieces (pair_counts);
  3. the most frequent pair becomes a new token and is replaced everywhere (merge); repeat
     until the vocabulary is full. Ties between equally frequent pairs go to the pair that
     occurs first in the text, as in minbpe and tiktoken's educational trainer, so the
     merges come out the same as theirs.

Encoding a piece applies the learned merges by rank, lowest (learned first) first
(encode_piece), as tiktoken does. Decoding joins the tokens' bytes.

Training is fast because of two things, both in train_merges: each distinct piece is
kept once with the number of times it occurs (tiny Shakespeare's 300k pieces are 15k
distinct ones), and after a merge only the pieces that hold the merged pair are
rewritten, so only their pairs' counts change.
"""
import base64
import collections
import heapq
import itertools
import json
import os
import tempfile
from pathlib import Path

try:
    import regex   # the `re` module has no \p{L} (any letter), which GPT-2's pattern needs
except ImportError:   # pragma: no cover - depends on the environment
    regex = None

# GPT-2's split: 's 't 're 've 'm 'll 'd, words with their leading space, numbers,
# punctuation runs, and whitespace (a run of spaces leaves its last space to the next word)
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
ENDOFTEXT = "<|endoftext|>"
HEADER = "tinyattn bpe v1"
CPU_KERNELS_ENV = "TINYATTN_CPU_KERNELS"   # 0: encode with the plain Python loop, not numba


def _compile(pattern):
    if regex is None:
        raise ImportError("the BPE tokenizer needs the `regex` module for its split pattern: "
                          "pip install regex (or pip install 'tinyattn[bpe]')")
    try:
        return regex.compile(pattern)
    except regex.error as e:
        raise ValueError(f"bad split pattern {pattern!r}: {e}") from None


# ---------------------------------------------------------------------------------------
# Training: the pair count, the merge, and the loop that repeats them
# ---------------------------------------------------------------------------------------

def pair_counts(words, freqs):
    """How often each adjacent pair of tokens occurs in the text: {(a, b): count}.

    words: each distinct piece as a list of token ids; freqs: how often each piece occurs.
    """
    counts = collections.defaultdict(int)
    for ids, freq in zip(words, freqs):
        for pair in zip(ids, ids[1:]):
            counts[pair] += freq
    return counts


def merge(ids, pair, new_id):
    """Replace each occurrence of pair in ids by new_id, from the left.

    merge([5, 6, 5, 6, 7], (5, 6), 300) -> [300, 300, 7];  merge([1, 1, 1], (1, 1), 300) -> [300, 1]
    """
    out = []
    i = 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def train_merges(pieces, n_tokens):
    """Learn merges until there are n_tokens tokens (256 bytes + the merged ones).

    pieces: {piece bytes: how often it occurs}, in the order the pieces first occur in
    the text. Returns (merges, vocab): merges is the list of (a, b, new_id) in the order
    learned; vocab[id] is the token's bytes. Stops early when no pair is left to merge.

    Rather than recounting every pair after each merge (minbpe does, it is simpler and
    slower), this keeps the counts and changes only those of the pieces that hold the pair.
    """
    words = [list(piece) for piece in pieces]     # each distinct piece as token ids (bytes first)
    freqs = list(pieces.values())
    counts = pair_counts(words, freqs)
    where = collections.defaultdict(set)          # pair -> indices of the words holding it
    for w, ids in enumerate(words):
        for pair in zip(ids, ids[1:]):
            where[pair].add(w)

    first = {}                                    # pair -> its first occurrence, while known

    def first_occurrence(pair):
        """(word index, position) of the pair's first occurrence: words are in text order."""
        if pair not in first:
            w = min(where[pair])
            ids = words[w]
            first[pair] = w, next(i for i in range(len(ids) - 1) if (ids[i], ids[i + 1]) == pair)
        return first[pair]

    # buckets[c]: the pairs that occur c times. The most frequent pairs are in buckets[top].
    # A new pair occurs only where the merged pair did, so top mostly moves down; it can
    # rise only when a merge reuses a token that already had pairs of its own.
    buckets = collections.defaultdict(set)
    for pair, c in counts.items():
        buckets[c].add(pair)
    top = max(counts.values(), default=0)
    vocab = [bytes([b]) for b in range(256)]
    ids_of = {tok: i for i, tok in enumerate(vocab)}
    merges = []
    while len(vocab) < n_tokens:
        while top > 0 and not buckets[top]:
            top -= 1
        if top == 0:
            break                                  # every piece is a single token
        # the most frequent pair; among equally frequent ones, the first in the text
        tied = buckets[top]
        pair = min(tied, key=first_occurrence) if len(tied) > 1 else next(iter(tied))
        token = vocab[pair[0]] + vocab[pair[1]]
        new_id = ids_of.get(token)                 # the same bytes may have been made before
        if new_id is None:                         # from another pair: then reuse that token
            new_id = ids_of[token] = len(vocab)
            vocab.append(token)
        merges.append((pair[0], pair[1], new_id))

        delta = collections.defaultdict(int)       # pair -> change of its count
        for w in where.pop(pair):                  # rewrite only the words that hold the pair
            old, freq = words[w], freqs[w]
            new = words[w] = merge(old, pair, new_id)
            for p in zip(old, old[1:]):
                delta[p] -= freq
            for p in zip(new, new[1:]):
                delta[p] += freq
            old_pairs, new_pairs = set(zip(old, old[1:])), set(zip(new, new[1:]))
            for p in old_pairs:                    # their places in the word may have moved
                first.pop(p, None)
            for p in old_pairs - new_pairs:
                where[p].discard(w)
            for p in new_pairs - old_pairs:
                where[p].add(w)
        for p, d in delta.items():                 # new counts, and move pairs to their new buckets
            if d == 0:
                continue
            first.pop(p, None)                     # a new pair may be first somewhere else
            buckets[counts[p]].discard(p)
            counts[p] += d
            if counts[p] > 0:
                buckets[counts[p]].add(p)
                top = max(top, counts[p])
            else:
                del counts[p]                      # gone from the text (the merged pair, too)
                where.pop(p, None)
    return merges, vocab


# ---------------------------------------------------------------------------------------
# Encoding by rank
# ---------------------------------------------------------------------------------------

def encode_piece(piece, ranks):
    """One piece's bytes -> token ids, merging the adjacent pair of lowest rank first.

    ranks: {token bytes: id}; a lower id was learned earlier. Among equal ranks the
    leftmost pair merges first. Stops when no adjacent pair forms a token.
    """
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best_rank, best_i = None, None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and (best_rank is None or rank < best_rank):
                best_rank, best_i = rank, i
        if best_rank is None:
            break
        parts[best_i:best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return [ranks[p] for p in parts]


LONG_PIECE = 200   # bytes: a longer piece is encoded by encode_long_piece


def encode_long_piece(piece, ranks):
    """encode_piece's ids for a long piece, in O(n log n) rather than O(n^2).

    encode_piece scans every pair after each merge; here the pairs wait in a heap keyed
    by (rank, position), the parts form a linked list, and a merge pushes only the two
    pairs it makes. A heap entry whose pair has changed since is skipped when popped.
    """
    parts = [piece[i:i + 1] for i in range(len(piece))]      # parts[i]: the part starting at byte i
    nxt = list(range(1, len(piece) + 1))                      # the next part's start (len(piece): none)
    prv = list(range(-1, len(piece) - 1))
    heap = []

    def push(i):
        j = nxt[i]
        if 0 <= i and j < len(piece):
            rank = ranks.get(parts[i] + parts[j])
            if rank is not None:
                heapq.heappush(heap, (rank, i, j))

    for i in range(len(piece) - 1):
        push(i)
    while heap:
        rank, i, j = heapq.heappop(heap)
        if parts[i] is None or nxt[i] != j or ranks.get(parts[i] + parts[j]) != rank:
            continue                                          # stale: a part has changed since
        parts[i], parts[j] = parts[i] + parts[j], None        # join j into i
        nxt[i] = nxt[j]
        if nxt[i] < len(piece):
            prv[nxt[i]] = i
        push(prv[i])
        push(i)
    return [ranks[p] for p in parts if p is not None]


# ---------------------------------------------------------------------------------------
# The tokenizer
# ---------------------------------------------------------------------------------------

class BPE:
    """A byte-level BPE tokenizer: ranks (token bytes -> id), a split pattern, special tokens.

        tok = BPE.train(text, vocab_size=4096)          # <|endoftext|> gets id 4096
        ids = tok.encode("To be, or not to be")
        tok.decode(ids)
        tok.save("shakespeare.bpe"); BPE.load("shakespeare.bpe")
        BPE.from_tiktoken("gpt2.tiktoken")              # a merges file in tiktoken's format

    ranks has the form tiktoken takes: tiktoken.Encoding(name, pat_str=tok.pattern,
    mergeable_ranks=tok.ranks, special_tokens=tok.special_tokens) encodes the same.
    """
    kind = "bpe"
    CACHE_SIZE = 100_000   # pieces whose ids the per-piece path remembers (cleared when full)

    def __init__(self, ranks, pattern=None, special_tokens=None):
        self.pattern = GPT2_PATTERN if pattern is None else pattern
        self._pat = _compile(self.pattern)
        self.ranks = dict(ranks)
        self.special_tokens = dict(special_tokens or {})
        missing = [b for b in range(256) if bytes([b]) not in self.ranks]
        if missing:
            raise ValueError(f"ranks lack {len(missing)} of the 256 single bytes (first: {missing[0]}); "
                             "a byte-level BPE needs them all to encode any text")
        self.n_vocab = max([*self.ranks.values(), *self.special_tokens.values()]) + 1
        self._decoder = [None] * self.n_vocab
        for tok, i in self.ranks.items():
            if i < 0 or self._decoder[i] is not None:
                raise ValueError(f"rank {i} is negative or given to two tokens")
            self._decoder[i] = tok
        for name, i in self.special_tokens.items():
            if i < 0 or self._decoder[i] is not None:
                raise ValueError(f"special token {name!r} has id {i}, which is negative or taken")
            self._decoder[i] = name.encode("utf-8")
        # longest first, so that one special token that begins another does not cut it
        names = sorted(self.special_tokens, key=len, reverse=True)
        self._special_pat = regex.compile("|".join(regex.escape(n) for n in names)) if names else None
        self._cache = {}       # piece -> its ids, for the pieces met so far
        self._fast = None      # fast.PairTable once built; False when numba is not used
        self._learned = None   # the merges [(a, b, id)] when trained or read from a merges file

    # -- training ------------------------------------------------------------------------
    @classmethod
    def train(cls, text, vocab_size, pattern=None, special_tokens=None):
        """Learn a vocabulary of vocab_size tokens (256 bytes + merges) from text.

        pattern: the split regex (GPT-2's by default). special_tokens: strings that encode
        as one id each, numbered after the learned tokens; default ["<|endoftext|>"], []
        for none. Special tokens in text are cut out before counting (never merged into).
        Fewer tokens are learned if the text runs out of pairs.
        """
        if not isinstance(vocab_size, int) or vocab_size < 256:
            raise ValueError(f"vocab_size must be an int of at least 256 (the bytes), got {vocab_size!r}")
        specials = [ENDOFTEXT] if special_tokens is None else list(special_tokens)
        if len(set(specials)) != len(specials) or not all(isinstance(s, str) and s for s in specials):
            raise ValueError(f"special_tokens must be distinct non-empty strings, got {specials!r}")
        pat = _compile(GPT2_PATTERN if pattern is None else pattern)
        chunks = [text]
        if specials:
            names = sorted(specials, key=len, reverse=True)
            chunks = regex.split("|".join(regex.escape(n) for n in names), text)
        # each distinct piece once, with its count, in order of first occurrence
        counts = collections.Counter(p for chunk in chunks for p in pat.findall(chunk))
        pieces = {p.encode("utf-8"): n for p, n in counts.items()}
        merges, vocab = train_merges(pieces, vocab_size)
        ranks = {tok: i for i, tok in enumerate(vocab)}
        tok = cls(ranks, pattern, {s: len(vocab) + i for i, s in enumerate(specials)})
        seen = set(range(256))                     # a merge that remade a token added no id
        tok._learned = [m for m in merges if m[2] not in seen and not seen.add(m[2])]
        return tok

    def with_special_tokens(self, names):
        """A copy with the special tokens ``names`` added, numbered after the last id (as chat
        fine-tuning adds its <|user|> and <|assistant|>); the learned tokens stay as they are."""
        new = [n for n in names if n not in self.special_tokens]
        if len(set(new)) != len(new) or not all(isinstance(n, str) and n for n in new):
            raise ValueError(f"special tokens must be distinct non-empty strings, got {list(names)!r}")
        specials = {**self.special_tokens, **{n: self.n_vocab + i for i, n in enumerate(new)}}
        tok = type(self)(self.ranks, self.pattern, specials)
        tok._learned = self._learned
        return tok

    # -- encoding and decoding -----------------------------------------------------------
    @property
    def vocab_size(self):
        """The number of ids (the model's vocabulary size): learned tokens and special ones."""
        return self.n_vocab

    def encode_ordinary(self, text):
        """str -> list of ids, reading special tokens' text as ordinary text.

        With numba, all pieces go to one compiled call. Otherwise each distinct piece is
        encoded once (encode_piece) and remembered: text repeats its words.
        """
        pieces = self._pat.findall(text)
        fast = self._compiled()
        if fast is not None:
            ids = fast.encode_text(text, pieces)           # all pieces in one compiled call
            if ids is not None:
                return ids
        cache = self._cache
        todo = list(set(pieces).difference(cache))   # the distinct pieces not seen before
        for piece, ids in zip(todo, self._encode_pieces([p.encode("utf-8") for p in todo])):
            cache[piece] = ids
        ids = list(itertools.chain.from_iterable(map(cache.__getitem__, pieces)))
        if len(cache) > self.CACHE_SIZE:
            cache.clear()
        return ids

    def _compiled(self):
        """fast.PairTable for these ranks (built on first use), or None without numba."""
        if self._fast is None:
            self._fast = False
            if os.environ.get(CPU_KERNELS_ENV, "1") != "0":
                try:
                    from .fast import PairTable
                    self._fast = PairTable(self.ranks)
                except ImportError:                # no numba: the plain loop below
                    pass
        return self._fast or None

    def _encode_pieces(self, pieces):
        """[piece bytes] -> [ids of each]: encode_piece, or its compiled twin in fast.py."""
        if self._compiled() is not None and pieces:
            return self._fast.encode_pieces(pieces)
        ranks = self.ranks
        return [[ranks[p]] if p in ranks else encode_piece(p, ranks) if len(p) <= LONG_PIECE
                else encode_long_piece(p, ranks) for p in pieces]

    def encode(self, text, allowed_special=()):
        """str -> list of ids. Special tokens encode as one id each if allowed.

        allowed_special: the special tokens that text may hold, or "all". A special
        token's text that is not allowed raises ValueError (as in tiktoken): text from a
        user should not be able to end a document. encode_ordinary reads them as text.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        if self._special_pat is None:
            return self.encode_ordinary(text)
        allowed = set(self.special_tokens) if allowed_special == "all" else set(allowed_special)
        unknown = allowed - set(self.special_tokens)
        if unknown:
            raise ValueError(f"allowed_special names {sorted(unknown)}, which are not special tokens "
                             f"of this tokenizer ({sorted(self.special_tokens)})")
        ids, start = [], 0
        for m in self._special_pat.finditer(text):
            if m.group() not in allowed:
                raise ValueError(f"text holds the special token {m.group()!r} at character {m.start()}; "
                                 f"pass allowed_special={{{m.group()!r}}} to encode it as one token, "
                                 "or use encode_ordinary to encode it as text")
            ids.extend(self.encode_ordinary(text[start:m.start()]))
            ids.append(self.special_tokens[m.group()])
            start = m.end()
        ids.extend(self.encode_ordinary(text[start:]))
        return ids

    def decode_bytes(self, ids):
        """ids -> the bytes of their tokens joined (any sequence of valid ids, or a 1-d integer Tensor)."""
        ids = _id_list(ids)
        try:
            if ids and min(ids) < 0:
                raise IndexError                   # a list would read -1 as the last id
            return b"".join([self._decoder[i] for i in ids])
        except (IndexError, TypeError):
            bad = next(i for i in ids if not (0 <= int(i) < self.n_vocab) or self._decoder[int(i)] is None)
            raise ValueError(f"token id {int(bad)} is not in this tokenizer (ids 0..{self.n_vocab - 1})") from None

    def decode(self, ids):
        """ids -> str; bytes that are not valid UTF-8 (half a character) become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_bytes(self, i):
        """The bytes of token i."""
        return self.decode_bytes([i])

    # -- saving and loading --------------------------------------------------------------
    def merges(self):
        """[(a, b, id)] for each learned token, in rank order: the two tokens it joins.

        The merges as learned, for a trained or loaded tokenizer; otherwise derived
        from the ranks (the shortest left part that works), so that it exists for ranks
        from tiktoken too. Raises ValueError where a token has no split into two
        lower-ranked tokens or the bytes are not tokens 0..255.
        """
        if self._learned is not None:
            return list(self._learned)
        if any(self.ranks[bytes([b])] != b for b in range(256)):
            raise ValueError("these ranks do not give byte b the id b; save them with format='tiktoken'")
        out = []
        for tok, i in sorted(self.ranks.items(), key=lambda kv: kv[1]):
            if i < 256:
                continue
            for cut in range(1, len(tok)):
                a, b = self.ranks.get(tok[:cut]), self.ranks.get(tok[cut:])
                if a is not None and b is not None and a < i and b < i:
                    out.append((a, b, i))
                    break
            else:
                raise ValueError(f"token {i} ({tok!r}) is not two lower tokens joined; "
                                 "save with format='tiktoken'")
        return out

    def save(self, path, format="merges"):
        """Write the tokenizer to path, atomically.

        format "merges": a text file: a header, the pattern, the special tokens, then one
        merge per line ("a b" joins tokens a and b into the next id, from 256 on).
        format "tiktoken": tiktoken's rank file (base64 token, space, id, per line); it
        holds the ranks only: give the pattern and special tokens to from_tiktoken.
        """
        if format == "merges":
            merges = self.merges()
            ids = [i for _, _, i in merges]
            if ids != list(range(256, 256 + len(ids))):
                raise ValueError("the ranks have gaps; save them with format='tiktoken'")
            lines = [HEADER, "pattern " + json.dumps(self.pattern)]
            lines += [f"special {i} {json.dumps(name)}" for name, i in self.special_tokens.items()]
            lines.append(f"merges {len(merges)}")
            lines += [f"{a} {b}" for a, b, _ in merges]
        elif format == "tiktoken":
            lines = [f"{base64.b64encode(tok).decode('ascii')} {i}"
                     for tok, i in sorted(self.ranks.items(), key=lambda kv: kv[1])]
        else:
            raise ValueError(f"format must be 'merges' or 'tiktoken', got {format!r}")
        _write_atomically(Path(path), "\n".join(lines) + "\n")

    @classmethod
    def load(cls, path):
        """Read a file written by save (either format; a tiktoken file gets GPT-2's pattern)."""
        text = _read(path)
        if not text.startswith(HEADER + "\n"):
            return cls.from_tiktoken(path)
        lines = text.splitlines()[1:]
        try:
            key, value = lines[0].split(" ", 1)
            assert key == "pattern"
            pattern = json.loads(value)
            specials, k = {}, 1
            while lines[k].startswith("special "):
                _, i, name = lines[k].split(" ", 2)
                specials[json.loads(name)] = int(i)
                k += 1
            key, n = lines[k].split()
            assert key == "merges" and len(lines) - k - 1 == int(n)
            vocab = [bytes([b]) for b in range(256)]
            merges = []
            for line in lines[k + 1:]:
                a, b = map(int, line.split())
                merges.append((a, b, len(vocab)))
                vocab.append(vocab[a] + vocab[b])
        except (AssertionError, ValueError, IndexError) as e:
            raise ValueError(f"{path}: not a tinyattn BPE file ({e or 'bad layout'})") from None
        tok = cls({tok: i for i, tok in enumerate(vocab)}, pattern, specials)
        tok._learned = merges
        return tok

    @classmethod
    def from_tiktoken(cls, path, pattern=None, special_tokens=None):
        """Load a tiktoken rank file ("base64-token id" per line, e.g. GPT-2's or cl100k's).

        pattern: the split regex those ranks were made with (GPT-2's by default; cl100k
        and others have their own). special_tokens: {name: id}; by default
        <|endoftext|> takes the id after the last rank, as in GPT-2.
        """
        ranks = {}
        for n, line in enumerate(_read(path).splitlines(), 1):
            if not line.strip():
                continue
            try:
                tok, i = line.split()
                ranks[base64.b64decode(tok, validate=True)] = int(i)
            except ValueError:
                raise ValueError(f"{path}:{n}: not a tiktoken rank line ('base64 id'): {line[:60]!r}") from None
        if special_tokens is None:
            special_tokens = {ENDOFTEXT: max(ranks.values(), default=-1) + 1}
        return cls(ranks, pattern, special_tokens)

    # -- as JSON, for checkpoints --------------------------------------------------------
    def to_dict(self):
        return {"kind": self.kind, "pattern": self.pattern, "special_tokens": self.special_tokens,
                "ranks": [[base64.b64encode(t).decode("ascii"), i] for t, i in self.ranks.items()]}

    @classmethod
    def from_dict(cls, d):
        try:
            return cls({base64.b64decode(t): i for t, i in d["ranks"]}, d["pattern"], d["special_tokens"])
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a BPE tokenizer's dict (missing or bad {e})") from None

    def __repr__(self):
        return f"BPE(n_vocab={self.n_vocab}, special_tokens={sorted(self.special_tokens)})"


def _read(path):
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e.strerror})") from None


def _write_atomically(path, text):
    """Write text to path through a temporary file, so path is never half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _id_list(ids):
    """Token ids as a list of ints, from a list, a tuple, or a 1-d integer Tensor or array;
    anything else is a TypeError that says what it got."""
    kind = getattr(getattr(ids, "dtype", None), "kind", None)
    if kind is not None:                                      # a Tensor or an array
        if kind not in "iu":
            raise TypeError(f"decode: token ids must be integers, got a {type(ids).__name__} of {ids.dtype}")
        if len(ids.shape) != 1:
            raise ValueError(f"decode: token ids must be one sequence (1-d), got shape {tuple(ids.shape)}")
        return ids.tolist()
    ids = list(ids)
    for i in ids:
        if isinstance(i, bool) or not hasattr(i, "__index__"):
            raise TypeError(f"decode: token ids must be ints, got {i!r} ({type(i).__name__})")
    return [i.__index__() for i in ids]
