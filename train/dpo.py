"""--stage dpo: Direct Preference Optimization (Rafailov et al., 2023) against a frozen reference.

Each pair is a prompt x with a chosen answer y_w and a rejected one y_l. The policy π (the
model that trains, started from --init_from) and the reference π_ref (a frozen copy of the
same model) each give the log-probability of each answer, the sum of its tokens' log
probabilities (never the prompt's: the prompt is given, not chosen). The loss is

    -logsigmoid(β ((log π(y_w) - log π_ref(y_w)) - (log π(y_l) - log π_ref(y_l))))

a logistic loss on the "implicit rewards" β log π(y)/π_ref(y): it is small when the policy
has moved toward the chosen answer more than toward the rejected one. Moving away from the
reference is what is rewarded, so the reference must stay fixed: trained along, the
difference would always be zero. β sets how far the policy may drift for a given margin.

DPO only asks that the chosen answer beat the rejected one: both may lose probability,
and with near-miss pairs they often do (the answers share most of their tokens). --dpo_nll
adds the chosen answer's mean negative log-likelihood per token (RPO, Pang et al., 2024),
which keeps the correct answer likely (each pair's per token, then the mean over the pairs, as
the DPO loss is: a batch split over processes or micro-batches gives the same loss).

A step costs two forwards, as TRL's DPOTrainer does it: the chosen and the rejected answers go
through the policy together (one batch of 2B rows, concatenated), and through the reference
together, under no_grad. The reference is the model that the run loads from --init_from's path at
its start (and again at --resume: the checkpoint keeps that path and the file's SHA-256, and
refuses one that changed). Nothing about the reference is kept in the checkpoint, so resuming is
exact.
"""
import hashlib
import math
import os
import sys
from types import SimpleNamespace

import numpy as np

import tinyattn as ta
import tinyattn.nn.functional as F
from data.chat import CHAT_TOKENS, answer_text, render, render_prompt
from data.pairs import identical, read_pairs

from .data import Dataset, fingerprint
from .stages import LanguageModel


# ---------------------------------------------------------------------------
# the loss
def sequence_logprobs(model, x, y):
    """log π(answer | prompt) of each row: x (B, T) the ids the model reads, y (B, T) the next
    ids, -1 where a token is not the answer's. -> (B,), the sum over the answer's tokens."""
    logits, _ = model(x)                                        # (B, T, V)
    return F.token_logprobs(logits, y, ignore_index=-1).sum(-1)   # (B, T) -> (B,)


def dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    """The DPO loss, the mean over the pairs: each argument (B,) per-sequence log-probs."""
    chosen_logratio = policy_chosen - ref_chosen               # (B,) log π(y_w)/π_ref(y_w)
    rejected_logratio = policy_rejected - ref_rejected         # (B,) log π(y_l)/π_ref(y_l)
    return -F.logsigmoid(beta * (chosen_logratio - rejected_logratio)).mean()


def pair_logprobs(model, batch):
    """(chosen, rejected) log-probs (B,) each, of a batch of pairs (x_chosen, y_chosen, x_rejected,
    y_rejected), each (B, T): one forward, the chosen and rejected rows run as one batch (2B, T)."""
    xc, yc, xr, yr = batch
    B = xc.shape[0]
    both = sequence_logprobs(model, ta.cat([xc, xr], 0), ta.cat([yc, yr], 0))   # (2B,)
    return both[:B], both[B:]


class DPOObjective:
    """The loss of --stage dpo: ``objective(model, batch)`` -> the 0-d loss of a batch of pairs
    (x_chosen, y_chosen, x_rejected, y_rejected), each (B, T). Two forwards: the policy's, and the
    frozen reference's (under no_grad)."""

    def __init__(self, reference, beta, nll=0.0):
        self.reference, self.beta, self.nll = reference, beta, nll

    def logprobs(self, model, batch):
        """(policy chosen, policy rejected, reference chosen, reference rejected), each (B,)."""
        with ta.no_grad():                                     # the reference never trains
            ref_chosen, ref_rejected = pair_logprobs(self.reference, batch)
        policy_chosen, policy_rejected = pair_logprobs(model, batch)
        return policy_chosen, policy_rejected, ref_chosen, ref_rejected

    def loss(self, logprobs, batch):
        """The objective from the four log-probs of a batch: DPO's, plus --dpo_nll's term."""
        policy_chosen, policy_rejected, ref_chosen, ref_rejected = logprobs
        loss = dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, self.beta)
        if self.nll:                                           # each chosen answer's NLL per token, the mean
            n_tokens = ta.where(batch[1] != -1, 1.0, 0.0).sum(-1)              # over the pairs. (B,) lengths
            loss = loss - (policy_chosen / n_tokens.to(policy_chosen.dtype)).mean() * self.nll
        return loss

    def __call__(self, model, batch):
        return self.loss(self.logprobs(model, batch), batch)


