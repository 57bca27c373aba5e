"""--stage rl: reinforcement learning with verifiable rewards, as a stage of python -m train.

    python -m train --stage rl --init_from SFT_RUN --data TEXT --rl_tasks count
    python -m train --stage rl --init_from SFT_RUN --data PROMPTS.jsonl [--rl_reward exact]

Each step draws --rl_prompts questions (the train split), lets the model being trained answer
each one --rl_samples times at --rl_temperature (with the KV cache, up to <|end|>), and scores
every answer. The questions are the built-in tasks' (data/tasks.py, their words from the --data
text; the task's reward: 1 if right, else 0), or a file of your prompts with reference answers:
JSON lines of {"prompt": ..., "answer": ...} (the prompt a text or messages; other keys are
columns) or {"messages": [...]} (a conversation whose last assistant turn is the reference).
Its answers score by --rl_reward: exact (the default), number (the same last number), contains,
or MODULE:FUNCTION, a function of yours called as TRL's GRPOTrainer calls its reward functions:
fn(completions=[...], prompts=[...], answer=[...], **other_columns) -> a list of floats, one an
answer (completions are strings, or [{"role": "assistant", "content": ...}] for conversations).

An answer's advantage is its reward minus the mean reward of its question's group (nanochat's
REINFORCE with a group-mean baseline; GRPO also divides by the group's std: --rl_std), and
the loss is

    -mean over the sampled answer tokens of advantage * log pi(token)

so answers better than their group's average become likelier and worse ones less likely. A
question whose answers all score the same teaches nothing: its advantages are 0. log.csv has a
row a step with its mean reward and the share of groups whose rewards all agree (TRL's
frac_reward_zero_std); when that share is 1 for 20 steps running, the run says so in one line.
--rl_kl adds that weight times an estimate of the KL divergence from a frozen copy of the
--init_from model (the reference), on the sampled tokens, which holds the model near it.

A batch is made by the model itself: the stage's get_batch samples with it (no gradient), so
the loop of train/loop.py runs this stage as it runs any other, with its Ctrl-C saving, exact
--resume and mpiexec. All the sampling draws from the run's batch generator (data_rng, which
checkpoints keep), so a resumed run samples exactly the answers the uninterrupted one did;
under mpiexec each process answers its share of questions.

The evaluation is not a loss: it is the held-out questions' mean reward when sampled at the
temperature (log.csv's sampled_accuracy column) and when answered greedily (greedy_accuracy;
for the built-in tasks, both are accuracies). best.npz keeps the best sampled one. A prompts
file holds out its last tenth (at most --rl_eval_prompts, at least one).
"""
import argparse
import hashlib
import importlib
import importlib.util
import json
import math
import os
import re

import numpy as np

import tinyattn as ta
import tinyattn.nn as nn
import tinyattn.nn.functional as F
from data.chat import END, answer_text, render_prompt
from data.tasks import make_task
from tinyattn.models import GPT

from .data import fingerprint
from .stages import LanguageModel


# ---------------------------------------------------------------------------
# the two formulas
def group_advantages(rewards, normalize=False):
    """rewards (P, K): K answers to each of P prompts -> advantages (P, K).

    Each reward minus the mean reward of its own prompt's K answers: an answer is good or bad
    compared with the others to the same question. normalize: also divide by the group's std
    (GRPO), where it is not 0."""
    rewards = np.asarray(rewards, dtype=np.float64)
    advantages = rewards - rewards.mean(axis=1, keepdims=True)       # (P, K)
    if normalize:
        std = rewards.std(axis=1, keepdims=True)                      # (P, 1)
        advantages = advantages / np.where(std > 0, std, 1.0)
    return advantages


def policy_gradient_loss(logprobs, advantages, mask):
    """-mean over the answer tokens of advantage * log pi(token).

    logprobs (N, T): log pi of each sampled token (a Tensor that carries the gradient);
    advantages (N,): one for each answer, for all its tokens; mask (N, T): 1 on the answer's
    tokens (its <|end|> included), 0 on the prompt and padding. -> a 0-d Tensor."""
    N = advantages.shape[0]
    weighted = logprobs * advantages.view(N, 1) * mask                  # (N, T)
    return -weighted.sum() / mask.sum()


