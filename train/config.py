"""python -m train's settings: the flags (named as nanoGPT names them), the presets they
override, their checks, and what --resume carries over and refuses."""
import argparse
import ast
import difflib
import math
import os
import sys
from pathlib import Path

from data import cli
from tinyattn import distributed as dist
from tinyattn.models import GPTConfig
from tinyattn.models.gpt import INITS, MLPS, NORMS, POSITIONS

from . import checkpoint, stages
from data.tasks import TASKS, task_list

from .data import tokenizer_from_json, tokenizer_to_json

# Defaults per dataset, like nanoGPT's config files: config/coref.py (the lesson corpus) and
# config/text.py (--data), read into PRESETS below build_parser. Flags, and a config file given
# first, override them. The config folder installs beside this package, so the same path works
# in a checkout and in an installed copy.
CONFIG_DIR = Path(__file__).resolve().parent.parent / "config"
DEFAULT_SEED = 1337
PROFILE_STEPS = range(1, 6)   # --profile: step 0 warms up, these five are timed
COMMON = dict(dropout=0.0, head_dropout=0.0, init="gpt2", pos="learned", norm="layernorm", mlp="gelu", qk_norm=False,
              tie_embeddings=True, rope_theta=10000.0, weight_decay=0.1, beta1=0.9, beta2=0.99, grad_clip=1.0,
              gradient_accumulation_steps=1, bias=True, log_interval=10, sample_tokens=200, shared_batches=False,
              always_save_checkpoint=False, save_interval_s=0.0,
              dtype="float32")   # the defaults under both presets (nanoGPT's train.py holds its own too)


class OneLineParser(cli.OneLineParser):
    """data/cli.py's one-line argparse, printed by rank 0 alone under mpiexec. Flags are never
    abbreviated (``--lr`` is not ``--lr_decay_iters``): an unknown flag is refused by name,
    with the closest real ones suggested."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n" if dist.rank() == 0 else None)

    def parse_args(self, args=None, namespace=None):
        args, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(unknown_argument_message(self, extras))
        return args


def at_least(lo, kind=int):
    """An argparse type: a number of ``kind`` that is at least ``lo``."""
    def parse(text):
        value = kind(text)
        if not value >= lo:                      # NaN fails too
            raise argparse.ArgumentTypeError(f"must be at least {lo}, got {text}")
        return value
    parse.__name__ = kind.__name__               # argparse's "invalid int value" message
    parse.kind = kind                            # what a config file's value must be
    return parse


def yes_or_no(text):
    """An argparse type for on/off flags: true/false, yes/no, 1/0."""
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_compile_flag(parser):
    """nanoGPT's --compile: the model runs on the fast layer (ta.compile) unless --compile False."""
    parser.add_argument("--compile", nargs="?", const=True, default=True, type=yes_or_no, metavar="BOOL",
                        help="run the model with ta.compile: fused blocks, fast ops, AdamW's flat step "
                             "(default True; --compile False runs every op's teaching formula)")


def positive_float(text):
    """An argparse type: a finite number above 0."""
    value = float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be above 0 and finite, got {text}")
    return value


