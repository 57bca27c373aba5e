"""--stage dpo: preference pairs, the DPO loss against formulas, and DPO runs through the training loop."""
import json

import numpy as np
import pytest

import tinyattn as ta
from data.chat import CHAT_TOKENS, render
from data.pairs import near_miss, pairs, write_pairs
from data.tasks import make_task, words_of
from tinyattn.models import GPT, GPTConfig
from tinyattn.tokenizers import CharTokenizer
from train import checkpoint
from train.command import main
from train.data import tokenizer_to_json
from train.dpo import dpo_loss, greedy_answers, heldout_report, load_pairs, sequence_logprobs
from train.sample import load_model

from training_data import ctrl_c_in_backward, error_lines

TEXT = ("the quick brown fox jumps over the lazy dog while seven wizards quietly hex big jumbo "
        "crates of ivory and the kings mourn their brave knights in grim winter halls ") * 3
TINY = ["--batch_size", "8", "--eval_iters", "2", "--eval_interval", "5", "--learning_rate", "3e-3",
        "--warmup_iters", "2", "--quiet"]


def logsigmoid(x):
    return -np.logaddexp(0.0, -x)


def numpy_dpo_loss(pc, pr, rc, rr, beta):
    """The DPO loss as the paper writes it, in numpy."""
    return float(np.mean(-logsigmoid(beta * ((pc - rc) - (pr - rr)))))


# ---------------------------------------------------------------------------
# the loss against formulas
@pytest.mark.parametrize("beta", [0.1, 0.5, 2.0])
def test_dpo_loss_equals_the_numpy_formula(beta):
    rng = np.random.default_rng(0)
    pc, pr, rc, rr = (rng.normal(-20, 8, size=7) for _ in range(4))
    got = dpo_loss(*(ta.tensor(a, dtype="float64") for a in (pc, pr, rc, rr)), beta).item()
    assert abs(got - numpy_dpo_loss(pc, pr, rc, rr, beta)) < 1e-6
    got32 = dpo_loss(*(ta.tensor(a.astype(np.float32)) for a in (pc, pr, rc, rr)), beta).item()
    assert abs(got32 - numpy_dpo_loss(pc, pr, rc, rr, beta)) < 1e-5


