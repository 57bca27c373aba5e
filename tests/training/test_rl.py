"""--stage rl: the group-mean advantage, the policy-gradient loss and the KL term against
plain numpy formulas; answers sampled with the KV cache from the run's own generator; a few
steps through python -m train, Ctrl-C and an exact --resume; the reward rising on a toy task."""
import json
import string
from types import SimpleNamespace

import numpy as np
import pytest

import tinyattn as ta
import train.rl as rl
from data.chat import CHAT_TOKENS, END, render_prompt
from data.tasks import Task, words_of
from tinyattn.models import GPT, GPTConfig
from tinyattn.tokenizers import CharTokenizer
from train import checkpoint
from train.command import main
from train.data import tokenizer_to_json

from training_data import TEXT, error_lines

CHARS = sorted(set(string.ascii_lowercase + string.digits + " :?+\n"))


def chat_model(block_size=48, seed=0):
    tok = CharTokenizer(CHARS).extended(special_tokens=CHAT_TOKENS)
    ta.manual_seed(seed)
    return GPT(GPTConfig(block_size=block_size, vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16)), tok


@pytest.fixture(scope="module")
def assistant(tmp_path_factory):
    """A tiny (untrained) model with the chat tokens, saved as --init_from reads it, and a text for the words."""
    folder = tmp_path_factory.mktemp("assistant")
    model, tok = chat_model()
    optimizer = model.configure_optimizer(0.1, 1e-3, (0.9, 0.99))
    checkpoint.save(str(folder / "ckpt.npz"), model, optimizer,
                    dict(config=model.config.to_dict(), tokenizer=tokenizer_to_json(tok), step=0, log=[]))
    (folder / "words.txt").write_text(TEXT.lower())
    return SimpleNamespace(ckpt=str(folder / "ckpt.npz"), text=str(folder / "words.txt"))


# ---------------------------------------------------------------- the formulas
def test_group_advantages_subtract_each_groups_own_mean():
    rewards = np.array([[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 1]], dtype=float)          # (P, K)
    want = np.array([[r - np.mean(row) for r in row] for row in rewards])
    np.testing.assert_allclose(rl.group_advantages(rewards), want, atol=0)
    assert (rl.group_advantages(rewards)[1] == 0).all()           # all right: nothing to learn
    std = rewards.std(axis=1, keepdims=True)
    np.testing.assert_allclose(rl.group_advantages(rewards, normalize=True),
                               np.where(std > 0, want / np.where(std > 0, std, 1), 0.0), rtol=1e-12)


def loss_inputs(seed=0, N=4, T=6):
    rng = np.random.default_rng(seed)
    logprobs = -rng.random((N, T)) * 3                                            # (N, T)
    advantages = rng.standard_normal(N)
    mask = (rng.random((N, T)) < 0.6).astype(float)
    mask[:, 0] = 1
    return logprobs, advantages, mask


def test_policy_gradient_loss_is_the_numpy_formula_and_its_gradient():
    logprobs, advantages, mask = loss_inputs()
    want = -sum(advantages[n] * logprobs[n, t] for n in range(4) for t in range(6) if mask[n, t]) / mask.sum()
    t = lambda a, grad=False: ta.tensor(a, dtype="float64", requires_grad=grad)    # noqa: E731
    lp = t(logprobs, True)
    loss = rl.policy_gradient_loss(lp, t(advantages), t(mask))
    np.testing.assert_allclose(loss.item(), want, rtol=1e-12)
    loss.backward()                                  # d/d logprob(n, t) = -A_n mask / (number of answer tokens)
    np.testing.assert_allclose(lp.grad.numpy(), -advantages[:, None] * mask / mask.sum(), rtol=1e-12)
    assert ta.gradcheck(lambda x: rl.policy_gradient_loss(x, t(advantages), t(mask)), (t(logprobs, True),))


def test_the_kl_estimate_is_zero_at_the_reference_positive_elsewhere_and_gradchecks():
    logprobs, _, mask = loss_inputs(1)
    ref = logprobs + np.random.default_rng(2).standard_normal(logprobs.shape) * 0.5
    t = lambda a, grad=False: ta.tensor(a, dtype="float64", requires_grad=grad)    # noqa: E731
    assert rl.kl_to_reference(t(logprobs), t(logprobs), t(mask)).item() == 0
    r = ref - logprobs
    want = ((np.exp(r) - r - 1) * mask).sum() / mask.sum()
    got = rl.kl_to_reference(t(logprobs), t(ref), t(mask)).item()
    assert got > 0
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert ta.gradcheck(lambda x: rl.kl_to_reference(x, t(ref), t(mask)), (t(logprobs, True),))
    # where the policy equals the reference the KL's gradient is 0: it only pulls back a model that moved
    lp = t(logprobs, True)
    rl.kl_to_reference(lp, t(logprobs), t(mask)).backward()
    assert np.abs(lp.grad.numpy()).max() == 0


