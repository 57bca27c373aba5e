"""The safetensors file format, read and written with numpy alone.

A .safetensors file is three parts, one after another:

    8 bytes     N, the length of the header, an unsigned little-endian integer
    N bytes     the header: UTF-8 JSON (padded with spaces), one entry per array
                    {"wte.weight": {"dtype": "F32", "shape": [65, 384], "data_offsets": [0, 99840]},
                     ...,
                     "__metadata__": {"format": "pt"}}          (optional; strings only)
    the rest    the arrays' bytes, little-endian and row-major, back to back;
                data_offsets [begin, end) count from the start of this part

No pickle and no code runs on load, so a file from anyone is safe to open; and
since the header says where every array is, one array can be read without the
others. Hugging Face `transformers` saves models this way (model.safetensors).

The reader trusts nothing in the file: every size and offset in the header is
checked against the others and against the file's length before a byte of data
is read, and anything wrong is one SafetensorsError (a ValueError) that names
the file and the problem.

``ta.save`` and ``ta.load`` (PyTorch's names, at the end of this file) write and read
state dicts this way: a module's as it is, nested ones (an optimizer's, a scheduler's, a
checkpoint of several) with their structure as JSON in the metadata.
"""
import json
import numbers
import os
import tempfile

from .backend import get_backend
from .tensor import Tensor, tensor

np = get_backend("cpu").xp          # the host's numpy: a file is bytes on the host

# The format's dtype names and numpy's little-endian types ("<f4": float32, 4 bytes).
DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
          "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}
BF16 = "BF16"                        # bfloat16: numpy has no such type; read as float32 (exactly), never written
NAMES = {np.dtype(v): k for k, v in DTYPES.items()}
MAX_HEADER = 100_000_000             # the limit the reference reader sets: a larger "header" is a damaged file
METADATA = "__metadata__"


class SafetensorsError(ValueError):
    """A file that is not valid safetensors, or a value that cannot be saved as safetensors."""

    def __init__(self, path, problem):
        super().__init__(f"{path}: {problem}")


# --- writing ---------------------------------------------------------------
def save_safetensors(tensors, path, metadata=None):
    """Write {name: Tensor or numpy array} to ``path`` as safetensors.

    ``metadata``: an optional {str: str} stored in the header. The file is written to
    a temporary file in the same folder and renamed into place, so ``path`` always
    holds either the old file or the whole new one.
    """
    arrays = {}
    for name, value in tensors.items():
        if not isinstance(name, str) or name == METADATA:
            raise SafetensorsError(path, f"cannot save an array named {name!r}: names are strings other than {METADATA!r}")
        a = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
        if a.dtype not in NAMES and a.dtype.newbyteorder("<") not in NAMES:
            raise SafetensorsError(path, f"cannot save {name!r}: dtype {a.dtype} has no safetensors name "
                                         f"(supported: {', '.join(sorted(str(np.dtype(d)) for d in DTYPES.values()))})")
        arrays[name] = a.astype(a.dtype.newbyteorder("<"), copy=False)          # tobytes() writes it row-major
    if metadata is not None and not (isinstance(metadata, dict) and
                                     all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise SafetensorsError(path, "metadata must be a dict of str to str")

    # Widest items first, so that every array starts at a multiple of its item size
    # (the header is padded to a multiple of 8): a reader can map them in place.
    order = sorted(arrays, key=lambda name: -arrays[name].dtype.itemsize)
    header, offset = {}, 0
    for name in order:
        a = arrays[name]
        header[name] = {"dtype": NAMES[a.dtype.newbyteorder("=")], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    if metadata:
        header[METADATA] = dict(metadata)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)                                  # pad: the data starts 8-aligned

    if os.path.isdir(path):
        raise SafetensorsError(path, "is a folder; give the path of a file to write (model.safetensors)")
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".safetensors")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(len(text).to_bytes(8, "little"))
            f.write(text)
            for name in order:
                f.write(arrays[name].tobytes())
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)                # mkstemp makes it private; this is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


