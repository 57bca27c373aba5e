"""Will a run fit in memory? An estimate made before anything is allocated.

A model or batch far too large (``--n_embd 65536``, ``--batch_size 1000000``) used to end in
a numpy traceback, or in the machine swapping for minutes first. ``check_fits`` refuses it
in one line instead. The estimate is a lower bound (what a step cannot do without), so a
run that is refused would certainly not have fitted; one that passes may still run out,
and then ``python -m train`` reports the MemoryError in one line too.
"""

GiB = 2 ** 30


def parameter_count(config):
    """The GPT's parameters, exactly, for each of GPTConfig's choices (tied: the output layer
    shares the token embedding; rotary: no position table; GQA: fewer key and value heads)."""
    C, b, F = config.n_embd, 1 if config.bias else 0, config.hidden
    kv = 2 * C * (config.n_kv_head or config.n_head) // config.n_head      # k and v's channels
    norm = C * (1 + b) if config.norm == "layernorm" else C
    qk_norm = 2 * (C // config.n_head) if config.qk_norm else 0
    matrices = 3 if config.mlp == "swiglu" else 2
    block = (2 * norm + qk_norm
             + (C + kv) * C + (C + kv) * b + C * C + C * b          # attention: c_attn, c_proj
             + matrices * F * C + (matrices - 1) * F * b + C * b)   # MLP: c_fc (and c_gate), c_proj
    positions = config.block_size if config.pos == "learned" else 0
    head = 0 if config.tie_embeddings else config.vocab_size * C
    return (config.vocab_size + positions) * C + config.n_layer * block + norm + head


def training_bytes(config, batch_rows, tokens_per_row, itemsize=4):
    """-> (bytes of the model's state, bytes of one step's activations), both lower bounds.

    State: weights, gradients and AdamW's two moments, 4 numbers per parameter. Activations:
    what backward keeps of a micro-batch of (B, T) tokens: per layer at least 12 (B, T, C)
    arrays (layer norms, q k v, attention output, the MLP's (B, T, 4C) twice), and the
    (B, T, V) logits, and the batch's ids (x, y and the window indices, int64)."""
    state = 4 * parameter_count(config) * itemsize
    tokens = batch_rows * tokens_per_row
    activations = tokens * (12 * config.n_layer * config.n_embd + config.vocab_size) * itemsize + tokens * 3 * 8
    return state, activations


def available_bytes():
    """Memory this process can still take: /proc/meminfo's MemAvailable, within the cgroup's
    limit where one is set (a container). None where neither can be read (not Linux)."""
    found = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read())
        if limit != "max":
            found.append(int(limit) - used)
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def check_fits(config, batch_rows, tokens_per_row, itemsize=4):
    """Raise a ValueError (one line, with the sizes) when a training step cannot fit in the
    memory available on the host (itemsize: 4 for float32, 8 for float64)."""
    available = available_bytes()
    if available is None:
        return
    state, activations = training_bytes(config, batch_rows, tokens_per_row, itemsize)
    if state + activations <= available:
        return
    lower = "--n_embd or --n_layer" if state >= activations else "--batch_size or --block_size"
    raise ValueError(f"this run needs at least {(state + activations) / GiB:,.1f} GiB of memory, more than the "
                     f"{available / GiB:,.1f} GiB available: the model's {parameter_count(config):,} parameters with "
                     f"their gradients and AdamW's state take {state / GiB:,.1f} GiB, a step's activations for "
                     f"{batch_rows:,} rows of {tokens_per_row:,} tokens {activations / GiB:,.1f} GiB; lower {lower}")
