"""python -m train: the command line; the loop, its flags and presets are in train/loop.py."""
import sys

from .loop import main

if __name__ == "__main__":
    sys.exit(main())