def test_rl_loss_weights_the_log_probability_of_the_answer_tokens_only():
    model, _ = chat_model()
    model.to("float64")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 40, (3, 7))
    y = np.full((3, 7), -1)
    y[:, 3:] = rng.integers(0, 40, (3, 4))
    y[1, 5:] = -1                                                      # a shorter answer, then padding
    advantages = np.array([0.5, -1.0, 0.25])
    logits = model(ta.tensor(x))[0].numpy()                           # (N, T, V)
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, np.maximum(y, 0)[..., None], -1)[..., 0]
    mask = y >= 0
    want = -(advantages[:, None] * picked * mask).sum() / mask.sum()
    batch = tuple(ta.tensor(a) for a in (x, y, advantages, np.zeros((3, 7))))
    np.testing.assert_allclose(rl.rl_loss(model, batch).item(), want, rtol=1e-9)
    # a reference that is the model itself adds nothing; another one adds a positive KL
    ref = ta.tensor(np.where(mask, picked, 0.0))
    same = rl.rl_loss(model, (*batch[:3], ref), kl_weight=0.5).item()
    np.testing.assert_allclose(same, want, rtol=1e-9)
    assert rl.rl_loss(model, (*batch[:3], ref - 0.3 * ta.tensor(mask.astype(float))), kl_weight=0.5).item() > want


# ---------------------------------------------------------------- sampling
def test_greedy_answers_are_generates_and_samples_come_from_the_generator_given():
    model, tok = chat_model()
    prompt = render_prompt(tok, [{"role": "user", "content": "how many a in banana?"}])
    end = tok.special_tokens[END]
    (greedy,) = rl.sample_answers(model, prompt, 1, 6, 0.0, np.random.default_rng(0), end)
    want = model.generate(ta.tensor([prompt]), 6, temperature=0)[0].tolist()[len(prompt):]
    assert greedy == want[:want.index(end) + 1] if end in want else greedy == want
    first = rl.sample_answers(model, prompt, 5, 6, 1.0, np.random.default_rng(7), end)
    again = rl.sample_answers(model, prompt, 5, 6, 1.0, np.random.default_rng(7), end)
    assert first == again and len({tuple(a) for a in first}) > 1
    assert all(len(a) <= 6 and (end not in a or a.index(end) == len(a) - 1) for a in first)


def test_a_batch_holds_each_answer_as_targets_after_its_prompt(assistant):
    model, tok = chat_model()
    args = SimpleNamespace(rl_tasks="count", data=assistant.text, rl_samples=4, rl_temperature=1.0, rl_kl=0.0,
                           rl_std=False, rl_max_tokens=5, rl_eval_prompts=6, block_size=48, seed=0, rl_reward=None,
                           rl_tasks_given=True)
    data = rl_stage(args, tok, model)
    x, y, advantages, ref = data.get_batch("train", 3, 48, np.random.default_rng(0))
    assert x.shape == y.shape == ref.shape and x.shape[0] == 12 and advantages.shape == (12,)
    np.testing.assert_allclose(advantages.reshape(3, 4).sum(1), 0, atol=1e-6)     # each group's mean is 0
    for n in range(12):
        answer = y[n][y[n] >= 0]
        first = int(np.argmax(y[n] >= 0))
        assert x[n, first] == tok.special_tokens["<|assistant|>"]      # the answer starts after <|assistant|>
        np.testing.assert_array_equal(x[n, first + 1:first + len(answer)], answer[:-1])
        assert (y[n, first:first + len(answer)] >= 0).all() and len(answer) <= 5


def rl_stage(args, tok, model):
    """The --stage rl object of ``args``, answering with ``model``."""
    stage = rl.RL(rl.load_questions(args, tok), args)
    stage.prepare(model, None, None, [])
    return stage