class DPO(LanguageModel):
    """--stage dpo as the loop runs it (train/stages.py): its batches are pairs, its loss the DPO
    objective against the frozen reference (loaded by ``prepare``), and its evaluation the loss of
    each split and, on the val pairs, the plain DPO loss, the implicit-reward accuracy and the drift
    of the log-probs from the reference's."""

    name = "dpo"
    preset = "dpo"                              # config/dpo.py: its batch size, learning rate, beta
    own_flags = ("dpo_beta", "dpo_nll")

    @classmethod
    def check_flags(cls, args):
        problems = []
        if not args.data or not (args.init_from or args.resume):
            problems.append("--stage dpo tunes a chat model on preference pairs: give --init_from MODEL and "
                            "--data PAIRS (a JSONL file of pairs, or a folder of python -m data.pairs)")
        if not (math.isfinite(args.dpo_beta) and args.dpo_beta > 0):
            problems.append(f"--dpo_beta must be > 0 and finite, got {args.dpo_beta}")
        if not (math.isfinite(args.dpo_nll) and args.dpo_nll >= 0):
            problems.append(f"--dpo_nll must be >= 0 and finite, got {args.dpo_nll}")
        if args.sample_tokens:
            problems.append("--sample_tokens: a DPO run prints no samples (its evaluation line gives the "
                            "reward accuracy): drop it")
        return problems

    def __init__(self, data, args):
        super().__init__(data, args)
        self.objective = None

    def prepare(self, model, meta, pretrained, notes):
        """The reference: a new run records --init_from's path and SHA-256 in args (the checkpoint
        keeps them); --resume (``meta``) loads it from them, refusing a file that changed."""
        args = self.args
        if meta is None:
            args.dpo_reference = os.path.abspath(args.init_from)
            args.dpo_reference_sha256 = file_sha256(reference_file(args.dpo_reference))
        else:
            ran = meta.get("args") or {}
            args.dpo_reference, args.dpo_reference_sha256 = ran.get("dpo_reference"), ran.get("dpo_reference_sha256")
            ckpt_path = os.path.join(args.out_dir, "ckpt.npz")
            if not args.dpo_reference:
                raise ValueError(f"--resume: {ckpt_path} is not a DPO run (--stage dpo): resume it without --stage")
            where = reference_file(args.dpo_reference)
            if not os.path.exists(where):
                raise ValueError(f"--resume: the DPO reference {args.dpo_reference} (the run's --init_from) is gone: "
                                 "put it back to resume the run")
            if file_sha256(where) != args.dpo_reference_sha256:
                raise ValueError(f"--resume: the DPO reference {args.dpo_reference} (the run's --init_from) has "
                                 "changed since the run began: the run cannot continue against another reference")
        self.objective = DPOObjective(load_reference(args.dpo_reference, args), args.dpo_beta, args.dpo_nll)
        notes.append(f"--stage dpo: beta {args.dpo_beta:g}, nll {args.dpo_nll:g}, against the frozen reference "
                     f"{args.dpo_reference}; the losses are the DPO objective's")

    def describe(self):
        n = {split: len(rows[0]) for split, rows in self.data.arrays.items()}
        return f"{self.data.name}: {n['train']:,} train / {n['val']:,} val pairs"

    def loss(self, model, batch):
        return self.objective(model, batch)

    def progress(self, loss):
        return dict(loss=f"{loss:.4f}")

    @ta.no_grad()
    def evaluate(self, model):
        """--eval_iters batches of each split, drawn from a generator of its own (the same batches
        at every evaluation): the mean objective of each, and on the val pairs, from the same
        forwards, the plain DPO loss, the implicit-reward accuracy (the fraction of pairs where
        β log π/π_ref is higher for the chosen answer), and how far the policy's log-probs of the
        chosen and rejected answers have moved from the reference's."""
        args = self.args
        rng = np.random.default_rng(args.seed + 1)
        losses, val_logprobs = {}, []
        model.eval()
        try:
            for split in ("train", "val"):
                parts = []
                for _ in range(args.eval_iters):
                    batch = tuple(ta.tensor(a, device=args.device)
                                  for a in self.get_batch(split, args.batch_size, args.block_size, rng))
                    logprobs = self.objective.logprobs(model, batch)
                    parts.append(self.objective.loss(logprobs, batch))
                    if split == "val":
                        val_logprobs.append(np.stack([t.numpy().astype(np.float64) for t in logprobs]))
                losses[split] = (sum(parts[1:], parts[0]) * (1.0 / len(parts))).item()
        finally:
            model.train()
        pc, pr, rc, rr = np.concatenate(val_logprobs, axis=1)    # each (eval_iters * B,)
        margin = self.objective.beta * ((pc - rc) - (pr - rr))
        return dict(train_loss=round(losses["train"], 6), val_loss=round(losses["val"], 6),
                    val_dpo_loss=round(float(np.mean(np.logaddexp(0.0, -margin))), 6),
                    val_reward_accuracy=round(float(np.mean(margin > 0)), 4),
                    val_chosen_drift=round(float(np.mean(pc - rc)), 4),
                    val_rejected_drift=round(float(np.mean(pr - rr)), 4))

    def eval_line(self, m):
        return (f"train loss {m['train_loss']:.4f}, val loss {m['val_loss']:.4f} (reward accuracy "
                f"{m['val_reward_accuracy']:.3f}, dpo loss {m['val_dpo_loss']:.4f}, log-prob drift "
                f"chosen {m['val_chosen_drift']:+.3f}, rejected {m['val_rejected_drift']:+.3f})")

    def sample_ids(self):
        return None                                # (its evaluation line says how it does)

    def summary(self, final, best):
        return dict(best_val_loss=round(best, 6), **final)

    def done_line(self, summary):
        return (f"done: {summary['iters']} iters, best val loss {summary['best_val_loss']:.4f}, val loss "
                f"{summary['val_loss']:.4f}, reward accuracy {summary['val_reward_accuracy']:.3f}, "
                f"{summary['wall_s']:.0f} s; wrote {os.path.join(self.args.out_dir, 'summary.json')}")


