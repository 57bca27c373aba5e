"""The exercises of EXERCISES.md, in order, and the learner's progress through them.

Each exercise's checks are in a module of its own in this folder (rmsnorm.py,
softmax.py, ...), written with the tools of common.py; this module runs them on a
package of answers: the learner's ``exercises``, or the reference solutions
``exercise_solutions`` (tests/support/exercise_solutions/, loaded by common.load_solutions).
"""
from dataclasses import dataclass

from . import (adamw, attention, bpe, common, cross_entropy, dpo, elementwise, embedding, engine, gqa,
               group_advantages, kv_cache, layernorm, lora, loss_mask, matmul, online_softmax, rmsnorm, rope, softmax,
               sum_to, swiglu)


@dataclass(frozen=True)
class Exercise:
    number: int
    name: str            # the file: exercises/<name>.py
    title: str
    checks: tuple


EXERCISES = [Exercise(i + 1, name, title, tuple(checks)) for i, (name, title, checks) in enumerate([
    ("rmsnorm", "RMSNorm", rmsnorm.CHECKS),
    ("rope", "Rotary position embeddings", rope.CHECKS),
    ("gqa", "Grouped-query attention", gqa.CHECKS),
    ("swiglu", "SwiGLU", swiglu.CHECKS),
    ("sum_to", "Broadcasting backward: sum_to", sum_to.CHECKS),
    ("matmul", "Batched matmul backward", matmul.CHECKS),
    ("elementwise", "exp, log, tanh (twice differentiable)", elementwise.CHECKS),
    ("softmax", "Softmax backward (a JVP)", softmax.CHECKS),
    ("layernorm", "LayerNorm backward by hand", layernorm.CHECKS),
    ("cross_entropy", "Fused cross-entropy", cross_entropy.CHECKS),
    ("embedding", "Embedding backward (scatter-add)", embedding.CHECKS),
    ("engine", "The engine: toposort and backward", engine.CHECKS),
    ("attention", "Attention backward by hand", attention.CHECKS),
    ("online_softmax", "Online softmax (tiled attention)", online_softmax.CHECKS),
    ("adamw", "AdamW step", adamw.CHECKS),
    ("kv_cache", "KV cache", kv_cache.CHECKS),
    ("lora", "LoRA: low-rank adapters", lora.CHECKS),
    ("bpe", "Write BPE (the tokenizer)", bpe.CHECKS),
    ("loss_mask", "The loss mask of a conversation", loss_mask.CHECKS),
    ("dpo", "The DPO loss", dpo.CHECKS),
    ("group_advantages", "RL: the group-mean advantage", group_advantages.CHECKS),
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
        module = common.load_exercise(exercise.name, package)
    except common.NotStarted as e:
        return Result(exercise, "not started", str(e), [])
    except Exception as e:  # the learner's file does not even import
        return Result(exercise, "failing", f"importing {package}/{exercise.name}.py raised "
                                           f"{type(e).__name__}: {e}", [])
    rows = [(c.__name__,) + common.run_check(c, module) for c in exercise.checks]
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