def task_names(text):
    """An argparse type for --rl_tasks: task names, separated by commas or spaces (as one argument
    or several) -> the names joined by commas."""
    try:
        return ",".join(task_list(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected task names from {', '.join(TASKS)}, got {text!r} ({e})") from None


def stage_name(text):
    """An argparse type for --stage: a name of train/stages.py's named_stages (dpo, rl). SFT has no
    --stage: it is a run on conversations."""
    if text.lower() == "sft":
        raise argparse.ArgumentTypeError("SFT needs no --stage: it is python -m train --data <conversation folder> "
                                         "(python -m data.prepare CONVS.jsonl writes one), with --init_from MODEL "
                                         "to fine-tune a model")
    if text not in stages.named_stages():
        raise argparse.ArgumentTypeError(f"expected {' or '.join(stages.named_stages())}, got {text!r}")
    return text


DTYPES = ("float32", "float64")


def float_dtype(text):
    """An argparse type for --dtype: float32 or float64. nanoGPT's float16 and bfloat16 (its
    mixed precision on a GPU) are refused by name."""
    if text in DTYPES:
        return text
    if text in ("float16", "bfloat16", "half"):
        raise argparse.ArgumentTypeError(f"{text} is not available: the CPU build computes in float32 or float64 "
                                         "(nanoGPT's float16 and bfloat16 are mixed precision on a GPU)")
    raise argparse.ArgumentTypeError(f"expected float32 or float64, got {text!r}")


ALIASES = {"--lr": "--learning_rate", "--epochs": "--max_iters", "--steps": "--max_iters", "--iters": "--max_iters",
           "--bs": "--batch_size", "--context": "--block_size", "--layers": "--n_layer", "--heads": "--n_head"}


def close_flags(parser, name):
    """The flags most like ``name`` (a mistyped flag, or a config file's unknown setting)."""
    flags = [f for action in parser._actions if action.help != argparse.SUPPRESS
             for f in action.option_strings if f.startswith("--")]
    full = "--" + name.lstrip("-")                           # -lr and --lr alike
    close = [ALIASES[full]] if full in ALIASES else [full] if full in flags else []
    close += [f for f in flags if f.startswith(full) and len(full) > 3 and f not in close]
    if not close:
        close = difflib.get_close_matches(full, flags, n=3, cutoff=0.6)
    return close[:3]


def unknown_argument_message(parser, extras):
    """One line about the first argument argparse did not know, with a suggestion."""
    first = next((e for e in extras if e.startswith("-")), extras[0])
    if not first.startswith("-"):
        if first.endswith(".py"):
            return (f"unexpected argument {first!r}: a config file comes first, as in "
                    f"python -m train {first} --max_iters 100")
        hint = f" (did you mean --data {first}?)" if os.path.isfile(first) else ""
        return f"unexpected argument {first!r}: every value follows its flag, as in --max_iters 100{hint}"
    name = first.split("=", 1)[0]
    close = close_flags(parser, name)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    return f"unknown flag {name}{hint}; flags are never abbreviated"


def build_parser():
    p = OneLineParser(prog="python -m train", description=__doc__, usage="%(prog)s [CONFIG.py] [flags]",
                      epilog="CONFIG.py: a Python file of NAME = value lines, named as the flags are (the\n"
                             "presets are config/coref.py and config/text.py, to copy); its settings count as\n"
                             "flags given, and flags after it override them.",
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="a UTF-8 text file for character-level training, or a folder of token files "
                                   "or conversations from python -m data.prepare (default: the lesson corpus); "
                                   "--stage dpo: pairs")
    p.add_argument("--out_dir", help="where ckpt.npz, log.csv, loss.png and summary.json go")
    p.add_argument("--resume", action="store_true", help="continue from out_dir/ckpt.npz")
    p.add_argument("--init_from", metavar="PATH",
                   help="fine-tune: start a new run from a trained model (a checkpoint, or a Hugging Face GPT-2 "
                        "or Llama folder, as GPT.export_hf writes them), with its vocabulary and a fresh optimizer")
    add_compile_flag(p)
    p.add_argument("--lora_rank", type=at_least(1), metavar="R",
                   help="with --init_from: train low-rank adapters of rank R (your LoRALinear, exercise 17) "
                        "around each block's attn.c_attn, every other weight frozen")
    p.add_argument("--lora_alpha", type=float, metavar="A", help="the adapters' scale is A / R (default A = R)")
    p.add_argument("--overwrite", action="store_true",
                   help="start a new run in an --out_dir that holds one (its checkpoints and logs are deleted first)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, or strict (the test stand-in for a GPU)")
    p.add_argument("--seed", type=int, help="the random streams: init, batches, dropout, evaluation (default 1337; "
                                            "--resume: the run's own)")
    for name in ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "max_iters", "lr_decay_iters",
                 "warmup_iters", "eval_interval", "eval_iters", "gradient_accumulation_steps", "log_interval",
                 "sample_tokens"):
        p.add_argument(f"--{name}", type=int)
    for name in ("learning_rate", "min_lr", "weight_decay", "beta1", "beta2", "grad_clip", "dropout", "head_dropout"):
        p.add_argument(f"--{name}", type=float)
    p.add_argument("--dtype", type=float_dtype, metavar="float32|float64",
                   help="float32 (the default) or float64: the parameters, the activations and AdamW's state "
                        "(--resume: the run's own)")
    p.add_argument("--bias", type=yes_or_no, help="biases in Linear and LayerNorm (true or false)")
    p.add_argument("--init", choices=INITS, help="weight init: gpt2 (nanoGPT's N(0, 0.02)) or default (each "
                                                 "layer's own, as in PyTorch: Embedding N(0, 1), Linear uniform)")
    # the modern block (Llama's and nanochat's choices; GPTConfig in tinyattn/models/gpt.py), each on its own
    p.add_argument("--pos", choices=POSITIONS, help="position encoding: learned (GPT-2's table, the default) "
                                                    "or rope (rotary, in attention)")
    p.add_argument("--rope_theta", type=at_least(1.0, float), metavar="THETA", help="rotary's base (default 10000)")
    p.add_argument("--norm", choices=NORMS, help="layernorm (the default) or rmsnorm")
    p.add_argument("--mlp", choices=MLPS, help="gelu (4 n_embd wide, the default), swiglu (Llama's gated MLP, "
                                               "8 n_embd / 3 wide: as many weights) or relu2 (nanochat's)")
    p.add_argument("--n_kv_head", type=at_least(1), metavar="N",
                   help="key/value heads, dividing --n_head (grouped-query attention; 1: multi-query; "
                        "default: --n_head)")
    p.add_argument("--qk_norm", type=yes_or_no, help="an RMSNorm on each head's queries and keys (true or false)")
    p.add_argument("--tie_embeddings", type=yes_or_no,
                   help="the output layer shares the token embedding (true, GPT-2's, the default) or not")
    p.add_argument("--layout", choices=("sentence", "stream"),
                   help="the 'it' corpus only: one sentence per sequence from position 0 (default), "
                        "or random windows of the sentences run together")
    p.add_argument("--shared_batches", action="store_true", default=None,
                   help="under mpiexec: every process draws the whole batch from --seed's stream and trains on "
                        "its slice, so N processes see exactly the batches of one (a check; see train/parallel.py)")
    p.add_argument("--always_save_checkpoint", action="store_true", default=None,
                   help="write ckpt.npz at every evaluation, not only when the val loss improved (best.npz "
                        "still keeps the best)")
    p.add_argument("--save_interval_s", type=at_least(0.0, float), metavar="S",
                   help="also write ckpt.npz every S seconds between evaluations (for long runs)")
    p.add_argument("--eval_only", action="store_true",
                   help="evaluate the model the run would start from (--resume: out_dir's checkpoint; "
                        "--init_from PATH) and print its losses; nothing is written")
    p.add_argument("--quiet", action="store_true", help="no progress bar or samples")
    p.add_argument("--use_exercises", action="store_true",
                   help="run with every passing piece of exercises/ (EXERCISES.md, part two) swapped into the library")
    p.add_argument("--detect_anomaly", action="store_true",
                   help="stop at the first op whose output or gradient holds NaN or Inf, and name it")
    # the fine-tuning stages after SFT (SFT itself is --init_from with --data a conversation folder)
    p.add_argument("--stage", type=stage_name, metavar="dpo|rl",
                   help="dpo: preference tuning of the --init_from model (a chat model) on --data's pairs "
                        "(a JSONL file in any of TRL's preference forms, or a folder of python -m data.pairs), "
                        "against a frozen copy of it (train/dpo.py); rl: reinforcement "
                        "learning with verifiable rewards on the tasks of data/tasks.py, from --init_from an "
                        "assistant (train/rl.py), --data then being the text the word tasks take their words from")
    # --stage rl
    p.add_argument("--rl_tasks", type=task_names, nargs="+", metavar="TASK[,TASK]",
                   help=f"--stage rl: the tasks whose questions the model answers, separated by commas or spaces "
                        f"({', '.join(TASKS)}; default count)")
    p.add_argument("--rl_prompts", type=at_least(1), metavar="P",
                   help="--stage rl: questions a step (it is the batch size; default 16)")
    p.add_argument("--rl_samples", type=at_least(2), metavar="K", help="--stage rl: answers a question (default 8)")
    p.add_argument("--rl_temperature", type=positive_float, metavar="T",
                   help="--stage rl: the temperature the answers are sampled at (default 1.0)")
    p.add_argument("--rl_kl", type=at_least(0.0, float), metavar="W",
                   help="--stage rl: weight of the KL to the frozen --init_from model (default 0: none)")
    p.add_argument("--rl_std", type=yes_or_no, metavar="true|false",
                   help="--stage rl: divide each advantage by its group's std, as GRPO does (default false)")
    p.add_argument("--rl_max_tokens", type=at_least(1), metavar="N",
                   help="--stage rl: the longest answer sampled, in tokens (default 32)")
    p.add_argument("--rl_eval_prompts", type=at_least(1), metavar="N",
                   help="--stage rl: held-out questions each evaluation answers (default 48)")
    p.add_argument("--rl_reward", metavar="exact|number|contains|MODULE:FUNCTION",
                   help="--stage rl with --data PROMPTS.jsonl (\"prompt\" and \"answer\", or conversations whose "
                        "last assistant turn is the answer): how an answer scores against the reference: exact "
                        "match (the default), the same last number, contains it, or your function, called as TRL's "
                        "reward functions are: fn(completions, prompts=..., answer=..., **columns) -> list of floats")
    p.add_argument("--profile", action="store_true",
                   help=f"time every op over steps {PROFILE_STEPS.start}-{PROFILE_STEPS.stop - 1}, print the "
                        "table and write out_dir/trace.json (for chrome://tracing or Perfetto)")
    # --data CONVERSATIONS (supervised fine-tuning): plain text mixed into each batch
    p.add_argument("--mix_data", metavar="FILE_OR_DIR",
                   help="with --data a conversation folder: a text file (or token folder) whose windows make "
                        "up --mix_fraction of each batch's rows, so the model keeps its language model")
    p.add_argument("--mix_fraction", type=float, metavar="F",
                   help="the fraction of each batch's rows that are --mix_data's text (default 0.25)")
    # --stage dpo
    p.add_argument("--dpo_beta", type=float, metavar="BETA",
                   help="--stage dpo: the scale of the implicit rewards beta log(pi/pi_ref) (default 0.1)")
    p.add_argument("--val", metavar="FILE",
                   help="with --data a file of conversations (SFT) or of pairs (--stage dpo): the held-out ones "
                        "(default: the last 10%% of --data)")
    p.add_argument("--max_length", type=at_least(1), metavar="N",
                   help="the longest conversation (SFT) or pair (DPO), in tokens the model reads: a longer one has "
                        "its prompt cut from the start and its answer from the end, as TRL truncates "
                        "(default: block_size)")
    p.add_argument("--dpo_nll", type=float, metavar="W",
                   help="--stage dpo: add W times the chosen answers' mean NLL per token, as RPO does (default 0)")
    return p


NANOGPT_INIT_FROM = {   # nanoGPT's --init_from values, and what tinyattn calls them
    "resume": "--init_from resume is nanoGPT's way to continue a run; here it is --resume (it continues "
              "--out_dir's ckpt.npz)",
    "scratch": "--init_from scratch is nanoGPT's new model; here a run starts from scratch without --init_from",
}


def setting_value(action, value):
    """A config file's value for a flag's setting, checked as the flag checks its text.
    -> the value (an int for a float setting becomes a float); raises ValueError with the reason."""
    takes_bool = isinstance(action, argparse._StoreTrueAction) or action.type is yes_or_no
    kind = bool if takes_bool else getattr(action.type, "kind", action.type) or str
    if kind is bool:
        ok, expected = isinstance(value, bool), "True or False"
    elif kind is int:
        ok, expected = isinstance(value, int) and not isinstance(value, bool), "a whole number"
    elif kind is float:
        ok, expected = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
    else:
        ok, expected = isinstance(value, str), "a string in quotes"
    if not ok:
        raise ValueError(f"expected {expected}, got {type(value).__name__}")
    if kind is float:
        value = float(value)
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"expected one of {', '.join(map(repr, action.choices))}")
    if action.type is not None and not takes_bool:
        try:
            action.type(str(value))              # the flag's own checks: a range, a refused dtype
        except argparse.ArgumentTypeError as e:
            raise ValueError(str(e)) from None
    return value