# ---------------------------------------------------------------- through python -m train
def rl_run(assistant, out, *extra):
    return ["--stage", "rl", "--init_from", assistant.ckpt, "--data", assistant.text, "--out_dir", str(out),
            "--rl_prompts", "4", "--rl_samples", "4", "--rl_max_tokens", "4", "--rl_eval_prompts", "6",
            "--eval_interval", "3", "--log_interval", "1", "--learning_rate", "3e-3", "--warmup_iters", "1",
            "--quiet", *extra]


def final_state(out):
    model, optim, meta = checkpoint.load(str(out / "ckpt.npz"))
    optim_arrays = {f"{i}/{k}": v for i, values in optim["state"].items() for k, v in values.items()}
    return model, optim_arrays, meta["train_losses"], (meta["log"], meta["step_log"]), meta["step"]


def test_a_few_rl_steps_write_a_gpt_checkpoint_and_an_accuracy_log(assistant, tmp_path, capsys):
    out = tmp_path / "rl"
    assert main(rl_run(assistant, out, "--max_iters", "4", "--rl_kl", "0.1")) == 0
    said = capsys.readouterr().out
    assert "done: 4 iters, held-out sampled accuracy " in said and "greedy accuracy" in said
    header = (out / "log.csv").read_text().splitlines()[0]
    assert header == "step,lr,time,sampled_accuracy,greedy_accuracy,reward,frac_reward_zero_std"
    summary = json.loads((out / "summary.json").read_text())
    assert 0 <= summary["sampled_accuracy"] <= 1 and summary["iters"] == 4
    model, _, meta = checkpoint.load(str(out / "ckpt.npz"))        # a GPT checkpoint, as any other
    GPT(GPTConfig(**meta["config"])).load_state_dict(model)
    assert meta["args"]["stage"] == "rl" and len(meta["train_losses"]) == 4


