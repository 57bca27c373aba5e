"""--stage rl: reinforcement learning with verifiable rewards, as a stage of python -m train.

    python -m train --stage rl --init_from SFT_RUN --data TEXT --rl_tasks count

Each step draws --rl_prompts questions of the tasks (data/tasks.py, the train split), lets
the model being trained answer each one --rl_samples times at --rl_temperature (with the KV
cache, up to <|end|>), and scores every answer with the task's reward: 1 if right, else 0.
An answer's advantage is its reward minus the mean reward of its question's group (nanochat's
REINFORCE with a group-mean baseline; GRPO also divides by the group's std: --rl_std), and
the loss is

    -mean over the sampled answer tokens of advantage * log pi(token)

so answers better than their group's average become likelier and worse ones less likely. A
question whose answers are all right (or all wrong) teaches nothing: its advantages are 0.
--rl_kl adds that weight times an estimate of the KL divergence from a frozen copy of the
--init_from model (the reference), on the sampled tokens, which holds the model near it.

The "data set" here is the questions, and a batch is made by the model itself: get_batch
samples with it (no gradient), so the loop of train/loop.py runs this stage as it runs any
other, with its Ctrl-C saving, exact --resume and mpiexec. All the sampling draws from the
run's batch generator (data_rng, which checkpoints keep), so a resumed run samples exactly the
answers the uninterrupted one did; under mpiexec each process answers its share of questions.

The evaluation is not a loss: it is the held-out questions' mean reward when sampled at the
temperature ("sampled_accuracy" in log.csv) and their accuracy when answered greedily
("greedy_accuracy"). best.npz keeps the best sampled accuracy.
"""
import hashlib
from functools import partial

import numpy as np

import tinyattn as ta
import tinyattn.nn as nn
import tinyattn.nn.functional as F
from data.chat import END, answer_text, render_prompt
from data.tasks import make_task