# ---------------------------------------------------------------------------
# the data: pairs rendered with the model's chat tokenizer
class PairDataset(Dataset):
    """Preference pairs as rows of ids. For each split, four (N, W) arrays: the chosen
    conversation's inputs and targets, the rejected one's; a target is -1 off the answer
    (the prompt, padding), so only the answer's tokens count."""

    def get_batch(self, split, batch_size, block_size, rng):
        """batch_size random pairs (drawn with ``rng``): (x_chosen, y_chosen, x_rejected, y_rejected), (B, W)."""
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        rows = self.arrays[split]
        if rows[0].shape[1] > block_size:
            raise ValueError(f"a pair of {self.name} has {rows[0].shape[1]} input tokens, more than "
                             f"block_size {block_size}: truncate the pairs with --max_length {block_size}")
        picked = rng.integers(0, len(rows[0]), size=batch_size)          # (B,)
        return tuple(a[picked] for a in rows)

    def fit_length(self, max_length):
        """Truncate each pair longer than max_length tokens (both answers share the prompt's cut:
        its start goes; each answer loses its end), and drop a pair whose answers are then alike.
        -> the notes of the loading (identical pairs left out) and of this."""
        notes, cut, dropped = list(self.notes), {}, {}
        for split in ("train", "val"):
            examples = [cut_pair(e, max_length) for e in self.rendered[split]]
            cut[split] = sum(a is not b for a, b in zip(examples, self.rendered[split]))
            kept = [e for e in examples if not same_targets(e)]
            dropped[split] = len(examples) - len(kept)
            if not kept:
                raise ValueError(f"--max_length {max_length}: each of the {len(examples)} {split} pairs of "
                                 f"{self.sources[split]} has the same chosen and rejected tokens once truncated "
                                 "(they differ past it): nothing to train on; raise --max_length")
            self.rendered[split] = kept
        self.arrays = {split: example_rows(self.rendered[split]) for split in self.rendered}
        self.train, self.val = answer_ids(self.arrays["train"]), answer_ids(self.arrays["val"])
        if cut["train"] or cut["val"]:
            notes.append(f"--max_length {max_length}: {cut['train']:,} of {len(self.examples['train']):,} train and "
                         f"{cut['val']:,} of {len(self.examples['val']):,} val pairs were longer and are truncated "
                         f"(the prompt's start, the answers' ends); {dropped['train'] + dropped['val']:,} dropped "
                         "(their answers alike once truncated)")
        return notes

    def sample_prompt(self):
        return None