@pytest.fixture(scope="module")
def uninterrupted(assistant, tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    assert main(rl_run(assistant, out, "--max_iters", "7", "--rl_kl", "0.1")) == 0
    return final_state(out)


# sample_answers: 12 calls an evaluation (6 questions, sampled and greedy), 4 a step (--rl_prompts 4)
@pytest.mark.parametrize("what, at_call", [("sample", 19), ("sample", 30), ("sample", 39), ("forward", 4), ("eval", 2)])
def test_ctrl_c_and_resume_is_exact(assistant, tmp_path, uninterrupted, what, at_call):
    owner, name = {"sample": (rl, "sample_answers"), "forward": (rl, "rl_loss"),
                   "eval": (rl.RL, "evaluate")}[what]
    real, calls = getattr(owner, name), []

    def patched(*args, **kwargs):
        calls.append(1)
        if len(calls) == at_call:
            raise KeyboardInterrupt                   # as a second Ctrl-C would: at once, then the saving
        return real(*args, **kwargs)
    out = tmp_path / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(owner, name, patched)
        assert main(rl_run(assistant, out, "--max_iters", "7", "--rl_kl", "0.1")) == 130
    stopped = checkpoint.read_meta(str(out / "ckpt.npz"))["step"]
    assert 0 < stopped < 7
    assert main(["--stage", "rl", "--data", assistant.text, "--out_dir", str(out), "--resume", "--quiet"]) == 0
    model, optim, losses, log, step = final_state(out)
    want_model, want_optim, want_losses, want_log, want_step = uninterrupted
    assert step == want_step == 7
    assert losses == want_losses
    assert [{k: v for k, v in r.items() if k != "time"} for r in log[0]] == \
        [{k: v for k, v in r.items() if k != "time"} for r in want_log[0]]
    assert log[1] == want_log[1] and len(log[1]) == 7            # each step's rewards, as the uninterrupted run's
    for key in model:
        np.testing.assert_array_equal(model[key], want_model[key], err_msg=key)
    for key in optim:
        np.testing.assert_array_equal(optim[key], want_optim[key], err_msg=key)


class FixedAnswer(Task):
    """A toy: every question's answer is "7" (one token), whatever it asks."""
    name = "count"
    answer_format = "[0-9]+"

    def make(self, word, rng):
        return f"how many {word[0]} in {word}?", "7"


def test_the_reward_rises_on_a_task_that_one_token_answers(assistant, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(rl, "make_task", lambda name, text: FixedAnswer(words_of(text)))
    out = tmp_path / "toy"
    assert main(rl_run(assistant, out, "--max_iters", "30", "--rl_max_tokens", "1", "--rl_prompts", "8",
                       "--rl_samples", "8", "--learning_rate", "3e-2", "--eval_interval", "30",
                       "--rl_eval_prompts", "10")) == 0
    first, last = checkpoint.read_meta(str(out / "ckpt.npz"))["log"]          # the evaluations at steps 0 and 30
    assert first["sampled_accuracy"] < 0.1               # 1 in 44 tokens at the start
    assert last["sampled_accuracy"] > 0.5 and last["greedy_accuracy"] == 1.0, last


# ---------------------------------------------------------------- refusals, one line each
@pytest.mark.parametrize("argv, said", [
    (["--rl_samples", "4"], "--rl_samples is a setting of --stage rl"),
    (["--stage", "rl"], "--stage rl trains an assistant: give --init_from PATH"),
    (["--stage", "rl", "--init_from", "x", "--rl_samples", "1"], "argument --rl_samples: must be at least 2, got 1"),
    (["--stage", "rl", "--init_from", "x", "--rl_tasks", "count,poem"], "expected task names from spell, count"),
    (["--stage", "rl", "--init_from", "x", "--rl_temperature", "0"], "must be above 0 and finite, got 0"),
])
def test_bad_rl_flags_are_one_line(argv, said, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and said in err[0], err


def test_a_model_without_chat_tokens_is_refused(assistant, tmp_path, capsys):
    model = GPT(GPTConfig(block_size=16, vocab_size=len(CHARS), n_layer=1, n_head=2, n_embd=16))
    optimizer = model.configure_optimizer(0.1, 1e-3, (0.9, 0.99))
    checkpoint.save(str(tmp_path / "base.npz"), model, optimizer,
                    dict(config=model.config.to_dict(), tokenizer=tokenizer_to_json(CharTokenizer(CHARS)), step=0))
    assert main(["--stage", "rl", "--init_from", str(tmp_path / "base.npz"), "--data", assistant.text,
                 "--out_dir", str(tmp_path / "rl"), "--quiet"]) == 1
    err = error_lines(capsys.readouterr().err)
    assert err == ["python -m train: error: --stage rl: the model has no chat tokens: start from a fine-tuned "
                   "assistant (--init_from a run of chat fine-tuning)"]


def test_shared_batches_give_each_process_whole_groups_of_answers(assistant, monkeypatch):
    """--shared_batches under mpiexec: every process draws the whole batch and keeps its rows;
    an RL batch's rows are K answers a question, so the slices must hold whole groups."""
    from tinyattn import distributed as dist
    from train import parallel
    model, tok = chat_model()
    args = SimpleNamespace(rl_tasks="count", data=assistant.text, rl_samples=4, rl_temperature=1.0, rl_kl=0.0,
                           rl_std=False, rl_max_tokens=4, rl_eval_prompts=6, block_size=48, seed=0, batch_size=4,
                           shared_batches=True, rl_reward=None, rl_tasks_given=False)
    data = rl_stage(args, tok, model)
    whole = data.get_batch("train", 4, 48, np.random.default_rng(3))
    monkeypatch.setattr(dist, "world_size", lambda: 2)
    parts = []
    for rank in (0, 1):
        monkeypatch.setattr(dist, "rank", lambda rank=rank: rank)
        parts.append(parallel.local_batch(data, args, np.random.default_rng(3)))
    for i, array in enumerate(whole):
        np.testing.assert_array_equal(np.concatenate([p[i] for p in parts]), array)
    assert all(len(p[0]) == 8 for p in parts)                         # 2 questions x 4 answers each
    np.testing.assert_allclose(parts[0][2].reshape(2, 4).sum(1), 0, atol=1e-6)


def test_a_word_task_without_its_text_is_one_line(assistant, tmp_path, capsys):
    assert main(["--stage", "rl", "--init_from", assistant.ckpt, "--out_dir", str(tmp_path / "rl"), "--quiet"]) == 1
    assert error_lines(capsys.readouterr().err) == [
        "python -m train: error: --stage rl: the count task takes its words from a text: pass --data TEXT (the one "
        "the fine-tuning's questions were made from)"]


def test_addition_needs_no_text_and_resumes_without_one(assistant, tmp_path):
    out = tmp_path / "add"
    argv = ["--stage", "rl", "--init_from", assistant.ckpt, "--rl_tasks", "add", "--out_dir", str(out),
            "--rl_prompts", "2", "--rl_samples", "2", "--rl_max_tokens", "3", "--rl_eval_prompts", "2",
            "--eval_interval", "2", "--quiet"]
    assert main([*argv, "--max_iters", "2"]) == 0
    assert main(["--out_dir", str(out), "--resume", "--max_iters", "3", "--quiet"]) == 0      # the stage carries over
    assert checkpoint.read_meta(str(out / "ckpt.npz"))["step"] == 3


def test_rl_trains_over_two_processes_and_resumes(assistant, tmp_path, monkeypatch):
    """mpiexec -n 2: each process answers its half of the questions; the run ends, and resumes, as one."""
    import subprocess
    import sys
    from test_distributed import MPIEXEC, TIMEOUT, WHY_NOT
    if MPIEXEC is None:
        pytest.skip(f"needs MPI: {WHY_NOT}")
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, "1")
    out = tmp_path / "two"
    for flags in (["--max_iters", "4"], ["--max_iters", "6", "--resume"]):
        argv = rl_run(assistant, out, *flags)
        if "--resume" in flags:                                    # a resumed run keeps its own settings
            argv = ["--out_dir", str(out), "--data", assistant.text, "--resume", "--max_iters", "6", "--quiet"]
        done = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "train", *argv],
                              capture_output=True, text=True, timeout=TIMEOUT)
        assert done.returncode == 0, done.stdout + done.stderr
    model, _, meta = checkpoint.load(str(out / "ckpt.npz"))
    assert meta["step"] == 6 and len(meta["train_losses"]) == 6 and meta["world_size"] == 2
    GPT(GPTConfig(**meta["config"])).load_state_dict(model)


