"""The exercises of EXERCISES.md, in order, and the learner's progress through them.

The checks are in checks.py (part one: extend the model) and checks_core.py
(part two: build the core); this module runs them on a package of answers:
the learner's ``exercises``, or the reference solutions ``exercise_solutions``
(tests/support/exercise_solutions/, loaded by checks.load_solutions).
"""
from dataclasses import dataclass

from . import checks as extend          # part one: extend the model
from . import checks_core as core       # part two: build the core
from . import checks_bpe                # write BPE, the tokenizer


@dataclass(frozen=True)
class Exercise:
    number: int
    name: str            # the file: exercises/<name>.py
    title: str
    checks: tuple


EXERCISES = [Exercise(i + 1, name, title, tuple(checks)) for i, (name, title, checks) in enumerate([
    ("rmsnorm", "RMSNorm", extend.RMSNORM),
    ("rope", "Rotary position embeddings", extend.ROPE),
    ("gqa", "Grouped-query attention", extend.GQA),
    ("swiglu", "SwiGLU", extend.SWIGLU),
    ("sum_to", "Broadcasting backward: sum_to", core.SUM_TO),
    ("matmul", "Batched matmul backward", core.MATMUL),
    ("elementwise", "exp, log, tanh (twice differentiable)", core.ELEMENTWISE_CHECKS),
    ("softmax", "Softmax backward (a JVP)", core.SOFTMAX),
    ("layernorm", "LayerNorm backward by hand", core.LAYERNORM),
    ("cross_entropy", "Fused cross-entropy", core.CROSS_ENTROPY),
    ("embedding", "Embedding backward (scatter-add)", core.EMBEDDING),
    ("engine", "The engine: toposort and backward", core.ENGINE),
    ("attention", "Attention backward by hand", core.ATTENTION),
    ("online_softmax", "Online softmax (tiled attention)", core.ONLINE_SOFTMAX),
    ("adamw", "AdamW step", core.ADAMW),
    ("kv_cache", "KV cache", core.KV_CACHE),
    ("lora", "LoRA: low-rank adapters", extend.LORA),
    ("bpe", "Write BPE (the tokenizer)", checks_bpe.BPE_CHECKS),
])]
BY_NAME = {e.name: e for e in EXERCISES}


@dataclass
class Result:
    exercise: Exercise
    status: str          # "not started", "failing" or "passing"
    reason: str          # the first failure's (or the first unwritten piece's) one-line reason
    checks: list         # (check name, "pass" | "skip" | "fail", message)

    @property
    def passing(self):
        return self.status == "passing"


def check(exercise, package="exercises"):
    """Run every check of one exercise on ``package``.<name>; a Result."""
    try:
        module = extend.load_exercise(exercise.name, package)
    except extend.NotStarted as e:
        return Result(exercise, "not started", str(e), [])
    except Exception as e:  # the learner's file does not even import
        return Result(exercise, "failing", f"importing {package}/{exercise.name}.py raised "
                                           f"{type(e).__name__}: {e}", [])
    rows = [(c.__name__,) + extend.run_check(c, module) for c in exercise.checks]
    outcomes = [outcome for _, outcome, _ in rows]
    if all(o == "pass" for o in outcomes):
        return Result(exercise, "passing", "", rows)
    if all(o == "skip" for o in outcomes):
        return Result(exercise, "not started", rows[0][2], rows)
    first = next(r for r in rows if r[1] == "fail") if "fail" in outcomes else next(r for r in rows if r[1] == "skip")
    return Result(exercise, "failing", first[2], rows)


def check_all(package="exercises", names=None):
    """Results of the named exercises (default: all, in order) on ``package``."""
    return [check(e, package) for e in ([BY_NAME[n] for n in names] if names else EXERCISES)]