# --- reading ---------------------------------------------------------------
def read_safetensors(path):
    """-> ({name: numpy array}, metadata dict), in the file's order of names.

    Every dtype of the table above comes back as that numpy type; BF16 comes back as
    float32 (each bfloat16 is the top half of a float32, so nothing is rounded).
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise SafetensorsError(path, f"{size} bytes: too short for the 8-byte header length (truncated?)")
        n = int.from_bytes(f.read(8), "little")
        if n > size - 8:
            raise SafetensorsError(path, f"the header length is {n} bytes but only {size - 8} follow (truncated?)")
        if n > MAX_HEADER:
            raise SafetensorsError(path, f"the header length {n} is over the limit of {MAX_HEADER} bytes")
        entries, metadata = _parse_header(path, f.read(n))
        data_size = size - 8 - n
        _check_offsets(path, entries, data_size)
        data = bytearray(data_size)                  # writable, so the arrays made on it are too
        if f.readinto(data) != data_size:
            raise SafetensorsError(path, "the file changed size while it was read")
    arrays = {}
    for name, (dtype, shape, (begin, end)) in entries.items():
        if dtype == BF16:                            # the 16 bits become the top half of a float32
            top = np.frombuffer(data, dtype="<u2", count=(end - begin) // 2, offset=begin)
            arrays[name] = (top.astype(np.uint32) << 16).view(np.float32).reshape(shape)
        else:
            kind = np.dtype(DTYPES[dtype])
            a = np.frombuffer(data, dtype=kind, count=(end - begin) // kind.itemsize, offset=begin).reshape(shape)
            arrays[name] = a.astype(kind.newbyteorder("="), copy=False)
    return arrays, metadata


def load_safetensors(path, device="cpu"):
    """-> {name: Tensor} from a safetensors file, as ``safetensors.torch.load_file`` gives
    torch tensors: ``model.load_state_dict(load_safetensors(path))`` works as it does there.

    Tensors hold float16/32/64, int8/16/32/64, uint8 and bool, as torch's do; a file with
    wider unsigned types (or
    to get plain numpy arrays and the metadata) is read with ``read_safetensors``.
    BF16 arrays come back as float32.
    """
    arrays, _ = read_safetensors(path)
    return {name: _tensor_of(path, name, a, device) for name, a in arrays.items()}


def _tensor_of(path, name, a, device):
    if a.dtype.name not in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"):
        raise SafetensorsError(path, f"{name!r} is {a.dtype}, which a Tensor cannot hold: "
                                     "read it as a numpy array with read_safetensors")
    return tensor(a, dtype=a.dtype.name, device=device)


def _parse_header(path, raw):
    """The header's bytes -> ({name: (dtype, shape, (begin, end))}, metadata), each field checked."""
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError:
        raise SafetensorsError(path, "the header is not UTF-8 text") from None
    except (json.JSONDecodeError, _Duplicate) as e:
        raise SafetensorsError(path, f"the header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(path, f"the header is JSON {type(header).__name__}, not an object")
    metadata = header.pop(METADATA, {})
    metadata = {} if metadata is None else metadata
    if not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise SafetensorsError(path, f"{METADATA} must map strings to strings")
    entries = {}
    for name, info in header.items():
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
            raise SafetensorsError(path, f"{name!r}: an entry needs dtype, shape and data_offsets")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in DTYPES and dtype != BF16:
            raise SafetensorsError(path, f"{name!r}: unsupported dtype {dtype!r}")
        if not (isinstance(shape, list) and all(_is_count(d) for d in shape)):
            raise SafetensorsError(path, f"{name!r}: shape {shape!r} is not a list of non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
            raise SafetensorsError(path, f"{name!r}: data_offsets {offsets!r} is not two non-negative integers")
        begin, end = offsets
        itemsize = 2 if dtype == BF16 else np.dtype(DTYPES[dtype]).itemsize
        nbytes = int(np.prod(shape, dtype=object)) * itemsize           # Python ints: no overflow
        if end - begin != nbytes:
            raise SafetensorsError(path, f"{name!r}: data_offsets [{begin}, {end}] hold {end - begin} bytes, but "
                                         f"shape {shape} of {dtype} needs {nbytes}")
        entries[name] = (dtype, tuple(shape), (begin, end))
    return entries, metadata


def _check_offsets(path, entries, data_size):
    """The arrays tile the data exactly: in order, no gap, no overlap, nothing past the end or left over."""
    at = 0
    for name, (_, _, (begin, end)) in sorted(entries.items(), key=lambda e: e[1][2]):
        if begin != at:
            problem = "overlaps the array before it" if begin < at else f"leaves a gap of {begin - at} bytes before it"
            raise SafetensorsError(path, f"{name!r}: data_offsets [{begin}, {end}] {problem} (expected to start at {at})")
        if end > data_size:
            raise SafetensorsError(path, f"{name!r}: data_offsets [{begin}, {end}] run past the end of the data "
                                         f"({data_size} bytes; truncated?)")
        at = end
    if at != data_size:
        raise SafetensorsError(path, f"the data is {data_size} bytes but the arrays cover {at}")


class _Duplicate(Exception):
    pass


def _no_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(f"{key!r} appears twice")
        out[key] = value
    return out


def _is_count(x):
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


# --- ta.save and ta.load: state dicts ----------------------------------------
STRUCTURE = "tinyattn.structure"     # the metadata entry that holds a nested state dict's shape


def save(obj, f):
    """Write a state dict to the file at path ``f`` as safetensors: atomically, as
    ``save_safetensors`` writes (``f`` holds the old file or the whole new one, never half).

    A module's state dict, {name: Tensor}, is written as it is, so any safetensors reader
    opens it (Hugging Face's, ``safetensors.torch.load_file``). Anything else is nested
    dicts, lists and tuples of Tensors, numpy arrays, numbers, strings, booleans and None (an
    optimizer's or a scheduler's state dict, or a checkpoint such as {"model": ..., "optimizer":
    ..., "step": 100}): each array is stored under its path of keys ("optimizer.state.0.exp_avg"),
    the rest as JSON in the metadata. There is no pickle (torch.save's format), so loading a
    file runs no code of anyone's.
    """
    if isinstance(obj, dict) and obj and all(isinstance(k, str) and isinstance(v, Tensor) for k, v in obj.items()):
        save_safetensors(obj, f)
        return
    arrays = {}
    structure = _encode(obj, "", arrays, f)
    save_safetensors(arrays, f, metadata={STRUCTURE: json.dumps(structure)})


def _encode(value, path, arrays, f):
    """``value`` as JSON; each Tensor or numpy array in it goes into ``arrays`` under its path."""
    if isinstance(value, (Tensor, np.ndarray)):
        name = path or "value"
        if name in arrays:
            raise SafetensorsError(f, f"save: two arrays would be stored as {name!r} (a key with a dot in it?)")
        arrays[name] = value
        return {"tensor" if isinstance(value, Tensor) else "array": name}
    if isinstance(value, dict):
        for k in value:
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise TypeError(f"save: dict keys must be strings or ints, got {k!r} at {path or 'the top'}")
        return {"dict": [[k, _encode(v, f"{path}.{k}" if path else str(k), arrays, f)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        kind = "list" if isinstance(value, list) else "tuple"
        return {kind: [_encode(v, f"{path}.{i}" if path else str(i), arrays, f) for i, v in enumerate(value)]}
    if value is None or isinstance(value, (bool, str)):
        return {"value": value}
    if isinstance(value, numbers.Integral):
        return {"value": int(value)}
    if isinstance(value, numbers.Real):
        return {"value": float(value)}                      # (inf and nan too: JSON's Infinity and NaN)
    raise TypeError(f"save: cannot save a {type(value).__name__} (at {path or 'the top'}); a state dict holds "
                    "Tensors, numpy arrays, numbers, strings, booleans, None, and dicts, lists and tuples of them")


def load(f, map_location=None):
    """What ``save`` wrote to the file at path ``f``: a module's state dict as {name: Tensor},
    or the nested state dict as it was, its Tensors on ``map_location`` (a device: "cpu",
    the default, or "cuda") and its numpy arrays as numpy arrays. A safetensors file from
    elsewhere loads as {name: Tensor}."""
    arrays, metadata = read_safetensors(f)
    device = map_location or "cpu"
    if STRUCTURE not in metadata:
        return {name: _tensor_of(f, name, a, device) for name, a in arrays.items()}
    try:
        structure = json.loads(metadata[STRUCTURE])
        return _decode(structure, arrays, f, device)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise SafetensorsError(f, f"the {STRUCTURE} metadata does not describe the file's arrays ({e})") from None


def _decode(node, arrays, f, device):
    (kind, body), = node.items()
    if kind == "tensor":
        return _tensor_of(f, body, arrays[body], device)
    if kind == "array":
        return arrays[body]
    if kind == "dict":
        return {k: _decode(v, arrays, f, device) for k, v in body}
    if kind in ("list", "tuple"):
        items = [_decode(v, arrays, f, device) for v in body]
        return items if kind == "list" else tuple(items)
    if kind == "value":
        return body
    raise ValueError(f"unknown entry {kind!r}")