def kl_to_reference(logprobs, ref_logprobs, mask):
    """An estimate of KL(pi || pi_ref) from the sampled tokens: the mean over the answer tokens
    of exp(r) - r - 1, r = log pi_ref(token) - log pi(token) (Schulman's k3). Each term is >= 0
    and 0 exactly where the two models agree. Shapes (N, T); ref_logprobs carry no gradient."""
    r = (ref_logprobs - logprobs) * mask                                # (N, T), 0 off the answers
    return ((r.exp() - r - 1.0) * mask).sum() / mask.sum()


def rl_loss(model, batch, kl_weight=0.0):
    """The stage's objective on a batch (x, y, advantages, ref_logprobs): y holds the sampled
    answer tokens as targets (-1 elsewhere)."""
    x, y, advantages, ref_logprobs = batch
    logits, _ = model(x)                                                # (N, T, V)
    logprobs = F.token_logprobs(logits, y, ignore_index=-1)             # (N, T), 0 off the answers
    mask = (y >= 0).to(logprobs.dtype)                                  # (N, T)
    loss = policy_gradient_loss(logprobs, advantages, mask)
    if kl_weight:
        loss = loss + kl_weight * kl_to_reference(logprobs, ref_logprobs, mask)
    return loss


# ---------------------------------------------------------------------------
# sampling answers
def draw(logits, temperature, rng):
    """One id per row of (B, V) logits, from the numpy Generator ``rng`` (temperature 0: the most
    likely). -> (B,) int64."""
    logits = logits.numpy().astype(np.float64)                         # (B, V)
    if temperature == 0:
        return logits.argmax(-1)
    probs = np.exp((logits - logits.max(-1, keepdims=True)) / temperature)
    cumulative = np.cumsum(probs, -1)
    u = rng.random((len(logits), 1)) * cumulative[:, -1:]               # (B, 1)
    return np.minimum((cumulative < u).sum(-1), logits.shape[1] - 1)


@ta.no_grad()
def sample_answers(model, prompt, k, max_tokens, temperature, rng, end_id):
    """k answers to one prompt (a list of ids), drawn together with the KV cache: a list of k
    lists of ids, each up to and with its <|end|> (or max_tokens long, without one)."""
    was_training = model.training
    model.eval()
    device = model.wte.weight.device
    caches = [nn.KVCache() for _ in model.h]
    logits, _ = model(ta.tensor([prompt] * k, device=device), kv_caches=caches)     # (k, T, V)
    answers, done = [[] for _ in range(k)], [False] * k
    for i in range(max_tokens):
        ids = draw(logits[:, -1, :], temperature, rng)                 # (k,)
        for row, token in enumerate(ids.tolist()):
            if not done[row]:
                answers[row].append(token)
                done[row] = token == end_id
        if all(done) or i == max_tokens - 1:
            break
        logits, _ = model(ta.tensor(ids[:, None], device=device), kv_caches=caches)
    model.train(was_training)
    return answers


# ---------------------------------------------------------------------------
# rewards: the built-in ones, and a user's, called as TRL's GRPOTrainer calls its reward functions
def completion_text(completion):
    """A completion's text: a string, or TRL's conversational form [{"role": "assistant", "content": ...}]."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


def exact_match(completions, answer, **kwargs):
    """1.0 where the completion is the reference answer (surrounding spaces aside), else 0.0."""
    return [float(completion_text(c).strip() == a.strip()) for c, a in zip(completions, answer)]


NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def number_match(completions, answer, **kwargs):
    """1.0 where the completion's last number equals the reference answer's, else 0.0."""
    def last_number(text):
        found = NUMBER.findall(text.replace(",", ""))
        return float(found[-1]) if found else None
    return [float(last_number(completion_text(c)) is not None and last_number(completion_text(c)) == last_number(a))
            for c, a in zip(completions, answer)]


def contains(completions, answer, **kwargs):
    """1.0 where the completion contains the reference answer, else 0.0."""
    return [float(a.strip() in completion_text(c)) for c, a in zip(completions, answer)]


REWARDS = {"exact": exact_match, "number": number_match, "contains": contains}


def reward_function(name):
    """--rl_reward: a built-in reward's name, or MODULE:FUNCTION (a module on the import path, or a
    file.py) -> the function, called as fn(completions, prompts=..., completion_ids=..., **columns)."""
    if name in REWARDS:
        return REWARDS[name]
    module_name, _, function = name.partition(":")
    if not module_name or not function:
        raise ValueError(f"--rl_reward {name}: expected {', '.join(REWARDS)} or MODULE:FUNCTION")
    try:
        if module_name.endswith(".py"):
            spec = importlib.util.spec_from_file_location(os.path.basename(module_name)[:-3], module_name)
            if spec is None or not os.path.isfile(module_name):
                raise ImportError(f"no file {module_name}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"--rl_reward {name}: cannot import {module_name} ({e})") from None
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ValueError(f"--rl_reward {name}: {module_name} has no function {function}")
    return fn


# ---------------------------------------------------------------------------
# the questions: the built-in tasks', or a file of prompts with reference answers
class Questions:
    """The questions an RL run answers: ``train`` and ``test`` (held out), each a list of dicts with
    "prompt" (the messages the model answers) and what its reward reads; ``reward(questions, answers)``
    scores answer i of questions[i] (a list of floats). Like a Dataset, it holds the tokenizer, a
    name, and the source that --resume checks."""

    def __init__(self, name, tokenizer, source, train, test, reward, where):
        self.name, self.tokenizer, self.source, self.train_questions, self.test_questions = \
            name, tokenizer, source, train, test
        self.reward, self.where = reward, where
        self.train = self.val = np.zeros(0, np.int64)       # (no token stream)
        self.rows, self.text_bytes = None, None

    def bits_per_byte(self, loss, split="val"):
        return None

    def groups(self, questions):
        """Where several tasks are asked: {task: [indices]} for the evaluation's greedy accuracy each."""
        names = [q.get("task") for q in questions]
        if len(set(names)) < 2:
            return {}
        return {name: [i for i, n in enumerate(names) if n == name] for name in dict.fromkeys(names)}