def read_config_file(path, parser):
    """The settings of a config file, as nanoGPT's config files give them: one ``name = value``
    line per setting, named as the flags are (``max_iters = 100`` is ``--max_iters 100``).
    -> {flag's dest: value}. Raises ValueError, one line naming the file (and the line).

    The file is read, not run: each value is a literal (a number, a string, True or False), taken
    by ast.literal_eval. nanoGPT exec()s its config files, so they may import and compute; here a
    config file is data, so it cannot run code, and each value has a type to check against its
    flag's before anything starts. Comments and a docstring are fine; anything else is refused."""
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        tree = ast.parse(source, filename=str(path))
    except OSError as e:
        raise ValueError(f"config file {path}: {e.strerror or e}") from None
    except (SyntaxError, UnicodeDecodeError, ValueError) as e:
        where = f" line {e.lineno}" if getattr(e, "lineno", None) else ""
        raise ValueError(f"config file {path}{where}: not Python that reads ({type(e).__name__})") from None
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    settings = {}
    for i, node in enumerate(tree.body):
        where = f"config file {path} line {node.lineno}"
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            continue                             # a docstring
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            raise ValueError(f"{where}: only NAME = value lines are read (a number, a string, True or False)")
        name = node.targets[0].id
        if name not in actions:
            close = [f.lstrip("-") for f in close_flags(parser, name)]
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise ValueError(f"{where}: unknown setting {name}{hint}; the settings are the flags of python -m train")
        try:
            value = ast.literal_eval(node.value)
        except ValueError:
            raise ValueError(f"{where}: {name} = {ast.get_source_segment(source, node.value)}: "
                             "a value here is a number, a string, True or False, not an expression") from None
        try:
            settings[actions[name].dest] = setting_value(actions[name], value)
        except ValueError as e:
            raise ValueError(f"{where}: {name} = {value!r}: {e}") from None
    return settings


