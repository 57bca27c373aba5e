"""Reference solution: write BPE (exercise 17 of EXERCISES.md)."""


def pair_counts(words):
    counts = {}
    for ids in words:
        for pair in zip(ids, ids[1:]):
            counts[pair] = counts.get(pair, 0) + 1
    return counts


def merge(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def train(pieces, vocab_size):
    words = [list(p) for p in pieces]
    vocab = [bytes([b]) for b in range(256)]
    while len(vocab) < vocab_size:
        counts = pair_counts(words)
        if not counts:
            break
        pair = max(counts, key=counts.get)                  # the first met of the most frequent
        new_id = len(vocab)
        vocab.append(vocab[pair[0]] + vocab[pair[1]])
        words = [merge(ids, pair, new_id) for ids in words]
    return {tok: i for i, tok in enumerate(vocab)}


def encode(piece, ranks):
    parts = [bytes([b]) for b in piece]
    while len(parts) > 1:
        joined = [ranks.get(a + b) for a, b in zip(parts, parts[1:])]
        known = [(r, i) for i, r in enumerate(joined) if r is not None]
        if not known:
            break
        _, i = min(known)                                   # lowest id; the leftmost of equals
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return [ranks[p] for p in parts]
