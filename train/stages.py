"""The stages of python -m train: what one run trains, as one object the loop calls.

The loop (train/loop.py) is the same for every stage. It asks its stage for:

    stage.get_batch(split, batch_size, block_size, rng)   a batch of arrays (x, y, ...)
    stage.loss(model, batch)                              the 0-d loss of a batch, to backward
    stage.evaluate(model)                                 the evaluation: one dict {metric: number}
    stage.score(metrics)                                  the number best.npz keeps lowest
    stage.eval_line(metrics), stage.describe()            what the run prints

and a few more below (the progress bar, the summary, the last line). The stages:

    LanguageModel   next-token prediction on a text, a token folder (python -m data.prepare)
    Lesson          the same on the lesson's "it" corpus, then its report on attention
    SFT             the same on conversations, the loss on the assistant's tokens (--data CONVS)
    DPO             preference pairs against a frozen reference (--stage dpo, train/dpo.py)
    RL              answers sampled and rewarded (--stage rl, train/rl.py)

``load(args, tokenizer)`` is the one place that looks at --stage and --data to pick the stage, and
``stage_class(args)`` the class whose flags the command line is checked against (each stage
declares its own flags and checks them: ``check_flags``): nothing else in train/ asks which stage
runs (TRL's trainers are the model: one compute_loss each).
"""
import math
import os

from .data import ConversationDataset, load_coref, load_data, load_mix
from .report import perplexity


class LanguageModel:
    """Next-token prediction on a text: the loss is the mean cross-entropy of each next token, the
    evaluation its mean over --eval_iters batches of each split, and best.npz keeps the lowest
    val loss. ``data`` is a train/data.py Dataset (it holds the tokens and the tokenizer)."""

    def __init__(self, data, args):
        self.data, self.args = data, args

    # ------------------------------------------------------------------ its flags (train/config.py asks)
    name = None                 # its --stage NAME (None: the stage follows from --data)
    preset = None               # the config/ preset of its own defaults, over the text preset's (config/dpo.py)
    own_flags = ()              # its own settings (--dpo_beta ...), which the other stages refuse
    takes_val = True            # --val FILE: the held-out file of --data a file of examples
    resume_needs_data = True    # a run trained on a text resumes with that --data again

    @classmethod
    def check_flags(cls, args):
        """Fill in the stage's own defaults and check the flags it needs (after the presets are
        filled in) -> the problems, each a one-line sentence."""
        return []

    # ------------------------------------------------------------------ set-up
    def prepare(self, model, meta, pretrained, notes):
        """After the model exists (``meta``: the checkpoint's on --resume, else None; ``pretrained``:
        --init_from's model, or None). A stage with more to load (a reference model) loads it here."""

    def fit_length(self, max_length):
        """Cut the examples longer than ``max_length`` tokens (--max_length) -> notes for the log.
        A stream of text has no examples: its data says nothing."""
        return self.data.fit_length(max_length)

    def rows_per_item(self):
        """Rows of the model's input for each item of a batch (the memory check's count)."""
        return 1

    def tokens_per_row(self, block_size):
        """The longest row the model reads: whole sentences where the data has them, else block_size."""
        rows = self.data.rows
        return rows["train"].shape[1] - 1 if rows is not None else block_size

    def describe(self):
        """The data, as the run's header says it."""
        return f"{self.data.name}: {len(self.data.train):,} train / {len(self.data.val):,} val tokens"

    # ------------------------------------------------------------------ training
    def get_batch(self, split, batch_size, block_size, rng):
        return self.data.get_batch(split, batch_size, block_size, rng)

    def loss(self, model, batch):
        """The language model's loss on a batch (x, y): the mean cross-entropy of each next token
        (a target of -1, padding or a token outside the loss mask, counts for nothing)."""
        x, y = batch
        return model(x, y)[1]

    def step_metrics(self):
        """Numbers of the newest training batch for log.csv's step rows ({} for none)."""
        return {}

    def stalled(self, step_rows):
        """Where the steps so far (log.csv's step rows) have had nothing to learn from for a while, a
        sentence that says so (printed once, under --quiet too); else None."""
        return None

    def progress(self, loss):
        """The progress bar's numbers for the newest step loss."""
        return dict(loss=f"{loss:.4f}", ppl=f"{perplexity(loss):.2f}")

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, model):
        """The mean loss over --eval_iters batches of each split (the same batches every time)."""
        from . import loop                      # (looked up at each call: tests patch estimate_loss)
        losses = loop.estimate_loss(model, self, self.args, self.loss)
        metrics = dict(train_loss=round(losses["train"], 6), val_loss=round(losses["val"], 6),
                       train_perplexity=round(perplexity(losses["train"]), 4),
                       val_perplexity=round(perplexity(losses["val"]), 4))
        bpb = self.data.bits_per_byte(losses["val"])       # val bits per byte: comparable across tokenizers
        if bpb is not None:
            metrics["val_bpb"] = round(bpb, 6)
        return metrics

    def score(self, metrics):
        return metrics["val_loss"]

    def diverged(self, metrics):
        """What is not finite in the evaluation (a sentence), or None."""
        if math.isfinite(metrics["train_loss"]) and math.isfinite(metrics["val_loss"]):
            return None
        return f"the eval loss is train {metrics['train_loss']}, val {metrics['val_loss']}"

    def eval_line(self, metrics):
        bpb = metrics.get("val_bpb")
        return (f"train loss {metrics['train_loss']:.4f}, val loss {metrics['val_loss']:.4f} "
                f"(perplexity {metrics['val_perplexity']:.2f}" +
                ("" if bpb is None else f", {bpb:.4f} bits per byte") + ")")

    @staticmethod
    def best_words(best, log):
        """'best val loss 1.9123' for the resuming line (the last val loss where no best is kept)."""
        if math.isfinite(best):
            return f"best val loss {best:.4f}"
        return f"val loss {log[-1]['val_loss']:.4f}" if log else "not evaluated yet"

    def sample_ids(self):
        """The ids a sample in the log starts from (None: no sample)."""
        return self.data.tokenizer.encode(self.data.sample_prompt())

    # ------------------------------------------------------------------ the end
    def summary(self, final, best):
        """summary.json's part of the stage: ``final`` the last evaluation, ``best`` the lowest score."""
        out = dict(best_val_loss=round(best, 6), val_loss=final["val_loss"],
                   best_val_perplexity=round(perplexity(best), 4), val_perplexity=final["val_perplexity"],
                   train_loss=final["train_loss"])
        if self.data.text_bytes:
            out.update(best_val_bpb=round(self.data.bits_per_byte(best), 6), val_bpb=final["val_bpb"])
        return out

    def report(self, model, say):
        """More of summary.json, measured after training ({} for none)."""
        return {}

    def done_line(self, summary):
        """The last line a finished run prints (stdout, also under --quiet)."""
        return (f"done: {summary['iters']} iters, best val loss {summary['best_val_loss']:.4f} "
                f"(perplexity {summary['best_val_perplexity']:.2f}), val loss {summary['val_loss']:.4f}"
                f"{self.done_extra(summary)}, "
                f"{'' if 'val_bpb' not in summary else str(round(summary['val_bpb'], 4)) + ' val bits per byte, '}"
                f"{'no steps timed' if summary['tokens_per_s'] is None else str(summary['tokens_per_s']) + ' tokens/s'}"
                f", {summary['wall_s']:.0f} s; wrote {os.path.join(self.args.out_dir, 'summary.json')}")

    def done_extra(self, summary):
        return ""