def task_questions(args, tokenizer, text, raw):
    """The tasks of --rl_tasks, their words from the --data text."""
    names = args.rl_tasks.split(",")
    missing = [name for name in names if name != "add" and text is None]
    if missing:
        raise ValueError(f"--stage rl: the {missing[0]} task takes its words from a text: pass --data TEXT (the one "
                         "the fine-tuning's questions were made from)")
    tasks = {name: make_task(name, text) for name in names}

    def questions(split, n=None):
        return [dict(prompt=conv["messages"][:-1], task=t.name, conv=conv) for t in tasks.values()
                for conv in t.conversations(split, n or len(t.splits[split]))]

    def reward(asked, answers):
        return [tasks[q["task"]].reward(q["conv"], a) for q, a in zip(asked, answers)]
    per_task = max(1, args.rl_eval_prompts // len(tasks))
    source = fingerprint(hashlib.sha256(raw).digest() + args.rl_tasks.encode())
    return Questions("rl: " + ", ".join(t.name for t in tasks.values()), tokenizer, source, questions("train"),
                     questions("test", per_task), reward, "questions")


def file_questions(args, tokenizer, raw):
    """--data PROMPTS.jsonl: one question a line, {"prompt": ..., "answer": ...} (the prompt a string
    or messages; more keys are columns the reward function gets) or {"messages": [...]} (a
    conversation whose last assistant turn is the reference answer). The last tenth (at most
    --rl_eval_prompts, at least one) is held out for the evaluation."""
    rows = []
    for number, line in enumerate(raw.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"--data {args.data} line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected an object with \"prompt\" and \"answer\", or \"messages\"")
        if "messages" in row and "prompt" not in row:
            messages = row.pop("messages")
            if not (isinstance(messages, list) and messages and isinstance(messages[-1], dict)
                    and messages[-1].get("role") == "assistant"):
                raise ValueError(f"{where}: a conversation's last message is the reference answer: it must be the "
                                 "assistant's")
            row = dict(row, prompt=messages[:-1], answer=messages[-1].get("content", ""))
        if not isinstance(row.get("prompt"), (str, list)) or not isinstance(row.get("answer"), str):
            raise ValueError(f"{where}: expected \"prompt\" (text or messages) and \"answer\" (text), or "
                             "\"messages\" (a conversation ending with the reference answer)")
        conversational = isinstance(row["prompt"], list)
        prompt = row["prompt"] if conversational else [{"role": "user", "content": row["prompt"]}]
        try:
            render_prompt(tokenizer, prompt)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        rows.append(dict(prompt=prompt, conversational=conversational, columns=row))
    if len(rows) < 2:
        raise ValueError(f"--data {args.data}: {len(rows)} prompt{'s' if len(rows) != 1 else ''}: RL needs some to "
                         "train on and one at least to evaluate")
    held = min(args.rl_eval_prompts, max(1, len(rows) // 10))
    fn = reward_function(args.rl_reward or "exact")

    def reward(asked, answers):
        """fn(completions, prompts=..., completion_ids=None, **columns), one list a column (TRL's call)."""
        conversational = asked[0]["conversational"]
        completions = [[{"role": "assistant", "content": a}] if conversational else a for a in answers]
        prompts = [q["columns"]["prompt"] for q in asked]
        keys = dict.fromkeys(k for q in asked for k in q["columns"] if k != "prompt")
        columns = {k: [q["columns"].get(k) for q in asked] for k in keys}
        values = fn(completions=completions, prompts=prompts, **columns)
        if values is None or len(values) != len(answers):
            raise ValueError(f"--rl_reward {args.rl_reward or 'exact'}: gave {'None' if values is None else len(values)}"
                             f" rewards for {len(answers)} completions")
        return [math.nan if v is None else float(v) for v in values]
    source = fingerprint(hashlib.sha256(raw).digest() + (args.rl_reward or "exact").encode())
    name = f"rl: {os.path.basename(args.data)}, reward {args.rl_reward or 'exact'}"
    return Questions(name, tokenizer, source, rows[:-held], rows[-held:], reward, "prompts")


def is_json_lines(raw):
    """Does the file hold JSON lines (its first line that is not blank, an object)?"""
    for line in raw.splitlines():
        if line.strip():
            try:
                return isinstance(json.loads(line), dict)
            except ValueError:
                return False
    return False


def load_questions(args, tokenizer):
    """--stage rl's questions: a file of prompts with reference answers (JSON lines), or the tasks of
    --rl_tasks, their words from the --data text."""
    if tokenizer is None or END not in getattr(tokenizer, "special_tokens", {}):
        raise ValueError("--stage rl: the model has no chat tokens: start from a fine-tuned assistant "
                         "(--init_from a run of chat fine-tuning)")
    text, raw = None, b""
    if args.data:
        try:
            with open(args.data, "rb") as f:
                raw = f.read()
            text = raw.decode("utf-8")
        except IsADirectoryError:
            raise ValueError(f"--stage rl: --data {args.data} is a folder: give a file of prompts (JSON lines of "
                             "\"prompt\" and \"answer\", or conversations), or the text the built-in tasks take "
                             "their words from") from None
        except UnicodeDecodeError as e:
            raise ValueError(f"--data {args.data}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if args.data and is_json_lines(raw):
        if args.rl_tasks_given:
            raise ValueError(f"--stage rl: --data {args.data} is JSON lines, prompts with their answers, not a text "
                             "for --rl_tasks's words: drop --rl_tasks (the prompts are the questions)")
        return file_questions(args, tokenizer, raw)
    if args.rl_reward:
        raise ValueError(f"--rl_reward scores the answers to a file of prompts (--data PROMPTS.jsonl); the built-in "
                         f"tasks ({args.rl_tasks}) have their own")
    if args.data and text.lstrip().startswith(("{", "[")):
        raise ValueError(f"--stage rl: --data {args.data} is JSON, not a text for the tasks' words: give JSON lines of "
                         "prompts with answers (one object a line), or a plain text")
    return task_questions(args, tokenizer, text, raw)


# ---------------------------------------------------------------------------
# the stage
STALLED_STEPS = 20          # steps with no group whose rewards differ before the run says so


class RL(LanguageModel):
    """--stage rl as the loop runs it (train/stages.py). Its batches are made by the model being
    trained (``prepare`` gives it the model, and with --rl_kl the frozen reference): each question
    answered rl_samples times, each answer rewarded. Its evaluation: the held-out questions' mean
    reward, sampled and greedy."""

    name = "rl"
    defaults = dict(rl_tasks="count", rl_prompts=16, rl_samples=8, rl_temperature=1.0, rl_kl=0.0, rl_std=False,
                    rl_max_tokens=32, rl_eval_prompts=48, rl_reward=None)
    own_flags = tuple(defaults)
    takes_val = False                           # a prompts file holds out its own last tenth
    resume_needs_data = False                   # the add task reads no text

    @classmethod
    def check_flags(cls, args):
        """Its defaults filled in; its questions a step are the batch size."""
        if not args.init_from and not args.resume:
            return ["--stage rl trains an assistant: give --init_from PATH (a chat fine-tuned run)"]
        for key, value in cls.defaults.items():
            if getattr(args, key) is None:
                setattr(args, key, value)
        given = set(args._given)
        if "batch_size" in given and "rl_prompts" in given and args.batch_size != args.rl_prompts:
            return [f"--stage rl: --batch_size {args.batch_size} and --rl_prompts {args.rl_prompts} are the same "
                    "setting (questions a step): give one"]
        if "batch_size" in given and "rl_prompts" not in given:
            args.rl_prompts = args.batch_size
        args.batch_size = args.rl_prompts
        return []

    def __init__(self, data, args):
        super().__init__(data, args)
        self.model = self.reference = None
        self.last = {}                                  # the newest batch's reward numbers

    def prepare(self, model, meta, pretrained, notes):
        self.model = model
        self.reference = reference_model(self.args, meta, pretrained) if self.args.rl_kl else None

    def fit_length(self, max_length):
        """Questions are short, and answers are sampled up to the room left: nothing to cut."""
        return []

    def rows_per_item(self):
        return self.args.rl_samples

    def tokens_per_row(self, block_size):
        return block_size

    def describe(self):
        return (f"{self.data.name}: {len(self.data.train_questions):,} train / {len(self.data.test_questions)} "
                f"held-out {self.data.where}, {self.args.rl_samples} answers a question at temperature "
                f"{self.args.rl_temperature:g}")

    def prompt(self, question):
        ids = render_prompt(self.data.tokenizer, question["prompt"])
        if len(ids) >= self.args.block_size:
            raise ValueError(f"the question {question['prompt'][-1]['content']!r} takes {len(ids)} tokens: no room "
                             f"for an answer in block_size {self.args.block_size}")
        return ids

    def answer(self, model, question, k, temperature, rng):
        """k answers to one question, sampled at ``temperature``: (prompt ids, [answer ids, ...])."""
        prompt = self.prompt(question)
        room = min(self.args.rl_max_tokens, self.args.block_size - len(prompt))
        return prompt, sample_answers(model, prompt, k, room, temperature, rng, self.data.tokenizer.special_tokens[END])

    def texts(self, answers):
        return [answer_text(self.data.tokenizer, ids) for ids in answers]

    def get_batch(self, split, batch_size, block_size, rng):
        """batch_size questions, rl_samples answers each: (x, y, advantages, ref_logprobs) for
        rl_loss. x (N, T) reads the prompt and the answer, y (N, T) holds the answer's tokens as
        targets (-1 on the prompt and padding), N = batch_size * rl_samples."""
        if split != "train":
            raise ValueError("the RL stage trains on the train split's questions; it evaluates by accuracy")
        k = self.args.rl_samples
        picked = rng.integers(0, len(self.data.train_questions), size=batch_size)
        rows, asked, texts = [], [], []
        for i in picked.tolist():
            question = self.data.train_questions[i]
            prompt, answers = self.answer(self.model, question, k, self.args.rl_temperature, rng)
            rows += [(prompt, ids) for ids in answers]
            asked += [question] * k
            texts += self.texts(answers)
        rewards = np.array(self.data.reward(asked, texts), dtype=np.float64).reshape(batch_size, k)    # (P, K)
        if not np.isfinite(rewards).all():
            raise ValueError(f"the reward of an answer is {rewards[~np.isfinite(rewards)][0]}: rewards must be numbers")
        advantages = group_advantages(rewards, self.args.rl_std).reshape(-1)           # (N,)
        T = max(len(prompt) + len(ids) - 1 for prompt, ids in rows)
        x = np.zeros((len(rows), T), np.int64)                                         # (N, T)
        y = np.full((len(rows), T), -1, np.int64)
        for n, (prompt, ids) in enumerate(rows):
            seq = prompt + ids
            x[n, :len(seq) - 1] = seq[:-1]
            y[n, len(prompt) - 1:len(seq) - 1] = ids          # the answer's tokens, each read after the one before
        # TRL's GRPO logs: the mean reward, and the share of groups whose rewards all agree (nothing to learn)
        self.last = dict(reward=float(rewards.mean()),
                         frac_reward_zero_std=float(np.mean(rewards.std(axis=1) == 0)))
        return x, y, advantages.astype(np.float32), self.reference_logprobs(x, y)

    @ta.no_grad()
    def reference_logprobs(self, x, y):
        """log pi_ref of the answer tokens (N, T) (0 elsewhere), for the KL term; zeros without it."""
        if not self.args.rl_kl:
            return np.zeros(x.shape, np.float32)
        device = self.reference.wte.weight.device
        logits, _ = self.reference(ta.tensor(x, device=device))
        return F.token_logprobs(logits, ta.tensor(y, device=device), ignore_index=-1).numpy().astype(np.float32)

    def loss(self, model, batch):
        return rl_loss(model, batch, kl_weight=self.args.rl_kl)

    def step_metrics(self):
        return self.last

    def progress(self, loss):
        return dict(loss=f"{loss:.4f}", reward=f"{self.last.get('reward', math.nan):.3f}")

    def stalled(self, step_rows):
        recent = step_rows[-STALLED_STEPS:]
        if len(recent) < STALLED_STEPS or any(r["frac_reward_zero_std"] < 1 for r in recent):
            return None
        return (f"no signal for {STALLED_STEPS} steps (to step {recent[-1]['step']}): every answer to each question "
                f"got the same reward (frac_reward_zero_std 1 in log.csv, mean reward "
                f"{np.mean([r['reward'] for r in recent]):.3f}), so every advantage is 0 and nothing is learned; "
                "check the reward, or sample more varied answers (--rl_samples, --rl_temperature)")

    @ta.no_grad()
    def evaluate(self, model):
        """The held-out questions: mean reward sampled at the temperature (rl_samples answers
        each, from a generator of its own, the same at every evaluation) and greedily."""
        args, questions = self.args, self.data.test_questions
        rng = np.random.default_rng(args.seed + 1)
        sampled_asked, sampled, greedy = [], [], []
        for question in questions:
            _, answers = self.answer(model, question, args.rl_samples, args.rl_temperature, rng)
            sampled_asked += [question] * len(answers)
            sampled += self.texts(answers)
            _, (ids,) = self.answer(model, question, 1, 0.0, rng)
            greedy += self.texts([ids])
        sampled_rewards = self.data.reward(sampled_asked, sampled)
        greedy_rewards = self.data.reward(questions, greedy)
        metrics = dict(sampled_accuracy=round(float(np.mean(sampled_rewards)), 6),
                       greedy_accuracy=round(float(np.mean(greedy_rewards)), 6))
        for name, indices in self.data.groups(questions).items():
            metrics[f"greedy_{name}"] = round(float(np.mean([greedy_rewards[i] for i in indices])), 6)
        return metrics

    def score(self, metrics):
        return 1.0 - metrics["sampled_accuracy"]

    def diverged(self, metrics):
        return None

    def eval_line(self, metrics):
        line = (f"held-out sampled accuracy (T={self.args.rl_temperature:g}) {metrics['sampled_accuracy']:.4f}, "
                f"greedy accuracy {metrics['greedy_accuracy']:.4f}")
        tasks = [name for name in self.data.groups(self.data.test_questions)]
        if tasks:
            line += " (" + ", ".join(f"{name} {metrics['greedy_' + name]:.4f}" for name in tasks) + ")"
        return line

    @staticmethod
    def best_words(best, log):
        return f"best sampled accuracy {1 - best:.4f}" if math.isfinite(best) else "not evaluated yet"

    def sample_ids(self):
        return None

    def summary(self, final, best):
        return dict(final, best_sampled_accuracy=round(1 - best, 6))

    def done_line(self, summary):
        said = ", ".join(f"{k.replace('_', ' ')} {v:.4f}" for k, v in summary.items()
                         if k.endswith("accuracy") or k.startswith("greedy_"))
        return (f"done: {summary['iters']} iters, held-out {said}, {summary['wall_s']:.0f} s; wrote "
                f"{os.path.join(self.args.out_dir, 'summary.json')}")


def reference_model(args, meta, pretrained):
    """--rl_kl's reference: a frozen copy of the --init_from model (a resumed run loads it again)."""
    from .finetune import Pretrained, load_pretrained
    if pretrained is None:
        ran = (meta.get("args") or {})
        args = argparse.Namespace(**{**vars(args), "init_from": ran.get("fine_tuned_from") or ran.get("init_from")})
        pretrained = load_pretrained(args)
    else:
        state = {k: v.numpy() for k, v in pretrained.model.state_dict().items()}
        pretrained = Pretrained(GPT(pretrained.model.config), pretrained.tokenizer, pretrained.where)
        pretrained.model.load_state_dict(state)
    reference = pretrained.model.to(args.dtype).to(args.device)
    for p in reference.parameters():
        p.requires_grad = False
    reference.eval()
    return ta.compile(reference, disable=not args.compile)