# the presets, read once; read_config_file checks them as it would check a user's copy
PRESETS = {name: read_config_file(CONFIG_DIR / f"{name}.py", build_parser()) for name in ("coref", "text", "dpo")}


def parse_args(argv=None):
    """The command line -> (args, notes): the flags with the presets filled in, and what was
    adapted to fit (printed when the run starts)."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0].endswith(".py") and not argv[0].startswith("-"):
        try:                                     # its settings are flags given; flags after it override them
            parser.set_defaults(**read_config_file(argv.pop(0), parser))
        except ValueError as e:
            parser.error(str(e))
    args = parser.parse_args(argv)
    if args.rl_tasks is not None:                # one or more arguments (a config file's string) -> "a,b"
        try:
            args.rl_tasks = ",".join(task_list(args.rl_tasks))
        except ValueError as e:
            parser.error(f"--rl_tasks: {e}")
    if args.init_from in NANOGPT_INIT_FROM and not os.path.exists(args.init_from):
        parser.error(NANOGPT_INIT_FROM[args.init_from])
    args._given = sorted(k for k, v in vars(args).items() if v is not None and k not in ("device", "seed", "compile"))
    args.rl_tasks_given = args.rl_tasks is not None      # (--stage rl: a prompts file takes no tasks)
    notes = []
    if args.resume and args.init_from:           # the command that started the run, with --resume appended
        try:
            notes.append(resume_ignores_init_from(args))
        except ValueError as e:
            parser.error(str(e))
    preset = {**COMMON, **PRESETS["text" if args.data else "coref"], "seed": DEFAULT_SEED}
    ran = resumed_settings(args.out_dir or preset["out_dir"]) if args.resume else {}
    stage = stages.stage_class(args, ran)       # (the class: its flags; the stage itself is made by train/start.py)
    if stage.preset:
        preset.update(PRESETS[stage.preset])     # a stage's own defaults (config/dpo.py)
    if args.resume:                              # --resume continues the run with its own settings
        preset.update(ran)
        args._given = sorted(set(args._given) | set(ran))      # kept as they are, like flags given again
    for key, value in preset.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    problems = stage_problems(args, stage)
    if problems:
        parser.error("; ".join(problems))
    problems, checked = validate_args(args, stage)
    if problems:
        parser.error("; ".join(problems))
    return args, notes + checked


def resume_ignores_init_from(args):
    """--resume with --init_from (the command that started a fine-tuning run, or a config file that
    sets init_from, with --resume appended): as nanoGPT's init_from = 'resume' replaces the file's
    setting, the run continues from its checkpoint. --init_from must be the model the run started
    from; it is then dropped. -> the note that says so; raises ValueError for another model."""
    where = os.path.join(args.out_dir or PRESETS["text" if args.data else "coref"]["out_dir"], "ckpt.npz")
    try:
        ran = checkpoint.read_meta(where).get("args") or {}
    except (ValueError, OSError):
        ran = None                               # no run to compare with: setup says what is wrong
    started = ran and (ran.get("fine_tuned_from") or ran.get("init_from") or ran.get("dpo_reference"))
    if ran is not None and not started:
        raise ValueError(f"--resume: the run in {where} started from scratch, not from --init_from "
                         f"{args.init_from}: drop --init_from to resume it")
    if started and not same_model_path(args.init_from, started):
        raise ValueError(f"--resume: --init_from {args.init_from} is not the model the run in {where} started "
                         f"from ({started}): drop --init_from to resume it, or use another --out_dir for a new run")
    given, args.init_from = args.init_from, None
    args._given = [k for k in args._given if k != "init_from"]
    return f"--resume: --init_from {given} is the model the run started from; the run continues from {where}"


def same_model_path(a, b):
    """Do two --init_from paths name the same model (a folder and its ckpt.npz alike)?"""
    def resolved(path):
        path = os.path.abspath(path)
        inside = os.path.join(path, "ckpt.npz")
        return inside if os.path.isdir(path) and os.path.isfile(inside) else path
    return resolved(a) == resolved(b)


def stage_problems(args, stage):
    """The flags of the stage that runs, checked by the stage (train/stages.py: each stage's
    check_flags, which also fills in its own defaults); the other stages' own flags refused."""
    given = set(args._given)
    for other in stages.named_stages().values():
        if other is not stage:
            refused = [name for name in other.own_flags if name in given and getattr(args, name) is not None]
            if refused:
                return [f"--{refused[0]} is a setting of --stage {other.name}"]
    return stage.check_flags(args)


