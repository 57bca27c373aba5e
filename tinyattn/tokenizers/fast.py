"""BPE encoding compiled with numba (the ``fast`` extra): encode_piece over many pieces at once.

bpe.encode_piece works on bytes and looks up each joined pair in the ranks. Here the
same merges run on token ids: a table maps a pair of ids (a, b) to the rank of the
token their bytes make, when there is one (every way of cutting every token into two
tokens is in it), so the results are the same as encode_piece's, id for id. The
tokenizer uses this module when numba imports and TINYATTN_CPU_KERNELS is not 0.
"""
import numpy as np
from numba import njit

EMPTY = -1


class PairTable:
    """An open-addressing hash table from a pair of ids to the rank of their joined bytes."""

    def __init__(self, ranks):
        self.n = max(ranks.values()) + 1
        pairs = []
        for tok, rank in ranks.items():
            for cut in range(1, len(tok)):
                a, b = ranks.get(tok[:cut]), ranks.get(tok[cut:])
                if a is not None and b is not None:
                    pairs.append((a * self.n + b, rank))
        size = 1 << max(4, (2 * len(pairs)).bit_length())      # at most half full
        self.shift = 64 - (size.bit_length() - 1)
        self.keys = np.full(size, EMPTY, dtype=np.int64)
        self.vals = np.zeros(size, dtype=np.int64)
        pairs = np.array(pairs, dtype=np.int64).reshape(-1, 2)  # (P, 2): key, rank
        _insert_all(self.keys, self.vals, self.shift, pairs[:, 0].copy(), pairs[:, 1].copy())
        self.byte_ids = np.array([ranks[bytes([b])] for b in range(256)], dtype=np.int64)

    def encode_pieces(self, pieces):
        """A list of byte strings -> a list of id lists, as [encode_piece(p, ranks) for p in pieces]."""
        starts = np.zeros(len(pieces) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in pieces], out=starts[1:])
        data = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        out = np.empty(len(data), dtype=np.int64)
        lengths = _encode_pieces(data, starts, self.byte_ids, self.keys, self.vals, self.n, self.shift, out)
        ends = np.cumsum(lengths).tolist()
        return [out[e - m:e].tolist() for e, m in zip(ends, lengths.tolist())]

    def encode_text(self, text, pieces):
        """The ids of all of text's pieces, in order, as one list; None unless the pieces
        (re.findall's, in order) cover text exactly. Every piece is merged, repeats too:
        at about 3 bytes a piece, that is quicker than finding the repeats."""
        chars = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        if int(chars.sum()) != len(text):
            return None                                   # the pattern skips text (or has groups)
        data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        starts = np.zeros(len(pieces) + 1, dtype=np.int64)
        np.cumsum(chars, out=starts[1:])                  # in characters
        if len(data) != len(text):                        # not ASCII: characters -> bytes
            cp = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
            size = 1 + (cp >= 0x80).astype(np.int64) + (cp >= 0x800) + (cp >= 0x10000)
            at = np.zeros(len(text) + 1, dtype=np.int64)
            np.cumsum(size, out=at[1:])
            starts = at[starts]
        out = np.empty(len(data), dtype=np.int64)
        lengths = _encode_pieces(data, starts, self.byte_ids, self.keys, self.vals, self.n, self.shift, out)
        return out[:int(lengths.sum())].tolist()


