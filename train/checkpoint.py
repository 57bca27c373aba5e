"""Checkpoints: one .npz file, loadable with allow_pickle=False.

Arrays: "model/<name>" for each parameter, "optim/<i>/<key>" for the
optimizer state of parameter i. Everything else (config, step, RNG states,
tokenizer, optimizer hyperparameters) is JSON in the 0-d string array "meta".
Writes are atomic: a temporary file in the same folder, then a rename, so a
run that dies keeps its last good checkpoint.
"""
import json
import os
import tempfile
import zipfile

import numpy as np

import tinyattn as ta
from tinyattn import distributed as dist

from . import lora
from .data import tokenizer_to_json


def save(path, model, optimizer, meta, state=None):
    """Write the checkpoint: ``state`` (default: the model's state_dict), the optimizer's state, meta."""
    state = model.state_dict() if state is None else state
    arrays = {f"model/{name}": t.numpy() for name, t in state.items()}
    opt = optimizer.state_dict()
    for i, values in opt["state"].items():
        for key, value in values.items():
            arrays[f"optim/{i}/{key}"] = np.asarray(value)
    check_finite(arrays, path)
    meta = dict(meta, optim_groups=opt["param_groups"])
    arrays["meta"] = np.array(json.dumps(meta))
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".ckpt-", suffix=".npz.tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)               # mkstemp makes it private; a checkpoint is an ordinary file
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, OSError):               # a full disk, a quota: one line, and what is left
            raise not_written(path, e) from None
        raise


def not_written(path, error):
    """The OSError of a write that failed (a full disk, a quota, a folder gone): it names the file and
    says what the previous one is (the write goes to a temporary file first, so that one is whole)."""
    reason = error.strerror or str(error) or type(error).__name__
    kept = f"the previous {os.path.basename(path)} is intact" if os.path.exists(path) else \
        f"no {os.path.basename(path)} was there before"
    out = OSError(f"could not write {path}: {reason[0].lower() + reason[1:]}; {kept}")
    out.errno = error.errno                     # (the message alone is the one line a command prints)
    return out


def save_run(path, model, optimizer, state, args, dataset):
    """A training run's checkpoint: the model, the optimizer, and what --resume needs to continue
    exactly (the step, the random streams, the log, the run's flags, the data's fingerprint)."""
    meta = dict(config=model.config.to_dict(), step=state["step"], best_val_loss=state["best_val_loss"],
                args={k: v for k, v in vars(args).items() if not k.startswith("_")}, data_rng=state["data_rng"].bit_generator.state,
                device_rng=ta.backend.get_backend(args.device).get_rng_state(),
                tokenizer=tokenizer_to_json(dataset.tokenizer), dataset=dataset.name, log=state["log"],
                train_losses=state["train_losses"], step_log=state.get("step_log"), elapsed=state.get("elapsed"), data_source=dataset.source,
                cpu_threads=ta.get_num_threads())
    if dist.world_size() > 1:                    # every rank's streams, for --resume (train/parallel.py)
        meta.update(world_size=dist.world_size(), rank_rngs=state.get("rank_rngs"))
    save(path, model, optimizer, meta, lora.merged_state(model) if args.lora_rank else None)


def other_thread_count(meta, on_host):
    """A note for a --resume under another CPU thread count than the run's, else None. The thread
    count is the one setting that changes a run's numbers on the CPU (tinyattn/fast/threads.py):
    an op cut into other parts sums in another order. A checkpoint without the count: None."""
    saved, now = meta.get("cpu_threads"), ta.get_num_threads()
    if not on_host or saved is None or saved == now:
        return None
    return (f"the run used {saved} CPU threads and this one uses {now} (TINYATTN_NUM_THREADS): ops cut into "
            "other parts round differently, so the resumed run is not the uninterrupted run to the bit")


def write_text(path, text):
    """Write a small text file (log.csv, summary.json) atomically, as checkpoints are: a run
    killed while writing leaves the previous file whole, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, OSError):
            raise not_written(path, e) from None
        raise


def check_finite(arrays, path):
    """Never write NaN or Inf: the file on disk stays the last good state."""
    for name, a in arrays.items():
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise ValueError(f"not saving {path}: {name} holds NaN or Inf (the last good checkpoint is kept)")


def read_meta(path):
    """Only the JSON metadata of a checkpoint (config, step, the run's flags): a cheap read."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        with np.load(path, allow_pickle=False) as f:
            return json.loads(str(f["meta"]))
    except (ValueError, KeyError, OSError, zipfile.BadZipFile) as e:
        raise ValueError(_unreadable(path, e)) from None


def _unreadable(path, error):
    return f"{path} is not a readable tinyattn checkpoint: damaged, or not written by python -m train ({type(error).__name__})"


def load(path):
    """-> (model_state, optim_state, meta), all on the host."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        with np.load(path, allow_pickle=False) as f:
            meta = json.loads(str(f["meta"]))
            model_state = {k[len("model/"):]: f[k] for k in f.files if k.startswith("model/")}
            state = {}
            for k in f.files:
                if k.startswith("optim/"):
                    _, i, key = k.split("/", 2)
                    value = f[k]
                    state.setdefault(int(i), {})[key] = value.item() if value.ndim == 0 else value
    except (ValueError, KeyError, OSError, zipfile.BadZipFile) as e:
        raise ValueError(_unreadable(path, e)) from None
    optim_state = {"state": state, "param_groups": [_groups_from_json(g) for g in meta.pop("optim_groups")]}
    return model_state, optim_state, meta


RUN_FILES = ("ckpt.npz", "best.npz")          # what a new run in the same folder would replace
RUN_OUTPUTS = ("log.csv", "summary.json", "loss.png", "trace.json")     # and what describes that run


def existing_run(out_dir):
    """A few words on the run whose checkpoints are in out_dir ("ckpt.npz at step 700, best val
    loss 1.7100"), or None when out_dir holds neither ckpt.npz nor best.npz."""
    found = [name for name in RUN_FILES if os.path.exists(os.path.join(out_dir, name))]
    if not found:
        return None
    try:
        meta = read_meta(os.path.join(out_dir, found[0]))
        loss = meta.get("best_val_loss")
        best = f", best val loss {loss:.4f}" if isinstance(loss, (int, float)) and loss != float("inf") else ""
        return f"{found[0]} at step {meta.get('step')}{best}"
    except ValueError:
        return f"{found[0]} (unreadable)"


def refuse_to_replace(out_dir, overwrite):
    """A new run never replaces another run's checkpoints without being told: raises a
    ValueError that says how to continue it, replace it or go elsewhere. -> a note for
    --overwrite when there was a run to replace (None otherwise)."""
    found = existing_run(out_dir)
    if found is None:
        return None
    if not overwrite:
        raise ValueError(f"--out_dir {out_dir} already holds a run ({found}): continue it with --resume, "
                         f"replace it with --overwrite, or pick another --out_dir")
    return f"--overwrite: the run in {out_dir} ({found}) is replaced: its checkpoints and logs are deleted"


def remove_run(out_dir):
    """--overwrite: delete the old run's checkpoints and logs, so that none of them (an old
    best.npz, an old summary.json) is ever taken for the new run's."""
    for name in RUN_FILES + RUN_OUTPUTS:
        path = os.path.join(out_dir, name)
        if os.path.exists(path):
            os.remove(path)


def _groups_from_json(group):
    if "betas" in group:
        group["betas"] = tuple(group["betas"])
    return group