def test_dpo_loss_equals_trls_sigmoid_loss_in_torch():
    """TRL's DPOTrainer (its "sigmoid" loss, reverse KL): -logsigmoid(beta * (chosen_logratios -
    rejected_logratios)), the mean over the batch, on the same log-probabilities."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    pc, pr, rc, rr = (rng.normal(-20, 8, size=9) for _ in range(4))
    chosen_logratios = torch.tensor(pc) - torch.tensor(rc)
    rejected_logratios = torch.tensor(pr) - torch.tensor(rr)
    theirs = (-torch.nn.functional.logsigmoid(0.1 * (chosen_logratios - rejected_logratios))).mean().item()
    ours = dpo_loss(*(ta.tensor(a, dtype="float64") for a in (pc, pr, rc, rr)), 0.1).item()
    assert abs(ours - theirs) < 1e-6


def test_dpo_loss_equals_trls_own_dpo_loss():
    """With TRL installed (and a version with DPOTrainer.dpo_loss on per-sequence log-probs)."""
    trainer = pytest.importorskip("trl.trainer.dpo_trainer")
    torch = pytest.importorskip("torch")
    if not hasattr(trainer.DPOTrainer, "dpo_loss"):
        pytest.skip("this TRL computes its DPO loss inside _compute_loss only")
    from types import SimpleNamespace
    rng = np.random.default_rng(2)
    logps = [torch.tensor(rng.normal(-20, 8, size=5)) for _ in range(4)]
    fake = SimpleNamespace(beta=0.1, loss_type="sigmoid", label_smoothing=0.0, reference_free=False,
                           f_divergence_type="reverse_kl", use_weighting=False, device="cpu",
                           args=SimpleNamespace(rpo_alpha=None))
    losses = trainer.DPOTrainer.dpo_loss(fake, *logps)[0]
    ours = dpo_loss(*(ta.tensor(t.numpy(), dtype="float64") for t in logps), 0.1).item()
    assert abs(ours - losses.mean().item()) < 1e-6


def test_dpo_loss_gradcheck():
    rng = np.random.default_rng(3)
    inputs = [ta.tensor(rng.normal(-5, 3, size=6), dtype="float64", requires_grad=True) for _ in range(4)]
    assert ta.gradcheck(lambda *a: dpo_loss(*a, 0.7), inputs)


def test_the_gradient_pushes_chosen_up_and_rejected_down():
    pc, pr = (ta.tensor(np.array([-3.0, -4.0]), dtype="float64", requires_grad=True) for _ in range(2))
    ref = ta.tensor(np.array([-3.5, -3.5]), dtype="float64")
    dpo_loss(pc, pr, ref, ref, 0.1).backward()
    assert (pc.grad.numpy() < 0).all() and (pr.grad.numpy() > 0).all()    # descent raises pc, lowers pr


def tiny_chat_tokenizer():
    return CharTokenizer.from_text(TEXT).extended(chars="abcdefghijklmnopqrstuvwxyz: 0123456789+?",
                                                  special_tokens=CHAT_TOKENS)


def test_sequence_logprobs_equal_numpy_on_the_answer_tokens_only():
    tok = tiny_chat_tokenizer()
    ta.manual_seed(0)
    model = GPT(GPTConfig(block_size=48, vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16)).to("float64")
    rows = pairs(make_task("reverse", TEXT), "train", 3)
    ids, mask = render(tok, rows[0]["prompt"] + rows[0]["chosen"])
    x = np.array([ids[:-1]])
    y = np.array([[t if m else -1 for t, m in zip(ids[1:], mask[1:])]])
    got = sequence_logprobs(model, ta.tensor(x), ta.tensor(y)).numpy()
    logits = model(ta.tensor(x))[0].numpy()[0]                           # (T, V)
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    answer = [t for t, m in enumerate(mask[1:]) if m]                    # positions whose target is the answer's
    expected = sum(logp[t, ids[t + 1]] for t in answer)
    assert len(answer) == len("".join(reversed(rows[0]["prompt"][0]["content"].split()[-1]))) + 1   # + <|end|>
    assert abs(got[0] - expected) < 1e-6


# ---------------------------------------------------------------------------
# the pairs
def test_near_misses_are_close_and_wrong():
    import random
    rng = random.Random(0)
    for name in ("spell", "reverse", "count", "add"):
        task = make_task(name, TEXT)
        for conv in task.conversations("train", 50):
            answer = conv["messages"][-1]["content"]
            wrong = near_miss(task, answer, rng)
            assert wrong != answer and task.evaluate(conv, wrong) == 0
            assert abs(len(wrong) - len(answer)) <= (2 if name == "spell" else 1)


def test_pair_files_keep_test_words_out_of_training(tmp_path):
    write_pairs(tmp_path, TEXT, ["spell", "reverse"], 40, 10)
    rows = {s: [json.loads(line) for line in open(tmp_path / f"{s}.jsonl")] for s in ("train", "test")}
    assert len(rows["train"]) == 80 and len(rows["test"]) == 20
    word = lambda p: p["prompt"][0]["content"].split()[-1]
    assert not {word(p) for p in rows["train"]} & {word(p) for p in rows["test"]}
    assert {word(p) for p in rows["train"] + rows["test"]} <= set(words_of(TEXT))
    for p in rows["train"]:
        assert set(p) == {"prompt", "chosen", "rejected"} and p["chosen"] != p["rejected"]
        assert [m["role"] for m in p["prompt"] + p["chosen"] + p["rejected"]] == ["user", "assistant", "assistant"]


def test_pairs_render_with_targets_on_the_answers_only(tmp_path):
    write_pairs(tmp_path, TEXT, ["spell"], 5, 5)
    tok = tiny_chat_tokenizer()
    data = load_pairs(str(tmp_path), tok)
    xc, yc, xr, yr = data.get_batch("train", 4, 64, np.random.default_rng(0))
    end = tok.special_tokens["<|end|>"]
    for x, y in ((xc, yc), (xr, yr)):
        for row_x, row_y in zip(x, y):
            answer = [t for t in row_y if t != -1]
            assert answer[-1] == end and answer.count(end) == 1          # the answer, then its <|end|>
            assert tok.decode(answer[:-1]).replace(" ", "").isalpha()
    assert (xc[:, 0] == tok.special_tokens["<|user|>"]).all()


# ---------------------------------------------------------------------------
# DPO runs through python -m train
@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny chat model (random weights, the chat tokens in its vocabulary), and pairs for it."""
    folder = tmp_path_factory.mktemp("dpo")
    tok = tiny_chat_tokenizer()
    ta.manual_seed(0)
    config = GPTConfig(block_size=48, vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16)
    model = GPT(config)
    optimizer = model.configure_optimizer(0.1, 1e-3, (0.9, 0.99))
    checkpoint.save(str(folder / "sft.npz"), model, optimizer,
                    dict(config=config.to_dict(), tokenizer=tokenizer_to_json(tok), step=0))
    write_pairs(folder / "pairs", TEXT, ["spell", "reverse"], 40, 10)
    return folder


