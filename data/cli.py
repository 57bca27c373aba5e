"""argparse for the project's commands: a bad command line gets one line and exit status 2."""
import argparse


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (``prog: error: ... (see --help)``), without
    the usage block, and never takes an abbreviation of a flag for the flag."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
