"""Benchmark: tinyattn's BPE against HuggingFace tokenizers (training) and tiktoken (encoding).

    python bench/bench_tokenizers.py data/shakespeare_char/input.txt
    python bench/bench_tokenizers.py FILE --vocab_size 4096 --repeats 5 --no_check

Needs `pip install tiktoken tokenizers` (neither is a dependency of tinyattn). Prints
JSON lines:

  check    the merges learned on the file's first 100 kB with GPT-2's pattern equal those
           of tiktoken's educational trainer (tiktoken._educational.bpe_train) for
           vocabularies 300 and 512, merge for merge, and with those ranks the encoding of
           the rest of the file equals a tiktoken.Encoding's ids (slow: the educational
           trainer recounts every pair at each merge; --no_check skips it)
  train    seconds to learn vocab_size tokens from the whole file: tinyattn's BPE.train
           and HuggingFace's BpeTrainer (byte-level, the same 256 bytes to start from, the
           same number of merges), alternating in one process; the median of each
           and tinyattn / HF
  encode   seconds to encode the first 1 MB of the file with the ranks just learned:
           tinyattn (a new tokenizer each time, its pair table built) and tiktoken.Encoding
           built from the same ranks, alternating; the ids are checked equal
"""
import argparse
import json
import statistics
import sys
import time

from tinyattn.tokenizers import BPE, GPT2_PATTERN


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def check(text):
    from tiktoken import Encoding
    from tiktoken._educational import bpe_train
    head, rest = text[:100_000], text[100_000:]
    for vocab_size in (300, 512):
        theirs = bpe_train(head, vocab_size, GPT2_PATTERN, visualise=None)
        tok = BPE.train(head, vocab_size, special_tokens=[])
        enc = Encoding("check", pat_str=GPT2_PATTERN, mergeable_ranks=tok.ranks, special_tokens={})
        print(json.dumps({"bench": "check", "vocab_size": vocab_size,
                          "merges_equal": list(theirs.items()) == list(tok.ranks.items()),
                          "encoding_of_rest_equal": tok.encode(rest) == enc.encode_ordinary(rest),
                          "rest_chars": len(rest)}), flush=True)


def hf_train(text, vocab_size):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)   # GPT-2's split, as bytes
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False, min_frequency=0,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator([text], trainer)
    return hf


def bench_train(text, vocab_size, repeats):
    ours, theirs = [], []
    for r in range(repeats):
        order = [("ours", ours), ("hf", theirs)][:: 1 if r % 2 == 0 else -1]   # swap who goes first
        for name, times in order:
            if name == "ours":
                t, tok = timed(lambda: BPE.train(text, vocab_size, special_tokens=[]))
            else:
                t, hf = timed(lambda: hf_train(text, vocab_size))
            times.append(t)
    row = {"bench": "train", "bytes": len(text.encode("utf-8")), "vocab_size": vocab_size,
           "tinyattn_s": statistics.median(ours), "hf_tokenizers_s": statistics.median(theirs),
           "hf_vocab_size": hf.get_vocab_size(), "tinyattn_vocab_size": tok.n_vocab}
    row["ratio"] = row["tinyattn_s"] / row["hf_tokenizers_s"]
    print(json.dumps(row), flush=True)
    return tok


def bench_encode(tok, text, repeats):
    from tiktoken import Encoding
    data = text.encode("utf-8")[:1_000_000].decode("utf-8", errors="ignore")
    enc = Encoding("bench", pat_str=tok.pattern, mergeable_ranks=tok.ranks, special_tokens={})
    BPE(tok.ranks).encode("warm up the compiled kernel")    # numba compiles (or loads) it once
    ours, theirs = [], []
    for r in range(repeats):
        fresh = BPE(tok.ranks, tok.pattern)
        fresh.encode("")            # builds its pair table (as tiktoken.Encoding builds its own, untimed)
        order = ["ours", "tiktoken"][:: 1 if r % 2 == 0 else -1]
        for name in order:
            if name == "ours":
                t, ids = timed(lambda: fresh.encode(data))
                ours.append(t)
            else:
                t, ref = timed(lambda: enc.encode_ordinary(data))
                theirs.append(t)
    row = {"bench": "encode", "bytes": len(data.encode("utf-8")), "tokens": len(ref),
           "ids_equal": ids == ref, "tinyattn_s": statistics.median(ours), "tiktoken_s": statistics.median(theirs)}
    row["ratio"] = row["tinyattn_s"] / row["tiktoken_s"]
    print(json.dumps(row), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("file", help="a UTF-8 text file, e.g. tiny Shakespeare")
    parser.add_argument("--vocab_size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no_check", action="store_true", help="skip the slow check against the educational trainer")
    args = parser.parse_args(argv)
    try:
        import tiktoken  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError as e:
        print(f"error: this benchmark needs tiktoken and tokenizers ({e}): pip install tiktoken tokenizers",
              file=sys.stderr)
        return 1
    try:
        with open(args.file, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        print(f"error: cannot read {args.file}: {e}", file=sys.stderr)
        return 1
    if not args.no_check:
        check(text)
    tok = bench_train(text, args.vocab_size, args.repeats)
    bench_encode(tok, text, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