def dpo(folder, out, *extra):
    return main(["--stage", "dpo", "--init_from", str(folder / "sft.npz"), "--data", str(folder / "pairs"),
                 "--out_dir", str(out), *TINY, *extra])


def test_a_dpo_run_learns_the_preference_and_leaves_a_normal_checkpoint(chat_model, tmp_path):
    before = checkpoint.load(str(chat_model / "sft.npz"))[0]
    assert dpo(chat_model, tmp_path / "run", "--max_iters", "40", "--learning_rate", "1e-2") == 0
    rows = [r for r in open(tmp_path / "run" / "log.csv").read().splitlines()]
    keys = rows[0].split(",")
    log = [dict(zip(keys, r.split(","))) for r in rows[1:]]
    assert float(log[0]["val_reward_accuracy"]) == 0.0                  # the policy is the reference
    assert float(log[0]["val_chosen_drift"]) == 0.0 and abs(float(log[0]["val_loss"]) - np.log(2)) < 1e-6
    assert float(log[-1]["val_reward_accuracy"]) > 0.6 and float(log[-1]["val_loss"]) < np.log(2)
    for row in log:                                                    # with no NLL term the loss is DPO's
        assert abs(float(row["val_loss"]) - float(row["val_dpo_loss"])) < 1e-5
    after = checkpoint.load(str(chat_model / "sft.npz"))[0]
    assert all(np.array_equal(before[k], after[k]) for k in before)     # the reference file is untouched
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["val_reward_accuracy"] == float(log[-1]["val_reward_accuracy"])


def test_a_dpo_checkpoint_loads_for_sampling_and_answers(chat_model, tmp_path):
    assert dpo(chat_model, tmp_path / "run", "--max_iters", "5") == 0
    model, tok = load_model(str(tmp_path / "run"), "cpu")
    rows = [json.loads(line) for line in open(chat_model / "pairs" / "test.jsonl")][:6]
    together = greedy_answers(model, tok, [p["prompt"] for p in rows], 8)
    alone = [greedy_answers(model, tok, [p["prompt"]], 8)[0] for p in rows]
    assert together == alone and all(isinstance(a, str) for a in alone)    # a batch answers as one prompt alone
    report = heldout_report(str(tmp_path / "run"), str(chat_model / "pairs"))
    assert set(report) == {"spell", "reverse"} and all(r["pairs"] == 10 for r in report.values())
    assert all(0 <= r["exact_match"] <= 1 and 0 <= r["reward_accuracy"] <= 1 for r in report.values())