# ---------------------------------------------------------------- your own prompts and rewards
def write_prompts(path, n=12, conversations=False):
    rows = []
    for i in range(n):
        word = ["cat", "dog", "sun", "sea"][i % 4]
        if conversations:
            rows.append({"messages": [{"role": "user", "content": f"spell {word}"},
                                      {"role": "assistant", "content": " ".join(word)}]})
        else:
            rows.append({"prompt": f"spell {word}", "answer": " ".join(word), "level": i % 3})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


REWARD_MODULE = '''
import json, os
CALLS = os.environ["REWARD_CALLS"]


def by_length(completions, prompts, answer, level, **kwargs):
    with open(CALLS, "a") as f:
        f.write(json.dumps(dict(completions=completions, prompts=prompts, answer=answer, level=level)) + "\\n")
    return [float(len(c)) / 4 for c in completions]


def nothing(completions, **kwargs):
    return [0.0] * len(completions)
'''


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(REWARD_MODULE)
    monkeypatch.setenv("REWARD_CALLS", str(tmp_path / "calls.jsonl"))
    return str(tmp_path / "my_rewards.py")


def prompts_run(assistant, data, out, *extra):
    return ["--stage", "rl", "--init_from", assistant.ckpt, "--data", data, "--out_dir", str(out),
            "--rl_prompts", "2", "--rl_samples", "3", "--rl_max_tokens", "3", "--eval_interval", "2",
            "--log_interval", "1", "--quiet", *extra]


def test_rl_on_a_prompts_file_with_a_reward_function_of_yours(assistant, reward_module, tmp_path, capsys):
    data = write_prompts(tmp_path / "prompts.jsonl")
    out = tmp_path / "rl"
    assert main(prompts_run(assistant, data, out, "--max_iters", "3", "--rl_reward",
                            f"{reward_module}:by_length")) == 0
    calls = [json.loads(line) for line in open(tmp_path / "calls.jsonl")]
    train_call = calls[2]                       # (the evaluation at step 0 comes first: sampled, then greedy)
    assert len(train_call["completions"]) == 6 and all(isinstance(c, str) for c in train_call["completions"])
    assert all(p.startswith("spell ") for p in train_call["prompts"])
    assert [" ".join(p.split()[1]) for p in train_call["prompts"]] == train_call["answer"]    # the row's columns
    assert all(level in (0, 1, 2) for level in train_call["level"])
    rows = list(csv_rows(out / "log.csv"))
    assert [int(r["step"]) for r in rows] == [0, 1, 2, 3]               # a row a step, evaluations at 0 and 2
    lengths = [len(c) / 4 for c in train_call["completions"]]
    assert float(rows[0]["reward"]) == pytest.approx(np.mean(lengths), abs=1e-6)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["iters"] == 3 and summary["dataset"] == "rl: prompts.jsonl, reward " + f"{reward_module}:by_length"
    # 12 prompts: the last tenth (one) is held out, answered 3 times sampled and once greedily
    assert [len(c["completions"]) for c in calls[:2]] == [3, 1] and calls[1]["prompts"] == ["spell sea"]


