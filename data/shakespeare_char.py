"""Get tiny Shakespeare (about 1 MB of plays) for character-level training.

    python data/shakespeare_char.py                 # download it (unless it is already there)
    python data/shakespeare_char.py --from FILE     # offline: copy a local copy

Either way the bytes are checked (size and sha256) before the file is written,
so a truncated download or a different text is never used by mistake. A file already
at the destination whose bytes check is used as it is, with no download (so it works offline).
"""
import argparse
import hashlib
import os
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
EXPECTED_SIZE = 1_115_394   # bytes
EXPECTED_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
TIMEOUT = 30                # seconds for the download

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "data" / "shakespeare_char" / "input.txt"


class FetchError(Exception):
    """A download, read or check failed; the message is one line for the user."""


def download(url, timeout=TIMEOUT):
    """Return the bytes at url (tests replace this function to stay offline)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    except (urllib.error.URLError, OSError) as e:   # no network, timeout, HTTP error
        reason = getattr(e, "reason", e)
        raise FetchError(f"could not download {url}: {reason} (offline? use --from FILE)") from None


def verify(content, what):
    """Raise FetchError unless content has the expected size and sha256."""
    if len(content) != EXPECTED_SIZE:
        raise FetchError(f"{what} has {len(content):,} bytes, expected {EXPECTED_SIZE:,}: "
                         "not tiny Shakespeare")
    digest = hashlib.sha256(content).hexdigest()
    if digest != EXPECTED_SHA256:
        raise FetchError(f"{what} has sha256 {digest}, expected {EXPECTED_SHA256}")


def write_atomically(path, content):
    """Write bytes to path through a temporary file, so path is never half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)         # the mode a new file gets, not mkstemp's 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def already_there(path):
    """Does path hold tiny Shakespeare already (the right size and sha256)?"""
    try:
        verify(Path(path).read_bytes(), str(path))
    except (OSError, FetchError):
        return False
    return True


def fetch(out_path=DEFAULT_OUT, source=None):
    """Download tiny Shakespeare (or copy it from source), check it, write out_path. With no
    source, a file at out_path whose bytes check is kept, and nothing is downloaded.

    Returns out_path as a Path. Raises FetchError with a one-line message.
    """
    out_path = Path(out_path)
    if source is None and already_there(out_path):
        return out_path
    if source is None:
        content = download(URL)
        what = "the download"
    else:
        try:
            content = Path(source).read_bytes()
        except OSError as e:
            raise FetchError(f"cannot read {source}: {e.strerror}") from None
        what = str(source)
    verify(content, what)
    try:
        write_atomically(out_path, content)
    except OSError as e:
        raise FetchError(f"cannot write {out_path}: {e.strerror}") from None
    return out_path


def shown(path):
    """path relative to the repository root when it is inside it (for the printed command)."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Get tiny Shakespeare and check its bytes.")
    parser.add_argument("--from", dest="source", metavar="FILE",
                        help="copy this local file instead of downloading")
    parser.add_argument("--out", default=str(DEFAULT_OUT), metavar="PATH",
                        help="where to write it (default: data/shakespeare_char/input.txt)")
    args = parser.parse_args(argv)
    kept = args.source is None and already_there(args.out)
    try:
        path = Path(args.out) if kept else fetch(args.out, source=args.source)
    except FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    done = "is already there, not downloaded again" if kept else "written"
    print(f"{shown(path)} {done} ({EXPECTED_SIZE:,} bytes, sha256 checked)")
    print("train on it with:")
    print(f"  python -m train --data {shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