def test_the_nll_term_is_added_to_the_dpo_loss(chat_model, tmp_path):
    assert dpo(chat_model, tmp_path / "run", "--max_iters", "0", "--dpo_nll", "0.5") == 0
    row = dict(zip(*(line.split(",") for line in open(tmp_path / "run" / "log.csv").read().splitlines()[:2])))
    assert float(row["val_loss"]) > float(row["val_dpo_loss"]) + 0.5 * 2      # + 0.5 x NLL per token (> 2 nats)


def test_resume_of_a_dpo_run_is_exact(chat_model, tmp_path):
    assert dpo(chat_model, tmp_path / "a", "--max_iters", "12") == 0
    assert dpo(chat_model, tmp_path / "b", "--max_iters", "6", "--lr_decay_iters", "12") == 0
    assert main(["--data", str(chat_model / "pairs"), "--out_dir", str(tmp_path / "b"), "--resume",
                 "--max_iters", "12", "--quiet"]) == 0
    a = checkpoint.load(str(tmp_path / "a" / "ckpt.npz"))
    b = checkpoint.load(str(tmp_path / "b" / "ckpt.npz"))
    assert all(np.array_equal(a[0][k], b[0][k]) for k in a[0])
    assert a[2]["log"][-1]["val_loss"] == b[2]["log"][-1]["val_loss"]
    assert b[2]["args"]["stage"] == "dpo" and b[2]["args"]["dpo_reference"] == str(chat_model / "sft.npz")
    # a second --resume still finds the model's tokenizer and the reference
    assert main(["--data", str(chat_model / "pairs"), "--out_dir", str(tmp_path / "b"), "--resume",
                 "--max_iters", "14", "--lr_decay_iters", "12", "--quiet"]) == 0


def test_resume_refuses_a_reference_that_changed(chat_model, tmp_path, capsys):
    import shutil
    shutil.copytree(chat_model, tmp_path / "m")
    assert dpo(tmp_path / "m", tmp_path / "run", "--max_iters", "4") == 0
    state, optim, meta = checkpoint.load(str(tmp_path / "m" / "sft.npz"))
    state["wte.weight"] = state["wte.weight"] + 1.0
    model = GPT(GPTConfig(**meta["config"]))
    model.load_state_dict(state)
    checkpoint.save(str(tmp_path / "m" / "sft.npz"), model, model.configure_optimizer(0.1, 1e-3, (0.9, 0.99)), meta)
    capsys.readouterr()
    code = main(["--data", str(tmp_path / "m" / "pairs"), "--out_dir", str(tmp_path / "run"), "--resume",
                 "--max_iters", "8", "--quiet"])
    err = "\n".join(error_lines(capsys.readouterr().err))
    assert code == 1 and "\n" not in err and "the DPO reference" in err and "has changed" in err


def test_dpo_flags_are_refused_in_one_line(chat_model, tmp_path, capsys):
    def refused(*flags):
        with pytest.raises(SystemExit) as e:
            main([*flags, "--out_dir", str(tmp_path / "x"), "--quiet"])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1
        return err
    assert "give --init_from MODEL and --data PAIRS" in refused("--stage", "dpo", "--data", str(chat_model / "pairs"))
    assert "--dpo_beta must be > 0" in refused("--stage", "dpo", "--init_from", str(chat_model / "sft.npz"),
                                               "--data", str(chat_model / "pairs"), "--dpo_beta", "0")
    assert "--dpo_nll is a setting of --stage dpo" in refused("--data", str(chat_model / "pairs"), "--dpo_nll", "1")