def csv_rows(path):
    import csv
    with open(path) as f:
        yield from csv.DictReader(f)


def test_a_conversations_file_is_prompts_with_reference_answers(assistant, tmp_path):
    data = write_prompts(tmp_path / "convs.json", conversations=True)      # (named .json: read by content)
    out = tmp_path / "rl"
    assert main(prompts_run(assistant, data, out, "--max_iters", "2", "--rl_reward", "contains")) == 0
    meta = checkpoint.read_meta(str(out / "ckpt.npz"))
    assert meta["dataset"] == "rl: convs.json, reward contains" and len(meta["step_log"]) == 2


def test_built_in_rewards_take_trls_arguments():
    completions = ["c a t", "  c a t ", "it is 42.", "dog", [{"role": "assistant", "content": "7 cats"}]]
    answers = ["c a t", "c a t", "42", "cat", "7"]
    assert rl.exact_match(completions, answer=answers, prompts=None) == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert rl.number_match(completions, answer=answers) == [0.0, 0.0, 1.0, 0.0, 1.0]
    assert rl.contains(completions, answer=answers) == [1.0, 1.0, 1.0, 0.0, 1.0]


def test_a_reward_that_never_varies_is_said_and_logged(assistant, reward_module, tmp_path, capsys):
    data = write_prompts(tmp_path / "prompts.jsonl")
    out = tmp_path / "rl"
    assert main(prompts_run(assistant, data, out, "--max_iters", "21", "--eval_interval", "50",
                            "--log_interval", "5", "--rl_reward", f"{reward_module}:nothing")) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "no signal" in line]
    assert len(err) == 1 and err[0].startswith("python -m train: note: no signal for 20 steps (to step 20)"), err
    assert "frac_reward_zero_std 1" in err[0]
    rows = [r for r in csv_rows(out / "log.csv") if r["reward"] != ""]       # (and the final evaluation's, at 21)
    assert len(rows) == 21 and all(float(r["frac_reward_zero_std"]) == 1.0 and float(r["reward"]) == 0.0
                                   for r in rows)


@pytest.mark.parametrize("content, extra, said", [
    ('{"prompt": "spell cat", "answer": "c a t"}\n' * 3, ["--rl_tasks", "count"],
     "is JSON lines, prompts with their answers, not a text for --rl_tasks's words"),
    ('[{"prompt": "spell cat"}]', [], "is JSON, not a text for the tasks' words"),
    ('{"prompt": "spell cat"}\n{"prompt": "spell dog"}\n', [], "line 1: expected \"prompt\" (text or messages)"),
    ("just some words here\n", ["--rl_reward", "exact"], "--rl_reward scores the answers to a file of prompts"),
    ('{"prompt": "a", "answer": "b"}\n' * 3, ["--rl_reward", "no_such_module:fn"], "cannot import no_such_module"),
])
def test_data_that_is_not_a_text_for_the_tasks_is_refused(assistant, tmp_path, capsys, content, extra, said):
    (tmp_path / "data.txt").write_text(content)
    code = main(["--stage", "rl", "--init_from", assistant.ckpt, "--data", str(tmp_path / "data.txt"),
                 "--out_dir", str(tmp_path / "rl"), "--quiet", *extra])
    err = error_lines(capsys.readouterr().err)
    assert code == 1 and len(err) == 1 and said in err[0], err


def test_a_prompts_run_resumes_exactly_with_its_command_and_resume_appended(assistant, reward_module, tmp_path,
                                                                           capsys):
    data = write_prompts(tmp_path / "prompts.jsonl")
    argv = lambda out: prompts_run(assistant, data, out, "--rl_reward", f"{reward_module}:by_length",  # noqa: E731
                                   "--lr_decay_iters", "4", "--warmup_iters", "1", "--rl_kl", "0.1")
    assert main([*argv(tmp_path / "a"), "--max_iters", "4"]) == 0
    assert main([*argv(tmp_path / "b"), "--max_iters", "2"]) == 0
    assert main([*argv(tmp_path / "b"), "--max_iters", "4", "--resume"]) == 0
    assert "is the model the run started from" in capsys.readouterr().err
    a, b = (checkpoint.load(str(tmp_path / r / "ckpt.npz")) for r in ("a", "b"))
    assert all(np.array_equal(a[0][k], b[0][k]) for k in a[0])
    assert a[2]["step_log"] == b[2]["step_log"] and len(a[2]["step_log"]) == 4
