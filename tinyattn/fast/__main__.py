"""python -m tinyattn.fast: which compiled paths run here, and why the others step aside.

python -m tinyattn.fast --write stores the teaching files' fingerprints as the library's
(after changing a teaching formula and checking its fast path against it: see checked.py).
"""
import argparse

import tinyattn  # noqa: F401  (the library, as a program that compiles a model has it)
from . import checked

parser = argparse.ArgumentParser(prog="python -m tinyattn.fast",
                                 description="Which compiled paths run, or store the library's fingerprints.")
parser.add_argument("--write", action="store_true", help="store the teaching files' fingerprints as the library's")
if parser.parse_args().write:
    print(f"wrote {checked.write()}")
else:
    allowed = checked.allowed()                  # (what differs: one line on stderr)
    for path in checked.DEPENDS:
        print(f"{path}: {'runs' if path in allowed else 'steps aside'}")