def test_a_model_without_chat_tokens_is_refused(chat_model, tmp_path, capsys):
    plain = tmp_path / "plain.txt"
    plain.write_text(TEXT)
    assert main(["--data", str(plain), "--out_dir", str(tmp_path / "base"), "--max_iters", "1", "--n_layer", "1",
                 "--n_embd", "16", "--n_head", "2", "--block_size", "16", "--quiet", "--sample_tokens", "0"]) == 0
    capsys.readouterr()
    code = main(["--stage", "dpo", "--init_from", str(tmp_path / "base"), "--data", str(chat_model / "pairs"),
                 "--out_dir", str(tmp_path / "x"), "--quiet"])
    err = "\n".join(error_lines(capsys.readouterr().err))
    assert code == 1 and "\n" not in err and "no chat tokens" in err


def test_ctrl_c_saves_a_dpo_run_and_resume_finishes_it_exactly(chat_model, tmp_path, capsys, monkeypatch):
    assert dpo(chat_model, tmp_path / "a", "--max_iters", "10", "--dpo_nll", "0.5") == 0
    with monkeypatch.context() as mp:
        ctrl_c_in_backward(mp, 4)
        assert dpo(chat_model, tmp_path / "b", "--max_iters", "10", "--dpo_nll", "0.5") == 130
    assert checkpoint.read_meta(str(tmp_path / "b" / "ckpt.npz"))["step"] == 4
    assert main(["--data", str(chat_model / "pairs"), "--out_dir", str(tmp_path / "b"), "--resume", "--quiet"]) == 0
    a, b = (checkpoint.load(str(tmp_path / r / "ckpt.npz")) for r in ("a", "b"))
    assert all(np.array_equal(a[0][k], b[0][k]) for k in a[0]) and a[2]["train_losses"] == b[2]["train_losses"]


def test_two_processes_train_dpo_as_one(chat_model, tmp_path, monkeypatch):
    """mpiexec -n 2 with --shared_batches: each process takes half of the pairs of one process that
    accumulates two micro-batches; the NLL term is a mean over the pairs, so it splits as the DPO
    loss does."""
    import subprocess
    import sys
    from test_distributed import MPIEXEC, TIMEOUT, WHY_NOT
    if MPIEXEC is None:
        pytest.skip(f"needs MPI: {WHY_NOT}")
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, "1")
    args = ["-m", "train", "--stage", "dpo", "--init_from", str(chat_model / "sft.npz"), "--data",
            str(chat_model / "pairs"), *TINY, "--max_iters", "8", "--dpo_nll", "0.5"]
    two = subprocess.run([MPIEXEC, "-n", "2", sys.executable, *args, "--out_dir", str(tmp_path / "two"),
                          "--shared_batches"], capture_output=True, text=True, timeout=TIMEOUT)
    assert two.returncode == 0, two.stdout + two.stderr
    assert main(args[2:] + ["--out_dir", str(tmp_path / "acc"), "--batch_size", "4",
                            "--gradient_accumulation_steps", "2"]) == 0
    losses = [checkpoint.read_meta(str(tmp_path / r / "ckpt.npz"))["train_losses"] for r in ("two", "acc")]
    assert len(losses[0]) == 8 and losses[0][-1] < losses[0][0]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6, atol=0)        # float32 rounding at most


