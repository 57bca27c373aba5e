"""python -m tinyattn.fast: which fast paths run here, and why the others step aside.

python -m tinyattn.fast --write stores the live code's fingerprints as the library's
(after changing a teaching formula and checking its fast path against it: see checked.py).
"""
import argparse

from . import checked

parser = argparse.ArgumentParser(prog="python -m tinyattn.fast",
                                 description="Which fast paths run, or store the library's fingerprints.")
parser.add_argument("--write", action="store_true", help="store the live code's fingerprints as the library's")
if parser.parse_args().write:
    print(f"wrote {checked.write()}")
else:
    for path, differ in checked.status().items():
        print(f"{checked.describe(path)}: " + ("runs" if not differ else
                                                "steps aside: " + ", ".join(map(checked.where, differ))))
