"""Benchmark: resident memory of python -m train --data DIR on a token file larger than you
would load, read through np.memmap (a new one per batch).

    python bench/bench_memmap.py --gb 2 --steps 200 --dir /tmp/tokens2gb
    python bench/bench_memmap.py --gb 2 --steps 200 --dir /tmp/tokens2gb --compare data/shakespeare_char/input.txt

Writes DIR (random uint16 ids of a 65-character vocabulary: train.bin of --gb GB, a
small val.bin, tokenizer.json and meta.json, as python -m data.prepare writes them)
unless it is there already, then runs `python -m train --data DIR --max_iters STEPS`
(the baby config that --data defaults to) in a child process, reading its resident
memory from /proc every 0.2 s. Prints one JSON line: the peak (VmHWM) and the last
resident size in MB, and the file's size. With --compare FILE.txt, a second line: the
same run on that text file, held in memory (what the process needs without the data).
Linux only (/proc).
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CHARS = [chr(c) for c in range(32, 97)]     # 65 characters, any will do


def write_tokens(folder, gb, seed=0):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n_train, chunk = int(gb * 2 ** 30) // 2, 2 ** 26
    with open(folder / "train.bin", "wb") as f:
        for start in range(0, n_train, chunk):
            rng.integers(0, len(CHARS), size=min(chunk, n_train - start), dtype=np.uint16).tofile(f)
    n_val = 1_000_000
    rng.integers(0, len(CHARS), size=n_val, dtype=np.uint16).tofile(folder / "val.bin")
    (folder / "tokenizer.json").write_text(json.dumps({"kind": "char", "chars": CHARS}))
    meta = dict(tokenizer="char", tokenizer_file="tokenizer.json", vocab_size=len(CHARS), dtype="uint16",
                source="random", train_tokens=n_train, train_bytes=n_train, val_tokens=n_val, val_bytes=n_val)
    (folder / "meta.json").write_text(json.dumps(meta))


def rss_mb(pid):
    """(VmRSS, VmHWM) of pid in MB, or None once it has ended."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    except (FileNotFoundError, ProcessLookupError):
        return None
    kb = lambda key: int(fields[key].split()[0]) if key in fields else 0
    return kb("VmRSS") / 1024, kb("VmHWM") / 1024


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gb", type=float, default=2.0)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--dir", default="tokens-memmap-bench", help="where the token files go (kept for reuse)")
    p.add_argument("--compare", metavar="FILE.txt", help="also run on this text file, held in memory")
    args = p.parse_args(argv)
    folder = Path(args.dir)
    if not (folder / "meta.json").exists():
        write_tokens(folder, args.gb)
    runs = [("memmap", folder)] + ([("in_memory_text", Path(args.compare))] if args.compare else [])
    for name, data in runs:
        cmd = [sys.executable, "-m", "train", "--data", str(data), "--max_iters", str(args.steps),
               "--eval_interval", str(args.steps), "--eval_iters", "20", "--sample_tokens", "0", "--quiet",
               "--out_dir", str(folder / "out"), "--overwrite"]          # a new run each time
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        peak = last = 0.0
        while child.poll() is None:
            now = rss_mb(child.pid)
            if now:
                last, peak = now[0], max(peak, now[1])
            time.sleep(0.2)
        out = child.stdout.read()
        if child.returncode != 0:
            print(out, file=sys.stderr)
            return child.returncode
        size = os.path.getsize(data / "train.bin" if data.is_dir() else data)
        print(json.dumps({"bench": name, "data": str(data), "data_gb": round(size / 2 ** 30, 3), "steps": args.steps,
                          "peak_rss_mb": round(peak, 1), "last_rss_mb": round(last, 1),
                          "done": out.strip().splitlines()[-1]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