AT_LEAST_1 = ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "eval_interval", "eval_iters",
              "gradient_accumulation_steps", "log_interval")
AT_LEAST_0 = ("max_iters", "warmup_iters", "lr_decay_iters", "sample_tokens", "seed")


def refit(args, name, value, limit):
    """Set a preset value that does not fit; -> the note that says so."""
    note = f"--{name} set to {value} to fit {limit} (the preset's was {getattr(args, name)})"
    setattr(args, name, value)
    return note


def validate_args(args, stage=None):
    """Range-check every numeric flag and fit the schedule to --max_iters.

    -> (problems, notes): problems stop the run (one line, all of them); notes say what was
    adapted. A preset value that does not fit is adapted; a flag the user gave is kept.
    """
    problems, notes = [], []
    given = set(args._given)
    stage = stage or stages.stage_class(args)
    if args.resume and args.overwrite:
        problems.append("--resume continues the run in --out_dir, --overwrite replaces it: give one of them")
    if args.data and args.layout:
        problems.append("--layout is for the 'it' corpus only, not with --data")
    if args.mix_fraction is not None and not args.mix_data:
        problems.append("--mix_fraction is the share of --mix_data's rows: give --mix_data too")
    if args.mix_data and not args.data and not args.resume:
        problems.append("--mix_data mixes text into conversations: give --data a conversation folder too "
                        "(python -m data.prepare CONVS.jsonl writes one)")
    if args.val and not (stage.takes_val and args.data and os.path.isfile(args.data)):
        problems.append("--val is the held-out file of --data a file of conversations or pairs (a text's val is "
                        "its last 10%, a folder holds its own)")
    if args.mix_data and args.mix_fraction is None:
        args.mix_fraction = 0.25
    if args.mix_fraction is not None and not 0 < args.mix_fraction < 1:
        problems.append(f"--mix_fraction must be in (0, 1), got {args.mix_fraction}")
    if args.lora_rank and not args.init_from:
        problems.append("--lora_rank adapts a trained model: give it with --init_from PATH")
    if args.lora_alpha is not None and not args.lora_rank:
        problems.append("--lora_alpha is the scale of --lora_rank's adapters: give --lora_rank too")
    for name in AT_LEAST_1:
        if getattr(args, name) < 1:
            problems.append(f"--{name} must be at least 1, got {getattr(args, name)}")
    for name in AT_LEAST_0:
        if getattr(args, name) < 0:
            problems.append(f"--{name} must not be negative, got {getattr(args, name)}")
    if args.n_embd >= 1 and args.n_head >= 1 and args.n_embd % args.n_head:
        problems.append(f"--n_embd {args.n_embd} must be divisible by --n_head {args.n_head}")
    elif args.pos == "rope" and args.n_embd >= 1 and args.n_head >= 1 and (args.n_embd // args.n_head) % 2:
        problems.append(f"--pos rope needs an even head size, --n_embd / --n_head, got {args.n_embd // args.n_head}")
    if args.n_kv_head is not None and args.n_head >= 1 and args.n_head % args.n_kv_head:
        problems.append(f"--n_kv_head {args.n_kv_head} must divide --n_head {args.n_head}")
    world = dist.world_size()
    if args.batch_size >= 1 and args.batch_size % world:
        problems.append(f"--batch_size {args.batch_size} is the global batch and must split evenly over the "
                        f"{world} processes: use a multiple of {world}")
    for name, lo, lo_ok, hi, hi_ok in (("learning_rate", 0, False, math.inf, False), ("min_lr", 0, True, math.inf, False),
                                       ("weight_decay", 0, True, math.inf, False), ("grad_clip", 0, True, math.inf, False),
                                       ("beta1", 0, True, 1, False), ("beta2", 0, True, 1, False),
                                       ("dropout", 0, True, 1, False), ("head_dropout", 0, True, 1, False)):
        value = getattr(args, name)
        if not (math.isfinite(value) and (value >= lo if lo_ok else value > lo) and (value <= hi if hi_ok else value < hi)):
            span = f"in {'[' if lo_ok else '('}{lo}, {hi}{']' if hi_ok else ')'}" if hi != math.inf else \
                f"{'>= ' if lo_ok else '> '}{lo} and finite"
            problems.append(f"--{name} must be {span.replace('inf', 'infinity')}, got {value}")
    if problems:
        return problems, notes
    if args.min_lr > args.learning_rate:
        if "min_lr" in given:
            problems.append(f"--min_lr {args.min_lr} must not exceed --learning_rate {args.learning_rate}")
        else:
            args.min_lr = args.learning_rate / 10
            notes.append(f"--min_lr set to {args.min_lr:g} (a tenth of --learning_rate; the preset's was higher)")
    if args.max_iters > 0:
        if args.lr_decay_iters > args.max_iters:
            if "lr_decay_iters" in given:
                notes.append(f"--lr_decay_iters {args.lr_decay_iters} is past --max_iters {args.max_iters}: "
                             "the learning rate will not reach --min_lr in this run")
            else:
                notes.append(refit(args, "lr_decay_iters", args.max_iters, "--max_iters"))
        if args.warmup_iters >= args.max_iters:
            if "warmup_iters" in given:
                notes.append(f"--warmup_iters {args.warmup_iters} is not below --max_iters {args.max_iters}: "
                             "the whole run is warmup")
            else:
                notes.append(refit(args, "warmup_iters", args.max_iters // 10, "--max_iters"))
    if args.warmup_iters > args.lr_decay_iters and "warmup_iters" not in given:
        notes.append(refit(args, "warmup_iters", args.lr_decay_iters // 10, "--lr_decay_iters"))
    if args.warmup_iters > args.lr_decay_iters:
        problems.append(f"--warmup_iters {args.warmup_iters} must not exceed --lr_decay_iters {args.lr_decay_iters}")
    return problems, notes


def check_resume(args, meta, dataset, notes):
    """--resume continues the checkpoint's run: the same data, vocabulary and model.

    Raises a ValueError naming every conflict. Model flags that were not given take the
    checkpoint's values, so the summary describes the model that is trained."""
    where = os.path.join(args.out_dir, "ckpt.npz")
    trained_on = (meta.get("args") or {}).get("data")
    lora_rank = (meta.get("args") or {}).get("lora_rank")
    if lora_rank:
        raise ValueError(f"--resume: {where} holds the merged weights of a LoRA run, not its adapters: start "
                         f"again from it with --init_from {where} --lora_rank {lora_rank} (and another --out_dir)")
    if meta.get("dataset") == "coref" and args.data:
        raise ValueError(f"--resume: {where} was trained on the lesson corpus, not on --data {args.data}: "
                         "drop --data, or use another --out_dir")
    if meta.get("dataset") != "coref" and not args.data and stages.stage_class(args).resume_needs_data:
        raise ValueError(f"--resume: {where} was trained on a text file ({trained_on or meta.get('dataset')}): "
                         f"pass --data {trained_on or 'FILE'} to resume it")
    if tokenizer_to_json(dataset.tokenizer) != meta["tokenizer"]:
        n_theirs = tokenizer_from_json(meta["tokenizer"]).vocab_size
        raise ValueError(f"--resume: the vocabulary of {args.data or dataset.name} ({dataset.tokenizer.vocab_size} "
                         f"tokens) differs from the one {where} was trained with ({n_theirs} tokens)")
    same_data(args, meta, dataset, where, notes)
    ran_length = (meta.get("args") or {}).get("max_length")
    if ran_length is not None and args.max_length != ran_length:     # the examples would be cut elsewhere
        raise ValueError(f"--resume: --max_length {args.max_length} (the run in {where} has --max_length "
                         f"{ran_length}): a resumed run keeps its examples as they were; drop --max_length")
    ran_seed = (meta.get("args") or {}).get("seed")
    if ran_seed is not None and args.seed != ran_seed:       # it draws the evaluation's batches: they would change
        raise ValueError(f"--resume: --seed {args.seed} (the run in {where} has --seed {ran_seed}): a resumed run "
                         f"continues its own random streams; drop --seed, or use another --out_dir for a new run")
    config, given = meta["config"], set(args._given)
    ran_dtype = (meta.get("args") or {}).get("dtype") or "float32"     # older checkpoints were all float32
    if "dtype" in given and args.dtype != ran_dtype:
        raise ValueError(f"--resume: --dtype {args.dtype} (the run in {where} computes in {ran_dtype}): a resumed "
                         f"run continues in its own dtype; drop --dtype, or use another --out_dir for a new run")
    args.dtype = ran_dtype
    config = {k: config.get(k, getattr(GPTConfig, k)) for k in MODEL_FLAGS}    # older ones lack init, head_dropout, ...
    config["n_kv_head"] = config["n_kv_head"] or config["n_head"]
    conflicts = [f"--{k} {getattr(args, k)} (the checkpoint has {config[k]})" for k in MODEL_FLAGS
                 if k in given and getattr(args, k) != config[k]]
    if conflicts:
        raise ValueError(f"--resume: {', '.join(conflicts)}: the model in {where} is fixed; drop "
                         f"{'these flags' if len(conflicts) > 1 else 'the flag'}, or use another --out_dir for a new model")
    for k in MODEL_FLAGS:
        setattr(args, k, config[k])


def same_data(args, meta, dataset, where, notes):
    """--resume: the text (or corpus) is the one the checkpoint was trained on, byte for byte
    (its size and SHA-256). A checkpoint from before they were kept: a note, and it goes on."""
    theirs, ours = meta.get("data_source"), dataset.source
    what = args.data or "the lesson corpus"
    if theirs is None:
        notes.append(f"{where} does not say which data it was trained on (an older checkpoint): {what} is taken "
                     "as that data, unchecked beyond its vocabulary")
    elif theirs != ours:
        def described(source):
            return f"{source['bytes']:,} bytes, sha256 {source['sha256'][:12]}"
        trained_on = (meta.get("args") or {}).get("data") or "the lesson corpus"
        raise ValueError(f"--resume: {what} ({described(ours)}) is not the data {where} was trained on "
                         f"({trained_on}: {described(theirs)}): pass that, or use another --out_dir for a new run")


RESUMED_FLAGS = ("seed", "layout", "max_iters", "batch_size", "learning_rate", "min_lr", "warmup_iters", "lr_decay_iters", "weight_decay",
                 "beta1", "beta2", "grad_clip", "gradient_accumulation_steps", "eval_interval", "eval_iters",
                 "log_interval", "sample_tokens", "shared_batches", "always_save_checkpoint", "save_interval_s",
                 "stage", "mix_data", "mix_fraction", "max_length", "val")      # and each stage's own flags


def resumed_settings(out_dir):
    """The training flags of the run in out_dir/ckpt.npz, the defaults of its --resume ({} when
    there is no readable checkpoint: train() then says what is wrong)."""
    try:
        ran = checkpoint.read_meta(os.path.join(out_dir, "ckpt.npz")).get("args") or {}
    except (ValueError, OSError):
        return {}
    own = [name for stage in stages.named_stages().values() for name in stage.own_flags]
    return {k: ran[k] for k in (*RESUMED_FLAGS, *own) if ran.get(k) is not None}


MODEL_FLAGS = ("n_layer", "n_head", "n_embd", "block_size", "dropout", "bias", "init", "head_dropout", "pos",
               "rope_theta", "norm", "mlp", "n_kv_head", "qk_norm", "tie_embeddings")


def schedule_ended(args, step, meta):
    """--resume: do new steps run past the schedule's end, at --min_lr, as the run did not? All of
    them (the schedule ended before the step resumed from), or those after a schedule that was
    fitted to the first run's --max_iters (a preset's, adapted) when --max_iters grew."""
    if args.min_lr == args.learning_rate or args.lr_decay_iters >= args.max_iters:
        return False
    return step >= args.lr_decay_iters or args.lr_decay_iters == (meta.get("args") or {}).get("max_iters")