def rendered_pair(tokenizer, pair):
    """(prompt length, (ids, mask) of prompt + chosen, (ids, mask) of prompt + rejected)."""
    prompt = pair["prompt"]
    return (len(render(tokenizer, prompt)[0]), render(tokenizer, prompt + pair["chosen"]),
            render(tokenizer, prompt + pair["rejected"]))


def cut_pair(example, max_length):
    """A rendered pair cut to max_length + 1 ids (max_length tokens read), as data.py's truncate cuts
    one conversation: the shared prompt keeps its end, each answer its start. The same tuple where it fits."""
    prompt, (ci, cm), (ri, rm) = example
    room = max_length + 1
    if max(len(ci), len(ri)) <= room:
        return example
    keep_prompt = min(prompt, max(room - (max(len(ci), len(ri)) - prompt), room // 2))
    start = prompt - keep_prompt
    end = start + room
    return keep_prompt, (ci[start:end], cm[start:end]), (ri[start:end], rm[start:end])


def targets(ids, mask):
    """(x, y) of a rendered conversation: x the ids read, y the next ids, -1 off the answer."""
    return ids[:-1], [t if m else -1 for t, m in zip(ids[1:], mask[1:])]


def same_targets(example):
    """Whether the chosen and rejected answers are the same tokens at the same places (the pair trains nothing)."""
    _, chosen, rejected = example
    return targets(*chosen) == targets(*rejected)


def example_rows(examples):
    """The four (N, W) arrays of rendered pairs; x is padded with 0, y with -1."""
    width = max(len(ids) - 1 for _, c, r in examples for ids, _ in (c, r))
    out = [np.zeros((len(examples), width), np.int64), np.full((len(examples), width), -1, np.int64),
           np.zeros((len(examples), width), np.int64), np.full((len(examples), width), -1, np.int64)]
    for i, (_, chosen, rejected) in enumerate(examples):
        for k, rendered in enumerate((chosen, rejected)):
            x, y = targets(*rendered)
            out[2 * k][i, :len(x)] = x
            out[2 * k + 1][i, :len(y)] = y
    return out


VAL_FRACTION = 0.1          # a file of pairs without --val: its last 10% are the held-out pairs


def pair_files(data, val):
    """{"train": path, "val": path or None} of --data (a folder of python -m data.pairs: train.jsonl and
    test.jsonl; a file of pairs, with --val's file or none: its last 10%)."""
    if os.path.isdir(data):
        paths = {split: os.path.join(data, f"{name}.jsonl") for split, name in (("train", "train"), ("val", "test"))}
        for path in paths.values():
            if not os.path.isfile(path):
                raise ValueError(f"--data {data}: no {os.path.basename(path)} (write the folder with "
                                 "python -m data.pairs, or pass one JSONL file of pairs)")
        return paths
    if not os.path.isfile(data):
        raise ValueError(f"--data {data}: no such file or folder (DPO reads a JSONL file of pairs, or a folder of "
                         "python -m data.pairs)")
    if val is not None and not os.path.isfile(val):
        raise ValueError(f"--val {val}: no such file")
    return {"train": data, "val": val}


def load_pairs(data, tokenizer, val=None):
    """--data's preference pairs as a PairDataset, rendered with the model's chat tokenizer: a folder
    of python -m data.pairs (its "val" split is test.jsonl, words never in training), or one JSONL file
    of pairs in any of TRL's forms (data/pairs.py) with --val's file, or its last 10%, held out. Pairs
    whose chosen and rejected are the same are left out with a note (all of them: refused)."""
    if tokenizer is None or tokenizer.kind != "char" and tokenizer.kind != "bpe":
        raise ValueError(f"--data {data}: DPO renders its pairs with the model's chat tokenizer")
    missing = [t for t in CHAT_TOKENS if t not in tokenizer.special_tokens]
    if missing:
        raise ValueError(f"--stage dpo: the model has no chat tokens ({', '.join(missing)}): start from a model "
                         "fine-tuned on conversations (SFT)")
    paths = pair_files(data, val)
    pairs = {split: read_pairs(path) for split, path in paths.items() if path is not None}
    sources = {split: path for split, path in paths.items()}
    if paths["val"] is None:
        n_val = max(1, round(VAL_FRACTION * len(pairs["train"])))
        if n_val >= len(pairs["train"]):
            raise ValueError(f"{data}: {len(pairs['train'])} pair(s) are too few to hold 10% out: pass --val FILE")
        pairs["train"], pairs["val"] = pairs["train"][:-n_val], pairs["train"][-n_val:]
        sources["val"] = f"{data} (its last {n_val} pairs)"
    notes = []
    for split in ("train", "val"):
        same = identical(pairs[split])
        if len(same) == len(pairs[split]):
            raise ValueError(f"{sources[split]}: chosen and rejected are the same in each of its "
                             f"{len(same)} {split} pairs: DPO learns nothing from them")
        if same:
            lines = ", ".join(map(str, same[:5])) + (", ..." if len(same) > 5 else "")
            notes.append(f"{sources[split]}: {len(same)} of {len(pairs[split])} {split} pairs have the same chosen and "
                         f"rejected (line{'s' if len(same) > 1 else ''} {lines}): they train nothing, and are left out")
            pairs[split] = [p for p in pairs[split] if p["chosen"] != p["rejected"]]
    rendered = {}
    for split in ("train", "val"):
        rendered[split] = []
        for p in pairs[split]:
            try:
                rendered[split].append(rendered_pair(tokenizer, p))
            except ValueError as e:            # a character the model lacks, a system message without its token
                where = paths[split] or paths["train"]
                raise ValueError(f"{where} line {p['line']}: {e}") from None
    rows = {split: example_rows(rendered[split]) for split in rendered}
    raw = b"".join(open(path, "rb").read() for path in paths.values() if path is not None)
    name = os.path.basename(os.path.normpath(data))
    dataset = PairDataset(train=answer_ids(rows["train"]), val=answer_ids(rows["val"]), tokenizer=tokenizer,
                          name=name if os.path.isdir(data) else os.path.splitext(name)[0], source=fingerprint(raw),
                          examples=pairs)
    dataset.arrays = rows                      # {split: [x_chosen, y_chosen, x_rejected, y_rejected]}
    dataset.rendered, dataset.sources, dataset.notes = rendered, sources, notes
    return dataset


def answer_ids(arrays):
    """The ids of every answer (chosen and rejected), as one 1-d array: the tokens DPO scores."""
    return np.concatenate([arrays[1][arrays[1] != -1], arrays[3][arrays[3] != -1]])


# ---------------------------------------------------------------------------
# the run: the reference model, kept by its path and checked on --resume
def reference_file(path):
    """The file that holds --init_from's weights (a folder holds ckpt.npz, or model.safetensors)."""
    if os.path.isdir(path):
        for name in ("ckpt.npz", "model.safetensors"):
            if os.path.isfile(os.path.join(path, name)):
                return os.path.join(path, name)
    return path


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_reference(path, args):
    """The frozen reference: the model at ``path``, in eval mode, with no gradients."""
    from .finetune import load_pretrained
    reference = load_pretrained(SimpleNamespace(init_from=path, dropout=0.0, head_dropout=0.0, out_dir=args.out_dir,
                                                data=None)).model
    for p in reference.parameters():
        p.requires_grad = False
    reference = ta.compile(reference.to(args.dtype).to(args.device), disable=not getattr(args, "compile", True))
    reference.eval()
    return reference


# ---------------------------------------------------------------------------
# held-out pairs: python -m train.dpo --out_dir RUN --data PAIRS
def greedy_answers(model, tokenizer, prompts, max_new_tokens):
    """The model's greedy answer (text up to <|end|>) to each prompt (a list of messages); prompts
    of one length are answered together, as one batch."""
    ids = [render_prompt(tokenizer, p) for p in prompts]
    device = next(iter(model.parameters())).device
    answers = [None] * len(ids)
    for length in sorted({len(i) for i in ids}):
        rows = [k for k, i in enumerate(ids) if len(i) == length]
        out = model.generate(ta.tensor([ids[k] for k in rows], device=device), max_new_tokens, temperature=0.0,
                             stop=[tokenizer.special_tokens["<|end|>"]])         # (B, length + new)
        for k, row in zip(rows, out.tolist()):
            answers[k] = answer_text(tokenizer, row[length:])
    return answers


def task_of(pair):
    """The task a pair's prompt asks (its first word: spell, reverse, how, what)."""
    first = pair["prompt"][-1]["content"].split()[0]
    return {"spell:": "spell", "reverse:": "reverse", "how": "count", "what": "add"}.get(first, first)


@ta.no_grad()
def heldout_report(out_dir, data, device="cpu", max_new_tokens=32, compile=True, val=None, say=None):
    """For each task of data/test.jsonl: the greedy exact match of the model in out_dir, and for a
    DPO run its implicit-reward accuracy against its reference, on the pairs as training cut them
    (to the run's --max_length, with a note to ``say``: stderr by default). -> {task: {...}}."""
    from .sample import load_model
    say = say or (lambda line: print(line, file=sys.stderr))
    model, tokenizer = load_model(out_dir, device)
    model = ta.compile(model, disable=not compile)
    meta = checkpoint_meta(out_dir)
    rows = heldout_pairs(data, val)
    args = meta.get("args") or {}
    objective, cut = None, None
    if args.get("dpo_reference"):
        ns = SimpleNamespace(out_dir=os.path.join(out_dir, "eval"), dtype=args.get("dtype") or "float32",
                             device=device, compile=compile)
        objective = DPOObjective(load_reference(args["dpo_reference"], ns), args["dpo_beta"])
        cut = heldout_rows(tokenizer, rows, args.get("max_length") or meta["config"]["block_size"], say)
    report = {}
    for task in sorted({task_of(p) for p in rows}):
        pairs = [p for p in rows if task_of(p) == task]
        answers = greedy_answers(model, tokenizer, [p["prompt"] for p in pairs], max_new_tokens)
        result = dict(pairs=len(pairs), exact_match=round(float(np.mean(
            [a.strip() == p["chosen"][0]["content"].strip() for a, p in zip(answers, pairs)])), 4))
        scored = [e for p, e in zip(rows, cut or []) if task_of(p) == task and e is not None]
        if objective is not None and scored:
            batch = tuple(ta.tensor(a, device=device) for a in example_rows(scored))
            pc, pr, rc, rr = (t.numpy().astype(np.float64) for t in objective.logprobs(model, batch))
            result["reward_accuracy"] = round(float(np.mean((pc - rc) - (pr - rr) > 0)), 4)
            result["chosen_drift"] = round(float(np.mean(pc - rc)), 4)
            result["rejected_drift"] = round(float(np.mean(pr - rr)), 4)
        report[task] = result
    return report


def heldout_rows(tokenizer, rows, max_length, say):
    """The held-out pairs rendered and cut to max_length as training cuts its val pairs (cut_pair);
    None for a pair whose answers are then alike (training leaves it out). Says how many were cut."""
    rendered = [rendered_pair(tokenizer, p) for p in rows]
    cut = [cut_pair(e, max_length) for e in rendered]
    n_cut = sum(a is not b for a, b in zip(cut, rendered))
    cut = [None if same_targets(e) else e for e in cut]
    alike = cut.count(None)
    if n_cut or alike:
        say(f"--max_length {max_length}: {n_cut:,} of {len(rows):,} held-out pairs were longer and are truncated "
            f"(the prompt's start, the answers' ends); {alike:,} left out of the reward accuracy (their answers "
            "alike)")
    return cut


def heldout_pairs(data, val=None):
    """The pairs training held out of --data: a folder's test.jsonl, --val's file, or a file's last 10%
    (as load_pairs splits it)."""
    paths = pair_files(data, val)
    if paths["val"] is not None:
        return read_pairs(paths["val"])
    rows = read_pairs(paths["train"])
    return rows[-max(1, round(VAL_FRACTION * len(rows))):]


def checkpoint_meta(out_dir):
    from . import checkpoint
    return checkpoint.read_meta(os.path.join(out_dir, "ckpt.npz"))


def main(argv=None):
    import argparse
    import json
    from .config import add_compile_flag
    parser = argparse.ArgumentParser(prog="python -m train.dpo",
                                     description="Held-out pairs: each task's greedy exact match, and for a DPO "
                                                 "run its implicit-reward accuracy and log-prob drift.")
    parser.add_argument("--out_dir", required=True, help="a run (SFT or DPO) with ckpt.npz")
    parser.add_argument("--data", required=True, help="a folder of python -m data.pairs (its test.jsonl is read), "
                                                      "or a JSONL file of pairs (its last 10%%, as training holds out)")
    parser.add_argument("--val", metavar="FILE", help="with --data a file of pairs: the held-out pairs training used")
    parser.add_argument("--device", default="cpu")
    add_compile_flag(parser)
    args = parser.parse_args(argv)
    try:
        report = heldout_report(args.out_dir, args.data, args.device, compile=args.compile, val=args.val)
    except (OSError, ValueError) as e:
        parser.exit(1, f"{parser.prog}: error: {e}\n")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