@njit(cache=True)
def _slot(keys, key, shift):
    """The slot of key in keys (2^(64 - shift) long): where it is, or the empty slot it would take.

    Fibonacci hashing: the top bits of key * 2^64 / golden ratio (the low bits of a
    product would depend on the key's low bits only), then linear probing.
    """
    mask = len(keys) - 1
    h = np.int64((np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(shift))
    while keys[h] != EMPTY and keys[h] != key:
        h = (h + 1) & mask
    return h


@njit(cache=True)
def _insert_all(keys, vals, shift, new_keys, new_vals):
    for k in range(len(new_keys)):
        h = _slot(keys, new_keys[k], shift)
        keys[h] = new_keys[k]
        vals[h] = new_vals[k]


LONG_PIECE = 200   # bytes: a longer piece goes to _encode_long (bpe.encode_long_piece's twin)


@njit(cache=True, nogil=True)
def _rank(keys, vals, n, shift, a, b):
    h = _slot(keys, a * n + b, shift)
    return vals[h] if keys[h] != EMPTY else -1


@njit(cache=True, nogil=True)
def _heap_push(heap, size, key, other):
    """Push (key, other) on the binary min-heap heap[:size] (rows of two int64); returns the new size."""
    i = size
    heap[i, 0], heap[i, 1] = key, other
    while i > 0 and heap[(i - 1) // 2, 0] > heap[i, 0]:
        p = (i - 1) // 2
        heap[p, 0], heap[i, 0] = heap[i, 0], heap[p, 0]
        heap[p, 1], heap[i, 1] = heap[i, 1], heap[p, 1]
        i = p
    return size + 1


@njit(cache=True, nogil=True)
def _heap_pop(heap, size):
    """Move the smallest row of heap[:size] to heap[size - 1], restore the heap in heap[:size - 1]."""
    size -= 1
    heap[0, 0], heap[size, 0] = heap[size, 0], heap[0, 0]
    heap[0, 1], heap[size, 1] = heap[size, 1], heap[0, 1]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and heap[c + 1, 0] < heap[c, 0]:
            c += 1
        if heap[i, 0] <= heap[c, 0]:
            break
        heap[c, 0], heap[i, 0] = heap[i, 0], heap[c, 0]
        heap[c, 1], heap[i, 1] = heap[i, 1], heap[c, 1]
        i = c
    return size


@njit(cache=True, nogil=True)
def _encode_long(ids, keys, vals, n, shift):
    """Merge ids (one piece's, from bytes) in place as bpe.encode_long_piece does; returns their count.

    Heap rows are (rank * m + i, j): the pair of the parts starting at i and j.
    """
    m = len(ids)
    nxt = np.arange(1, m + 1)
    prv = np.arange(-1, m - 1)
    alive = np.ones(m, dtype=np.bool_)
    heap = np.empty((3 * m, 2), dtype=np.int64)          # m - 1 pairs, then at most two per merge
    size = 0
    for i in range(m - 1):
        r = _rank(keys, vals, n, shift, ids[i], ids[i + 1])
        if r >= 0:
            size = _heap_push(heap, size, r * m + i, i + 1)
    while size > 0:
        size = _heap_pop(heap, size)
        r, i, j = heap[size, 0] // m, heap[size, 0] % m, heap[size, 1]
        if not alive[i] or nxt[i] != j or _rank(keys, vals, n, shift, ids[i], ids[j]) != r:
            continue                                      # stale: a part has changed since
        ids[i] = r                                        # the joined token's id is its rank
        alive[j] = False
        nxt[i] = nxt[j]
        if nxt[i] < m:
            prv[nxt[i]] = i
        for a in (prv[i], i):                             # the two pairs this merge made
            if a >= 0 and nxt[a] < m:
                ra = _rank(keys, vals, n, shift, ids[a], ids[nxt[a]])
                if ra >= 0:
                    size = _heap_push(heap, size, ra * m + a, nxt[a])
    count = 0
    i = 0
    while i < m:                                          # the surviving parts, in order
        ids[count] = ids[i]
        count += 1
        i = nxt[i]
    return count


@njit(cache=True, nogil=True)
def _encode_pieces(data, starts, byte_ids, keys, vals, n, shift, out):
    """Each piece data[starts[k]:starts[k+1]] -> its ids, written one piece after another
    into out (never ahead of the piece's bytes); returns the number of ids of each piece."""
    lengths = np.empty(len(starts) - 1, dtype=np.int64)
    s = 0                                  # where this piece's ids go
    for k in range(len(starts) - 1):
        m = starts[k + 1] - starts[k]
        for i in range(m):
            out[s + i] = byte_ids[data[starts[k] + i]]
        if m > LONG_PIECE:
            lengths[k] = _encode_long(out[s:s + m], keys, vals, n, shift)
            s += lengths[k]
            continue
        while m > 1:                       # merge the pair of lowest rank (the leftmost of equals)
            best, best_i = -1, -1
            for i in range(m - 1):
                h = _slot(keys, out[s + i] * n + out[s + i + 1], shift)
                if keys[h] != EMPTY and (best < 0 or vals[h] < best):
                    best, best_i = vals[h], i
            if best < 0:
                break
            out[s + best_i] = best
            for i in range(best_i + 1, m - 1):
                out[s + i] = out[s + i + 1]
            m -= 1
        lengths[k] = m
        s += m
    return lengths