from .data import fingerprint


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
# the questions, as a data set
class RLTasks:
    """The questions of the tasks, and the batches the model makes by answering them. Every train
    question of every task is one item, drawn alike (a task with more questions comes up more)."""

    def __init__(self, tasks, tokenizer, args, source):
        self.tasks, self.tokenizer, self.args, self.source = tasks, tokenizer, args, source
        self.name = "rl: " + ", ".join(t.name for t in tasks)
        self.text_bytes = None
        self.rows = None
        self.end_id = tokenizer.special_tokens[END]
        self.train_questions = [(t, conv) for t in tasks for conv in t.conversations("train", len(t.splits["train"]))]
        per_task = max(1, args.rl_eval_prompts // len(tasks))
        self.test_questions = [(t, conv) for t in tasks for conv in t.conversations("test", per_task)]
        self.train = self.val = np.zeros(0, np.int64)   # (no token stream: announce describes the questions)
        self.model = self.reference = None
        self.last_reward = float("nan")                 # the mean reward of the newest batch (the progress bar's)
        self.loss_fn = partial(rl_loss, kl_weight=args.rl_kl)

    def attach(self, model, reference=None):
        """The model that answers (the one being trained) and the frozen reference (for --rl_kl)."""
        self.model, self.reference = model, reference

    def describe(self):
        return (f"{self.name}: {len(self.train_questions):,} train / {len(self.test_questions)} held-out questions, "
                f"{self.args.rl_samples} answers a question at temperature {self.args.rl_temperature:g}")

    def bits_per_byte(self, loss, split="val"):
        return None

    def prompt(self, conv):
        ids = render_prompt(self.tokenizer, conv["messages"][:-1])
        if len(ids) >= self.args.block_size:
            raise ValueError(f"the question {conv['messages'][0]['content']!r} takes {len(ids)} tokens: no room "
                             f"for an answer in block_size {self.args.block_size}")
        return ids

    def answer(self, conv, k, temperature, rng):
        """k answers to one question, sampled at ``temperature``: (prompt ids, [answer ids, ...])."""
        prompt = self.prompt(conv)
        room = min(self.args.rl_max_tokens, self.args.block_size - len(prompt))
        answers = sample_answers(self.model, prompt, k, room, temperature, rng, self.end_id)
        return prompt, answers

    def get_batch(self, split, batch_size, block_size, rng):
        """batch_size questions, rl_samples answers each: (x, y, advantages, ref_logprobs) for
        rl_loss. x (N, T) reads the prompt and the answer, y (N, T) holds the answer's tokens as
        targets (-1 on the prompt and padding), N = batch_size * rl_samples."""
        if split != "train":
            raise ValueError("the RL stage trains on the train split's questions; it evaluates by accuracy")
        k = self.args.rl_samples
        picked = rng.integers(0, len(self.train_questions), size=batch_size)
        rows, rewards = [], np.zeros((batch_size, k))                                  # (P, K)
        for p, i in enumerate(picked.tolist()):
            task, conv = self.train_questions[i]
            prompt, answers = self.answer(conv, k, self.args.rl_temperature, rng)
            for j, ids in enumerate(answers):
                rewards[p, j] = task.reward(conv, answer_text(self.tokenizer, ids))
                rows.append((prompt, ids))
        advantages = group_advantages(rewards, self.args.rl_std).reshape(-1)           # (N,)
        T = max(len(prompt) + len(ids) - 1 for prompt, ids in rows)
        x = np.zeros((len(rows), T), np.int64)                                         # (N, T)
        y = np.full((len(rows), T), -1, np.int64)
        for n, (prompt, ids) in enumerate(rows):
            seq = prompt + ids
            x[n, :len(seq) - 1] = seq[:-1]
            y[n, len(prompt) - 1:len(seq) - 1] = ids          # the answer's tokens, each read after the one before
        self.last_reward = float(rewards.mean())
        return x, y, advantages.astype(np.float32), self.reference_logprobs(x, y)

    @ta.no_grad()
    def reference_logprobs(self, x, y):
        """log pi_ref of the answer tokens (N, T) (0 elsewhere), for the KL term; zeros without it."""
        if not self.args.rl_kl:
            return np.zeros(x.shape, np.float32)
        device = self.reference.wte.weight.device
        logits, _ = self.reference(ta.tensor(x, device=device))
        return F.token_logprobs(logits, ta.tensor(y, device=device), ignore_index=-1).numpy().astype(np.float32)

    @ta.no_grad()
    def evaluate(self, model, args):
        """The held-out questions: mean reward sampled at the temperature (rl_samples answers
        each, from a generator of its own, the same at every evaluation) and greedy accuracy.
        -> (log.csv's columns, the number best.npz keeps lowest (1 - sampled accuracy), a line)."""
        rng = np.random.default_rng(args.seed + 1)
        sampled, greedy = {t.name: [] for t in self.tasks}, {t.name: [] for t in self.tasks}
        for task, conv in self.test_questions:
            _, answers = self.answer(conv, args.rl_samples, args.rl_temperature, rng)
            sampled[task.name] += [task.reward(conv, answer_text(self.tokenizer, ids)) for ids in answers]
            _, (ids,) = self.answer(conv, 1, 0.0, rng)
            greedy[task.name].append(task.reward(conv, answer_text(self.tokenizer, ids)))
        mean = lambda lists: float(np.mean([v for values in lists for v in values]))  # noqa: E731
        columns = dict(sampled_accuracy=round(mean(sampled.values()), 6), greedy_accuracy=round(mean(greedy.values()), 6))
        if len(self.tasks) > 1:
            columns.update({f"greedy_{name}": round(float(np.mean(v)), 6) for name, v in greedy.items()})
        line = (f"held-out sampled accuracy (T={args.rl_temperature:g}) {columns['sampled_accuracy']:.4f}, "
                f"greedy accuracy {columns['greedy_accuracy']:.4f}")
        if len(self.tasks) > 1:
            line += " (" + ", ".join(f"{name} {float(np.mean(v)):.4f}" for name, v in greedy.items()) + ")"
        return columns, 1.0 - columns["sampled_accuracy"], line


def load_tasks(args, tokenizer):
    """--stage rl's questions: the tasks of --rl_tasks, their words from the --data text."""
    names = args.rl_tasks.split(",")
    text, raw = None, b""
    if args.data:
        try:
            with open(args.data, "rb") as f:
                raw = f.read()
            text = raw.decode("utf-8")
        except IsADirectoryError:
            raise ValueError(f"--stage rl: --data {args.data} is a folder; the word tasks take their words from a "
                             "text file (the one the fine-tuning's questions were made from)") from None
        except UnicodeDecodeError as e:
            raise ValueError(f"--data {args.data}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if tokenizer is None or END not in getattr(tokenizer, "special_tokens", {}):
        raise ValueError("--stage rl: the model has no chat tokens: start from a fine-tuned assistant "
                         "(--init_from a run of chat fine-tuning)")
    missing = [name for name in names if name != "add" and text is None]
    if missing:
        raise ValueError(f"--stage rl: the {missing[0]} task takes its words from a text: pass --data TEXT (the one "
                         "the fine-tuning's questions were made from)")
    tasks = [make_task(name, text) for name in names]
    source = fingerprint(hashlib.sha256(raw).digest() + args.rl_tasks.encode())
    return RLTasks(tasks, tokenizer, args, source)