def test_the_heldout_report_command_errs_in_one_line(chat_model, tmp_path, capsys):
    from train.dpo import main as report_main
    with pytest.raises(SystemExit) as e:
        report_main(["--out_dir", str(tmp_path / "none"), "--data", str(chat_model / "pairs")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 1 and len(err.splitlines()) == 1 and "no checkpoint" in err


# ---------------------------------------------------------------------------
# the cost of a step, and what --eval_only prints
def test_a_dpo_step_costs_two_forwards(chat_model, tmp_path, monkeypatch):
    """TRL's way: chosen and rejected through the policy in one forward (concatenated on the batch),
    and through the reference in one: 2 forwards a step, whatever the micro-batches hold."""
    from train import loop
    calls, per_step = [], []
    real_forward, real_step = GPT.forward, loop.train_step

    def counted_forward(self, *args, **kwargs):
        calls.append(1)
        return real_forward(self, *args, **kwargs)

    def counted_step(*args, **kwargs):
        calls.clear()
        out = real_step(*args, **kwargs)
        per_step.append(len(calls))
        return out
    monkeypatch.setattr(GPT, "forward", counted_forward)
    monkeypatch.setattr(loop, "train_step", counted_step)
    assert dpo(chat_model, tmp_path / "run", "--max_iters", "3", "--compile", "False", "--dpo_nll", "0.5") == 0
    assert per_step == [2, 2, 2]
    per_step.clear()
    assert dpo(chat_model, tmp_path / "acc", "--max_iters", "2", "--compile", "False", "--batch_size", "4",
               "--gradient_accumulation_steps", "2") == 0
    assert per_step == [4, 4]                                             # 2 a micro-batch


def test_the_concatenated_forward_gives_each_answers_own_logprobs(chat_model):
    from train.dpo import pair_logprobs
    state, _, meta = checkpoint.load(str(chat_model / "sft.npz"))
    model = GPT(GPTConfig(**meta["config"]))
    model.load_state_dict(state)
    tok = tiny_chat_tokenizer()
    data = load_pairs(str(chat_model / "pairs"), tok)
    batch = tuple(ta.tensor(a) for a in data.get_batch("val", 5, 48, np.random.default_rng(0)))
    chosen, rejected = pair_logprobs(model, batch)
    np.testing.assert_allclose(chosen.numpy(), sequence_logprobs(model, batch[0], batch[1]).numpy(), rtol=1e-5)
    np.testing.assert_allclose(rejected.numpy(), sequence_logprobs(model, batch[2], batch[3]).numpy(), rtol=1e-5)


def test_eval_only_prints_what_a_dpo_evaluation_prints(chat_model, tmp_path, capsys):
    assert dpo(chat_model, tmp_path / "run", "--max_iters", "4", "--eval_interval", "4") == 0
    last = json.loads((tmp_path / "run" / "summary.json").read_text())
    capsys.readouterr()
    assert main(["--data", str(chat_model / "pairs"), "--out_dir", str(tmp_path / "run"), "--resume",
                 "--eval_only"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line == (f"eval at step 4: train loss {last['train_loss']:.4f}, val loss {last['val_loss']:.4f} (reward "
                    f"accuracy {last['val_reward_accuracy']:.3f}, dpo loss {last['val_dpo_loss']:.4f}, log-prob drift "
                    f"chosen {last['val_chosen_drift']:+.3f}, rejected {last['val_rejected_drift']:+.3f})")
    assert main(["--stage", "dpo", "--init_from", str(chat_model / "sft.npz"), "--data", str(chat_model / "pairs"),
                 "--out_dir", str(tmp_path / "new"), "--eval_only"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("eval at step 0: train loss 0.6931, val loss 0.6931 (reward accuracy 0.000, dpo loss "
                           "0.6931, log-prob drift chosen +0.000") and "perplexity" not in line


def test_resume_appended_to_the_dpo_command_reloads_its_reference(chat_model, tmp_path, capsys):
    assert dpo(chat_model, tmp_path / "a", "--max_iters", "8") == 0
    assert dpo(chat_model, tmp_path / "b", "--max_iters", "4", "--lr_decay_iters", "8") == 0
    assert dpo(chat_model, tmp_path / "b", "--max_iters", "8", "--resume") == 0
    assert "is the model the run started from" in capsys.readouterr().err
    a, b = (checkpoint.load(str(tmp_path / r / "ckpt.npz")) for r in ("a", "b"))
    assert all(np.array_equal(a[0][k], b[0][k]) for k in a[0]) and a[2]["train_losses"] == b[2]["train_losses"]