class Lesson(LanguageModel):
    """The lesson's "it" corpus (data/coref.py): a language model, then how well it, and its
    attention, resolve "it" (train/lesson.py)."""

    def report(self, model, say):
        from . import lesson
        return lesson.report(model, self.data, self.args.out_dir, self.args.device, say)

    def done_extra(self, summary):
        return (f", held-out referent accuracy {summary['heldout_accuracy']:.3f}, "
                f"attention on the referent {summary['heldout_attention_correct']:.3f}")


class SFT(LanguageModel):
    """Supervised fine-tuning on conversations (--data a folder of python -m data.prepare
    CONVS.jsonl): the language model's loss on the assistant's tokens only, and with --mix_data
    plain text mixed into each batch."""

    def tokens_per_row(self, block_size):
        return block_size if self.data.mix is not None else super().tokens_per_row(block_size)

    def sample_ids(self):
        return self.data.sample_ids()


# ---------------------------------------------------------------------------
# the one place that picks the stage
def named_stages():
    """{NAME: class} of the stages --stage NAME runs (the others follow from --data)."""
    from .dpo import DPO
    from .rl import RL
    return {DPO.name: DPO, RL.name: RL}


def stage_class(args, ran=None):
    """The class of the stage a command runs, for its flags: --stage's (on --resume, ``ran``, the
    run's settings, may give it), else LanguageModel (a language model, SFT or the lesson alike)."""
    name = args.stage or (ran or {}).get("stage")
    return named_stages()[name] if name else LanguageModel


def chat_stage(args):
    """The stage's name where it fine-tunes an assistant (its --init_from needs the chat tokens), else None."""
    return args.stage if args.stage in ("dpo", "rl") else None


def load(args, tokenizer):
    """The stage of this run, with its data: --stage dpo, --stage rl, or (without --stage) a
    language model on --data (SFT where --data is conversations), or the lesson corpus."""
    if args.stage == "dpo":                     # preference pairs, rendered with the model's chat tokenizer
        from . import dpo
        stage = dpo.DPO(dpo.load_pairs(args.data, tokenizer, args.val), args)
    elif args.stage == "rl":                    # questions, answered by the model (train/rl.py)
        from . import rl
        stage = rl.RL(rl.load_questions(args, tokenizer), args)
    elif not args.data:
        stage = Lesson(load_coref(seed=0, layout=args.layout), args)
    else:
        data = load_data(args.data, tokenizer, args.val)
        stage = SFT(data, args) if isinstance(data, ConversationDataset) else LanguageModel(data, args)
    if args.mix_data:
        if not isinstance(stage, SFT):
            given = f"--data {args.data} is not a conversation folder" if args.data else "no --data was given"
            raise ValueError(f"--mix_data mixes text into conversations: {given} (python -m data.prepare "
                             "CONVS.jsonl writes one)")
        stage.data.add_mix(*load_mix(args.mix_data, stage.data.tokenizer), args.mix_fraction)
    return stage

